"""`python -m minigrpo.lab.bench_process`: what process supervision's per-token advantages cost in a GRPO step,
outcome and process side by side on the same rollouts.

Each round samples one batch (`--prompts` x G completions of the task's shipped model), then runs the rest of the
step twice from the same weights and optimizer state, in alternating order (outcome first on even rounds, process
first on odd ones, so both see the same machine load):

    outcome   the task's correctness reward, advantage_estimator "grpo": one advantage per completion (N,)
    process   the task's step checker ("steps"), advantage_estimator "process": per-token advantages (N, T)

    score+adv sample_round on the sampled rollout (replayed, not sampled again): every reward function, and for
              process the characters -> tokens mapping (step_rewards.token_starts), the step tensors and
              process_advantages
    update    the loss and optimizer step (trainer.grpo_update)

A step is the sampling (measured once per round, shared) + score+adv + update. Reported: median [min-max] over the
timed rounds, wall and CPU time (process_time); what process's score+adv adds, as a share of the outcome step (the
cost of per-token advantages: the step checker, the mapping to tokens, the estimator); and the whole steps' difference,
which also holds the updates' noise (the same work on (N,) and (N, T) advantages). The first `--warmup` rounds are
not counted. The weights are put back after every update, so every round samples from the
warm start and both sides train on identical inputs.
"""

import argparse
import copy
import sys
import warnings

import torch

from ..collect import sample_round
from ..config import Config
from ..generation.engines import GenerateEngine
from ..loading.models import load_model_and_tokenizer
from ..rewards import build_reward_funcs
from ..tasks import get_task
from ..trainer import grpo_update
from .bench import Clock, _fmt, _stats

__all__ = ["main", "SIDES"]

SIDES = {"outcome": dict(advantage_estimator="grpo", reward_funcs=["correctness"]),
         "process": dict(advantage_estimator="process", reward_funcs=["steps"])}


class Replay:
    """An engine that returns a rollout already sampled (so both sides score the very same completions)."""

    def __init__(self, rollout, tokenizer):
        self.rollout, self.tokenizer = rollout, tokenizer

    def generate(self, prompts, **kwargs):
        return self.rollout


def one_side(cfg, model, tokenizer, optimizer, task, rows, rollout) -> dict:
    """score+adv and the update of one side on `rollout`; the model and optimizer are left as they were."""
    state, optimizer_state = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    reward_funcs = build_reward_funcs(cfg.reward_funcs, task, cfg.max_completion_length)
    clock = Clock().start()
    batch = sample_round(cfg, Replay(rollout, tokenizer), rows, reward_funcs, [1.0], cfg.max_completion_length)
    score = clock.stop()
    batch.loss_mask = batch.policy_mask
    model.train()
    clock = Clock().start()
    grpo_update(model, optimizer, batch, cfg, max_completion_length=cfg.max_completion_length)
    update = clock.stop()
    model.load_state_dict(state)
    optimizer.load_state_dict(optimizer_state)
    return {"score": score, "update": update, "adv_shape": tuple(batch.adv.shape)}


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m minigrpo.lab.bench_process", description=__doc__.split("\n")[0])
    p.add_argument("--task", default="think_addition", help="a task with a step checker (reward_funcs 'steps')")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--num-generations", type=int, default=8)
    p.add_argument("--max-completion-length", type=int, default=None, help="default: the task's")
    p.add_argument("--rounds", type=int, default=7, help="timed rounds")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    warnings.filterwarnings("ignore", message="over half of a batch's completions")
    torch.set_num_threads(args.threads)
    task = get_task(args.task)
    model, tokenizer = load_model_and_tokenizer(task.model_dir)
    max_len = args.max_completion_length or task.max_completion_length
    base = dict(task=task.name, num_generations=args.num_generations, max_completion_length=max_len,
                generation_batch_size=args.prompts * args.num_generations, seed=args.seed)
    configs = {side: Config(**base, **settings) for side, settings in SIDES.items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    all_rows = task.load("train")
    results = {side: [] for side in SIDES}
    sampling = []
    for r in range(args.warmup + args.rounds):
        rows = all_rows[r * args.prompts:(r + 1) * args.prompts]
        torch.manual_seed(args.seed + r)
        clock = Clock().start()
        rollout = GenerateEngine(model, tokenizer).generate([row["prompt"] for row in rows],
                                                            num_generations=args.num_generations,
                                                            max_completion_length=max_len)
        sampled = clock.stop()
        order = list(SIDES) if r % 2 == 0 else list(SIDES)[::-1]
        measured = {side: one_side(configs[side], model, tokenizer, optimizer, task, rows, rollout) for side in order}
        if r >= args.warmup:
            sampling.append(sampled)
            for side in SIDES:
                results[side].append(measured[side])
    report(results, sampling, args, int(rollout.completion_mask.sum()))
    return 0


def report(results: dict, sampling: list, args, tokens: int) -> None:
    print(f"\n{args.task}: {args.prompts} prompts x G={args.num_generations}, {args.rounds} timed rounds "
          f"(median [min-max]); last batch {tokens} completion tokens; process advantages "
          f"{results['process'][0]['adv_shape']}")
    print(f"{'':28s} {'outcome':>26s} {'process':>26s} {'process - outcome':>18s}")
    steps = {}
    for i, clock in ((0, "wall"), (1, "CPU")):
        sample = [s[i] for s in sampling]
        for part in ("score", "update"):
            a, b = ([x[part][i] for x in results[side]] for side in SIDES)
            print(f"{part + ', ' + clock + ' (s)':28s} {_fmt(a):>26s} {_fmt(b):>26s} "
                  f"{_stats(b)[0] - _stats(a)[0]:>+18.4f}")
        steps[clock] = [[s + x["score"][i] + x["update"][i] for s, x in zip(sample, results[side])] for side in SIDES]
        a, b = steps[clock]
        print(f"{'step, ' + clock + ' (s)':28s} {_fmt(a):>26s} {_fmt(b):>26s} {_stats(b)[0] - _stats(a)[0]:>+18.4f}")
    print(f"{'sampling, shared (s)':28s} {_fmt([s[0] for s in sampling]):>26s}")
    for i, clock in ((0, "wall"), (1, "CPU")):
        a, b = steps[clock]
        extra = [(y["score"][i] - x["score"][i]) / step for x, y, step in zip(*results.values(), a)]
        whole = [(y - x) / x for x, y in zip(a, b)]
        print(f"per-token advantages ({clock}): score+adv adds {100 * _stats(extra)[0]:.1f}% of the outcome step "
              f"(median of the rounds, {100 * min(extra):.1f}% to {100 * max(extra):.1f}%); the whole step "
              f"{100 * _stats(whole)[0]:+.1f}% ({100 * min(whole):+.1f}% to {100 * max(whole):+.1f}%: the update's noise)")


if __name__ == "__main__":
    sys.exit(main())
