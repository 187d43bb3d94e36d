"""`minigrpo bench --against trl --reward-model [PATH]`: scoring one batch with a reward model, minigrpo against TRL.

One process, one run. The policy samples one batch (--prompts x G completions of the task's prompts, the bench's
usual shape); then the same batch is scored, alternately, by

    minigrpo   reward_model.RewardModel, as the trainer calls it (rewards.score_completions)
    TRL        GRPOTrainer._calculate_rewards, on a GRPOTrainer built with reward_funcs=[the same model]

--steps times each after --warmup untimed, wall and CPU time, and the two sets of scores are compared. Then
minigrpo's whole GRPO step at the same shape (sampling, scoring with the reward model, the update) is timed, so
that the reward model's share of a training step is printed beside the ratio.

PATH: a reward model directory; without one, the policy's own body under a fresh scalar head (the shape a reward
model trained here from the warm start has, notebook 10). TRL is imported here only, lazily.
"""

import statistics
import tempfile
import time
from pathlib import Path

import torch

from ..collect import collect_batch
from ..generation.engines import GenerateEngine
from ..loading.models import load_model_and_tokenizer
from ..reward_model import load_reward_model
from ..rewards import score_completions
from ..tasks import get_task
from .bench import Clock, _InOrder, build_model_dir, make_trl_trainer, minigrpo_step, task_tokenizer

__all__ = ["main"]


def reward_model_dir(args, policy_dir: Path, tmp: Path) -> Path:
    """--reward-model PATH, or the policy's body under a fresh scalar head, saved in tmp."""
    if args.reward_model != "policy-shape":
        return Path(args.reward_model)
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the new head's "newly initialized" note
    torch.manual_seed(args.seed)
    model = AutoModelForSequenceClassification.from_pretrained(policy_dir, num_labels=1)
    model.save_pretrained(tmp / "reward_model")
    AutoTokenizer.from_pretrained(policy_dir).save_pretrained(tmp / "reward_model")
    return tmp / "reward_model"


def time_scorers(rm, trainer, batch, args) -> dict:
    """Both scorers on the same batch, alternating which goes first, warm-up excluded: (wall, CPU) per call."""
    prompts = [r["prompt"] for r in batch.rows]
    completions = batch.completions
    columns = {k: [r[k] for r in batch.rows] for k in batch.rows[0] if k != "prompt"}
    ids = [[0]] * len(prompts)
    times, scores = {"minigrpo": [], "trl": []}, {}
    for rep in range(args.warmup + args.steps):
        for side in ("minigrpo", "trl") if rep % 2 == 0 else ("trl", "minigrpo"):
            clock = Clock().start()
            if side == "minigrpo":
                scores[side] = score_completions([rm], prompts, completions, columns)[0][:, 0]
            else:
                scores[side] = trainer._calculate_rewards(batch.rows, prompts, completions, ids)[:, 0].cpu()
            if rep >= args.warmup:
                times[side].append(clock.stop())
    times["max_abs_diff"] = (scores["minigrpo"] - scores["trl"]).abs().max().item()
    return times


def main(args) -> int:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    device, task = torch.device(args.device), get_task(args.task)
    rows = task.load("train")[: args.prompts * (args.steps + args.warmup)]
    with tempfile.TemporaryDirectory(prefix="minigrpo-bench-rm-") as tmp:
        tokenizer, _ = task_tokenizer(task, Path(tmp))
        policy_dir = build_model_dir(args, task, tokenizer, Path(tmp))
        model, tokenizer = load_model_and_tokenizer(policy_dir, device)
        rm = load_reward_model(reward_model_dir(args, policy_dir, Path(tmp)), device)
        cfg = _config(args, policy_dir, task)
        torch.manual_seed(args.seed)
        batch = collect_batch(cfg, GenerateEngine(model, tokenizer), _InOrder(rows[: args.prompts]), [rm], [1.0],
                              args.max_completion_length)
        trainer = make_trl_trainer(policy_dir, tokenizer, rows, task, args, Path(tmp) / "trl", callback=None,
                                   reward_funcs=[rm.model], reward_processing_classes=[rm.tokenizer])
        scoring = time_scorers(rm, trainer, batch, args)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate)
        step_rows = [rows[rep * args.prompts:(rep + 1) * args.prompts] for rep in range(args.warmup + args.steps)]
        steps = [minigrpo_step(model, tokenizer, optimizer, task, cfg, r, [rm], device)["step"]
                 for r in step_rows][args.warmup:]
    report(scoring, steps, rm, batch, args)
    return 0


def _config(args, policy_dir, task):
    from ..config import Config

    return Config(model_name_or_path=str(policy_dir), task=task.name, num_generations=args.num_generations,
                  generation_batch_size=args.prompts * args.num_generations,
                  max_completion_length=args.max_completion_length, temperature=args.temperature,
                  learning_rate=args.learning_rate, seed=args.seed)


def report(scoring, steps, rm, batch, args) -> None:
    med = lambda values, i: statistics.median(v[i] for v in values)  # noqa: E731
    params = sum(p.numel() for p in rm.model.parameters())
    tokens = batch.completion_mask.sum().item()
    print(f"minigrpo bench --against trl --reward-model: scoring {len(batch)} completions ({args.prompts} prompts x "
          f"G={args.num_generations}, {tokens:.0f} completion tokens) with a {type(rm.model).__name__} of "
          f"{params / 1e6:.2f}M parameters, {args.steps} timed calls per side after {args.warmup} warm-up, "
          f"alternating; torch threads {torch.get_num_threads()}")
    print(f"{'':32s} {'minigrpo':>12s} {'TRL':>12s} {'minigrpo/TRL':>13s}")
    for label, i in (("scoring time, wall (s)", 0), ("scoring time, CPU (s)", 1)):
        a, b = med(scoring["minigrpo"], i), med(scoring["trl"], i)
        print(f"{label:32s} {a:12.4f} {b:12.4f} {a / b:13.2f}")
    step_wall, step_cpu = med(steps, 0), med(steps, 1)
    print(f"{'minigrpo GRPO step, wall (s)':32s} {step_wall:12.4f}   (sampling, scoring with it, update; median)")
    print(f"{'minigrpo GRPO step, CPU (s)':32s} {step_cpu:12.4f}")
    print(f"scores max |minigrpo - TRL|: {scoring['max_abs_diff']:.2e}")
    print()
    print(f"reward model scoring ratio minigrpo/trl: {med(scoring['minigrpo'], 0) / med(scoring['trl'], 0):.2f} "
          f"(wall), {med(scoring['minigrpo'], 1) / med(scoring['trl'], 1):.2f} (CPU)")
    print(f"reward model scoring share of a minigrpo step: {med(scoring['minigrpo'], 0) / step_wall:.3f} (wall), "
          f"{med(scoring['minigrpo'], 1) / step_cpu:.3f} (CPU)")


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit("run it as: minigrpo bench --against trl --reward-model [PATH]")
