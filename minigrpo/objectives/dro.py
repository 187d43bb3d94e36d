"""DRO — Direct Reward Optimization with a quadratic log-ratio penalty, as verl's `dro` loss mode has it
(verl-project/verl pull request 7245, `compute_policy_loss_dro`; Tinker's `dro` loss is the same formula):

    l_t = -( A_t log pi_theta(o_t) - beta/2 (log pi_theta(o_t) - log pi_old(o_t))^2 )

Against GRPO's two lines: no ratio and no clip at all (GPG's plain policy gradient, gpg.py), and in their place a
soft trust region — every token pays beta/2 (log rho)^2 for moving away from pi_old, whatever its advantage.
A hard clip zeroes a token's gradient at the edge of the region; the quadratic pulls it back harder the further it
went, so the update never stops learning from a token and never lets one run away.

Why this shape: it is the policy-gradient form of the squared loss of Direct Reward Optimization (Richemond et al.
2024, arXiv 2405.19107), 1/2 (r - V(x) - beta log pi(y)/pi_ref(y))^2, whose gradient in theta, divided by beta, is
-(r - V) grad log pi + beta log(pi/pi_ref) grad log pi — here per token, with the group's baseline for V (in the
advantage) and pi_old for pi_ref. It is Kimi K2.5's KL term (kimi.py) with tau = beta / 2, and beta times the k2
estimator of KL(pi_theta || pi_old) (kl.py). The penalty acts at tokens whose advantage is 0 too.

verl's option: `dro_beta`, which verl requires (no default; its pull request's example is 0.05, used here).
Aggregated as DAPO (verl's default "token-mean"). Clips nothing.
"""

from dataclasses import dataclass

from .common import masked_mean
from .gpg import gpg_surrogate
from .kimi import log_ratio_penalty
from .registry import Surrogate, SurrogateInputs, register_loss


@dataclass(frozen=True)
class DroOptions:
    dro_beta: float = 0.05  # beta of beta/2 (log rho)^2 (verl's name; verl has no default and refuses none)

    def __post_init__(self):
        if not self.dro_beta > 0:
            raise ValueError(f"dro_beta: must be > 0 (DRO's penalty), got {self.dro_beta}")


@register_loss("dro", aggregation="token_sum", options=DroOptions, levels=("token",))
def dro_loss(x: SurrogateInputs, opts: DroOptions) -> Surrogate:
    """-A log pi + beta/2 (log rho)^2 per token."""
    per_token_loss = gpg_surrogate(x.adv, x.logp) + log_ratio_penalty(x.token_log_ratio, opts.dro_beta / 2)
    return Surrogate(per_token_loss,
                     stats={"dro/log_ratio_sq_mean": masked_mean(x.token_log_ratio.detach().square(), x.mask).item()})
