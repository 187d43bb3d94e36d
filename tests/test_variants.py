"""The variants beyond those of tests/test_objectives.py, against cases small enough to compute by hand (the
arithmetic is in the comments): the losses LUSPO, VESPO, GPG, Clip-Cov, KL-Cov and dual-clip; the off-policy
mask, top-entropy tokens, the entropy bonus and the bias-corrected KL; the advantage estimators REINFORCE++,
OPO, GRPO pass@k, pass@k training, GPG and GDPO. Then Config's checks on their fields, and two training steps of
each.
"""

import itertools
import math

import pytest
import torch

from minigrpo.advantages import (gpg_advantages, grpo_passk_advantages, normalize_then_sum_advantages,
                                 opo_advantages, pass_at_k_advantages, reinforce_pp_advantages,
                                 reinforce_pp_baseline_advantages)
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
])
def test_config_refuses_in_one_line(fields, match):
    with pytest.raises(ConfigError, match=match) as info:
        Config(**fields)
    assert "\n" not in str(info.value)


def test_config_accepts_each_variant():
    for loss_type in ("luspo", "vespo", "gpg", "clip_cov", "kl_cov"):
        Config(loss_type=loss_type)
    for estimator in ("reinforce_plus_plus", "reinforce_plus_plus_baseline", "opo", "grpo_passk", "pass_at_k", "gpg"):
        Config(advantage_estimator=estimator)
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
