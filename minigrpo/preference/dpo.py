"""DPO's loss: the Bradley–Terry loss (bradley_terry.py) on a reward the policy itself defines.

RLHF maximises E[r(x, y)] - beta KL(pi || pi_ref). Its optimum is pi*(y | x) = pi_ref(y | x) exp(r(x, y) / beta) / Z(x)
(Rafailov et al. 2023, "Direct Preference Optimization", eq. 4), so any policy defines the reward it is optimal for,
up to a term of x alone:

    r_pi(x, y) = beta log pi(y | x) / pi_ref(y | x)          the implicit reward (beta log Z(x) cancels in a pair)

Put r_pi into the Bradley–Terry loss and the reward model disappears: the policy is trained on the pairs directly,

    L_DPO = - mean_pairs log sigmoid( beta [log pi(y_c | x) - log pi_ref(y_c | x)]
                                     - beta [log pi(y_r | x) - log pi_ref(y_r | x)] )          (DPO, eq. 7)

where log pi(y | x) is the completion's summed token log-probs (not their mean). Offline: the pairs are fixed, nothing
is sampled, and the policy never sees what its own completions would score — the contrast with GRPO, which samples
from the policy at every step (notebook 10 puts them side by side on the same pairs).

Worked example, as the test computes it: log pi = (-5, -6) for (chosen, rejected), log pi_ref = (-5.5, -5.5),
beta = 0.1: implicit rewards 0.1 * 0.5 = 0.05 and 0.1 * -0.5 = -0.05, so L = log(1 + e^-0.1) = 0.64440 and
dL/d log pi(y_c) = -beta sigmoid(-0.1) = -0.04750 = -dL/d log pi(y_r).

TRL 1.16's DPOTrainer (loss_type "sigmoid", its default) computes the same number (tests/test_preference.py).
"""

import torch
import torch.nn.functional as F

__all__ = ["dpo_loss"]


def dpo_loss(logp_chosen: torch.Tensor, logp_rejected: torch.Tensor, ref_logp_chosen: torch.Tensor,
             ref_logp_rejected: torch.Tensor, beta: float = 0.1) -> tuple[torch.Tensor, dict]:
    """L_DPO above. Each argument (P,): a completion's log-probability (summed over its tokens) under the policy or the
    frozen reference. Returns (loss, stats) with TRL's names: rewards/chosen, rewards/rejected (the implicit
    rewards' means), rewards/accuracies (pairs whose chosen has the higher implicit reward), rewards/margins."""
    chosen_rewards = beta * (logp_chosen - ref_logp_chosen)  # (P,) r_pi(x, y_c)
    rejected_rewards = beta * (logp_rejected - ref_logp_rejected)  # (P,) r_pi(x, y_r)
    loss = -F.logsigmoid(chosen_rewards - rejected_rewards).mean()
    with torch.no_grad():
        stats = {"rewards/chosen": chosen_rewards.mean().item(), "rewards/rejected": rejected_rewards.mean().item(),
                 "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean().item(),
                 "rewards/margins": (chosen_rewards - rejected_rewards).mean().item()}
    return loss, stats
