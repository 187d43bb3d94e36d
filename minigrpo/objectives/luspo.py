"""LUSPO — "Length-Unbiased Sequence Policy Optimization" (Liu et al. 2026, Meituan, arXiv 2602.05261).

GSPO (gspo.py) gives every completion one clipped term, -min(s_i A_i, clip(s_i) A_i), averaged over the G
completions. The sequence ratio s_i is a geometric mean over |o_i| tokens, so each token of a long completion
gets 1/|o_i| of the gradient: long completions learn less per token than short ones, and under GSPO the
response length collapses (the paper's analysis). LUSPO multiplies each completion's term by its length:

    L = -1/G sum_i |o_i| * min( s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i )

so every token again carries a full-size gradient, s_i * A_i * grad log pi(o_{i,t}), as in a token-sum loss.

The surrogate is GRPO's `clipped_surrogate`; only the aggregation is new. As in TRL 1.16 (`loss_type="luspo"`):
the per-token loss is summed over each completion's tokens and averaged over completions, which with the
sequence ratio (B, 1) is exactly |o_i| times GSPO's term. The paper uses importance_sampling_level="sequence";
TRL (and minigrpo) also accept "token", where the same aggregation is a per-completion token sum.
"""

from .grpo import ppo_clip
from .registry import register_loss


register_loss("luspo", aggregation="sequence_sum", takes_delta=True)(ppo_clip)  # the paper: level "sequence"
