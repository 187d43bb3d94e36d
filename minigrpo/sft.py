"""Supervised fine-tuning (SFT): imitate reference completions. GRPO's honest baseline.

    L(theta) = - 1/|T| sum_{(q, o)} sum_{t=1..|o|} log pi_theta(o_t | q, o_<t)

the mean cross-entropy over the completion tokens (and the closing eos) of a batch of (prompt q, correct
completion o) pairs; the prompt tokens are context only (label -100). T is the set of completion tokens in the
batch — the same token-level mean as DAPO's loss, with every token weighted 1 instead of by an advantage.

minigrpo uses SFT twice:
  * `scripts/make_tiny_world.py` warm-starts the shipped tiny models with it, to the edge of ability.
  * notebook 3 spends GRPO's wall time on more SFT from the same warm start, as a control.

SFT needs a correct completion for every prompt; GRPO needs only a checker of the final answer. When reference
solutions exist (as here, where `task.target_completion` writes them) SFT is the faster teacher; RL earns its keep
when they do not.
"""

import json
import random
import time
from collections.abc import Callable
from pathlib import Path

import torch

from .evaluate import evaluate
from .models import load_model_and_tokenizer, resolve_device
from .tasks import Task, get_task

__all__ = ["collate_sft", "sft_batch", "train_sft"]

IGNORE_INDEX = -100  # label of positions that take no loss (prompt, padding), as in Hugging Face models


def collate_sft(tokenizer, prompts: list[str], completions: list[str]):
    """Tokenise (prompt, completion) pairs for SFT; eos is appended to each completion.

    Returns input_ids, attention_mask and labels, each (B, L) right-padded to the longest pair; labels hold the
    completion and eos ids and IGNORE_INDEX on the prompt and padding, so only completion tokens take loss.
    """
    sequences, labels = [], []
    for prompt, completion in zip(prompts, completions, strict=True):
        prompt_ids = tokenizer(prompt)["input_ids"]  # <bos> prompt
        completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        sequences.append(prompt_ids + completion_ids)
        labels.append([IGNORE_INDEX] * len(prompt_ids) + completion_ids)
    width = max(map(len, sequences))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([s + [pad] * (width - len(s)) for s in sequences])  # (B, L)
    attention_mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sequences])  # (B, L)
    label_ids = torch.tensor([lab + [IGNORE_INDEX] * (width - len(lab)) for lab in labels])  # (B, L)
    return input_ids, attention_mask, label_ids


def sft_batch(
    task: Task,
    tokenizer,
    rng: random.Random,
    batch_size: int,
    exclude: set[str] = frozenset(),
    target_completion: Callable | None = None,
):
    """A fresh batch of problems from the task's generator with their correct completions, collated by `collate_sft`.

    exclude: prompts never to train on (the test split). target_completion(row, rng) -> text writes the reference
    completion; default `task.target_completion` (for think_addition: a fair coin between thinking and not).
    """
    target_completion = target_completion or task.target_completion
    prompts, completions = [], []
    while len(prompts) < batch_size:
        row = task.make_problem(rng)
        if row["prompt"] in exclude:
            continue
        prompts.append(row["prompt"])
        completions.append(target_completion(row, rng))
    return collate_sft(tokenizer, prompts, completions)


def train_sft(
    task: str = "think_addition",
    *,
    output_dir: str | Path = "runs/sft",
    model_name_or_path: str | None = None,
    target_completion: Callable | None = None,
    max_steps: int = 200,
    max_seconds: float | None = None,
    learning_rate: float = 1e-3,
    warmup_steps: int = 10,
    batch_size: int = 128,
    eval_steps: int = 25,
    eval_num_problems: int = 200,
    eval_limit: int | None = None,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """SFT from a model (default: the task's shipped warm start); writes a run directory like GRPO's.

    Stops after max_steps, or earlier once max_seconds of training time (evaluation excluded, as in GRPO's
    `wall_seconds`) are spent — so a control can get exactly the wall time a GRPO run took.
    output_dir gets metrics.jsonl (step, loss, learning_rate, step_seconds, eval/accuracy_greedy every eval_steps)
    and summary.json (accuracy_before / accuracy_after on the test split, greedy), so `minigrpo.lab.plots` draws
    SFT and GRPO runs on the same axes. Returns the summary.
    """
    torch.manual_seed(seed)
    rng = random.Random(seed)
    the_task = get_task(task)
    device = resolve_device("auto")
    model, tokenizer = load_model_and_tokenizer(model_name_or_path or the_task.model_dir, device)
    test_rows = the_task.load("test")[:eval_limit]
    eval_rows = test_rows[:eval_num_problems]
    exclude = {row["prompt"] for row in the_task.load("test")}  # never train on a test problem
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    settings = dict(task=task, model_name_or_path=model_name_or_path, max_steps=max_steps, max_seconds=max_seconds,
                    learning_rate=learning_rate, warmup_steps=warmup_steps, batch_size=batch_size, seed=seed,
                    eval_steps=eval_steps, eval_num_problems=eval_num_problems, eval_limit=eval_limit,
                    target_completion=getattr(target_completion, "__name__", repr(target_completion)))
    (out / "sft_config.json").write_text(json.dumps(settings, indent=2) + "\n")

    before = evaluate(model, tokenizer, the_task, test_rows)
    wall_seconds, step = 0.0, 0
    with open(out / "metrics.jsonl", "w") as metrics_file:
        while step < max_steps and (max_seconds is None or wall_seconds < max_seconds):
            step += 1
            t0 = time.perf_counter()
            lr = learning_rate * min(1.0, step / warmup_steps) if warmup_steps else learning_rate  # linear warm-up
            for group in optimizer.param_groups:
                group["lr"] = lr
            model.train()
            input_ids, attention_mask, labels = (
                t.to(device) for t in sft_batch(the_task, tokenizer, rng, batch_size, exclude, target_completion)
            )
            loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss  # mean over T
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step_seconds = time.perf_counter() - t0
            wall_seconds += step_seconds

            row = {"step": step, "loss": loss.item(), "learning_rate": lr, "step_seconds": step_seconds}
            done = step >= max_steps or (max_seconds is not None and wall_seconds >= max_seconds)
            if eval_steps and (step % eval_steps == 0 or done):
                row["eval/accuracy_greedy"] = evaluate(model, tokenizer, the_task, eval_rows)["accuracy_greedy"]
                if progress:
                    print(f"sft step {step:4d}  loss {row['loss']:.4f}  greedy accuracy "
                          f"{row['eval/accuracy_greedy']:6.1%}  {wall_seconds:6.1f} s", flush=True)
            metrics_file.write(json.dumps(row) + "\n")
            metrics_file.flush()

    after = evaluate(model, tokenizer, the_task, test_rows)
    summary = {
        "task": the_task.name, "method": "sft", "model": str(model_name_or_path or the_task.model_dir), "seed": seed,
        "steps": step, "wall_seconds": round(wall_seconds, 2),
        "accuracy_before": before["accuracy_greedy"], "accuracy_after": after["accuracy_greedy"],
        "completion_length_before": before["mean_length_greedy"], "completion_length_after": after["mean_length_greedy"],
        "eval_before": before, "eval_after": after, "num_test_problems": len(test_rows),
        "device": str(device), "torch": torch.__version__,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
