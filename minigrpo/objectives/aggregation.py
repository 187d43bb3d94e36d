"""How per-token losses become one number: the aggregations, by name, that loss types declare, and the share of
the mini-batch's loss that one micro-batch on one of W processes computes.

    name            formula                                   micro-batch share     loss types
    -------------   ---------------------------------------   -------------------   ----------
    sequence_mean   1/B sum_i 1/|o_i| sum_t l_{i,t}           rows                  grpo, sapo, gmpo, ...
    token_mean      sum_{i,t} l_{i,t} / sum_i |o_i|           tokens                bnpo
    token_sum       sum_{i,t} l_{i,t} / num_items_in_batch    none                  dapo, cispo, ...
    constant        sum_{i,t} l_{i,t} / (B * L_max)           rows                  dr_grpo
    sequence_sum    1/B sum_i sum_t l_{i,t}                   rows                  luspo

One optimizer step sees a mini-batch; gradient accumulation computes it in micro-batches and W processes each
compute 1/W of it (their gradients averaged). `micro_batch_share` is the factor that makes a micro-batch's loss
its part of the mini-batch's (verl's agg_loss takes dp_size and the batch's token count for the same reason):
"rows" |micro| / |mini| for means over completions, "tokens" tokens(micro) * W / tokens(mini, all processes) for a
mean over the batch's tokens, "none" (1) where the normaliser already is the mini-batch's (num_items_in_batch).
Summed over micro-batches and averaged over processes, the shares give the mini-batch's loss, and its gradient.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .common import sequence_mean

__all__ = ["Aggregation", "AGGREGATIONS", "aggregate", "micro_batch_share", "grpo_aggregate", "bnpo_aggregate",
           "dapo_aggregate", "dr_grpo_aggregate", "luspo_aggregate"]


def grpo_aggregate(per_token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GRPO: mean over each sequence's tokens, then mean over sequences — 1/G sum_i 1/|o_i| sum_t.

    The 1/|o_i| gives each token of a short answer more weight than a token of a long one: for a wrong
    (A < 0) answer, making it longer dilutes its penalty. Dr. GRPO calls this the length bias.
    """
    return sequence_mean(per_token_loss, mask).mean()


def bnpo_aggregate(per_token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """BNPO (TRL's "bnpo"): one mean over all tokens of the (local) batch, sum_{i,t} l_{i,t} / sum_i |o_i|.

    Same formula as DAPO's token-level mean; TRL distinguishes them only under gradient accumulation,
    where bnpo normalises each micro-batch by its own token count.
    """
    return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)


def dapo_aggregate(
    per_token_loss: torch.Tensor, mask: torch.Tensor, num_items_in_batch: float | torch.Tensor | None = None
) -> torch.Tensor:
    """DAPO's token-level loss (eq. 10): sum of masked per-token losses / number of completion tokens.

    num_items_in_batch: the token count to divide by. Defaults to this batch's; when one batch is split into
    micro-batches whose gradients are accumulated, pass the whole batch's count so the normaliser does not
    change with the micro-batch size.
    """
    n = mask.sum() if num_items_in_batch is None else torch.as_tensor(num_items_in_batch, dtype=mask.dtype)
    return (per_token_loss * mask).sum() / n.clamp(min=1.0)


def dr_grpo_aggregate(per_token_loss: torch.Tensor, mask: torch.Tensor, max_completion_length: int) -> torch.Tensor:
    """Dr. GRPO: sum of masked per-token losses / (B * L_max). per_token_loss, mask: (B, T); L_max >= T."""
    if max_completion_length is None:
        raise ValueError("loss_type='dr_grpo' needs max_completion_length (its constant normaliser)")
    return (per_token_loss * mask).sum() / (mask.shape[0] * max_completion_length)


def luspo_aggregate(per_token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """LUSPO: sum_t over each completion's tokens, mean over completions: 1/G sum_i sum_t l_{i,t}.

    per_token_loss: (B, T), or (B, 1) with one value per completion (then the sum is |o_i| times it); mask (B, T).
    """
    return (per_token_loss * mask).sum(-1).mean()


@dataclass(frozen=True)
class Aggregation:
    """fn(per_token_loss, mask, num_items_in_batch, max_completion_length) -> scalar; micro_batch_share above."""

    fn: Callable
    micro_batch_share: str


AGGREGATIONS = {
    "sequence_mean": Aggregation(lambda loss, mask, n, L: grpo_aggregate(loss, mask), "rows"),
    "token_mean": Aggregation(lambda loss, mask, n, L: bnpo_aggregate(loss, mask), "tokens"),
    "token_sum": Aggregation(lambda loss, mask, n, L: dapo_aggregate(loss, mask, n), "none"),
    "constant": Aggregation(lambda loss, mask, n, L: dr_grpo_aggregate(loss, mask, L), "rows"),
    "sequence_sum": Aggregation(lambda loss, mask, n, L: luspo_aggregate(loss, mask), "rows"),
}


def aggregate(aggregation: str, per_token_loss: torch.Tensor, mask: torch.Tensor,
              num_items_in_batch: float | torch.Tensor | None = None, max_completion_length: int | None = None,
              dp_size: int = 1) -> torch.Tensor:
    """The loss of this process's batch by the named aggregation. num_items_in_batch counts the tokens of all
    dp_size processes: each divides by its share of them, so that the processes' averaged gradients are the global
    batch's (their engines average gradients; they do not know a loss's normaliser)."""
    if num_items_in_batch is not None:
        num_items_in_batch = num_items_in_batch / dp_size
    return AGGREGATIONS[aggregation].fn(per_token_loss, mask, num_items_in_batch, max_completion_length)


def micro_batch_share(aggregation: str, mask: torch.Tensor, mini_batch_rows: int,
                      mini_batch_tokens: torch.Tensor | float, dp_size: int = 1) -> torch.Tensor | float:
    """The factor that makes this micro-batch's loss its part of the mini-batch's (the table above).

    mask: (B, T) the micro-batch's loss mask, B of this process's mini_batch_rows; mini_batch_tokens: the
    mini-batch's loss tokens summed over all dp_size processes. A whole mini-batch in one process gives 1.
    """
    share = AGGREGATIONS[aggregation].micro_batch_share
    if share == "rows":
        return mask.shape[0] / mini_batch_rows
    if share == "tokens":
        return mask.sum() * dp_size / torch.as_tensor(mini_batch_tokens).clamp(min=1)
    return 1.0
