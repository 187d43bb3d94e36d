"""The variants beyond those of tests/test_objectives.py, against cases small enough to compute by hand (the
arithmetic is in the comments): the losses LUSPO, VESPO, GPG, Clip-Cov, KL-Cov, dual-clip, DPPO-Binary-TV and -KL,
DRO and Kimi K2.5's; the off-policy mask, top-entropy tokens, the entropy bonus and the bias-corrected KL; the
advantage estimators REINFORCE++, OPO, GRPO pass@k, pass@k training, GPG, GDPO, MaxRL, ReMax and the optimal token
baseline, with their degenerate groups. Then Config's checks on their fields, and two training steps of each.
"""

import contextlib
import itertools
import math

import pytest
import torch

from minigrpo.advantages import (AdvantageInputs, compute_advantages, gpg_advantages, grpo_passk_advantages,
                                 maxrl_advantages, normalize_then_sum_advantages, opo_advantages,
                                 optimal_token_baseline_advantages, pass_at_k_advantages, reinforce_pp_advantages,
                                 reinforce_pp_baseline_advantages, remax_advantages)
from minigrpo.config import Config, ConfigError
from minigrpo.objectives import policy_loss
from minigrpo.objectives.entropy import high_entropy_mask

# The batch of tests/test_objectives.py: two completions, three tokens and one, ratios [1.5, 0.9, 1.0] and [0.5].
LOG_RATIO = torch.tensor([[math.log(1.5), math.log(0.9), 0.0], [math.log(0.5), 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
OLD = torch.full((2, 3), -1.0)
LOGP = OLD + LOG_RATIO  # [[-0.5945, -1.1054, -1.0], [-1.6931, ., .]]


def run(adv=(1.0, -1.0), **kw):
    logp = LOGP.clone().requires_grad_()
    loss, stats = policy_loss(logp, OLD, torch.tensor(adv), MASK, **kw)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.item(), grad, stats


# ---------------------------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------------------------
def test_luspo_is_gspo_times_length():
    # s0 = 1.35^(1/3) = 1.1052 inside [0.8, 1.2]: term -s0; s1 = 0.5 with A < 0: clipped at 0.8, term 0.8.
    # LUSPO weighs them by |o| = 3 and 1: (3 * -s0 + 1 * 0.8) / 2. GSPO (grpo, sequence) would be (-s0 + 0.8) / 2.
    s0 = 1.35 ** (1 / 3)
    loss, grad, stats = run(loss_type="luspo", importance_sampling_level="sequence")
    assert loss == pytest.approx((3 * -s0 + 0.8) / 2)
    # d/dlogp_t of -3 s0 / 2 = -3/2 * s0 / 3 for each token of row 0; row 1 is clipped.
    assert grad.tolist() == [pytest.approx([-s0 / 2] * 3), [0.0, 0.0, 0.0]]
    assert stats["clip_ratio/low_mean"] == pytest.approx(1 / 2)  # of sequences, as GSPO


def test_vespo_weight_by_hand():
    # W0 = 1.5 * 0.9 * 1.0 = 1.35 (A = +1: k = 2, lambda = 3): phi0 = 1.35^2 e^(3 (1 - 1.35)) = 1.8225 e^-1.05
    # W1 = 0.5 (A = -1: k = 3, lambda = 2): phi1 = 0.5^3 e^(2 * 0.5) = 0.125 e
    phi0, phi1 = 1.8225 * math.exp(-1.05), 0.125 * math.e
    loss, grad, stats = run(loss_type="vespo")
    logp = LOGP
    expected = -(phi0 * (logp[0, 0] + logp[0, 1] + logp[0, 2]) - phi1 * logp[1, 0]) / 4  # over 4 tokens
    assert loss == pytest.approx(expected.item())
    assert grad.tolist() == [pytest.approx([-phi0 / 4] * 3), pytest.approx([phi1 / 4, 0.0, 0.0])]
    assert stats["vespo/phi_seq_mean"] == pytest.approx((phi0 + phi1) / 2)
    assert stats["clip_ratio/region_mean"] == 0.0  # clips nothing


def test_vespo_kernel_is_one_on_policy_and_folds_in_sampler_weights():
    logp = torch.zeros(1, 2, requires_grad=True)
    loss, stats = policy_loss(logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), loss_type="vespo")
    assert stats["vespo/phi_seq_mean"] == pytest.approx(1.0)  # phi(1) = 1^k e^0
    # a sampler weight of 2 on one token: W = 2, phi = 4 e^(3 (1 - 2)) = 4 e^-3; the loss is not multiplied by 2
    _, stats = policy_loss(logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), loss_type="vespo",
                           token_weights=torch.tensor([[2.0, 1.0]]))
    assert stats["vespo/phi_seq_mean"] == pytest.approx(4 * math.exp(-3))


def test_gpg_is_reinforce_without_ratio_or_clip():
    # -A log pi summed over the 4 tokens / 4: -(1 * (logp00 + logp01 + logp02) - 1 * logp10) / 4
    loss, grad, stats = run(loss_type="gpg")
    assert loss == pytest.approx(-(LOGP[0].sum() - LOGP[1, 0]).item() / 4)
    assert grad.tolist() == [pytest.approx([-1 / 4] * 3), pytest.approx([1 / 4, 0.0, 0.0])]
    assert stats["clip_ratio/region_mean"] == 0.0


def test_clip_cov_detaches_the_high_covariance_token():
    # Token means: A 0.5 (three tokens of +1, one of -1), log pi (-0.5945 - 1.1054 - 1.0 - 1.6931) / 4 = -1.0983.
    # Cov = (A - 0.5)(log pi + 1.0983): row 0 [0.2519, -0.0036, 0.0491], row 1 (-1.5)(-0.5949) = 0.8923.
    # PPO already clips row 0 token 0 (rho 1.5 > 1.2) and row 1 (rho 0.5 < 0.8, A < 0), so with cov in (0.04, 0.1)
    # the one candidate is row 0 token 2: its loss -1.0 becomes 0. Token losses -1.2, -0.9, 0, 0.8 over 4 tokens.
    loss, grad, stats = run(loss_type="clip_cov", clip_cov_ratio=1.0, clip_cov_lb=0.04, clip_cov_ub=0.1)
    assert loss == pytest.approx((-1.2 - 0.9 + 0.0 + 0.8) / 4)
    assert grad.tolist() == [pytest.approx([0.0, -0.9 / 4, 0.0]), [0.0, 0.0, 0.0]]
    assert stats["clip_cov/detached_frac"] == pytest.approx(1 / 4)
    assert stats["clip_ratio/region_mean"] == pytest.approx(2 / 4)  # PPO's own clipping, as for grpo


def test_kl_cov_penalises_the_highest_covariance_token():
    # k = max(1, floor(4 * 0.25)) = 1 token: row 1 (cov 0.8923). No clipping: -rho A = -1.5, -0.9, -1.0 and
    # +0.5, plus |log 0.5| = 0.6931 on row 1. Gradient of -rho A is -rho A; of |log rho| it is sign(log rho) = -1.
    loss, grad, stats = run(loss_type="kl_cov", kl_cov_ratio=0.25)
    assert loss == pytest.approx((-1.5 - 0.9 - 1.0 + 0.5 + math.log(2)) / 4)
    assert grad.tolist() == [pytest.approx([-1.5 / 4, -0.9 / 4, -1.0 / 4]), pytest.approx([(0.5 - 1) / 4, 0, 0])]
    assert stats["kl_cov/penalised_frac"] == pytest.approx(1 / 4)


def test_kl_cov_penalises_nothing_without_a_positive_covariance():
    # Every advantage 0: every covariance is 0, nothing lowers the entropy, no penalty (verl's top-k would still
    # penalise one token here).
    loss, grad, stats = run([0.0, 0.0], loss_type="kl_cov", kl_cov_ratio=0.25)
    assert loss == 0.0 and (grad == 0).all() and stats["kl_cov/penalised_frac"] == 0.0


def test_delta_is_dual_clip():
    # verl's dual-clip with c = 3 on A = -1: loss -A min(c, max(rho, 0.8)) = min(3, rho) for rho = 5 -> 3, no grad.
    logp = torch.tensor([[math.log(5.0), math.log(2.0)]], requires_grad=True)
    loss, _ = policy_loss(logp, torch.zeros(1, 2), torch.tensor([-1.0]), torch.ones(1, 2), delta=3.0,
                          loss_type="dapo")
    assert loss.item() == pytest.approx((3.0 + 2.0) / 2)
    assert torch.autograd.grad(loss, logp)[0].tolist() == [[0.0, pytest.approx(2.0 / 2)]]  # d(rho)/dlogp = rho


def test_dppo_tv_masks_on_the_probability_change_by_hand():
    # pi_old = e^-1 = 0.3679 on every token. Row 0 (A = +1): ratios [1.5, 0.9, 1] -> pi = [0.5518, 0.3311, 0.3679],
    # pi - pi_old = [+0.1839, -0.0368, 0]; with delta_high 0.15 token 0 rose too far: masked. Row 1 (A = -1):
    # ratio 0.5 -> pi - pi_old = -0.1839 >= -delta_low = -0.2: kept. Kept tokens: -A sg[rho] log pi over 4 tokens.
    q = math.exp(-1)
    loss, grad, stats = run(loss_type="dppo_tv", epsilon=0.2, epsilon_high=0.15)
    assert 1.5 * q - q == pytest.approx(0.1839, abs=1e-4)
    assert loss == pytest.approx(-(0.9 * LOGP[0, 1] + 1.0 * LOGP[0, 2] - 0.5 * LOGP[1, 0]).item() / 4)
    assert grad.tolist() == [pytest.approx([0.0, -0.9 / 4, -1.0 / 4]), pytest.approx([0.5 / 4, 0.0, 0.0])]
    assert (stats["clip_ratio/high_mean"], stats["clip_ratio/low_mean"]) == (pytest.approx(0.25), 0.0)
    # delta_low 0.15: row 1's probability fell 0.1839 > 0.15 with A < 0: masked too (the low side)
    loss, grad, stats = run(loss_type="dppo_tv", epsilon=0.15)
    assert grad[1, 0].item() == 0.0 and stats["clip_ratio/low_mean"] == pytest.approx(0.25)
    # PPO-clip at the same 0.15 would clip row 0 token 0 by its ratio 1.5 too, but also a rare token whose
    # probability went from 0.001 to 0.002 (ratio 2, TV change 0.001): DPPO lets that one learn.
    rare, _ = policy_loss(torch.tensor([[math.log(0.002)]], requires_grad=True), torch.tensor([[math.log(0.001)]]),
                          torch.tensor([1.0]), torch.ones(1, 1), loss_type="dppo_tv", epsilon=0.15)
    assert rare.item() == pytest.approx(-2 * math.log(0.002))  # -A sg[rho] log pi, kept, rho = 2


def test_dppo_kl_masks_on_a_binary_kl_by_hand():
    # Binary KL(q || p) = q log(q/p) + (1 - q) log((1 - q)/(1 - p)), q = 0.3679:
    #   row 0 token 0 (p = 0.5518): 0.3679 (-0.4055) + 0.6321 (0.3439) = 0.0682 > 0.05, rose, A > 0: masked
    #   row 0 token 1 (p = 0.3311): fell, A > 0: kept whatever its KL (0.0030)
    #   row 1 token 0 (p = 0.1839): 0.3679 (0.6931) + 0.6321 (-0.2555) = 0.0935 > 0.05, fell, A < 0: masked
    q = math.exp(-1)
    kl = lambda p: q * math.log(q / p) + (1 - q) * math.log((1 - q) / (1 - p))  # noqa: E731
    assert (kl(1.5 * q), kl(0.5 * q)) == (pytest.approx(0.0682, abs=1e-4), pytest.approx(0.0935, abs=1e-4))
    loss, grad, stats = run(loss_type="dppo_kl", epsilon=0.05)
    assert loss == pytest.approx(-(0.9 * LOGP[0, 1] + 1.0 * LOGP[0, 2]).item() / 4)
    assert grad.tolist() == [pytest.approx([0.0, -0.9 / 4, -1.0 / 4]), [0.0, 0.0, 0.0]]
    assert stats["clip_ratio/region_mean"] == pytest.approx(0.5)
    # at 0.1 both KLs are inside: every token learns, the loss is CISPO's uncapped -A sg[rho] log pi
    assert run(loss_type="dppo_kl", epsilon=0.1)[2]["clip_ratio/region_mean"] == 0.0


def test_dppo_truncates_the_importance_weight():
    # pi_old 0.01 -> pi 0.25: rho = 25, A = -1 (a fall is allowed: 0.24 >= -0.2). The weight is min(rho, C):
    # C = 20 unset (verl's function default), 3 with delta=3 (verl's actor config default). d loss / d log pi = -A w.
    def grad_of(**kw):
        logp = torch.tensor([[math.log(0.25)]], requires_grad=True)
        loss, stats = policy_loss(logp, torch.tensor([[math.log(0.01)]]), torch.tensor([-1.0]), torch.ones(1, 1),
                                  loss_type="dppo_tv", **kw)
        return torch.autograd.grad(loss, logp)[0].item(), stats["dppo/truncated_frac"]

    assert grad_of() == (pytest.approx(20.0), 1.0)
    assert grad_of(delta=3.0) == (pytest.approx(3.0), 1.0)
    assert grad_of(delta=30.0) == (pytest.approx(25.0), 0.0)


def test_dro_is_reinforce_with_a_quadratic_pull_to_pi_old():
    # -A log pi + beta/2 (log rho)^2 per token, over 4 tokens; d/dlogp = -A + beta log rho.
    beta = 0.5
    l = LOG_RATIO.tolist()
    loss, grad, stats = run(loss_type="dro", dro_beta=beta)
    quadratic = beta / 2 * (l[0][0] ** 2 + l[0][1] ** 2 + l[1][0] ** 2)
    assert loss == pytest.approx((-(LOGP[0].sum() - LOGP[1, 0]).item() + quadratic) / 4)
    assert grad.tolist() == [pytest.approx([(-1 + beta * x) / 4 for x in l[0]]),
                             pytest.approx([(1 + beta * l[1][0]) / 4, 0.0, 0.0])]
    # the pull acts where A = 0 too (only the penalty is left), and clips nothing
    loss, grad, stats = run([0.0, 0.0], loss_type="dro", dro_beta=beta)
    assert loss == pytest.approx(quadratic / 4) and stats["clip_ratio/region_mean"] == 0.0


def test_kimi_clips_whatever_the_advantage_sign_by_hand():
    # K2.5: -Clip(rho, 0.8, 1.2) A + tau (log rho)^2. A = [-1, +1] puts each clipped token on the side PPO lets
    # through: row 0 (A < 0) has rho 1.5 > 1.2, row 1 (A > 0) has rho 0.5 < 0.8. GRPO keeps both gradients (its min
    # picks the unclipped term), K2.5 masks both; only the KL term's 2 tau log rho is left on them.
    tau = 0.01
    l = LOG_RATIO.tolist()
    loss, grad, stats = run([-1.0, 1.0], loss_type="kimi", kl_tau=tau)
    penalty = tau * (l[0][0] ** 2 + l[0][1] ** 2 + l[1][0] ** 2)
    assert loss == pytest.approx((1.2 + 0.9 + 1.0 - 0.8 + penalty) / 4)
    assert grad.tolist() == [pytest.approx([2 * tau * l[0][0] / 4, (0.9 + 2 * tau * l[0][1]) / 4, 1.0 / 4]),
                             pytest.approx([2 * tau * l[1][0] / 4, 0.0, 0.0])]
    assert stats["clip_ratio/region_mean"] == pytest.approx(0.5)
    _, grpo_grad, _ = run([-1.0, 1.0], loss_type="dapo")
    assert grpo_grad[0, 0].item() == pytest.approx(1.5 / 4) and grpo_grad[1, 0].item() == pytest.approx(-0.5 / 4)
    # kl_tau unset: prime-rl's 1e-3
    assert run([-1.0, 1.0], loss_type="kimi")[0] == pytest.approx((1.2 + 0.9 + 1.0 - 0.8 + penalty / 10) / 4)


def test_kl_tau_adds_kimis_term_to_dppo():
    # prime-rl's default loss: DPPO-Binary-TV's gradient plus tau (log rho)^2 on every token, masked ones too.
    tau, l = 0.1, LOG_RATIO.tolist()
    plain = run(loss_type="dppo_tv", epsilon=0.2, epsilon_high=0.15)
    with_term = run(loss_type="dppo_tv", epsilon=0.2, epsilon_high=0.15, kl_tau=tau)
    assert with_term[0] - plain[0] == pytest.approx(tau * (l[0][0] ** 2 + l[0][1] ** 2 + l[1][0] ** 2) / 4, abs=1e-6)
    assert (with_term[1] - plain[1])[0, 0].item() == pytest.approx(2 * tau * l[0][0] / 4)  # the masked token


# ---------------------------------------------------------------------------------------------------------
# Which tokens learn; the KL and entropy terms
# ---------------------------------------------------------------------------------------------------------
def test_off_policy_mask_drops_negative_far_off_policy_completions():
    # Mean log pi_old - log pi: row 0 -(log 1.5 + log 0.9 + 0)/3 = -0.100 (kept), row 1 -log 0.5 = 0.693 > 0.3 and
    # A < 0: dropped. GRPO's mean over completions still divides by 2: ((-1.2 - 0.9 - 1.0)/3 + 0)/2.
    loss, grad, stats = run(off_policy_mask_threshold=0.3)
    assert loss == pytest.approx((-1.2 - 0.9 - 1.0) / 3 / 2)
    assert stats["off_policy_mask/kept_frac"] == 0.5
    # A positive advantage is never dropped, however far off-policy.
    assert run([1.0, 1.0], off_policy_mask_threshold=0.3)[2]["off_policy_mask/kept_frac"] == 1.0


def test_off_policy_mask_reads_the_samplers_log_probs():
    # The sampler (e.g. vLLM) gave row 0 log-probs 2 above ours, on average: mean KL 2 > 0.3, and A0 < 0.
    sampling = LOGP + torch.tensor([[2.0, 2.0, 2.0], [0.0, 0.0, 0.0]])
    _, _, stats = run([-1.0, 1.0], off_policy_mask_threshold=0.3, sampling_logp=sampling)
    assert stats["off_policy_mask/kept_frac"] == 0.5


ENTROPIES = torch.tensor([[0.1, 2.0, 0.5], [1.0, 9.0, 9.0]])  # the 9s are padding


def test_top_entropy_quantile_keeps_the_forking_tokens():
    # Completion tokens' entropies [0.1, 2.0, 0.5, 1.0]; the 0.5 quantile (linear) of [0.1, 0.5, 1.0, 2.0] is 0.75:
    # keep 2.0 (row 0, token 1) and 1.0 (row 1). GRPO: row 0 (-0.9)/3, row 1 clipped 0.8 -> (-0.3 + 0.8) / 2.
    assert high_entropy_mask(ENTROPIES, MASK, 0.5).tolist() == [[False, True, False], [True, False, False]]
    loss, grad, stats = run(entropies=ENTROPIES, top_entropy_quantile=0.5)
    assert loss == pytest.approx((-0.9 / 3 + 0.8) / 2)
    assert grad.tolist() == [pytest.approx([0.0, -0.9 / 6, 0.0]), [0.0, 0.0, 0.0]]
    assert stats["entropy_mask/kept_frac"] == 0.5
    # 0 keeps the highest-entropy token only; 1 keeps every token.
    assert high_entropy_mask(ENTROPIES, MASK, 0.0).sum() == 1
    assert high_entropy_mask(ENTROPIES, MASK, 1.0).tolist() == MASK.bool().tolist()


def test_entropy_bonus_is_the_mean_token_entropy():
    # Mean entropy over the 4 completion tokens (0.1 + 2.0 + 0.5 + 1.0) / 4 = 0.9; loss - 0.1 * 0.9.
    entropies = ENTROPIES.clone().requires_grad_()
    logp = LOGP.clone().requires_grad_()
    loss, stats = policy_loss(logp, OLD, torch.tensor([1.0, -1.0]), MASK, entropies=entropies, entropy_coef=0.1)
    assert stats["policy_loss"] == pytest.approx(run()[0])
    assert loss.item() == pytest.approx(run()[0] - 0.1 * 0.9)
    (d_entropy,) = torch.autograd.grad(loss, entropies)
    assert d_entropy.tolist() == [pytest.approx([-0.1 / 4] * 3), pytest.approx([-0.1 / 4, 0.0, 0.0])]


def test_bias_corrected_kl_by_hand():
    # ref = old, so log r = ref - logp = -l with l = log rho. k3 = e^-l + l - 1; times rho = e^l: 1 + (l - 1) e^l,
    # whose derivative in l (= in logp) is l e^l. With A = 0 only the KL term remains, GRPO-aggregated.
    logp = LOGP.clone().requires_grad_()
    loss, stats = policy_loss(logp, OLD, torch.tensor([0.0, 0.0]), MASK, beta=0.1, ref_logp=OLD,
                              use_bias_correction_kl=True)
    terms = [[1 + (l - 1) * math.exp(l) for l in row] for row in LOG_RATIO.tolist()]
    assert loss.item() == pytest.approx(0.1 * (sum(terms[0]) / 3 + terms[1][0]) / 2)
    (grad,) = torch.autograd.grad(loss, logp)
    l = LOG_RATIO.tolist()
    assert grad[0].tolist() == pytest.approx([0.1 * x * math.exp(x) / 6 for x in l[0]])
    assert grad[1, 0].item() == pytest.approx(0.1 * l[1][0] * math.exp(l[1][0]) / 2)


def test_options_need_their_inputs():
    with pytest.raises(ValueError, match="entropies"):
        run(top_entropy_quantile=0.2)
    with pytest.raises(ValueError, match="gmpo"):
        run(loss_type="gmpo", token_weights=torch.ones(2, 3))


# ---------------------------------------------------------------------------------------------------------
# Advantages
# ---------------------------------------------------------------------------------------------------------
def test_reinforce_pp_whitens_returns_over_tokens():
    # rewards [1, 0], lengths 2 and 1, gamma 1: token returns [1, 1] and [0]. Over the 3 tokens: mean 2/3,
    # sample var (2 (1/3)^2 + (2/3)^2) / 2 = 1/3. A = (1/3)/sqrt(1/3) = 0.5774 and -(2/3)/sqrt(1/3) = -1.1547.
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = reinforce_pp_advantages(torch.tensor([1.0, 0.0]), mask)
    assert adv.tolist() == [pytest.approx([0.57735, 0.57735], abs=1e-5), pytest.approx([-1.1547, 0.0], abs=1e-4)]
    # gamma 0.5: returns [0.5, 1] and [0]: mean 0.5, var (0 + 0.25 + 0.25) / 2 = 0.25, A = [0, 1] and [-1]
    adv = reinforce_pp_advantages(torch.tensor([1.0, 0.0]), mask, gamma=0.5)
    assert adv.tolist() == [pytest.approx([0.0, 1.0], abs=1e-6), pytest.approx([-1.0, 0.0], abs=1e-6)]


def test_reinforce_pp_baseline_by_hand():
    # Groups [1, 0] and [1, 1] -> x = r - group mean = [0.5, -0.5, 0, 0]; lengths [2, 1, 3, 1] (7 tokens).
    # Token mean (2 * 0.5 - 0.5) / 7 = 1/14; token var (2 (3/7)^2 + (4/7)^2 + 4 (1/14)^2) / 6 = 5/42.
    adv = reinforce_pp_baseline_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), 2,
                                           torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]]).float())
    sd = math.sqrt(5 / 42)
    assert adv.tolist() == pytest.approx([(3 / 7) / sd, (-4 / 7) / sd, (-1 / 14) / sd, (-1 / 14) / sd], abs=1e-5)


def test_opo_length_weighted_baseline():
    # rewards [1, 0, 0], lengths [1, 2, 3]: b = (1 * 1) / 6; A = r - b.
    adv = opo_advantages(torch.tensor([1.0, 0.0, 0.0]), 3, torch.tensor([1, 2, 3]))
    assert adv.tolist() == pytest.approx([5 / 6, -1 / 6, -1 / 6])
    # equal lengths: the plain group mean (Dr. GRPO's advantage)
    assert opo_advantages(torch.tensor([1.0, 0.0]), 2, torch.tensor([4, 4])).tolist() == [0.5, -0.5]


def test_grpo_passk_only_the_best_learns():
    # [0.2, 0.9, 0.5, 0.1]: best 0.9, runner-up 0.5, margin 0.4; sample std: mean 0.425,
    # squares 0.050625 + 0.225625 + 0.005625 + 0.105625 = 0.3875, / 3 -> std 0.35940.
    adv = grpo_passk_advantages(torch.tensor([0.2, 0.9, 0.5, 0.1]), 4, eps=0.0)
    assert adv.tolist() == pytest.approx([0.0, 0.4 / math.sqrt(0.3875 / 3), 0.0, 0.0])
    assert grpo_passk_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]), 4).tolist() == [0.0] * 4  # tie: margin 0


def test_pass_at_k_analytic_by_hand():
    # N = 4, k = 2, one right: R = 1 - C(3,2)/C(4,2) = 1/2, sigma = 1/2.
    # A_pos = (1 - 1/2) / (1/2) = 1; A_neg = (1 - 1/2 - C(2,1)/C(3,1)) / (1/2) = (1/2 - 2/3) * 2 = -1/3.
    adv = pass_at_k_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, k=2)
    assert adv.tolist() == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    # k = 1 is GRPO with population std: [1, 1, 0, 0] -> +-1
    assert pass_at_k_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0]), 4, k=1).tolist() == pytest.approx([1, 1, -1, -1])
    # all right, or too few wrong to fill a 3-subset: every subset passes, no signal
    assert pass_at_k_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0]), 4, k=3).tolist() == [0.0] * 4


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_pass_at_k_equals_the_mean_over_k_subsets(k):
    """Brute force: score every k-subset by its best, normalise over subsets, average each member's scores."""
    g = torch.Generator().manual_seed(k)
    for _ in range(10):
        rewards = (torch.rand(6, generator=g) < 0.4).double()
        scores = {s: max(rewards[list(s)].tolist()) for s in itertools.combinations(range(6), k)}
        mean = sum(scores.values()) / len(scores)
        sigma = math.sqrt(sum((v - mean) ** 2 for v in scores.values()) / len(scores))
        expected = [0.0 if sigma == 0 else
                    sum((v - mean) / sigma for s, v in scores.items() if i in s) / sum(i in s for s in scores)
                    for i in range(6)]
        assert pass_at_k_advantages(rewards, 6, k).tolist() == pytest.approx(expected, abs=1e-9)


def test_gpg_advantage_rescales_for_the_informative_completions():
    # groups [1, 0] (informative) and [1, 1] (all equal): r - mean = [0.5, -0.5, 0, 0]; alpha = 4 / 2 = 2.
    assert gpg_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), 2).tolist() == [1.0, -1.0, 0.0, 0.0]


def test_normalize_then_sum_by_hand():
    # Two prompts, G = 2, two reward functions; weights [1, 2].
    # f1: [1, 0 | 1, 1] -> group-normalised [+a, -a | 0, 0] with a = 0.5 / (std [1, 0] = 0.7071) = 0.7071
    # f2: [0, 3 | 0, 3] -> [-a, +a | -a, +a]
    # sums 1 * f1 + 2 * f2: [a - 2a, -a + 2a, -2a, 2a] = [-a, a, -2a, 2a]; batch mean 0,
    # sample std a * sqrt((1 + 1 + 4 + 4) / 3) -> A = [-1, 1, -2, 2] / sqrt(10 / 3)
    per_func = torch.tensor([[1.0, 0.0], [0.0, 3.0], [1.0, 0.0], [1.0, 3.0]])
    adv = normalize_then_sum_advantages(per_func, 2, torch.tensor([1.0, 2.0]), eps=0.0)
    assert adv.tolist() == pytest.approx([x / math.sqrt(10 / 3) for x in (-1, 1, -2, 2)], abs=1e-6)


def test_normalize_then_sum_gives_no_signal_groups_and_unscorable_rows_zero():
    nan = math.nan
    per_func = torch.tensor([[1.0, 2.0], [1.0, 2.0], [1.0, nan], [0.0, nan], [nan, nan], [1.0, 5.0]])
    adv = normalize_then_sum_advantages(per_func, 2)
    assert adv[:2].tolist() == [0.0, 0.0]  # every function constant in group 1
    assert adv[4].item() == 0.0  # no function scored it
    assert adv[2].item() > 0 > adv[3].item()


def test_maxrl_divides_by_the_pass_rate():
    # [1, 0, 0, 0]: mean 0.25 -> (1 - 0.25) / 0.25 = 3 and -1 (GRPO with the population std: +1.732 / -0.577);
    # [1, 1, 0, 0]: mean 0.5 -> +-1. A rare success weighs 1/p.
    adv = maxrl_advantages(torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0]), 4)
    assert adv.tolist() == pytest.approx([3, -1, -1, -1, 1, 1, -1, -1])
    # no signal: all wrong (mean 0), all right, a mean of 0 from rewards of both signs, a lone completion: exactly 0
    assert maxrl_advantages(torch.tensor([0.0, 0, 0, 0, 1, 1, 1, 1]), 4).tolist() == [0.0] * 8
    assert maxrl_advantages(torch.tensor([1.0, -1.0]), 2).tolist() == [0.0, 0.0]
    assert maxrl_advantages(torch.tensor([0.1, 0.1, 0.1]), 3).tolist() == [0.0] * 3  # float mean != 0.1: no residue
    assert maxrl_advantages(torch.tensor([1.0, 0.0]), 1).tolist() == [0.0, 0.0]
    # NaN: out of the mean (1/3 over the other three), advantage 0
    assert maxrl_advantages(torch.tensor([1.0, math.nan, 0.0, 0.0]), 4).tolist() == pytest.approx([2, 0, -1, -1])


def test_remax_subtracts_the_greedy_reward():
    # groups [1, 0, 1, 1] and [0, 0, 0, 0]; greedy rewards [1, 0]: A = r - b
    rewards = torch.tensor([1.0, 0, 1, 1, 0, 0, 0, 0])
    assert remax_advantages(rewards, torch.tensor([1.0, 0.0]), 4).tolist() == [0, -1, 0, 0, 0, 0, 0, 0]
    # an all-equal group still learns when its greedy answer scored otherwise (all four samples wrong, greedy right)
    assert remax_advantages(rewards, torch.tensor([0.0, 1.0]), 4).tolist() == [1, 0, 1, 1, -1, -1, -1, -1]
    # one sample per prompt is enough (no group needed); an unscorable greedy answer or sample: 0
    assert remax_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0]), 1).tolist() == [1.0, 0.0]
    assert remax_advantages(torch.tensor([1.0, math.nan]), torch.tensor([math.nan]), 2).tolist() == [0.0, 0.0]


def test_optimal_token_baseline_by_hand():
    # One group of 2, 2 tokens each. Completion 0 was uncertain: pi(o) = 0.5, sum pi^2 = 0.5 -> w = 1 - 1 + 0.5 = 0.5
    # per token, W = [0.5, 1.0]. Completion 1 was confident: pi(o) = 0.9, sum pi^2 = 0.82 -> w = 0.02, W = [0.02, 0.04].
    # Rewards [1, 0]: B_t = (1 W0_t + 0 W1_t) / (W0_t + W1_t) = 0.5/0.52 = 1.0/1.04 = 0.9615 at both t.
    # A = [1 - 0.9615, 0 - 0.9615] = [+0.0385, -0.9615]: the uncertain trajectory sets the baseline. (Dr. GRPO's
    # mean baseline would give +-0.5.)
    old_logp = torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.9]]))
    sum_pi_squared = torch.tensor([[0.5, 0.5], [0.82, 0.82]])
    adv = optimal_token_baseline_advantages(torch.tensor([1.0, 0.0]), old_logp, sum_pi_squared, torch.ones(2, 2), 2)
    b = 0.5 / 0.52
    assert adv.tolist() == [pytest.approx([1 - b, 1 - b], abs=1e-6), pytest.approx([-b, -b], abs=1e-6)]
    # Completion 0 one token longer: at t = 2 it is alone, and its baseline there is 0, not its own return (verl's
    # zero tail): A = its return, 1.
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    pad = lambda x, v: torch.cat([x, torch.full((2, 1), v)], 1)  # noqa: E731
    adv = optimal_token_baseline_advantages(torch.tensor([1.0, 0.0]), pad(old_logp, math.log(0.5)),
                                            pad(sum_pi_squared, 0.5), mask, 2)
    assert adv[0, 2].item() == 1.0 and adv[1, 2].item() == 0.0 and adv[0, 0].item() == pytest.approx(1 - b, abs=1e-6)


def test_optimal_token_baseline_tool_form_counts_policy_tokens():
    # Completion 0: policy, tool, policy; completion 1: policy, policy, padding. In the tool form t counts policy
    # tokens, so completion 0's third position is its 2nd token and meets completion 1's 2nd; the plain form meets
    # nobody there (completion 1 has nothing at position 2). The tool token's own pi and sum pi^2 (nonsense here)
    # never enter W, and it gets advantage 0 in both forms.
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    old_logp = torch.log(torch.tensor([[0.5, 1e-9, 0.5], [0.9, 0.9, 1.0]]))
    sum_pi_squared = torch.tensor([[0.5, 1e6, 0.5], [0.82, 0.82, 1.0]])
    rewards = torch.tensor([1.0, 0.0])
    tool_form = optimal_token_baseline_advantages(rewards, old_logp, sum_pi_squared, mask, 2, policy_tokens_only=True)
    b = 0.5 / 0.52  # as in the hand case above, both tokens
    assert tool_form.tolist() == [pytest.approx([1 - b, 0.0, 1 - b], abs=1e-6), pytest.approx([-b, -b, 0.0], abs=1e-6)]
    # The plain form compares positions: at 1 and 2 each row is alone, its baseline its own return, its advantage 0
    # (both have 2 policy tokens, so verl's zero tail, which counts tokens, does not apply): the tool form's reason.
    plain = optimal_token_baseline_advantages(rewards, old_logp, sum_pi_squared, mask, 2)
    assert plain.tolist() == [pytest.approx([1 - b, 0.0, 0.0], abs=1e-6), pytest.approx([-b, 0.0, 0.0], abs=1e-6)]


def test_optimal_token_baseline_degenerate_groups():
    ones, logp = torch.ones(4, 3), torch.full((4, 3), math.log(0.5))
    # all-equal rewards: exactly 0 (verl leaves residues of eps / W and gives the longest completion's tail its return)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = optimal_token_baseline_advantages(torch.ones(4), logp, 0.5 * ones, mask, 4)
    assert (adv == 0).all()
    # a lone completion (G = 1) has nothing to compare with: 0, as GRPO (verl gives it its return); finite
    adv = optimal_token_baseline_advantages(torch.tensor([1.0, 0.0]), logp[:2], 0.5 * ones[:2], ones[:2], 1)
    assert adv.tolist() == [[0.0] * 3, [0.0] * 3]
    # one non-empty completion among empty ones: verl's rule, no baseline, its return
    empty = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    adv = optimal_token_baseline_advantages(torch.tensor([1.0, 0.0]), logp[:2], 0.5 * ones[:2], empty, 2)
    assert adv.tolist() == [[1.0] * 3, [0.0] * 3]
    # a NaN reward is left out (advantage 0); the others compare among themselves
    adv = optimal_token_baseline_advantages(torch.tensor([1.0, math.nan, 0.0, 0.0]), logp, 0.5 * ones, ones, 4)
    assert torch.isfinite(adv).all() and (adv[1] == 0).all() and adv[0, 0] > 0 > adv[2, 0]


def test_the_update_reuses_the_old_log_probs_the_estimator_read():
    # collect_batch hands the batch on with the log pi_old the optimal token baseline read; with two passes the update
    # needs them too (the ratio) and keeps them instead of running the policy again. In one pass it needs none.
    from minigrpo.batch import Batch
    from minigrpo.trainer import prepare_update

    def policy(*ids, **options):
        raise AssertionError("the policy ran a second old-policy forward")

    policy.eval = lambda: None
    old_logp = torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.9]]))
    ids = torch.ones(2, 2, dtype=torch.long)
    for num_iterations, kept in ((2, old_logp), (1, None)):
        batch = Batch.of_completions(ids, ids, ids, ids, torch.tensor([1.0, -1.0]), old_logp=old_logp)
        cfg = Config(advantage_estimator="optimal_token_baseline", num_iterations=num_iterations)
        inputs, _ = prepare_update(cfg, batch, policy, None, contextlib.nullcontext)
        assert inputs.old_logp is kept


def test_estimators_that_need_more_than_rewards_say_so():
    x = AdvantageInputs(torch.tensor([1.0, 0.0]), 2, torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="greedy_rewards"):
        compute_advantages(x, "remax")
    with pytest.raises(ValueError, match="old_logp, sum_pi_squared, mask"):
        compute_advantages(x, "optimal_token_baseline")


# ---------------------------------------------------------------------------------------------------------
# Config: these variants' fields and the combinations refused in one line
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fields, match", [
    (dict(loss_type="clip_cov", importance_sampling_level="sequence"), "importance_sampling_level"),
    (dict(delta=1.1), "delta"),
    (dict(loss_type="dapo", epsilon_high=0.28, delta=1.25), "delta"),
    (dict(top_entropy_quantile=1.5), "top_entropy_quantile"),
    (dict(off_policy_mask_threshold=0.0), "off_policy_mask_threshold"),
    (dict(use_bias_correction_kl=True), "use_bias_correction_kl"),
    (dict(use_bias_correction_kl=True, beta=0.04, kl_in_reward=True), "use_bias_correction_kl"),
    (dict(clip_cov_ratio=0.0), "clip_cov_ratio"),
    (dict(clip_cov_lb=5.0, clip_cov_ub=1.0), "clip_cov_lb"),
    (dict(advantage_estimator="pass_at_k", pass_k=9), "pass_k"),
    (dict(multi_objective_aggregation="normalize_then_sum", advantage_estimator="rloo"), "multi_objective"),
    (dict(multi_objective_aggregation="normalize_then_sum", scale_rewards="none"), "multi_objective"),
    (dict(advantage_estimator="ppo"), "advantage_estimator"),
    (dict(loss_type="dro", dro_beta=0.0), "dro_beta"),
    (dict(loss_type="kimi", kl_tau=-1.0), "kl_tau"),
    (dict(loss_type="dppo_tv", importance_sampling_level="sequence"), "importance_sampling_level"),
    (dict(advantage_estimator="remax", use_vllm=True), "advantage_estimator: remax"),
    (dict(advantage_estimator="optimal_token_baseline", loss_type="gmpo"), "one advantage per token"),
])
def test_config_refuses_in_one_line(fields, match):
    with pytest.raises(ConfigError, match=match) as info:
        Config(**fields)
    assert "\n" not in str(info.value)


def test_config_accepts_each_variant():
    for loss_type in ("luspo", "vespo", "gpg", "clip_cov", "kl_cov", "dppo_tv", "dppo_kl", "dro", "kimi"):
        Config(loss_type=loss_type)
    for estimator in ("reinforce_plus_plus", "reinforce_plus_plus_baseline", "opo", "grpo_passk", "pass_at_k", "gpg",
                      "max_rl", "remax", "optimal_token_baseline", "tir_optimal_token_baseline"):
        Config(advantage_estimator=estimator)
    # kl_tau left None: each loss type's own default (kimi: prime-rl's 1e-3; dppo: 0, verl's loss)
    assert "kl_tau" not in Config(loss_type="kimi").policy_loss_options()
    assert Config(loss_type="dppo_tv", kl_tau=1e-3).policy_loss_options() == {"kl_tau": 1e-3}
    Config(beta=0.04, use_bias_correction_kl=True, off_policy_mask_threshold=0.5, top_entropy_quantile=0.2,
           multi_objective_aggregation="normalize_then_sum", delta=1.5)


# ---------------------------------------------------------------------------------------------------------
# Wired into the trainer: two steps of each on the tiny random model, nothing NaN, the variant's own metric
# ---------------------------------------------------------------------------------------------------------
SMALL = dict(max_steps=2, num_generations=4, generation_batch_size=16, eval_steps=0, eval_num_problems=8,
             eval_num_samples=0, eval_limit=8, save_model=False, learning_rate=1e-3)


def alternating(prompts, completions, **row):
    """1 for every other completion: every group has a spread."""
    return [float(i % 2) for i in range(len(completions))]


def by_length(prompts, completions, **row):
    """A second reward on another scale: the completion's length in characters."""
    return [float(len(c if isinstance(c, str) else c[-1]["content"])) for c in completions]


@pytest.mark.parametrize("overrides, metric", [
    (dict(loss_type="luspo", importance_sampling_level="sequence", advantage_estimator="reinforce_plus_plus"), None),
    (dict(loss_type="vespo", advantage_estimator="reinforce_plus_plus_baseline", num_iterations=2),
     "vespo/phi_seq_mean"),
    (dict(loss_type="gpg", advantage_estimator="gpg"), None),
    (dict(loss_type="clip_cov", clip_cov_ratio=0.2, clip_cov_lb=0.0, advantage_estimator="opo", num_iterations=2),
     "clip_cov/detached_frac"),
    (dict(loss_type="kl_cov", kl_cov_ratio=0.2, advantage_estimator="grpo_passk"), "kl_cov/penalised_frac"),
    (dict(loss_type="dapo", advantage_estimator="pass_at_k", pass_k=2), None),
    (dict(off_policy_mask_threshold=0.01, num_iterations=2, steps_per_generation=2), "off_policy_mask/kept_frac"),
    (dict(top_entropy_quantile=0.2), "entropy_mask/kept_frac"),
    (dict(beta=0.04, use_bias_correction_kl=True), "kl"),
    (dict(multi_objective_aggregation="normalize_then_sum", reward_funcs=["correctness", "format"],
          reward_weights=[1.0, 0.5]), None),
], ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()) if isinstance(o, dict) else str(o))
def test_variant_trains_two_steps(tmp_path, random_model_dir, overrides, metric):
    import json

    from minigrpo.trainer import train

    # distinct sums, so that grpo_passk's best has a margin over the runner-up; pass@k needs 0/1 rewards
    funcs = [alternating] if overrides.get("advantage_estimator") == "pass_at_k" else [alternating, by_length]
    cfg = Config(model_name_or_path=str(random_model_dir), output_dir=str(tmp_path / "run"), **{**SMALL, **overrides})
    summary = train(cfg, reward_funcs=funcs, progress=False)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert summary["steps"] == 2 and len(lines) == 2
    for line in lines:
        for key, value in line.items():
            assert not (isinstance(value, float) and math.isnan(value)), key
        assert line["loss"] is not None and line["grad_norm"] is not None
        if metric is not None:
            assert line[metric] is not None, metric
    if "advantage_estimator" in overrides or "reward_weights" in overrides:
        assert any(a != 0.0 for a in lines[0]["advantages"])


# ---------------------------------------------------------------------------------------------------------
# The command line: each new loss type and estimator trains two steps, logs its own numbers, checkpoints
# ---------------------------------------------------------------------------------------------------------
CLI_RUNS = {  # one new loss type and one new estimator per run, so that four runs cover the eight names
    "dppo_tv-max_rl": (["--loss-type", "dppo_tv", "--kl-tau", "0.001", "--advantage-estimator", "max_rl",
                        "--num-iterations", "2"], "dppo/truncated_frac"),
    "dppo_kl-remax": (["--loss-type", "dppo_kl", "--epsilon", "0.05", "--advantage-estimator", "remax",
                       "--save-steps", "1"], "dppo/truncated_frac"),
    "dro-optimal_token_baseline": (["--loss-type", "dro", "--dro-beta", "0.1", "--advantage-estimator",
                                    "optimal_token_baseline", "--steps-per-generation", "2"], "dro/log_ratio_sq_mean"),
    "kimi-tir_optimal_token_baseline": (["--loss-type", "kimi", "--scale-rewards", "none", "--advantage-estimator",
                                         "tir_optimal_token_baseline", "--num-iterations", "2"],
                                        "kimi/log_ratio_sq_mean"),
}


@pytest.mark.parametrize("name", list(CLI_RUNS))
def test_new_variant_trains_two_steps_from_the_cli(name, tmp_path, random_model_dir, one_thread):
    import json

    from minigrpo.cli import main

    flags, metric = CLI_RUNS[name]
    (tmp_path / "rewards.py").write_text("def alternating(prompts, completions, **row):\n"
                                         "    return [float(i % 2) for i in range(len(completions))]\n")
    out = tmp_path / "run"
    assert main(["train", "--model", str(random_model_dir), "--out", str(out), "--reward-funcs",
                 f"{tmp_path}/rewards.py:alternating", "--max-steps", "2", "--num-generations", "4",
                 "--generation-batch-size", "8", "--eval-steps", "0", "--eval-limit", "4", "--eval-num-samples", "0",
                 "--save-model", "false", "--learning-rate", "1e-3", *flags]) == 0
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(line[metric] is not None and line["grad_norm"] > 0 for line in lines)
    assert any(a != 0.0 for line in lines for a in line["advantages"])
    for line in lines:
        assert not any(isinstance(v, float) and math.isnan(v) for v in line.values())
    records = [json.loads(x) for x in (out / "completions.jsonl").read_text().splitlines()]
    assert all(math.isfinite(c["advantage"]) for r in records for c in r["completions"])
    if "--save-steps" in flags:
        assert [p.name for p in sorted((out / "checkpoints").iterdir())] == ["step-000001.pt", "step-000002.pt"]


def test_remax_greedy_row_is_the_greedy_completion_decoded_with_the_group():
    # One more row per prompt, after its G samples, in the same decode loop: the same text as decoding greedily alone.
    from minigrpo.loading.models import load_model_and_tokenizer
    from minigrpo.rollout import sample_completions
    from minigrpo.tasks import get_task

    task = get_task("think_addition")
    model, tokenizer = load_model_and_tokenizer(task.model_dir)
    prompts = [row["prompt"] for row in task.load("test")[:6]]
    torch.manual_seed(0)
    together = sample_completions(model, tokenizer, prompts, num_generations=4, max_completion_length=40,
                                  with_greedy=True)
    alone = sample_completions(model, tokenizer, prompts, max_completion_length=40, do_sample=False)
    assert len(together.completions) == 6 * 5
    assert together.completions[4::5] == alone.completions
    assert (together.prompt_ids[4::5] == together.prompt_ids[::5]).all()  # the greedy row shares its group's prompt


def test_the_loop_gives_the_token_baseline_the_policys_tokens_only():
    # collect.py hands the estimator Batch.policy_mask (completion x tool mask): tool output neither enters W nor
    # gets an advantage, and the (N, T) advantage keeps the batch's width.
    from minigrpo.batch import Batch
    from minigrpo.collect import _advantages

    g = torch.Generator().manual_seed(0)
    N, T, G = 4, 5, 2
    completion_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 0, 0, 0]]).float()
    tool_mask = torch.tensor([[1, 0, 0, 1, 1], [1, 1, 1, 1, 1], [1, 1, 0, 1, 1], [1, 1, 1, 1, 1]]).float()
    batch = Batch.of_completions(torch.zeros(N, 2, dtype=torch.long), torch.ones(N, 2, dtype=torch.long),
                                 torch.zeros(N, T, dtype=torch.long), completion_mask, adv=torch.zeros(N),
                                 tool_mask=tool_mask)
    batch.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    old_logp, sum_pi_squared = -torch.rand(N, T, generator=g), torch.rand(N, T, generator=g)
    cfg = Config(advantage_estimator="tir_optimal_token_baseline", num_generations=G, generation_batch_size=N)
    adv, zero_std = _advantages(cfg, batch, G, [1.0], None, (old_logp, sum_pi_squared))
    expected = optimal_token_baseline_advantages(batch.rewards, old_logp, sum_pi_squared, completion_mask * tool_mask,
                                                 G, policy_tokens_only=True)
    assert adv.shape == (N, T) and torch.equal(adv, expected) and not zero_std.any()
    assert (adv[tool_mask == 0] == 0).all() and (adv[completion_mask * tool_mask == 1] != 0).any()


def test_remax_with_tools_is_refused_in_one_line():
    # The multi-turn rollout samples no greedy completion: refused before anything is sampled.
    from minigrpo.collect import _sample

    with pytest.raises(ConfigError, match="greedy completion per prompt") as info:
        _sample(Config(advantage_estimator="remax"), None, [], 8, tools=object(), with_greedy=True)
    assert "\n" not in str(info.value)


def test_a_bad_new_option_is_one_line_from_the_cli(capsys):
    from minigrpo.cli import main

    assert main(["train", "--loss-type", "dro", "--dro-beta", "0"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "minigrpo train: error: dro_beta: must be > 0 (DRO's penalty), got 0.0"]
