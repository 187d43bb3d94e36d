"""One training batch: prompts in, scored completions with their advantages out — steps 1 to 3 of the loop.

    sampler.take(prompts)              which prompts, in a seeded order                 PromptSampler
    sample_round                       G completions per prompt (the engine), every reward function on
                                       each (rewards.py), advantages over the group (advantages.py)
    collect_batch                      one round; with dynamic_sampling (DAPO), more rounds until the batch
                                       holds enough groups whose rewards differ

A batch is a dict of per-completion entries, N = generation_batch_size / W rows grouped by prompt (rows
i*G .. i*G+G-1 share prompt i):

    prompt_ids, prompt_mask            (N, P) left-padded         completion_ids, completion_mask   (N, T)
    is_truncated                       (N,) no eos within max_completion_length
    sampling_logp                      (N, T) the engine's log-probs (vLLM), or None
    rewards, rewards_per_func          (N,), (N, F) NaN = no reward function could score it
    adv, zero_std                      (N,) advantage; True where the group's rewards are all equal
    completions, rows                  the completion texts, and each completion's dataset row
    zero_std_sampled                   (all sampled,) zero_std of every group sampled, kept or not
    sampling_rounds                    how many rounds were sampled (1 without dynamic sampling)
"""

import random
import warnings

import torch
import torch.nn.functional as F

from . import advantages, distributed
from .advantages import gfpo_keep, kl_penalized_rewards
from .logprobs import completion_logprobs
from .prompts import completions_for_rewards
from .rewards import combine_rewards, score_completions

__all__ = ["PromptSampler", "collect_batch", "sample_round", "compute_advantages"]


class PromptSampler:
    """Endless shuffled passes over the training rows, deterministic in the seed.

    With several processes, every rank draws the same global stream (same seed) and keeps its own contiguous
    share: take(n) on rank r of W draws n * W rows and returns rows [r n, (r+1) n). So a W-process run trains
    on the prompts a one-process run would, in the same order.
    """

    def __init__(self, rows: list[dict], seed: int, rank: int = 0, world_size: int = 1):
        self.rows, self.rng, self.order = rows, random.Random(seed), []
        self.rank, self.world_size = rank, world_size

    def take(self, n: int) -> list[dict]:
        batch = []
        while len(batch) < n * self.world_size:
            if not self.order:
                self.order = list(range(len(self.rows)))
                self.rng.shuffle(self.order)
            batch.append(self.rows[self.order.pop()])
        return batch[self.rank * n:(self.rank + 1) * n]

    def state_dict(self) -> dict:
        """Where the sampler is: its RNG and what is left of the current pass (saved in checkpoints)."""
        return {"rng": self.rng.getstate(), "order": list(self.order)}

    def load_state_dict(self, state: dict) -> None:
        self.rng.setstate(state["rng"])
        self.order = list(state["order"])


def compute_advantages(rewards: torch.Tensor, cfg, group_size: int, lengths: torch.Tensor,
                       rewards_per_func: torch.Tensor | None = None,
                       reward_weights: list[float] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(N,) rewards, grouped by group_size -> (adv (N,), zero_std (N,)) with the run's estimator and settings
    (advantages.compute_advantages, the table and the formulas); GDPO when multi_objective_aggregation is
    "normalize_then_sum". lengths (N,): completion lengths, for the estimators that weigh by them."""
    x = advantages.AdvantageInputs(rewards, group_size, lengths, cfg.scale_rewards, cfg.std_type, cfg.pass_k)
    gdpo = cfg.multi_objective_aggregation == "normalize_then_sum"
    return advantages.compute_advantages(x, cfg.advantage_estimator, reward_weights=reward_weights,
                                         rewards_per_func=rewards_per_func if gdpo else None)


def sample_round(cfg, engine, prompt_rows: list[dict], reward_funcs: list, reward_weights: list[float], max_len: int,
                 policy=None, ref_model=None) -> dict:
    """Sample G completions for each prompt row, score them, and compute their advantages: a batch (above).

    policy, ref_model: only for kl_in_reward, which subtracts beta * KL(policy || ref) from each reward.
    With num_remains_in_group (GFPO), only the kept k of each group's G completions are returned."""
    G = cfg.num_generations
    roll = engine.generate([r["prompt"] for r in prompt_rows], num_generations=G, max_completion_length=max_len,
                           temperature=cfg.temperature, top_p=cfg.top_p)
    rows = [r for r in prompt_rows for _ in range(G)]  # one dataset row per completion, grouped like the rollout

    # Score: every reward function gets TRL's arguments — prompts, completions, and every dataset column.
    prompts = [r["prompt"] for r in rows]  # strings, or lists of chat messages
    columns = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"}
    columns["completion_ids"] = [ids[m.bool()].tolist() for ids, m in zip(roll.completion_ids, roll.completion_mask)]
    rewards_per_func, unscorable = score_completions(reward_funcs, prompts,
                                                     completions_for_rewards(prompts, roll.completions), columns)
    rewards = combine_rewards(rewards_per_func, unscorable, reward_weights)  # (N,), NaN = unscorable
    if cfg.kl_in_reward and cfg.beta > 0:
        with torch.no_grad():
            ids = (roll.prompt_ids, roll.prompt_mask, roll.completion_ids, roll.completion_mask)
            logp, _ = completion_logprobs(policy, *ids, temperature=cfg.temperature)
            ref_logp, _ = completion_logprobs(ref_model, *ids, temperature=cfg.temperature)
        rewards = kl_penalized_rewards(rewards, logp.cpu(), ref_logp.cpu(), roll.completion_mask.cpu(), cfg.beta)
    batch = {
        "prompt_ids": roll.prompt_ids, "prompt_mask": roll.prompt_mask,
        "completion_ids": roll.completion_ids, "completion_mask": roll.completion_mask,
        "is_truncated": roll.is_truncated, "sampling_logp": roll.sampling_logp,
        "rewards": rewards, "rewards_per_func": rewards_per_func, "completions": roll.completions, "rows": rows,
    }
    if cfg.num_remains_in_group:  # GFPO: train on the k shortest (or most reward per token) of each group
        lengths = roll.completion_mask.sum(-1).cpu()
        batch = _select(batch, gfpo_keep(rewards, lengths, G, cfg.num_remains_in_group, cfg.gfpo_filter))
        G = cfg.num_remains_in_group

    # Advantages need the group's rewards (always on this rank) or, for scale_rewards="batch", the whole batch's:
    # with several processes, gather every rank's rewards, then keep this rank's share.
    lengths = batch["completion_mask"].sum(-1).cpu()  # (N,), for the estimators that weigh by length
    batch_rewards, batch_lengths, batch_per_func = (torch.cat(distributed.gather_objects(x))  # (N * W, ...)
                                                    for x in (batch["rewards"], lengths, batch["rewards_per_func"]))
    adv, zero_std = compute_advantages(batch_rewards, cfg, G, batch_lengths, batch_per_func, reward_weights)
    N = len(batch["rows"])
    share = slice(distributed.rank() * N, (distributed.rank() + 1) * N)
    batch["adv"], batch["zero_std"] = adv[share], zero_std[share]
    return batch


def collect_batch(cfg, engine, sampler: PromptSampler, reward_funcs: list, reward_weights: list[float], max_len: int,
                  policy=None, ref_model=None) -> dict:
    """Steps 1-3 of the loop: a batch (above) of this process's generation_batch_size / W completions.

    With dynamic_sampling (DAPO, Yu et al. 2025, sec. 3.2), groups whose rewards are all equal (advantage 0:
    nothing to learn) are dropped and more prompts are sampled until the batch is full, for at most
    max_dynamic_sampling_rounds rounds; the batch may then hold fewer groups. If no round found a single
    useful group, the last round is kept whole (every advantage 0)."""
    num_prompts = cfg.generation_batch_size // cfg.num_generations // distributed.world_size()
    sample = lambda: sample_round(cfg, engine, sampler.take(num_prompts), reward_funcs, reward_weights,  # noqa: E731
                                  max_len, policy, ref_model)
    batch = sample()
    zero_std_sampled = [batch["zero_std"]]
    if cfg.dynamic_sampling:
        batch, zero_std_sampled = _dynamic_sampling(batch, sample, cfg.max_dynamic_sampling_rounds,
                                                    pad_id=getattr(engine.tokenizer, "pad_token_id", None) or 0)
    # The logged zero-std fraction is of what was *sampled*, so that dynamic sampling does not hide it.
    batch["zero_std_sampled"] = torch.cat(zero_std_sampled)
    batch["sampling_rounds"] = len(zero_std_sampled)
    _warn_if_nothing_to_learn(batch, max_len)
    return batch


def _dynamic_sampling(first: dict, sample, max_rounds: int, pad_id: int) -> tuple[dict, list[torch.Tensor]]:
    """DAPO's loop over rounds: keep the groups of each round whose rewards differ, until there are as many
    completions as one round has. Returns the batch (trimmed to that size) and each round's zero_std."""
    size = len(first["rows"])
    kept, zero_std_sampled, part = [_select(first, ~first["zero_std"])], [first["zero_std"]], first
    while sum(len(p["rows"]) for p in kept) < size and len(zero_std_sampled) < max_rounds:
        part = sample()
        zero_std_sampled.append(part["zero_std"])
        kept.append(_select(part, ~part["zero_std"]))
    kept = [p for p in kept if p["rows"]]
    if not kept:  # no round had a group to learn from: keep the last round as it is
        kept = [part]
    return _concat(kept, pad_id, size), zero_std_sampled


# Per-completion tensors that are padded, with their pad value and side: prompts on the left, completions right.
_PADDED = {"prompt_ids": "left", "prompt_mask": "left", "completion_ids": "right", "completion_mask": "right",
           "sampling_logp": "right"}


def _select(batch: dict, keep: torch.Tensor) -> dict:
    """The rows of a batch where keep (N,) is True."""
    idx = keep.nonzero().squeeze(1)
    return {k: None if v is None else [v[i] for i in idx] if isinstance(v, list) else v[idx] for k, v in batch.items()}


def _concat(parts: list[dict], pad_id: int, size: int) -> dict:
    """Batches stacked row-wise (padded to the widest), cut to the first `size` rows (whole groups)."""
    out = {}
    for key, first in parts[0].items():
        values = [p[key] for p in parts]
        if first is None or any(v is None for v in values):
            out[key] = None
        elif isinstance(first, list):
            out[key] = sum(values, [])[:size]
        elif key in _PADDED:
            width = max(v.shape[1] for v in values)
            value = pad_id if key.endswith("_ids") else 0
            pad = lambda v: (width - v.shape[1], 0) if _PADDED[key] == "left" else (0, width - v.shape[1])  # noqa: E731
            out[key] = torch.cat([F.pad(v, pad(v), value=value) for v in values])[:size]
        else:
            out[key] = torch.cat(values)[:size]
    return out


def _warn_if_nothing_to_learn(batch: dict, max_len: int) -> None:
    """Python's warnings say each of these once per run (same words every time)."""
    if batch["is_truncated"].float().mean() > 0.5:  # the classic trap: the answer never fits, every reward is 0
        warnings.warn(f"over half of a batch's completions reached max_completion_length={max_len} without an eos; "
                      f"cut-off answers usually score 0 and teach nothing: raise max_completion_length", stacklevel=3)
    if batch["rewards"].isnan().all():
        warnings.warn("a step had nothing to learn from: every reward of its batch was None or NaN (do the reward "
                      "functions apply to this task?); its loss is 0 and metrics.jsonl logs its reward as null",
                      stacklevel=3)
