"""`minigrpo bench --against trl --reward-model [PATH]`: scoring one batch with a reward model, minigrpo against TRL.

One process, one run. The policy samples one batch (--prompts x G completions of the task's prompts, the bench's
usual shape); then the same batch is scored, alternately, by

    minigrpo   reward_model.RewardModel, as the trainer calls it (rewards.score_completions): each prompt's
               shared tokens computed once (reward_models.outcome.shared_prefix_scores)
    padded     the same RewardModel, every text whole, in length chunks (RewardModel.score without prompts): the
               path before prefix sharing, and the one models it cannot take run
    TRL        GRPOTrainer._calculate_rewards, on a GRPOTrainer built with reward_funcs=[the same model]

--steps times each after --warmup untimed, wall and CPU time, and the sets of scores are compared. Then
minigrpo's whole GRPO step at the same shape (sampling, scoring with the reward model, the update) is timed, with
the reward model's own calls inside it, so that its share of a training step (on the step's own batch) is printed
beside the ratio, also with the forward that `minigrpo train` adds for the drift. And the floating-point operations
of one more step, and of each scorer and the drift forward on that step's batch, are counted
(torch.utils.flop_counter: the matrix multiplies; attention's products on the CPU are not counted, a few percent at
these lengths): the share a reward model of the policy's size costs whatever the overheads.

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
from ..logprobs import LogprobForward
from ..reward_models.outcome import load_reward_model
from ..rewards import score_completions
from ..tasks import get_task
from .bench import Clock, _InOrder, build_model_dir, make_trl_trainer, minigrpo_step, task_tokenizer
from .bench_logprobs import matmul_flops

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
    """The scorers on the same batch, rotating which goes first, warm-up excluded: (wall, CPU) per call, the
    scores' largest differences."""
    scorers = scorers_of(rm, trainer, batch)
    sides = list(scorers)
    times, scores = {side: [] for side in sides}, {}
    for rep in range(args.warmup + args.steps):
        for side in sides[rep % 3:] + sides[:rep % 3]:
            clock = Clock().start()
            scores[side] = scorers[side]().cpu()
            if rep >= args.warmup:
                times[side].append(clock.stop())
    times["max_abs_diff"] = (scores["minigrpo"] - scores["trl"]).abs().max().item()
    times["padded_max_abs_diff"] = (scores["padded"] - scores["trl"]).abs().max().item()
    return times


def scorers_of(rm, trainer, batch) -> dict:
    """The three scorers of the bench on one batch, as callables returning (N,) scores."""
    prompts = [r["prompt"] for r in batch.rows]
    columns = {k: [r[k] for r in batch.rows] for k in batch.rows[0] if k != "prompt"}
    return {
        "minigrpo": lambda: score_completions([rm], prompts, batch.completions, columns)[0][:, 0],
        "padded": lambda: rm.score(rm.texts(prompts, batch.completions)),
        "trl": lambda: trainer._calculate_rewards(batch.rows, prompts, batch.completions, [[0]] * len(prompts))[:, 0],
    }


def step_flops(rm, trainer, model, tokenizer, optimizer, task, cfg, rows, device) -> dict:
    """Floating-point operations of one more GRPO step, and of each scorer and of the drift's forward on that
    step's own batch (the scorers' figures are then shares of the same batch)."""
    step = {}
    flops = {"step": matmul_flops(lambda: step.update(minigrpo_step(model, tokenizer, optimizer, task, cfg, rows, [rm],
                                                                   device)))}
    batch = step["inputs"]
    flops.update({side: matmul_flops(scorer) for side, scorer in scorers_of(rm, trainer, batch).items()})
    flops["drift"] = matmul_flops(lambda: drift_forward_time(model, batch, cfg))
    return flops


def drift_forward_time(model, inputs, cfg) -> tuple[float, float]:
    """(wall, CPU) of the forward that `minigrpo train` adds to a step when a reward is learned: the log-probs of
    the batch under the start, for the drift (trainer.prepare_update). The start is a copy of the policy's shape,
    so the policy's own forward on the same batch costs the same; minigrpo_step leaves it out (beta = 0)."""
    ids = (inputs.prompt_ids, inputs.prompt_mask, inputs.completion_ids, inputs.completion_mask)
    model.eval()
    clock = Clock().start()
    with torch.no_grad():
        LogprobForward(model)(*ids, temperature=cfg.temperature, share_prompts=cfg.shared_prefix)
    return clock.stop()


class TimedReward:
    """The reward model as a reward function whose last call's (wall, CPU) time is kept in `last`."""

    learned = True

    def __init__(self, rm):
        self.rm, self.__name__, self.last = rm, rm.__name__, None

    def __call__(self, prompts, completions, **row) -> list[float]:
        clock = Clock().start()
        scores = self.rm(prompts, completions, **row)
        self.last = clock.stop()
        return scores


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
        timed_rm = TimedReward(rm)  # the reward model as the step calls it, its calls timed on the step's batches
        steps = []
        for rep, r in enumerate(step_rows):
            step = minigrpo_step(model, tokenizer, optimizer, task, cfg, r, [timed_rm], device)
            if rep >= args.warmup:
                steps.append({"step": step["step"], "scoring": timed_rm.last,
                              "drift": drift_forward_time(model, step["inputs"], cfg)})
        scoring["flops"] = step_flops(rm, trainer, model, tokenizer, optimizer, task, cfg, step_rows[0], device)
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
    flops = scoring["flops"]
    print(f"{'':32s} {'minigrpo':>12s} {'padded':>12s} {'TRL':>12s} {'minigrpo/TRL':>13s}")
    for label, i in (("scoring time, wall (s)", 0), ("scoring time, CPU (s)", 1)):
        a, b, c = med(scoring["minigrpo"], i), med(scoring["padded"], i), med(scoring["trl"], i)
        print(f"{label:32s} {a:12.4f} {b:12.4f} {c:12.4f} {a / c:13.2f}")
    print(f"{'scoring GFLOP (a step batch)':32s} {flops['minigrpo'] / 1e9:12.3f} {flops['padded'] / 1e9:12.3f} "
          f"{flops['trl'] / 1e9:12.3f} {flops['minigrpo'] / flops['trl']:13.2f}")
    step = lambda key, i: statistics.median(s[key][i] for s in steps)  # noqa: E731
    print(f"{'minigrpo GRPO step, wall (s)':32s} {step('step', 0):12.4f}   (sampling, scoring with it, update; median)")
    print(f"{'minigrpo GRPO step, CPU (s)':32s} {step('step', 1):12.4f}")
    print(f"{'  of which scoring, CPU (s)':32s} {step('scoring', 1):12.4f}   (minigrpo's, on the step's own batch)")
    print(f"{'  + the drift forward, CPU (s)':32s} {step('drift', 1):12.4f}   (what `minigrpo train` adds with a "
          f"learned reward: the start's log-probs of the batch)")
    print(f"{'one step, GFLOP':32s} {flops['step'] / 1e9:12.3f}   (scoring included; + {flops['drift'] / 1e9:.3f} "
          f"for the drift forward)")
    print(f"scores max |minigrpo - TRL|: {scoring['max_abs_diff']:.2e}")
    print(f"scores max |padded - TRL|: {scoring['padded_max_abs_diff']:.2e}")
    print()
    print(f"reward model scoring ratio minigrpo/trl: {med(scoring['minigrpo'], 0) / med(scoring['trl'], 0):.2f} "
          f"(wall), {med(scoring['minigrpo'], 1) / med(scoring['trl'], 1):.2f} (CPU)")
    share = lambda i: statistics.median(s["scoring"][i] / s["step"][i] for s in steps)  # noqa: E731
    with_drift = lambda i: statistics.median(  # noqa: E731
        s["scoring"][i] / (s["step"][i] + s["drift"][i]) for s in steps)
    print(f"reward model scoring share of a minigrpo step: {share(0):.3f} (wall), {share(1):.3f} (CPU), "
          f"{flops['minigrpo'] / flops['step']:.3f} (FLOP); the padded path's FLOP share "
          f"{flops['padded'] / flops['step']:.3f}")
    print(f"reward model scoring share of a `minigrpo train` step (with the drift forward): {with_drift(0):.3f} "
          f"(wall), {with_drift(1):.3f} (CPU), {flops['minigrpo'] / (flops['step'] + flops['drift']):.3f} (FLOP)")


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit("run it as: minigrpo bench --against trl --reward-model [PATH]")
