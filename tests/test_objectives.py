"""Each objective against a case small enough to compute by hand."""

import math

import pytest
import torch

from minigrpo.kl import kl_divergence
from minigrpo.objectives import policy_loss

# Two sequences: three tokens and one token. Log-ratios chosen to land inside and outside the clip range.
LOG_RATIO = torch.tensor([[math.log(1.5), math.log(0.9), 0.0], [math.log(0.5), 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
OLD = torch.full((2, 3), -1.0)


def run(adv, **kw):
    logp = (OLD + LOG_RATIO).clone().requires_grad_()
    loss, stats = policy_loss(logp, OLD, torch.tensor(adv), MASK, **kw)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.item(), grad, stats


def test_grpo_token_level_by_hand():
    # A = [+1, -1], eps 0.2. Row 0 (A>0): rho 1.5 -> clipped to 1.2 (no gradient), 0.9, 1.0 -> losses -1.2, -0.9, -1.0
    # Row 1 (A<0): rho 0.5 -> min(0.5*-1, 0.8*-1) = -0.8 -> loss 0.8 (clipped, no gradient).
    loss, grad, stats = run([1.0, -1.0])
    assert loss == pytest.approx(((-1.2 - 0.9 - 1.0) / 3 + 0.8) / 2)
    # d/dlogp of -rho*A/(3*2) = -rho A / 6 for unclipped tokens of row 0
    assert grad.tolist() == [pytest.approx([0.0, -0.9 / 6, -1.0 / 6]), pytest.approx([0.0, 0.0, 0.0])]
    assert stats["clip_ratio/high_mean"] == pytest.approx(1 / 4)  # 1 of 4 tokens
    assert stats["clip_ratio/low_mean"] == pytest.approx(1 / 4)
    assert stats["clip_ratio/region_mean"] == pytest.approx(2 / 4)
    assert stats["ratio_mean"] == pytest.approx((1.5 + 0.9 + 1.0 + 0.5) / 4)


def test_aggregations_by_hand():
    per_token = [-1.2, -0.9, -1.0, 0.8]
    assert run([1.0, -1.0], loss_type="bnpo")[0] == pytest.approx(sum(per_token) / 4)
    assert run([1.0, -1.0], loss_type="dapo")[0] == pytest.approx(sum(per_token) / 4)
    assert run([1.0, -1.0], loss_type="dapo", num_items_in_batch=8)[0] == pytest.approx(sum(per_token) / 8)
    assert run([1.0, -1.0], loss_type="dr_grpo", max_completion_length=5)[0] == pytest.approx(sum(per_token) / (2 * 5))


def test_clip_higher():
    # eps_high 0.6: rho 1.5 is now inside [0.8, 1.6] and keeps its gradient.
    loss, grad, stats = run([1.0, -1.0], epsilon_high=0.6)
    assert loss == pytest.approx(((-1.5 - 0.9 - 1.0) / 3 + 0.8) / 2)
    assert grad[0, 0].item() == pytest.approx(-1.5 / 6)
    assert stats["clip_ratio/high_mean"] == 0.0


def test_two_sided_clipping_caps_negative_advantage_ratio():
    # A < 0 and rho = 3: plain PPO-clip takes max(3, 0.8)*1 -> loss 3; delta=2 caps it at 2.
    logp = torch.tensor([[math.log(3.0)]], requires_grad=True)
    old = torch.zeros(1, 1)
    mask = torch.ones(1, 1)
    plain, _ = policy_loss(logp, old, torch.tensor([-1.0]), mask)
    capped, _ = policy_loss(logp, old, torch.tensor([-1.0]), mask, delta=2.0)
    assert plain.item() == pytest.approx(3.0) and capped.item() == pytest.approx(2.0)
    assert torch.autograd.grad(capped, logp)[0].item() == 0.0


def test_gspo_sequence_ratio_by_hand():
    # Row 0: s = exp(mean(log 1.5, log 0.9, 0)) = (1.35)^(1/3) = 1.1052 -> inside [0.8, 1.2]; row 1: s = 0.5 -> clipped.
    loss, grad, _ = run([1.0, -1.0], importance_sampling_level="sequence")
    s0 = 1.35 ** (1 / 3)
    assert loss == pytest.approx((-s0 + 0.8) / 2)
    # d(-s0/2)/dlogp_t = -s0/2 * 1/3 for each token of row 0
    assert grad[0].tolist() == pytest.approx([-s0 / 6] * 3)
    assert grad[1].tolist() == [0.0, 0.0, 0.0]


def test_gspo_token_matches_gspo_with_sequence_advantages():
    # With one advantage per sequence, GSPO-token equals GSPO in value and gradient (paper, eq. 14).
    a = run([1.0, -1.0], importance_sampling_level="sequence")
    b = run([1.0, -1.0], importance_sampling_level="sequence_token")
    assert a[0] == pytest.approx(b[0]) and torch.allclose(a[1], b[1])


def test_gspo_token_gradient_follows_token_advantages():
    adv = [[2.0, 0.0, 1.0], [0.0, 0.0, 0.0]]
    loss, grad, _ = run(adv, importance_sampling_level="sequence_token")
    s0 = 1.35 ** (1 / 3)
    # loss = -(1/2) * (1/3) * sum_t s_{0,t} A_{0,t}; d s_{0,t} / d logp_t = s0 (only through its own token)
    assert loss == pytest.approx(-(s0 * 3.0) / 6)
    assert grad[0].tolist() == pytest.approx([-2 * s0 / 6, 0.0, -s0 / 6])


def test_gmpo_by_hand():
    # Row 0 (A=+1): log-ratios clipped at +0.4: [log 1.5 = 0.405 -> 0.4, log 0.9, 0] -> r0 = exp((0.4 + log 0.9)/3)
    # Row 1 (A=-1): log 0.5 = -0.69 clipped at -0.4 -> r1 = exp(-0.4).
    loss, grad, _ = run([1.0, -1.0], loss_type="gmpo")
    r0 = math.exp((0.4 + math.log(0.9)) / 3)
    r1 = math.exp(-0.4)
    assert loss == pytest.approx(-(1 * r0 - 1 * r1) / 2)
    assert grad[0].tolist() == pytest.approx([0.0, -r0 / 6, -r0 / 6])  # clipped token has no gradient
    assert grad[1].tolist() == [0.0, 0.0, 0.0]


def test_cispo_keeps_gradient_of_clipped_tokens():
    # Weight sg[min(rho, eps_max)] with eps_max = 1.2: row 0 weights [1.2, 0.9, 1.0], row 1 [0.5]; token-level mean.
    loss, grad, stats = run([1.0, -1.0], loss_type="cispo", epsilon_high=1.2)
    logp = OLD + LOG_RATIO
    expected = -(1.2 * logp[0, 0] + 0.9 * logp[0, 1] + 1.0 * logp[0, 2] - 0.5 * logp[1, 0]) / 4
    assert loss == pytest.approx(expected.item())
    assert grad.tolist() == [pytest.approx([-1.2 / 4, -0.9 / 4, -1.0 / 4]), pytest.approx([0.5 / 4, 0.0, 0.0])]
    assert stats["clip_ratio/high_mean"] == pytest.approx(1 / 4) and stats["clip_ratio/low_mean"] == 0.0


def test_cispo_unset_epsilon_high_caps_at_5_not_epsilon():
    # epsilon_high unset: eps_max = 5.0 (ScaleRL), so no weight here is capped: row 0 [1.5, 0.9, 1.0], row 1 [0.5].
    # (TRL would cap at epsilon = 0.2: every weight 0.2, i.e. 0.2 x REINFORCE.)
    loss, grad, stats = run([1.0, -1.0], loss_type="cispo")
    assert grad.tolist() == [pytest.approx([-1.5 / 4, -0.9 / 4, -1.0 / 4]), pytest.approx([0.5 / 4, 0.0, 0.0])]
    assert stats["clip_ratio/high_mean"] == 0.0
    assert loss == pytest.approx(run([1.0, -1.0], loss_type="cispo", epsilon_high=5.0)[0])
    _, grad_trl_default, _ = run([1.0, -1.0], loss_type="cispo", epsilon_high=0.2)
    assert grad_trl_default.tolist() == [pytest.approx([-0.2 / 4] * 3), pytest.approx([0.2 / 4, 0.0, 0.0])]
    # The other loss types still read epsilon_high = None as epsilon.
    assert run([1.0, -1.0], loss_type="dapo")[0] == pytest.approx(run([1.0, -1.0], loss_type="dapo", epsilon_high=0.2)[0])


def test_sapo_gate_has_unit_slope_at_ratio_one():
    logp = torch.zeros(1, 1, requires_grad=True)
    loss, _ = policy_loss(logp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), loss_type="sapo")
    assert loss.item() == pytest.approx(-2.0)  # -(4/1) * sigmoid(0) * 1
    assert torch.autograd.grad(loss, logp)[0].item() == pytest.approx(-1.0)  # = -A * d rho/d logp at rho = 1


def test_k3_kl_term_by_hand():
    beta = 0.1
    ref = OLD + torch.tensor([[0.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    logp = (OLD + LOG_RATIO).clone().requires_grad_()
    loss, stats = policy_loss(logp, OLD, torch.tensor([0.0, 0.0]), MASK, beta=beta, ref_logp=ref)
    kl = kl_divergence(OLD + LOG_RATIO, ref)  # (2, 3)
    expected = beta * ((kl[0] * MASK[0]).sum() / 3 + kl[1, 0]) / 2
    assert loss.item() == pytest.approx(expected.item())
    assert stats["kl"] == pytest.approx(((kl * MASK).sum() / 4).item())


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([-1.0]), torch.tensor([-2.0])  # log r = ref - logp = -1
    assert kl_divergence(logp, ref, "k1").item() == pytest.approx(1.0)
    assert kl_divergence(logp, ref, "k2").item() == pytest.approx(0.5)
    assert kl_divergence(logp, ref, "k3").item() == pytest.approx(math.exp(-1) + 1 - 1)
    with pytest.raises(ValueError, match="k4"):
        kl_divergence(logp, ref, "k4")


def test_kl_estimators_are_unbiased_or_not_as_documented():
    # Exact KL(p || q) of two categorical distributions vs. the mean estimate over many samples from p.
    torch.manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.3, 0.5])
    exact = (p * (p / q).log()).sum().item()
    idx = torch.multinomial(p, 200_000, replacement=True)
    est = {k: kl_divergence(p.log()[idx], q.log()[idx], k).mean().item() for k in ("k1", "k2", "k3")}
    assert est["k1"] == pytest.approx(exact, abs=5e-3)
    assert est["k3"] == pytest.approx(exact, abs=5e-3)
    assert abs(est["k2"] - exact) > 1e-2  # k2 is biased


def test_padding_garbage_never_reaches_the_loss():
    logp = torch.tensor([[-1.0, -float("inf")]], requires_grad=True)
    old = torch.tensor([[-1.0, float("nan")]])
    loss, stats = policy_loss(logp, old, torch.tensor([1.0]), torch.tensor([[1.0, 0.0]]), beta=0.1, ref_logp=old)
    (grad,) = torch.autograd.grad(loss, logp)
    assert math.isfinite(loss.item()) and grad.isfinite().all()


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"loss_type": "ppo"}, "loss_type"),
        ({"importance_sampling_level": "seq"}, "importance_sampling_level"),
        ({"beta": 0.1}, "ref_logp"),
        ({"loss_type": "dr_grpo"}, "max_completion_length"),
        ({"loss_type": "gmpo", "importance_sampling_level": "sequence"}, "gmpo"),
    ],
)
def test_bad_arguments_name_the_problem(kw, match):
    with pytest.raises(ValueError, match=match):
        run([1.0, -1.0], **kw)


def test_sapo_logs_its_gate_slope_not_ppo_clip_ratios():
    # SAPO clips nothing, so the clip ratios are 0 even though rho = 1.5 and 0.5 lie outside 1 +- 0.2.
    # Gate slope 4 s (1 - s), s = sigmoid(tau (rho - 1)); tau = 1 for row 0 (A > 0), 1.05 for row 1 (A < 0).
    _, _, stats = run([1.0, -1.0], loss_type="sapo")
    assert stats["clip_ratio/low_mean"] == stats["clip_ratio/high_mean"] == stats["clip_ratio/region_mean"] == 0.0

    def slope(rho, tau):
        s = 1 / (1 + math.exp(-tau * (rho - 1)))
        return 4 * s * (1 - s)

    expected = (slope(1.5, 1.0) + slope(0.9, 1.0) + slope(1.0, 1.0) + slope(0.5, 1.05)) / 4
    assert stats["sapo/gate_slope_mean"] == pytest.approx(expected)
