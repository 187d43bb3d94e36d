"""The engine–trainer mismatch (engine_mismatch.py): a hand-computed case, properties, then parity with TRL 1.16.

No vLLM needed: the inputs are log-prob tensors. TRL's own lines are the oracle — the block of
`GRPOTrainer._generate_and_score_completions` that computes `vllm_importance_sampling_ratio`, and the one that
logs `sampling/*`, cut out of TRL's source by their first and last lines and executed on our tensors.
"""

import functools
import inspect
import math
import textwrap
import types
from collections import defaultdict

import pytest
import torch

from minigrpo.generation.engine_mismatch import IMPORTANCE_SAMPLING_MODES, importance_weights, mismatch_stats
from minigrpo.objectives import policy_loss


# ---------------------------------------------------------------------------------------------------------
# By hand: one completion of 3 tokens and one of 1 token (padded to 3).
# ---------------------------------------------------------------------------------------------------------
LN2 = math.log(2.0)
TRAINER = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, 0.0, 0.0]])
SAMPLER = torch.tensor([[-1.0 - LN2, -2.0 + LN2, -0.5 - 2 * LN2], [-0.3, 5.0, 5.0]])  # row 2: padding differs
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
# delta = trainer - sampler on tokens: [[ln2, -ln2, 2 ln2], [0, -, -]]  ->  per-token ratios [[2, 1/2, 4], [1]]


def test_token_ratios_by_hand():
    w = importance_weights(TRAINER, SAMPLER, MASK, mode="token_truncate", clip_max=3.0)
    torch.testing.assert_close(w[0], torch.tensor([2.0, 0.5, 3.0]))  # 4 truncated to C_max = 3
    w = importance_weights(TRAINER, SAMPLER, MASK, mode="token_mask", clip_min=0.6, clip_max=3.0)
    torch.testing.assert_close(w[0], torch.tensor([2.0, 0.0, 0.0]))  # 1/2 < C_min and 4 > C_max: masked
    assert w[1, 0] == 1.0  # identical log-probs: weight 1


def test_sequence_ratio_by_hand():
    # sequence 1: exp(ln2 - ln2 + 2 ln2) = 4; sequence 2: exp(0) = 1 (its padding is ignored)
    w = importance_weights(TRAINER, SAMPLER, MASK, mode="sequence_truncate", clip_max=3.0)
    torch.testing.assert_close(w, torch.tensor([[3.0], [1.0]]))
    w = importance_weights(TRAINER, SAMPLER, MASK, mode="sequence_mask", clip_max=3.0)  # TRL's default
    torch.testing.assert_close(w, torch.tensor([[0.0], [1.0]]))  # 4 > 3: the whole completion drops out


def test_mismatch_stats_by_hand():
    stats = mismatch_stats(TRAINER, SAMPLER, MASK)
    # |delta| over the 4 completion tokens: ln2, ln2, 2 ln2, 0 -> mean ln2, max 2 ln2
    assert stats["sampling/sampling_logp_difference/mean"] == pytest.approx(LN2)
    assert stats["sampling/sampling_logp_difference/max"] == pytest.approx(2 * LN2)
    # k3 per token: r - 1 - ln r with r = 2, 1/2, 4:  (1 - ln2) + (-1/2 + ln2) + (3 - 2 ln2) = 3.5 - 2 ln2;
    # sequence 2: 0. Mean over the 2 sequences:
    assert stats["sampling/sequence_kl/mean"] == pytest.approx((3.5 - 2 * LN2) / 2)
    assert "sampling/importance_sampling_ratio/mean" not in stats  # only with a weight


def test_token_weights_scale_each_tokens_loss():
    """policy_loss(token_weights=w): each token's loss times w, so with all ratios 1 (on-policy) the GRPO loss is
    -mean_i mean_t w_{i,t} A_i, and its gradient w.r.t. logp_{i,t} is -w_{i,t} A_i / |o_i| / B."""
    logp = TRAINER.clone().requires_grad_(True)
    adv = torch.tensor([1.0, -2.0])
    w = torch.tensor([[2.0, 0.5, 0.0], [1.0, 7.0, 7.0]])  # padding weights are ignored
    loss, _ = policy_loss(logp, TRAINER, adv, MASK, token_weights=w)
    # row 1: -(2 + 0.5 + 0) * 1 / 3 = -5/6; row 2: -(1 * -2) / 1 = 2;  mean: (2 - 5/6) / 2 = 7/12
    assert loss.item() == pytest.approx(7 / 12)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-2 / 6, -0.5 / 6, 0.0], [2 / 2, 0.0, 0.0]]))


def test_nan_sampling_logp_counts_as_no_correction():
    sampler = SAMPLER.clone()
    sampler[0, 1] = float("nan")  # a token vLLM gave no log-prob for
    w = importance_weights(TRAINER, sampler, MASK, mode="token_truncate", clip_max=None)
    assert w[0, 1] == 1.0 and not w.isnan().any()
    stats = mismatch_stats(TRAINER, sampler, MASK)
    assert stats["sampling/sampling_logp_difference/mean"] == pytest.approx(LN2)  # (ln2 + 2 ln2 + 0) / 3


@pytest.mark.parametrize("mode", IMPORTANCE_SAMPLING_MODES)
def test_equal_log_probs_give_weight_one_and_zero_mismatch(mode):
    g = torch.Generator().manual_seed(0)
    logp = -3 * torch.rand(4, 6, generator=g)
    mask = (torch.rand(4, 6, generator=g) < 0.7).float()
    w = importance_weights(logp, logp, mask, mode=mode)
    assert torch.equal(w, torch.ones_like(w))
    stats = mismatch_stats(logp, logp, mask, w, mode)
    assert stats["sampling/sampling_logp_difference/max"] == 0.0 and stats["sampling/sequence_kl/mean"] == 0.0


def test_bad_mode_is_one_line():
    with pytest.raises(ValueError, match="mode must be one of"):
        importance_weights(TRAINER, SAMPLER, MASK, mode="token")
    with pytest.raises(ValueError, match="token_weights: gmpo"):
        policy_loss(TRAINER, TRAINER, torch.ones(2), MASK, loss_type="gmpo", token_weights=torch.ones(2, 3))


# ---------------------------------------------------------------------------------------------------------
# Parity with TRL 1.16
# ---------------------------------------------------------------------------------------------------------
try:
    import trl.trainer.grpo_trainer as trl_grpo
except ImportError:  # the parity tests need trl (the dev extra); the hand-computed ones above do not
    trl_grpo = None
needs_trl = pytest.mark.skipif(trl_grpo is None, reason="TRL parity needs trl (the dev extra)")


def _trl_block(first: str, last: str, back: int = 0) -> types.CodeType:
    """Lines of TRL's `_generate_and_score_completions` from the one starting with `first` (or `back` lines before
    it) up to, not including, the next one starting with `last`; dedented and compiled."""
    lines = inspect.getsource(trl_grpo.GRPOTrainer._generate_and_score_completions).splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(first)) - back
    end = next(i for i in range(start + 1, len(lines)) if lines[i].strip().startswith(last))
    return compile(textwrap.dedent("\n".join(lines[start:end])), "trl-grpo-trainer-block", "exec")


@functools.cache
def _trl_code():
    weights = _trl_block("# Compute the importance sampling ratio when using vLLM",
                         "# Compute the per-token log probabilities for the reference model")
    metrics = _trl_block("delta = torch.abs(old_per_token_logps - sampling_per_token_logps)", "output = {", back=1)
    return weights, metrics


class _Accelerator:
    def gather(self, x):
        return x


def run_trl(trainer_logp, sampling_logp, mask, mode, clip_min, clip_max):
    """TRL's two blocks, run on a fake `self` holding the attributes they read."""
    weights_code, metrics_code = _trl_code()
    fake = types.SimpleNamespace(
        use_vllm=True, vllm_importance_sampling_correction=True, vllm_importance_sampling_mode=mode,
        vllm_importance_sampling_clip_min=clip_min, vllm_importance_sampling_clip_max=clip_max,
        accelerator=_Accelerator(), _metrics=defaultdict(lambda: defaultdict(list)),
    )
    scope = dict(vars(trl_grpo), self=fake, old_per_token_logps=trainer_logp,
                 sampling_per_token_logps=sampling_logp, completion_mask=mask, tool_mask=None, device="cpu",
                 mode="train")
    exec(weights_code, scope)
    exec(metrics_code, scope)
    metrics = {k: v[0] for k, v in fake._metrics["train"].items()}
    return scope["vllm_importance_sampling_ratio"], metrics


def random_batch(seed):
    g = torch.Generator().manual_seed(seed)
    B, T = int(torch.randint(1, 7, (1,), generator=g)), int(torch.randint(1, 10, (1,), generator=g))
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    mask = (torch.arange(T) < lengths.unsqueeze(1)).double()  # (B, T), some rows empty
    trainer_logp = -4 * torch.rand(B, T, generator=g, dtype=torch.float64)
    scale = (0.05, 0.5, 1.5)[seed % 3]  # small, medium and large mismatches: the caps bind sometimes
    sampling_logp = trainer_logp + scale * torch.randn(B, T, generator=g, dtype=torch.float64)
    if seed % 5 == 4:
        sampling_logp[0, 0] = float("nan")  # a token vLLM returned no log-prob for
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return trainer_logp, sampling_logp, mask, adv


CAPS = {"default": (None, 3.0), "both": (0.5, 2.0), "max_only": (None, 1.5), "min_only": (0.8, None)}


@needs_trl
@pytest.mark.parametrize("caps", CAPS)
@pytest.mark.parametrize("mode", IMPORTANCE_SAMPLING_MODES)
def test_weights_and_metrics_match_trl(mode, caps):
    clip_min, clip_max = CAPS[caps]
    changed = 0
    for seed in range(40):
        trainer_logp, sampling_logp, mask, _ = random_batch(seed)
        trl_w, trl_metrics = run_trl(trainer_logp, sampling_logp, mask, mode, clip_min, clip_max)
        w = importance_weights(trainer_logp, sampling_logp, mask, mode=mode, clip_min=clip_min, clip_max=clip_max)
        torch.testing.assert_close(w, trl_w, rtol=1e-12, atol=0, msg=lambda m: f"seed {seed}: {m}")
        stats = mismatch_stats(trainer_logp, sampling_logp, mask, w, mode)
        for key, value in trl_metrics.items():  # TRL logs the difference and ratio metrics; sequence_kl is ours
            assert stats[key] == pytest.approx(value, rel=1e-12, abs=1e-12), (seed, key)
        assert set(trl_metrics) == set(stats) - {"sampling/sequence_kl/mean"}
        uncapped = importance_weights(trainer_logp, sampling_logp, mask, mode=mode, clip_min=None, clip_max=None)
        changed += not torch.equal(w, uncapped)
    assert changed > 0  # the random inputs reach the caps, or the modes are not being told apart


@needs_trl
@pytest.mark.parametrize("mode", IMPORTANCE_SAMPLING_MODES)
def test_weighted_loss_matches_trl_in_value_and_gradient(mode):
    """TRL's `_compute_loss` with use_vllm and the correction on multiplies each token's loss by
    inputs["importance_sampling_ratio"]; policy_loss(token_weights=w) must equal it, loss and d loss / d logp."""
    from test_trl_parity import _FakeTrainer  # the fake `self` TRL's loss reads, shared with the parity tests

    for seed in range(20):
        trainer_logp, sampling_logp, mask, adv = random_batch(seed)
        w = importance_weights(trainer_logp, sampling_logp, mask, mode=mode, clip_max=2.0)
        logp = (trainer_logp + 0.3 * torch.randn_like(trainer_logp)).requires_grad_(True)  # after an update
        for loss_type in ("grpo", "dapo"):
            fake = _FakeTrainer(logp, loss_type=loss_type, level="token", epsilon=0.2, epsilon_high=None,
                                delta=None, beta=0.0, max_completion_length=mask.shape[1])
            fake.use_vllm = fake.vllm_importance_sampling_correction = True
            B, T = mask.shape
            inputs = {
                "prompt_ids": torch.zeros(B, 2, dtype=torch.long), "prompt_mask": torch.ones(B, 2),
                "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask, "advantages": adv,
                "old_per_token_logps": trainer_logp, "importance_sampling_ratio": w,
                "num_items_in_batch": mask.sum(),
            }
            trl_loss = trl_grpo.GRPOTrainer._compute_loss(fake, fake.model, inputs)
            (trl_grad,) = torch.autograd.grad(trl_loss, logp)
            loss, _ = policy_loss(logp, trainer_logp, adv, mask, loss_type=loss_type, token_weights=w)
            (grad,) = torch.autograd.grad(loss, logp)
            torch.testing.assert_close(loss, trl_loss.detach(), rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(grad, trl_grad, rtol=1e-10, atol=1e-12)
