"""The table of loss types: each one declares itself, once, in its own file (verl's `register_policy_loss`).

A loss type is what makes GRPO, DAPO, CISPO, ... differ, and nothing else:

    surrogate      the per-token loss from the ratio and the advantage (`fn`, below)
    aggregation    how per-token losses become one number, by name (aggregation.py's AGGREGATIONS)
    options        its own settings, a dataclass with TRL's / verl's names and defaults, checked in __post_init__
    constraints    which importance-sampling levels it takes, whether it can weight tokens (the vLLM correction),
                   whether `delta` caps its ratio, its default epsilon_high

Everything else reads this table: `policy_loss` (the pipeline in __init__.py), Config's validation, the
micro-batch loss share of gradient accumulation (`micro_batch_share`), the CLI's choices. A loss written outside
the package trains like a built-in one after one call:

    @register_loss("my_loss", aggregation="token_sum")
    def my_loss(x: SurrogateInputs, opts) -> Surrogate:
        return Surrogate(-x.adv * x.ratio)          # a per-token loss, (B, T) or (B, 1)
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .aggregation import AGGREGATIONS

__all__ = ["SurrogateInputs", "Surrogate", "LossType", "LOSSES", "register_loss", "get_loss", "NoOptions"]


@dataclass
class SurrogateInputs:
    """What a surrogate may read. Padding is already 0 in logp and token_log_ratio."""

    ratio: torch.Tensor  # (B, T) per token, or (B, 1) per sequence (GSPO)
    log_ratio: torch.Tensor  # log of ratio, same shape
    token_log_ratio: torch.Tensor  # (B, T) log pi_theta - log pi_old per token, whatever the level
    logp: torch.Tensor  # (B, T) log pi_theta, with gradient
    adv: torch.Tensor  # (B, 1) or (B, T)
    mask: torch.Tensor  # (B, T) float, 1 on the tokens the loss acts on
    epsilon_low: float
    epsilon_high: float
    delta: float | None = None  # cap on the unclipped ratio (two-sided clipping), for losses that take it
    token_weights: torch.Tensor | None = None  # only passed to losses that fold it in themselves (vespo)
    generator: torch.Generator | None = None  # for losses that draw at random (clip_cov)
    old_logp: torch.Tensor | None = None  # (B, T) log pi_old, 0 on padding (DPPO bounds the probability's change)


@dataclass
class Surrogate:
    """A surrogate's output: per-token loss ((B, T), or (B, 1) per sequence), the range its clip diagnostics count
    against (None: it clips nothing, clip ratios log 0, unless its own statistics say what it clipped) and its own
    statistics."""

    per_token_loss: torch.Tensor
    clip_range: tuple[float, float] | None = None
    stats: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class NoOptions:
    """The options of a loss type that has none."""


ALL_LEVELS = ("token", "sequence", "sequence_token")


@dataclass(frozen=True)
class LossType:
    """One entry of the table (module docstring). fn(x: SurrogateInputs, opts) -> Surrogate."""

    name: str
    fn: Callable
    aggregation: str
    options: type = NoOptions
    levels: tuple[str, ...] = ALL_LEVELS  # importance_sampling_level values it accepts
    takes_token_weights: bool = True  # False: refuses token_weights (no per-token loss to weight)
    folds_token_weights: bool = False  # True: fn reads x.token_weights itself; the pipeline does not multiply
    takes_delta: bool = False  # delta (two-sided clipping) caps its ratio: must be > 1 + epsilon_high
    default_delta: float | None = None  # the cap when delta is unset (dppo: 20, its truncated IS weight); None: off
    sequence_advantages_only: bool = False  # True: adv must be (B,), one per completion
    default_epsilon_high: float | None = None  # None: epsilon_high defaults to epsilon

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(self.options))

    def make_options(self, values: dict):
        """The options dataclass from {name: value} (unknown names: ValueError naming them)."""
        unknown = set(values) - set(self.option_names)
        if unknown:
            raise ValueError(f"loss_type {self.name!r} has no option {', '.join(sorted(unknown))}; its options: "
                             f"{', '.join(self.option_names) or 'none'}")
        return self.options(**values)


LOSSES: dict[str, LossType] = {}


def register_loss(name: str, *, aggregation: str, options: type = NoOptions, **constraints) -> Callable:
    """Decorator: add fn as loss type `name` (constraints: the LossType fields above). Re-registering a name
    replaces it (a notebook cell run twice)."""
    def add(fn: Callable) -> Callable:
        LOSSES[name] = LossType(name, fn, aggregation, options, **constraints)
        return fn

    return add


def get_loss(name: str) -> LossType:
    """The entry called name; ValueError naming the registered ones (and a bad aggregation) otherwise."""
    if name not in LOSSES:
        raise ValueError(f"loss_type must be one of {', '.join(LOSSES)}, got {name!r}")
    if LOSSES[name].aggregation not in AGGREGATIONS:
        raise ValueError(f"loss_type {name!r}: aggregation must be one of {', '.join(AGGREGATIONS)}, got "
                         f"{LOSSES[name].aggregation!r}")
    return LOSSES[name]
