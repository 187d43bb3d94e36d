"""What a run leaves behind and reads back.

    checkpoint.py  checkpoints (weights, optimizer, scheduler, every process's RNGs) and the exact resume from them
    run_log.py     metrics.jsonl (one line per step), completions.jsonl, and TensorBoard / W&B when asked
"""
