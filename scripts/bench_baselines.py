"""What ReMax's greedy row and the optimal token baseline's old-policy pass cost per step, measured side by side.

    OMP_NUM_THREADS=1 python scripts/bench_baselines.py                  # the shipped think_addition model
    OMP_NUM_THREADS=1 python scripts/bench_baselines.py --steps 10 --prompts 16 --num-generations 8
    OMP_NUM_THREADS=1 python scripts/bench_baselines.py --num-iterations 2  # two passes: old log-probs needed

One process, one model: the estimators take turns (grpo, remax, optimal_token_baseline, grpo, ...) so that they see
the same machine load, each step timed in two parts:

    rollout   collect_batch: sample, score, advantages. ReMax decodes one more row per prompt (its greedy
              completion, in the same prompt pass and decode steps) and scores it; the optimal token baseline runs
              one no-grad forward of the policy for log pi_old and sum pi^2 (logprobs.py, the head in blocks).
    update    prepare_update + grpo_update: identical work for the three (the greedy rows are not trained on),
              but with --num-iterations > 1: then prepare_update runs a no-grad forward for log pi_old, which the
              optimal token baseline's batch already carries (its estimator read them).

The first --warmup rounds are not counted. Wall and CPU time (process_time; the steadier on a shared machine) are
printed as means over the timed steps and as ratios to grpo's. Each step is also one optimizer step, at a learning
rate of 1e-6 so that the policy, and so the completions' lengths, barely move over the run.
"""

import argparse
import contextlib
import statistics
import time

import torch

from minigrpo.batch import PromptSampler
from minigrpo.collect import collect_batch
from minigrpo.config import Config
from minigrpo.generation.engines import GenerateEngine
from minigrpo.logprobs import LogprobForward
from minigrpo.loading.models import load_model_and_tokenizer
from minigrpo.rewards import build_reward_funcs
from minigrpo.run import make_optimizer
from minigrpo.tasks import get_task
from minigrpo.trainer import grpo_update, prepare_update

ESTIMATORS = ("grpo", "remax", "optimal_token_baseline")


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="think_addition")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--num-generations", type=int, default=8)
    p.add_argument("--steps", type=int, default=8, help="timed steps per estimator")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--num-iterations", type=int, default=1, help="passes over each batch (old log-probs when > 1)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    torch.manual_seed(args.seed)
    task = get_task(args.task)
    model, tokenizer = load_model_and_tokenizer(task.model_dir)
    configs = {name: Config(task=args.task, advantage_estimator=name, num_generations=args.num_generations,
                            generation_batch_size=args.prompts * args.num_generations, learning_rate=1e-6,
                            num_iterations=args.num_iterations)
               for name in ESTIMATORS}
    max_len = task.max_completion_length
    reward_funcs = build_reward_funcs(configs["grpo"].reward_funcs, task, max_len)
    engine = GenerateEngine(model, tokenizer)
    sampler = PromptSampler(task.load("train"), args.seed)
    optimizer, _ = make_optimizer(configs["grpo"], model.parameters())
    times = {name: {"rollout": [], "update": [], "rollout_cpu": [], "update_cpu": []} for name in ESTIMATORS}
    print(f"{args.task}: {args.prompts} prompts x G = {args.num_generations}, max {max_len} tokens, "
          f"num_iterations {args.num_iterations}, {torch.get_num_threads()} torch thread(s); {args.warmup} warm-up "
          f"round(s), {args.steps} timed")

    def update(cfg, batch):
        inputs, _ = prepare_update(cfg, batch, LogprobForward(model), None, contextlib.nullcontext)
        return grpo_update(LogprobForward(model), optimizer, inputs, cfg, max_completion_length=max_len)

    for round_ in range(args.warmup + args.steps):
        for name, cfg in configs.items():
            batch, wall, cpu = timed(lambda: collect_batch(cfg, engine, sampler, reward_funcs, [1.0], max_len, model))
            _, wall_u, cpu_u = timed(lambda: update(cfg, batch))
            if round_ >= args.warmup:
                for key, value in (("rollout", wall), ("rollout_cpu", cpu), ("update", wall_u), ("update_cpu", cpu_u)):
                    times[name][key].append(value)

    mean = {name: {key: statistics.fmean(v) for key, v in t.items()} for name, t in times.items()}
    print(f"\n{'estimator':24s} {'rollout s':>10s} {'(cpu)':>8s} {'update s':>9s} {'(cpu)':>8s} {'step s':>8s} "
          f"{'step / grpo':>12s} {'step cpu / grpo':>16s}")
    base = mean["grpo"]
    for name, m in mean.items():
        step, step_cpu = m["rollout"] + m["update"], m["rollout_cpu"] + m["update_cpu"]
        print(f"{name:24s} {m['rollout']:10.3f} {m['rollout_cpu']:8.3f} {m['update']:9.3f} {m['update_cpu']:8.3f} "
              f"{step:8.3f} {step / (base['rollout'] + base['update']):12.2f} "
              f"{step_cpu / (base['rollout_cpu'] + base['update_cpu']):16.2f}")
    for name in ESTIMATORS[1:]:
        print(f"{name}: rollout {mean[name]['rollout_cpu'] / base['rollout_cpu']:.2f}x grpo's CPU time")


if __name__ == "__main__":
    main()
