"""One training batch: prompts in, scored completions with their advantages out — steps 1 to 3 of the loop.

    sampler.take(prompts)              which prompts, in a seeded order                 PromptSampler
    sample_round                       G completions per prompt (the engine, or the multi-turn tool loop),
                                       every reward function on each (rewards.py), advantages (advantages.py)
    collect_batch                      one round; with dynamic_sampling (DAPO), more rounds until the batch
                                       holds enough groups whose rewards differ

A `Batch` holds N = generation_batch_size / W completions grouped by prompt (rows i*G .. i*G+G-1 share prompt i);
it moves to a device, selects rows and concatenates as one object (fields below). The trainer adds what it
computes before the update: loss_mask, old_logp, ref_logp, is_weight.
"""

import dataclasses
import random
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from . import advantages, distributed
from .advantages import gfpo_keep, kl_penalized_rewards
from .engines import sampling_options
from .logprobs import completion_logprobs
from .prompts import completions_for_rewards
from .rewards import combine_rewards, score_completions

__all__ = ["Batch", "ToolSetup", "PromptSampler", "collect_batch", "sample_round"]


@dataclass
class Batch:
    """N completions and what the loss needs of them. Tensors are per completion, grouped by prompt."""

    prompt_ids: torch.Tensor  # (N, P) left-padded
    prompt_mask: torch.Tensor  # (N, P) 1 on prompt tokens
    completion_ids: torch.Tensor  # (N, T) right-padded
    completion_mask: torch.Tensor  # (N, T) 1 on every completion token, tool output included
    is_truncated: torch.Tensor  # (N,) no eos within max_completion_length
    rewards: torch.Tensor  # (N,) NaN = no reward function could score it
    rewards_per_func: torch.Tensor  # (N, F)
    completions: list  # the completion texts (tool output included)
    rows: list  # each completion's dataset row
    tool_mask: torch.Tensor | None = None  # (N, T) 1 = sampled by the policy, 0 = written by a tool; None: no tools
    sampling_logp: torch.Tensor | None = None  # (N, T) the engine's log-probs (vLLM), or None
    adv: torch.Tensor | None = None  # (N,) advantage
    zero_std: torch.Tensor | None = None  # (N,) True where the group's rewards are all equal
    tool_counts: dict = field(default_factory=dict)  # (N,) tensors: calls, failed, turns (with tools)
    messages: list | None = None  # with tools: each completion as TRL's messages (what reward functions get)
    # the trainer's, before the update
    loss_mask: torch.Tensor | None = None  # (N, T) the tokens the loss acts on
    old_logp: torch.Tensor | None = None  # (N, T) log pi_old; None: on-policy, the ratio is 1
    ref_logp: torch.Tensor | None = None  # (N, T) the reference's
    is_weight: torch.Tensor | None = None  # (N, T) or (N, 1) the vLLM sampler correction
    # of the whole step
    zero_std_sampled: torch.Tensor | None = None  # zero_std of every group sampled, kept or not
    sampling_rounds: int = 1

    # Per-completion tensors that are padded when batches of different widths are stacked: side of the padding.
    PADDED = {"prompt_ids": "left", "prompt_mask": "left", "completion_ids": "right", "completion_mask": "right",
              "tool_mask": "right", "sampling_logp": "right", "loss_mask": "right", "old_logp": "right",
              "ref_logp": "right"}
    PER_STEP = ("zero_std_sampled", "sampling_rounds")

    @classmethod
    def of_completions(cls, prompt_ids, prompt_mask, completion_ids, completion_mask, adv, **fields) -> "Batch":
        """A batch of given completions and advantages alone (no rewards or texts): what `trainer.grpo_update`
        needs, for benchmarks, memory measurements and tests. loss_mask defaults to the policy's tokens."""
        N = len(adv)
        batch = cls(prompt_ids, prompt_mask, completion_ids, completion_mask, is_truncated=torch.zeros(N, dtype=torch.bool),
                    rewards=torch.zeros(N), rewards_per_func=torch.zeros(N, 0), completions=[""] * N, rows=[{}] * N,
                    adv=adv, **fields)
        if batch.loss_mask is None:
            batch.loss_mask = batch.policy_mask
        return batch

    @property
    def policy_mask(self) -> torch.Tensor:
        """(N, T) 1 on the tokens the policy sampled: completion_mask * tool_mask. Every quantity about the policy's
        actions (loss, KL, entropy, clip ratios, lengths) is taken over it; tool tokens stay in the context."""
        return self.completion_mask if self.tool_mask is None else self.completion_mask * self.tool_mask

    def __len__(self) -> int:
        return len(self.rows)

    def _per_completion(self):
        return ((f.name, getattr(self, f.name)) for f in dataclasses.fields(self) if f.name not in self.PER_STEP)

    def to(self, device) -> "Batch":
        """A copy with every tensor on device."""
        moved = {name: value.to(device) if isinstance(value, torch.Tensor) else value
                 for name, value in self._per_completion()}
        moved["tool_counts"] = {k: v.to(device) for k, v in self.tool_counts.items()}
        return dataclasses.replace(self, **moved)

    def select(self, rows: torch.Tensor) -> "Batch":
        """The completions at rows (indices (n,), or a bool mask (N,))."""
        idx = rows.nonzero().squeeze(1) if rows.dtype == torch.bool else rows
        pick = lambda v: None if v is None else [v[i] for i in idx] if isinstance(v, list) else v[idx]  # noqa: E731
        picked = {name: pick(value) for name, value in self._per_completion() if name != "tool_counts"}
        return dataclasses.replace(self, **picked, tool_counts={k: v[idx] for k, v in self.tool_counts.items()})

    @classmethod
    def concat(cls, parts: list["Batch"], pad_id: int, size: int) -> "Batch":
        """Batches stacked row-wise (padded to the widest), cut to the first `size` rows (whole groups)."""
        out = {}
        for f in dataclasses.fields(cls):
            if f.name in cls.PER_STEP:
                continue
            values = [getattr(p, f.name) for p in parts]
            if f.name == "tool_counts":
                out[f.name] = {k: torch.cat([v[k] for v in values])[:size] for k in values[0]}
            elif any(v is None for v in values):
                out[f.name] = None
            elif isinstance(values[0], list):
                out[f.name] = sum(values, [])[:size]
            elif f.name in cls.PADDED:
                out[f.name] = _pad_cat(values, cls.PADDED[f.name], pad_id if f.name.endswith("_ids") else
                                       1 if f.name == "tool_mask" else 0)[:size]
            else:
                out[f.name] = torch.cat(values)[:size]
        return cls(**out)


def _pad_cat(values: list[torch.Tensor], side: str, value) -> torch.Tensor:
    width = max(v.shape[1] for v in values)
    pad = lambda v: (width - v.shape[1], 0) if side == "left" else (0, width - v.shape[1])  # noqa: E731
    return torch.cat([F.pad(v, pad(v), value=value) for v in values])


@dataclass
class ToolSetup:
    """What the multi-turn rollout needs for a run with tools (tools/loop.py), made once by the trainer."""

    tools: list  # plain typed functions
    worker: object  # tools.ToolWorker running them, kept for the run
    eos_ids: list[int]
    max_tool_calling_iterations: int | None = None
    tool_timeout: float = 10.0
    max_tool_output_chars: int = 4000
    environments: object = None  # tools.EnvironmentPool (environment_factory): one environment per completion

    def sample(self, engine, rows: list[dict], *, num_generations: int, max_completion_length: int, **sampling):
        """The multi-turn rollout of these dataset rows' prompts with these tools (tools/loop.py), each completion
        with its own environment reset from its row when there is an environment_factory; sampling: temperature,
        top_p, top_k, do_sample, chat_template_kwargs."""
        from .tools import sample_with_tools

        prompts, environments = [row["prompt"] for row in rows], None
        if self.environments is not None:
            environments, prompts = self.environments.reset_groups(rows, num_generations)
        return sample_with_tools(engine, engine.tokenizer, prompts, tools=self.tools, environments=environments,
                                 num_generations=num_generations,
                                 max_completion_length=max_completion_length,
                                 max_tool_calling_iterations=self.max_tool_calling_iterations, eos_ids=self.eos_ids,
                                 tool_timeout=self.tool_timeout, max_tool_output_chars=self.max_tool_output_chars,
                                 worker=self.worker, **sampling)


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


def sample_round(cfg, engine, prompt_rows: list[dict], reward_funcs: list, reward_weights: list[float], max_len: int,
                 policy=None, ref_model=None, tools: ToolSetup | None = None) -> Batch:
    """Sample G completions for each prompt row, score them, and compute their advantages: a Batch.

    policy, ref_model: only for kl_in_reward, which subtracts beta * KL(policy || ref) from each reward.
    tools: the multi-turn rollout (tools/loop.py) instead of single-turn sampling.
    With num_remains_in_group (GFPO), only the kept k of each group's G completions are returned."""
    G = cfg.num_generations
    roll = _sample(cfg, engine, prompt_rows, max_len, tools)
    rows = [r for r in prompt_rows for _ in range(G)]  # one dataset row per completion, grouped like the rollout

    # Score: every reward function gets TRL's arguments — prompts, completions, and every dataset column.
    prompts = [r["prompt"] for r in rows]  # strings, or lists of chat messages
    columns = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"}
    columns["completion_ids"] = [ids[m.bool()].tolist() for ids, m in zip(roll.completion_ids, roll.completion_mask)]
    if tools and roll.environments is not None:  # TRL's name: reward functions read each completion's environment
        columns["environments"] = roll.environments
    completions = roll.messages if tools else completions_for_rewards(prompts, roll.completions)
    rewards_per_func, unscorable = score_completions(reward_funcs, prompts, completions, columns)
    rewards = combine_rewards(rewards_per_func, unscorable, reward_weights)  # (N,), NaN = unscorable
    batch = Batch(roll.prompt_ids, roll.prompt_mask, roll.completion_ids, roll.completion_mask, roll.is_truncated,
                  rewards, rewards_per_func, roll.completions, rows, sampling_logp=roll.sampling_logp)
    if tools:
        batch.tool_mask, batch.messages = roll.tool_mask, roll.messages
        batch.tool_counts = {"calls": roll.num_tool_calls, "failed": roll.num_failed_calls,
                             "turns": roll.num_tool_turns}
    if cfg.kl_in_reward and cfg.beta > 0:
        with torch.no_grad():
            ids = (batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
            options = dict(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                           share_prompts=cfg.shared_prefix)
            logp, _ = completion_logprobs(policy, *ids, **options)
            ref_logp, _ = completion_logprobs(ref_model, *ids, **options)
        batch.rewards = kl_penalized_rewards(rewards, logp.cpu(), ref_logp.cpu(), batch.policy_mask.cpu(), cfg.beta)
    if cfg.num_remains_in_group:  # GFPO: train on the k shortest (or most reward per token) of each group
        lengths = batch.policy_mask.sum(-1).cpu()
        batch = batch.select(gfpo_keep(batch.rewards, lengths, G, cfg.num_remains_in_group, cfg.gfpo_filter))
        G = cfg.num_remains_in_group

    # Advantages need the group's rewards (always on this rank) or, for scale_rewards="batch", the whole batch's:
    # with several processes, gather every rank's rewards, then keep this rank's share.
    lengths = batch.policy_mask.sum(-1).cpu()  # (N,) the policy's tokens, for the estimators that weigh by length
    batch_rewards, batch_lengths, batch_per_func = (torch.cat(distributed.gather_objects(x))  # (N * W, ...)
                                                    for x in (batch.rewards, lengths, batch.rewards_per_func))
    x = advantages.AdvantageInputs(batch_rewards, G, batch_lengths, cfg.scale_rewards, cfg.std_type, cfg.pass_k)
    gdpo = cfg.multi_objective_aggregation == "normalize_then_sum"  # GDPO: each reward function normalised alone
    adv, zero_std = advantages.compute_advantages(x, cfg.advantage_estimator, reward_weights=reward_weights,
                                                  rewards_per_func=batch_per_func if gdpo else None)
    share = slice(distributed.rank() * len(batch), (distributed.rank() + 1) * len(batch))
    batch.adv, batch.zero_std = adv[share], zero_std[share]
    return batch


def _sample(cfg, engine, rows: list[dict], max_len: int, tools: ToolSetup | None):
    """G completions per row's prompt: the engine's single-turn sampling, or the multi-turn rollout with tools."""
    sampling = sampling_options(cfg.temperature, cfg.top_p, cfg.top_k)
    if tools is None:
        return engine.generate([row["prompt"] for row in rows], num_generations=cfg.num_generations,
                               max_completion_length=max_len, **sampling)
    return tools.sample(engine, rows, num_generations=cfg.num_generations, max_completion_length=max_len,
                        chat_template_kwargs=cfg.chat_template_kwargs, **sampling)


def collect_batch(cfg, engine, sampler: PromptSampler, reward_funcs: list, reward_weights: list[float], max_len: int,
                  policy=None, ref_model=None, tools: ToolSetup | None = None) -> Batch:
    """Steps 1-3 of the loop: a Batch of this process's generation_batch_size / W completions.

    With dynamic_sampling (DAPO, Yu et al. 2025, sec. 3.2), groups whose rewards are all equal (advantage 0:
    nothing to learn) are dropped and more prompts are sampled until the batch is full, for at most
    max_dynamic_sampling_rounds rounds; the batch may then hold fewer groups. If no round found a single
    useful group, the last round is kept whole (every advantage 0)."""
    num_prompts = cfg.generation_batch_size // cfg.num_generations // distributed.world_size()
    sample = lambda: sample_round(cfg, engine, sampler.take(num_prompts), reward_funcs, reward_weights,  # noqa: E731
                                  max_len, policy, ref_model, tools)
    batch = sample()
    zero_std_sampled = [batch.zero_std]
    if cfg.dynamic_sampling:
        batch, zero_std_sampled = _dynamic_sampling(batch, sample, cfg.max_dynamic_sampling_rounds,
                                                    pad_id=getattr(engine.tokenizer, "pad_token_id", None) or 0)
    # The logged zero-std fraction is of what was *sampled*, so that dynamic sampling does not hide it.
    batch.zero_std_sampled = torch.cat(zero_std_sampled)
    batch.sampling_rounds = len(zero_std_sampled)
    _warn_if_nothing_to_learn(batch, max_len)
    return batch


def _dynamic_sampling(first: Batch, sample, max_rounds: int, pad_id: int) -> tuple[Batch, list[torch.Tensor]]:
    """DAPO's loop over rounds: keep the groups of each round whose rewards differ, until there are as many
    completions as one round has. Returns the batch (trimmed to that size) and each round's zero_std."""
    size = len(first)
    kept, zero_std_sampled, part = [first.select(~first.zero_std)], [first.zero_std], first
    while sum(len(p) for p in kept) < size and len(zero_std_sampled) < max_rounds:
        part = sample()
        zero_std_sampled.append(part.zero_std)
        kept.append(part.select(~part.zero_std))
    kept = [p for p in kept if len(p)]
    if not kept:  # no round had a group to learn from: keep the last round as it is
        kept = [part]
    return Batch.concat(kept, pad_id, size), zero_std_sampled


def _warn_if_nothing_to_learn(batch: Batch, max_len: int) -> None:
    """Python's warnings say each of these once per run (same words every time)."""
    if batch.is_truncated.float().mean() > 0.5:  # the classic trap: the answer never fits, every reward is 0
        warnings.warn(f"over half of a batch's completions reached max_completion_length={max_len} without an eos; "
                      f"cut-off answers usually score 0 and teach nothing: raise max_completion_length", stacklevel=3)
    if batch.rewards.isnan().all():
        warnings.warn("a step had nothing to learn from: every reward of its batch was None or NaN (do the reward "
                      "functions apply to this task?); its loss is 0 and metrics.jsonl logs its reward as null",
                      stacklevel=3)
