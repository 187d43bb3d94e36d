"""Property tests (hypothesis): every advantage and every loss is finite, whatever the inputs.

Rewards: NaN (unscorable), all-equal groups, huge (1e30) and tiny (1e-30) magnitudes, float32 and float64.
Losses: every loss_type x importance_sampling_level, masks with empty rows, length-1 completions,
log-probs in [-50, 0] with token ratios up to e^±20, and garbage (-inf, NaN, 1e30) in padding positions,
which `policy_loss` documents may hold anything.
"""

import math

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from minigrpo.advantages import group_advantages, process_advantages, rloo_advantages
from minigrpo.kl import KL_ESTIMATORS, kl_divergence
from minigrpo.objectives import IMPORTANCE_SAMPLING_LEVELS, LOSS_TYPES, LOSSES, policy_loss

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)

HUGE = torch.tensor(1e30).item()  # float32-representable bounds for hypothesis' width=32 floats
TINY = torch.tensor(1e-30).item()


# ---------------------------------------------------------------------------------------------------------
# Rewards
# ---------------------------------------------------------------------------------------------------------
reward_value = st.one_of(
    st.sampled_from([0.0, 1.0, -1.0, 0.5, 0.1]),  # makes all-equal groups and ties common
    st.floats(-HUGE, HUGE, width=32),
    st.floats(-TINY, TINY, width=32),
    st.floats(-10.0, 10.0, width=32),
    st.just(math.nan),
)


@st.composite
def grouped_rewards(draw, min_group_size=1):
    """(rewards tensor, group_size): each group free, constant, or constant with some NaNs."""
    group_size = draw(st.integers(min_group_size, 6))
    num_prompts = draw(st.integers(1, 4))
    values = []
    for _ in range(num_prompts):
        mode = draw(st.sampled_from(["free", "constant", "constant_nan", "all_nan"]))
        if mode == "free":
            group = draw(st.lists(reward_value, min_size=group_size, max_size=group_size))
        elif mode == "all_nan":
            group = [math.nan] * group_size
        else:
            c = draw(reward_value.filter(lambda x: not math.isnan(x)))
            group = [c] * group_size
            if mode == "constant_nan":
                nan_at = draw(st.lists(st.booleans(), min_size=group_size, max_size=group_size))
                group = [math.nan if n else x for n, x in zip(nan_at, group)]
        values += group
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    return torch.tensor(values, dtype=dtype), group_size


def _groups_all_equal(rewards, group_size):
    """Per group: True when its non-NaN rewards are all equal (or there are none)."""
    out = []
    for g in rewards.view(-1, group_size):
        scored = g[~g.isnan()]
        out.append(bool(scored.numel() == 0 or (scored == scored[0]).all()))
    return out


@settings(max_examples=300, **SETTINGS)
@given(
    data=grouped_rewards(),
    scale=st.sampled_from(["group", "batch", "none"]),
    std=st.sampled_from(["sample", "population"]),
)
def test_group_advantages_finite_and_zero_for_degenerate_groups(data, scale, std):
    rewards, group_size = data
    adv, zero_std = group_advantages(rewards, group_size, scale=scale, std=std)
    assert adv.shape == rewards.shape and zero_std.shape == rewards.shape and zero_std.dtype == torch.bool
    assert torch.isfinite(adv).all(), (rewards.tolist(), adv.tolist())
    assert (adv[rewards.isnan()] == 0).all()
    for i, all_equal in enumerate(_groups_all_equal(rewards, group_size)):
        sl = slice(i * group_size, (i + 1) * group_size)
        if all_equal:
            assert (adv[sl] == 0).all(), (rewards.tolist(), adv.tolist())  # exactly 0, no rounding residue
            if not rewards[sl].isnan().all():
                assert zero_std[sl].all()
        else:
            assert not zero_std[sl].any()


@settings(max_examples=150, **SETTINGS)
@given(
    data=grouped_rewards(),
    scale=st.sampled_from(["group", "batch"]),
    std=st.sampled_from(["sample", "population"]),
)
@example(data=(torch.tensor([0.0, 1e-30]), 2), scale="group", std="sample")  # squared deviations underflow
def test_group_advantages_finite_without_eps(data, scale, std):
    """eps=0 is the documented setting for the papers' worked examples; it must not divide by a zero std."""
    rewards, group_size = data
    adv, _ = group_advantages(rewards, group_size, scale=scale, std=std, eps=0.0)
    assert torch.isfinite(adv).all(), (rewards.tolist(), group_size, adv.tolist())


@settings(max_examples=200, **SETTINGS)
@given(data=grouped_rewards(min_group_size=2))
@example(data=(torch.tensor([0.1, 0.1, 0.1]), 3))  # (sum - r) / (G - 1) != r in floating point
def test_rloo_advantages_finite_and_zero_for_degenerate_groups(data):
    rewards, group_size = data
    adv = rloo_advantages(rewards, group_size)
    assert adv.shape == rewards.shape
    assert torch.isfinite(adv).all(), (rewards.tolist(), adv.tolist())
    assert (adv[rewards.isnan()] == 0).all()
    for i, all_equal in enumerate(_groups_all_equal(rewards, group_size)):
        if all_equal:
            sl = slice(i * group_size, (i + 1) * group_size)
            assert (adv[sl] == 0).all(), (rewards.tolist(), group_size, adv.tolist())


def test_rloo_rejects_group_size_one():
    with pytest.raises(ValueError):
        rloo_advantages(torch.tensor([1.0, 2.0]), 1)


@st.composite
def process_batches(draw):
    group_size = draw(st.integers(1, 4))
    num_prompts = draw(st.integers(1, 3))
    N, K, T = group_size * num_prompts, draw(st.integers(1, 3)), draw(st.integers(1, 6))
    constant = draw(st.booleans())
    if constant:  # every valid step of every completion gets the same reward
        c = draw(reward_value.filter(lambda x: not math.isnan(x)))
        rewards = [c] * (N * K)
    else:
        rewards = draw(st.lists(reward_value, min_size=N * K, max_size=N * K))
    ends = draw(st.lists(st.integers(-1, T + 1), min_size=N * K, max_size=N * K))
    smask = draw(st.lists(st.booleans(), min_size=N * K, max_size=N * K))
    return (
        torch.tensor(rewards).view(N, K),
        torch.tensor(ends, dtype=torch.long).view(N, K),
        torch.tensor(smask, dtype=torch.float32).view(N, K),
        group_size,
        T,
        constant,
    )


@settings(max_examples=200, **SETTINGS)
@given(data=process_batches())
def test_process_advantages_finite(data):
    step_rewards, step_end, step_mask, group_size, T, constant = data
    adv = process_advantages(step_rewards, step_end, step_mask, group_size, T)
    assert adv.shape == (step_rewards.shape[0], T)
    assert torch.isfinite(adv).all(), (step_rewards.tolist(), step_end.tolist(), step_mask.tolist(), adv.tolist())
    if constant:
        assert (adv == 0).all()


# ---------------------------------------------------------------------------------------------------------
# KL estimators
# ---------------------------------------------------------------------------------------------------------
logprob = st.floats(-50.0, 0.0, width=32)


@settings(max_examples=200, **SETTINGS)
@given(
    pairs=st.lists(st.tuples(logprob, logprob), min_size=1, max_size=12),
    estimator=st.sampled_from(KL_ESTIMATORS),
)
def test_kl_estimators_finite(pairs, estimator):
    logp = torch.tensor([[p for p, _ in pairs]], requires_grad=True)
    ref = torch.tensor([[r for _, r in pairs]])
    kl = kl_divergence(logp, ref, estimator)
    assert kl.shape == logp.shape and torch.isfinite(kl).all()
    (grad,) = torch.autograd.grad(kl.sum(), logp)
    assert torch.isfinite(grad).all()
    if estimator in ("k2", "k3"):
        # >= 0 in exact arithmetic; allow float32 rounding of exp(x) - x - 1 near x = 0.
        assert (kl >= -1e-6).all(), kl.tolist()


# ---------------------------------------------------------------------------------------------------------
# Policy losses
# ---------------------------------------------------------------------------------------------------------
@st.composite
def loss_batches(draw):
    B, T = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    n = B * T

    def tensor(strategy, size=n, shape=(B, T)):
        return torch.tensor(draw(st.lists(strategy, min_size=size, max_size=size)), dtype=torch.float32).view(shape)

    old_logp = tensor(logprob)
    logp = (old_logp + tensor(st.floats(-20.0, 20.0, width=32))).clamp(-50.0, 0.0)  # ratios up to e^±20
    ref_logp = tensor(logprob)

    lengths = torch.tensor(draw(st.lists(st.sampled_from([0, 1, T]) | st.integers(0, T), min_size=B, max_size=B)))
    mask = (torch.arange(T) < lengths.unsqueeze(1)).float()
    if draw(st.booleans()):  # non-contiguous: some completion tokens masked out (e.g. tool output)
        mask = mask * tensor(st.sampled_from([0.0, 1.0]))
    if draw(st.integers(0, 9)) == 0:
        mask = torch.zeros(B, T)

    adv_2d = draw(st.booleans())
    adv_value = st.one_of(st.just(0.0), st.floats(-5.0, 5.0, width=32), st.floats(-1e6, 1e6, width=32))
    if draw(st.integers(0, 7)) == 0:
        adv_value = st.just(0.0)
    adv = tensor(adv_value) if adv_2d else tensor(adv_value, size=B, shape=(B,))

    garbage = draw(st.sampled_from([None, -math.inf, math.nan, 1e30]))
    if garbage is not None:  # padding positions "may hold anything (even -inf)"
        pad = mask == 0
        logp, old_logp, ref_logp = (x.masked_fill(pad, garbage) for x in (logp, old_logp, ref_logp))

    kwargs = dict(
        epsilon=draw(st.sampled_from([0.2, 0.1])),
        epsilon_high=draw(st.sampled_from([None, 0.28, 5.0])),
        delta=draw(st.sampled_from([None, 1.5])),
        beta=draw(st.sampled_from([0.0, 0.04])),
        kl_estimator=draw(st.sampled_from(KL_ESTIMATORS)),
        max_completion_length=T + draw(st.integers(0, 3)),
    )
    kwargs["ref_logp"] = ref_logp if kwargs["beta"] != 0.0 else None
    return logp, old_logp, adv, mask, kwargs, garbage


DRIFT_PENALTY = ("dro", "kimi")  # loss types whose default options add a penalty on log rho to every token


@pytest.mark.parametrize("level", IMPORTANCE_SAMPLING_LEVELS)
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@settings(max_examples=40, **SETTINGS)
@given(batch=loss_batches())
def test_policy_loss_and_gradient_finite(loss_type, level, batch):
    logp, old_logp, adv, mask, kwargs, garbage = batch
    logp = logp.clone().requires_grad_(True)
    call = lambda: policy_loss(  # noqa: E731
        logp, old_logp, adv, mask, loss_type=loss_type, importance_sampling_level=level, **kwargs
    )
    entry = LOSSES[loss_type]
    if level not in entry.levels or (entry.sequence_advantages_only and adv.dim() == 2):
        with pytest.raises(ValueError):  # declared by the loss type, e.g. GMPO's own sequence ratio from (B,) advantages
            call()
        return
    loss, stats = call()
    where = dict(logp=logp.tolist(), old_logp=old_logp.tolist(), adv=adv.tolist(), mask=mask.tolist(), **kwargs)
    assert loss.dim() == 0 and torch.isfinite(loss), where
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.isfinite(grad).all(), (grad.tolist(), where)
    assert (grad[mask == 0] == 0).all(), (grad.tolist(), where)  # padding never receives gradient
    for key, value in stats.items():
        assert math.isfinite(float(value)), (key, value, where)
    for key in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"):
        assert 0.0 <= float(stats[key]) <= 1.0, (key, stats[key], where)
    if kwargs["beta"] != 0.0:
        assert "kl" in stats
    # DRO's beta/2 (log rho)^2 and Kimi K2.5's tau (log rho)^2 pull every token back to pi_old, advantage or not: for
    # them, no advantage and no reference leaves that pull, which is 0 only on-policy
    on_policy = bool((torch.where(mask.bool(), logp - old_logp, 0.0) == 0).all())
    if mask.sum() == 0 or ((adv == 0).all() and kwargs["beta"] == 0.0 and (loss_type not in DRIFT_PENALTY or on_policy)):
        # nothing to learn from: no loss, no gradient
        assert loss.item() == 0.0, where
        assert (grad == 0).all(), where
