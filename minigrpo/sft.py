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
import math
import random
import time
from collections.abc import Callable

import torch

from .config import Config, ConfigError
from .evaluate import evaluator
from .loading.models import resolve_device
from .mixed_precision import optimizer_step, scaled_backward
from .parallel import processes
from .persistence.run_log import write_config
from .run import finish_run, load_run, make_optimizer, refuse_unsupported
from .tasks import Task, get_task

__all__ = ["collate_sft", "sft_batch", "train_sft"]

# Config settings train_sft does not honour (it samples nothing, keeps no checkpoints, logs only metrics.jsonl)

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


def train_sft(cfg: Config, *, batch_size: int = 128, max_seconds: float | None = None,
              target_completion: Callable | None = None, progress: bool = True) -> dict:
    """SFT from cfg's model (default: the task's shipped warm start) on problems from the task's generator; writes
    a run directory like GRPO's: config.yaml (with an `sft:` section), metrics.jsonl (step, loss, learning_rate,
    step_seconds, eval/accuracy_greedy every eval_steps), summary.json, plots/, model/ (save_model). Returns the
    summary, whose accuracy_before / accuracy_after are greedy on the test split, as GRPO's.

    From the Config it reads what SFT shares with GRPO: task, model_name_or_path (and use_peft / load_in_4bit,
    dtype), bf16 / fp16, seed, max_steps, learning_rate and its schedule (warmup_steps, lr_scheduler_type), AdamW's
    settings, eval_steps / eval_num_problems / eval_limit, output_dir, save_model, device. The gradient is not
    clipped; a non-finite one stops the run before the weights change (fp16: skips the step, mixed_precision.py).
    batch_size: (prompt, completion) pairs per optimizer step. max_seconds: stop once this much training time
    (evaluation excluded, as in GRPO's `wall_seconds`) is spent, so a control can get exactly a GRPO run's time.
    target_completion(row, rng) -> text: the completion to imitate (default `task.target_completion`).
    """
    if type(get_task(cfg.task)).make_problem is Task.make_problem:
        raise ConfigError(f"task: train_sft draws problems from a task's generator; {cfg.task!r} has none")
    if processes.launched_processes() > 1:
        raise ConfigError("train_sft: one process only")
    refuse_unsupported(cfg, "train_sft")  # what the loop would otherwise silently ignore
    run = load_run(cfg, resolve_device(cfg.device))  # seeded: the task, the model, the test rows, the output folder
    model, tokenizer, task = run.model, run.tokenizer, run.task
    rng = random.Random(cfg.seed)  # the problems' stream
    exclude = {row["prompt"] for row in task.load("test")}  # never train on a test problem
    optimizer, scheduler = make_optimizer(cfg, model.parameters())
    write_config(run.out, cfg.to_dict(), algorithm="sft", sft=dict(batch_size=batch_size, max_seconds=max_seconds,
                 target_completion=getattr(target_completion, "__name__", repr(target_completion))))
    evaluate_on = evaluator(model, tokenizer, task, run.max_completion_length, cfg.temperature,
                            cfg.chat_template_kwargs)  # evaluate_on(rows) -> accuracies

    before = evaluate_on(run.test_rows)
    wall_seconds, step = 0.0, 0
    with open(run.out / "metrics.jsonl", "w") as metrics_file:
        while step < cfg.max_steps and (max_seconds is None or wall_seconds < max_seconds):
            step += 1
            t0 = time.perf_counter()
            model.train()
            input_ids, attention_mask, labels = (
                t.to(run.device) for t in sft_batch(task, tokenizer, rng, batch_size, exclude, target_completion)
            )
            with run.autocast():  # bf16 / fp16: the forward in 16 bits; HF's cross-entropy upcasts the logits
                loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss  # mean over T
            optimizer.zero_grad(set_to_none=True)
            scaled_backward(loss, run.scaler)  # fp16: of S * loss (mixed_precision.py)
            _, skipped = optimizer_step(optimizer, model.parameters(), math.inf, run.scaler, where=f"sft step {step}: ")
            learning_rate = scheduler.get_last_lr()[0]
            scheduler.step()
            step_seconds = time.perf_counter() - t0
            wall_seconds += step_seconds

            row = {"step": step, "loss": loss.item(), "learning_rate": learning_rate, "step_seconds": step_seconds}
            if run.scaler is not None:  # fp16: a step skipped on an overflow, and the loss scale after it
                row.update({"grad_scaler/skipped_steps": int(skipped), "grad_scaler/scale": run.scaler.get_scale()})
            done = step >= cfg.max_steps or (max_seconds is not None and wall_seconds >= max_seconds)
            if cfg.eval_steps and (step % cfg.eval_steps == 0 or done):
                row["eval/accuracy_greedy"] = evaluate_on(run.test_rows[: cfg.eval_num_problems])["accuracy_greedy"]
                if progress:
                    print(f"sft step {step:4d}  loss {row['loss']:.4f}  greedy accuracy "
                          f"{row['eval/accuracy_greedy']:6.1%}  {wall_seconds:6.1f} s", flush=True)
            metrics_file.write(json.dumps(row) + "\n")
            metrics_file.flush()

    after = evaluate_on(run.test_rows)
    return finish_run(cfg, task, model, tokenizer, run.out, before=before, after=after,
                      num_test_problems=len(run.test_rows), wall_seconds=wall_seconds, device=run.device,
                      algorithm="sft", loss_type="sft", steps=step)
