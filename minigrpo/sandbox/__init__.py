"""Code minigrpo did not write, kept at arm's length.

    user_code.py           reward functions and tools named as module:function or path.py:function, loaded by name
    isolation.py           a worker process with time and memory limits, for anything that may hang or evaluate
                           text (reasoning-gym's scorers, math-verify, the python tool); a failed call scores 0
    verifiers.py           what runs inside that worker (the scorers themselves)
    math_verify_grader.py  math-verify as a grader of LaTeX answers, through the worker
"""
