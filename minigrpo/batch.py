"""One training batch as one typed object, and the prompts' seeded order.

A `Batch` holds N = generation_batch_size / W completions grouped by prompt (rows i*G .. i*G+G-1 share prompt i);
it moves to a device, selects rows and concatenates as one object (fields below). The trainer adds what it
computes before the update: loss_mask, old_logp, ref_logp, is_weight. collect.py fills it (steps 1-3 of the loop).
"""

import dataclasses
import random
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

__all__ = ["Batch", "PromptSampler"]


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
    adv: torch.Tensor | None = None  # (N,) advantage, or (N, T) per token (process, optimal token baseline)
    step_rewards: torch.Tensor | None = None  # (N, K) process supervision: each step's reward, NaN past a row's steps
    step_end: torch.Tensor | None = None  # (N, K) the token index where each step ends (step_rewards.py)
    zero_std: torch.Tensor | None = None  # (N,) True where the group's rewards are all equal
    tool_counts: dict = field(default_factory=dict)  # (N,) tensors: calls, failed, turns (with tools)
    messages: list | None = None  # with tools: each completion as TRL's messages (what reward functions get)
    logged_columns: dict = field(default_factory=dict)  # {column: N values} reward functions' log_extra
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
              "ref_logp": "right", "adv": "right"}  # adv: when it is per token
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

    @property
    def completion_adv(self) -> torch.Tensor:
        """(N,) one advantage per completion, what the logs show: adv, or a per-token adv's mean over the policy's
        tokens."""
        if self.adv.dim() == 1:
            return self.adv
        mask = self.policy_mask.to(self.adv.device, self.adv.dtype)
        return (self.adv * mask).sum(-1) / mask.sum(-1).clamp(min=1)

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
        picked = {name: pick(value) for name, value in self._per_completion()
                  if name not in ("tool_counts", "logged_columns")}
        return dataclasses.replace(self, **picked, tool_counts={k: v[idx] for k, v in self.tool_counts.items()},
                                   logged_columns={k: pick(v) for k, v in self.logged_columns.items()})

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
            elif f.name == "logged_columns":  # a column some rounds lack: None in their rows
                columns = {k for v in values for k in v}
                out[f.name] = {k: sum((v.get(k, [None] * len(p)) for v, p in zip(values, parts)), [])[:size]
                               for k in sorted(columns)}
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
    if values[0].dim() == 1:  # adv of one number per completion: nothing to pad
        return torch.cat(values)
    width = max(v.shape[1] for v in values)
    pad = lambda v: (width - v.shape[1], 0) if side == "left" else (0, width - v.shape[1])  # noqa: E731
    return torch.cat([F.pad(v, pad(v), value=value) for v in values])


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
