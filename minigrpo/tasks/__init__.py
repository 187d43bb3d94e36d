"""Tasks with checkable answers: a generator, a grader, rewards, data files and a default model.

    from minigrpo.tasks import get_task
    task = get_task("addition")
    rows = task.load("test")                       # [{"prompt": "347+586=", "answer": "933"}, ...]
    task.correctness_reward(prompts, completions, answer=[r["answer"] for r in rows])
    task.model_dir                                 # data/models/addition: tiny Llama + tokenizer

Known tasks: ``addition`` (fixed format) and ``think_addition`` (the policy chooses how long
it thinks), with shipped tiny models (``scripts/make_tiny_world.py`` rebuilds their data and models);
``long_addition`` (think_addition with 7-8 digit operands, always worked out: the world where process supervision
pays, ``scripts/make_long_world.py``);
for real models: ``countdown`` (generated, data/tasks/countdown), ``gsm8k`` (hub or a local copy) and ``answer`` (your own prompt + answer rows), graded
in the R1 answer format (answers.py); ``prompts`` (rows with no answer, scored by your reward functions alone:
prompts.py); ``reasoning_gym`` (reasoning-gym's ~100 generated tasks, scored by their own
verifiers in an isolated worker: reasoning_gym.py, isolation.py).
"""

import dataclasses

from ..errors import ConfigError
from .addition import AdditionTask
from .answers import AnswerTask
from .base import DATA_DIR, DataError, Task
from .countdown import CountdownTask
from .prompts import PromptsTask
from .gsm8k import Gsm8kTask
from .reasoning_gym import ReasoningGymTask
from .think_addition import ThinkAdditionTask
from .tool_addition import ToolAdditionTask

# think_addition's long-chain world (process supervision, notebook 11): 7- and 8-digit operands, always worked out
# column by column, so a completion is 7-8 steps and the answer: most steps right, the whole answer rarely.
# Longest target: 8 steps "9+9+1=19" and 7 commas + tags + 9 digits + eos = 83 tokens.
LONG_ADDITION = ThinkAdditionTask(name="long_addition", max_completion_length=88, min_digits=7, max_digits=8,
                                  think_share=1.0, data_script="scripts/make_long_world.py")
TASKS: dict[str, Task] = {task.name: task for task in (AdditionTask(), ThinkAdditionTask(), LONG_ADDITION, CountdownTask(),
                                                AnswerTask(), Gsm8kTask(), ReasoningGymTask(), ToolAdditionTask(),
                                                PromptsTask())}


def get_task(name: str, *, answer_grader: str = "numeric") -> Task:
    """The task called ``name``; raises ConfigError naming the known tasks otherwise. answer_grader: how the
    final-answer tasks (``answer``, ``gsm8k``) compare an answer, "numeric" (answers.py) or "math_verify"."""
    if name not in TASKS:
        raise ConfigError(f"task: unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    task = TASKS[name]
    if answer_grader != "numeric":
        if not isinstance(task, AnswerTask):
            raise ConfigError(f"answer_grader: {answer_grader!r} grades the answer and gsm8k tasks' final answers; "
                              f"{name} has a checker of its own (use reward_funcs: [math_verify] for LaTeX answers)")
        task = dataclasses.replace(task, grader=answer_grader)
    return task


__all__ = ["DATA_DIR", "DataError", "TASKS", "Task", "AdditionTask", "ThinkAdditionTask", "AnswerTask", "CountdownTask", "Gsm8kTask", "ToolAdditionTask",
           "ReasoningGymTask", "PromptsTask", "get_task"]
