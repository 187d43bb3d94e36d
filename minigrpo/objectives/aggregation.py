"""How per-token losses become one number: the aggregations, by name, that loss types declare.

    name            formula                                   micro-batch share     defined in
    -------------   ---------------------------------------   -------------------   ----------
    sequence_mean   1/B sum_i 1/|o_i| sum_t l_{i,t}           rows                  grpo.py (GRPO)
    token_mean      sum_{i,t} l_{i,t} / sum_i |o_i|           tokens                grpo.py (BNPO)
    token_sum       sum_{i,t} l_{i,t} / num_items_in_batch    none                  dapo.py (DAPO)
    constant        sum_{i,t} l_{i,t} / (B * L_max)           rows                  dr_grpo.py (Dr. GRPO)
    sequence_sum    1/B sum_i sum_t l_{i,t}                   rows                  luspo.py (LUSPO)

The share is what a micro-batch's loss counts for under gradient accumulation (trainer.loss_share): "rows"
|micro| / |mini| for means over completions, "tokens" tokens(micro) / tokens(mini) for a mean over the batch's
tokens, "none" (1) where the normaliser already is the mini-batch's (num_items_in_batch).
"""

from dataclasses import dataclass
from collections.abc import Callable

from .dapo import dapo_aggregate
from .dr_grpo import dr_grpo_aggregate
from .grpo import bnpo_aggregate, grpo_aggregate
from .luspo import luspo_aggregate

__all__ = ["Aggregation", "AGGREGATIONS"]


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
