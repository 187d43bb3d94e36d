"""Dr. GRPO — "Understanding R1-Zero-Like Training: A Critical Perspective" (Liu et al. 2025, sec. 3.1).

Dr. GRPO removes GRPO's two normalisations that bias optimisation:
  1. the per-sequence 1/|o_i| (length bias: long wrong answers are penalised less per token), replaced by
     a constant — the maximum completion length L_max — so every token weighs the same:

        L = 1/(G * L_max) sum_i sum_t l_{i,t}

  2. the division of the advantage by the group std (question-difficulty bias): A_i = r_i - mean(r),
     which is `group_advantages(..., scale="none")` in advantages.py.
The surrogate itself is GRPO's `clipped_surrogate`.
"""

from .grpo import ppo_clip
from .registry import register_loss


register_loss("dr_grpo", aggregation="constant", takes_delta=True)(ppo_clip)
