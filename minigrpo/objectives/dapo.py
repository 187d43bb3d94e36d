"""DAPO — "An Open-Source LLM Reinforcement Learning System at Scale" (Yu et al. 2025).

DAPO changes four things; each lives where it acts:
  1. Clip-Higher: a larger upper clip, eps_high = 0.28 > eps_low = 0.2, so low-probability tokens can grow
     and entropy does not collapse — `epsilon_high` in `clipped_surrogate` (grpo.py).
  2. Dynamic sampling: drop groups whose rewards are all equal (zero advantage, zero gradient) and sample
     more prompts until the batch is full — the trainer's `dynamic_sampling` option.
  3. Token-level policy-gradient loss (eq. 10), here: every token of the batch weighs the same,

        L = 1 / (sum_i |o_i|) * sum_i sum_t l_{i,t}

  4. Overlong reward shaping — `overlong_penalty` in rewards.py.
"""

from .grpo import ppo_clip
from .registry import register_loss


register_loss("dapo", aggregation="token_sum", takes_delta=True)(ppo_clip)  # Clip-Higher: set epsilon_high=0.28
