"""What a run reports: one line of metrics.jsonl per step (every trainer); summary.json is run.run_summary's.

Names follow TRL's GRPOTrainer where TRL logs the same quantity, so its users find them where they look:

    reward, reward_std, rewards/<func>/mean|std    the combined reward and each reward function's
    frac_reward_zero_std                           groups whose rewards are all equal (advantage 0), of all sampled
    completions/mean_length|min_length|max_length  completion tokens (eos included), over all completions
    completions/mean_terminated_length             ... over those that ended with an eos
    completions/clipped_ratio                      completions cut off at max_completion_length
    entropy, clip_ratio/low_mean|high_mean|region_mean, kl, grad_norm, loss, learning_rate

and minigrpo's own: accuracy (the task's grader on the training samples), frac_reward_nan, advantages/* and
`advantages` (every completion's, for the histograms; per-token advantages: each completion's mean over its
tokens), completions/mean_length_correct|incorrect (the length of right and wrong answers: where length drift
shows), ratio_mean and approx_kl (old -> new policy), sampling_rounds (dynamic sampling), sampling/* (vLLM's
log-probs against the trainer's), step_seconds, generate_seconds, tokens_per_second, eval/accuracy_greedy; with fp16,
grad_scaler/skipped_steps (optimizer steps of this step skipped because the scaled gradients overflowed float16;
grad_norm averages the steps taken) and grad_scaler/scale; with a learned reward (reward_models/outcome.py), drift/kl
(KL(pi || pi_init) per completion, in nats: kl.sequence_kl) and drift/d = sqrt(drift/kl).

When a reward function grades steps (process supervision, step_rewards.py), whatever the estimator:

    process/step_accuracy                  the mean step reward over every graded step (a 0/1 checker's accuracy)
    process/frac_completions_with_error    completions with a step whose reward is below 0.5 (wrong, for 0/1)
    process/first_error_step               among those, the mean position of the first such step (1 = the first)
    process/frac_groups_with_signal        groups whose advantages are not all 0 (1 - frac_reward_zero_std)
    process/adv_token_abs_mean|std         mean |A_t| and the std of A_t over the policy's tokens of the batch

With advantage_estimator "process", frac_reward_zero_std counts the groups whose every token's advantage is 0 (all
their step rewards equal), the groups that teach nothing.
"""

import json
import math
from statistics import fmean

import torch

from .parallel import processes

__all__ = ["gather_batch", "gather_stats", "step_metrics", "json_line", "finite_or_none",
           "step_counts", "process_metrics"]

def gather_batch(batch, task) -> dict:
    """What step_metrics reads of a Batch, as CPU tensors, concatenated over the processes in rank order (so
    in the order a one-process run holds the same prompts). With one process: this batch's. Lengths count the
    policy's own tokens (tool output left out); with tools, each completion's calls, failed calls and tool turns."""
    correct = [task.grade(c, r) if task.graded else False for c, r in zip(batch.completions, batch.rows)]
    policy_mask, adv = batch.policy_mask.cpu(), batch.adv.cpu()
    mine = {
        "rewards": batch.rewards.cpu(), "adv": batch.completion_adv.cpu(), "correct": torch.tensor(correct, dtype=torch.bool),
        "lengths": batch.policy_mask.sum(1).cpu(), "is_truncated": batch.is_truncated.cpu(),
        "rewards_per_func": batch.rewards_per_func.cpu(), "zero_std_sampled": batch.zero_std_sampled.cpu(),
        "sampling_rounds": torch.tensor([batch.sampling_rounds]),
        **{f"tool_{name}": counts.cpu() for name, counts in batch.tool_counts.items()},
    }
    if batch.tool_mask is not None:
        mine["tool_tokens"] = (batch.completion_mask * (1 - batch.tool_mask)).sum(1).cpu()
    if batch.step_rewards is not None:
        mine.update(step_counts(batch.step_rewards.cpu(), adv, policy_mask))
    if not task.graded:  # nothing to grade: step_metrics leaves accuracy out
        mine["ungraded"] = torch.ones(1, dtype=torch.bool)
    ranks = processes.gather_objects(mine)
    return {key: torch.cat([r[key] for r in ranks]) for key in mine}


def step_counts(step_rewards: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> dict:
    """Per completion, what the process/* metrics sum over the batch: its graded steps, their rewards' sum, the
    position of the first step below 0.5 (0: none), and its per-token advantages' count, sum, |sum| and square sum
    over the policy's tokens. step_rewards (N, K), NaN past a row's steps; adv (N,) or (N, T); mask (N, T)."""
    graded = ~step_rewards.isnan()
    wrong = graded & (step_rewards < 0.5)
    first_error = torch.where(wrong.any(1), wrong.float().argmax(1) + 1, 0)  # argmax: the first True
    token_adv = (adv.unsqueeze(1) if adv.dim() == 1 else adv) * mask  # (N, T), 0 off the policy's tokens
    return {"steps": graded.sum(1), "steps_reward": step_rewards.nansum(1), "first_error": first_error,
            "adv_tokens": mask.sum(1), "adv_sum": token_adv.sum(1), "adv_abs_sum": token_adv.abs().sum(1),
            "adv_sq_sum": (token_adv ** 2).sum(1)}


def process_metrics(batch: dict) -> dict:
    """The process/* metrics (module docstring) from step_counts' sums over the gathered batch."""
    with_error = batch["first_error"] > 0
    tokens = batch["adv_tokens"].sum().clamp(min=1)
    mean = batch["adv_sum"].sum() / tokens
    return {
        "process/step_accuracy": (batch["steps_reward"].sum() / batch["steps"].sum().clamp(min=1)).item(),
        "process/frac_completions_with_error": with_error.float().mean().item(),
        "process/first_error_step": batch["first_error"][with_error].float().mean().item() if with_error.any() else None,
        "process/frac_groups_with_signal": 1.0 - batch["zero_std_sampled"].float().mean().item(),
        "process/adv_token_abs_mean": (batch["adv_abs_sum"].sum() / tokens).item(),
        "process/adv_token_std": (batch["adv_sq_sum"].sum() / tokens - mean ** 2).clamp(min=0).sqrt().item(),
    }


def gather_stats(step_stats: list[dict]) -> list[dict]:
    """Each mini-batch's loss statistics over all processes (every rank ran as many mini-batches).

    loss and grad_norm are the same quantity on every rank's scale (the loss is normalised so that the ranks'
    average is the global batch's; the gradient is averaged before its norm is taken): a plain mean. The
    rest are token means (entropy, clip ratios, ratio, KL): weighted by each rank's tokens, which makes them
    the global batch's token mean. (GSPO's sequence-level clip ratios are sequence means: token-weighting them
    is then an approximation.)"""
    ranks = processes.gather_objects(step_stats)
    if len(ranks) == 1:
        return step_stats
    gathered = []
    for i, stats in enumerate(step_stats):
        tokens = [r[i]["tokens"] for r in ranks]
        weighted = lambda key: sum(r[i][key] * n for r, n in zip(ranks, tokens)) / max(sum(tokens), 1)  # noqa: E731
        gathered.append({key: fmean(r[i][key] for r in ranks) if key in ("loss", "grad_norm") else weighted(key)
                         for key in stats})
    return gathered


def step_metrics(batch: dict, step_stats: list[dict], reward_names: list[str]) -> dict:
    """The per-step numbers of metrics.jsonl (module docstring). batch: as `gather_batch` returns it;
    step_stats: one dict per mini-batch, as `gather_stats` returns them."""
    rewards, adv, lengths, correct = batch["rewards"], batch["adv"], batch["lengths"], batch["correct"]
    scored, ended = ~rewards.isnan(), ~batch["is_truncated"]
    row = {
        "loss": fmean(s["loss"] for s in step_stats),
        "reward": rewards[scored].mean().item() if scored.any() else math.nan,
        "reward_std": rewards[scored].std().item() if scored.sum() > 1 else 0.0,
        "frac_reward_zero_std": batch["zero_std_sampled"].float().mean().item(),
        "frac_reward_nan": (~scored).float().mean().item(),
        "accuracy": correct.float().mean().item(),
        "advantages/mean": adv.mean().item(), "advantages/std": adv.std().item(),
        "advantages/min": adv.min().item(), "advantages/max": adv.max().item(),
        "advantages": [round(a, 4) for a in adv.tolist()],
        "completions/mean_length": lengths.mean().item(),
        "completions/min_length": lengths.min().item(), "completions/max_length": lengths.max().item(),
        "completions/mean_terminated_length": lengths[ended].mean().item() if ended.any() else None,
        "completions/mean_length_correct": lengths[correct].mean().item() if correct.any() else None,
        "completions/mean_length_incorrect": lengths[~correct].mean().item() if (~correct).any() else None,
        "completions/clipped_ratio": batch["is_truncated"].float().mean().item(),
        "sampling_rounds": batch["sampling_rounds"].max().item(),
    }
    if "ungraded" in batch:  # the prompts task: no answers, so no accuracy
        for key in ("accuracy", "completions/mean_length_correct", "completions/mean_length_incorrect"):
            del row[key]
    if "tool_calls" in batch:  # TRL's tools/* names, and how many tokens were the tool's
        calls = batch["tool_calls"].float()
        row["tools/call_frequency"] = calls.mean().item()
        row["tools/failure_frequency"] = batch["tool_failed"].sum().item() / max(calls.sum().item(), 1.0)
        row["tools/turns_mean"] = batch["tool_turns"].float().mean().item()
        row["tools/tool_tokens_mean"] = batch["tool_tokens"].float().mean().item()
    if "steps" in batch:  # a reward function graded steps (process supervision)
        row.update(process_metrics(batch))
    for j, name in enumerate(reward_names):
        col = batch["rewards_per_func"][:, j]
        row[f"rewards/{name}/mean"] = col.nanmean().item()
        row[f"rewards/{name}/std"] = col[~col.isnan()].std().item() if (~col.isnan()).sum() > 1 else 0.0
    for key in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "ratio_mean", "approx_kl",
                "entropy"):
        row[key] = fmean(s[key] for s in step_stats)
    taken = [s["grad_norm"] for s in step_stats if math.isfinite(s["grad_norm"])]  # fp16: a skipped step's is inf
    row["grad_norm"] = fmean(taken) if taken else math.nan
    if "skipped" in step_stats[0]:  # fp16's loss scaler: optimizer steps skipped on an overflow, the scale after
        row["grad_scaler/skipped_steps"] = int(sum(s["skipped"] for s in step_stats))
        row["grad_scaler/scale"] = step_stats[-1]["loss_scale"]
    row["kl"] = fmean(s["kl"] for s in step_stats) if "kl" in step_stats[0] else None
    for key in step_stats[0]:  # what only some objectives report (sapo/gate_slope_mean, ...): under their own names
        if "/" in key and key not in row and not key.startswith("clip_ratio/"):
            row[key] = fmean(s[key] for s in step_stats)
    if "drift/kl" in row:  # Gao et al. 2022's axis: d = sqrt(KL(pi || pi_init)), KL per completion in nats
        row["drift/d"] = math.sqrt(max(row["drift/kl"], 0.0))
    return row


def json_line(row: dict) -> str:
    """One line of metrics.jsonl. A number that is missing (NaN: no reward scored; or infinite) is written null:
    Python's json would write NaN, which jq, JavaScript and pandas' strict readers refuse."""
    return json.dumps(finite_or_none(row), allow_nan=False) + "\n"


def finite_or_none(x):
    """x with every non-finite float (in dicts and lists too) replaced by None."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite_or_none(v) for k, v in x.items()}
    if isinstance(x, list):
        return [finite_or_none(v) for v in x]
    return x
