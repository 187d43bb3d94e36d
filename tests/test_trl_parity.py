"""Parity with TRL: `policy_loss` equals TRL 1.16's own `GRPOTrainer._compute_loss`, in value and gradient.

TRL is a test oracle only. We do not re-implement its loss here: we call its method unbound, on a small fake
`self` that carries the attributes the method reads, and whose `_get_per_token_logps_and_entropies` returns
our leaf log-prob tensor instead of running a model. Then the loss, d loss / d logp and the logged metrics
(clip ratios, kl) must match minigrpo's to 1e-5, in float64, over many random batches per configuration.

Skipped when trl is not installed (it is in the `dev` extra).
"""

import dataclasses
import math
import types
from collections import defaultdict

import pytest
import torch

trl = pytest.importorskip("trl")
grpo_trainer = pytest.importorskip("trl.trainer.grpo_trainer")

from minigrpo.objectives import policy_loss  # noqa: E402

GRPOTrainer = grpo_trainer.GRPOTrainer
CONFIG_DEFAULTS = {f.name: f.default for f in dataclasses.fields(trl.GRPOConfig)}

N_SEEDS = 50
TOL = dict(rtol=1e-5, atol=1e-5)
DTYPE = torch.float64

CLIP_FAMILY = ("grpo", "bnpo", "dr_grpo", "dapo")


# ---------------------------------------------------------------------------------------------------------
# The fake trainer: exactly the attributes `_compute_loss` reads on the path we exercise.
# ---------------------------------------------------------------------------------------------------------
class _Accelerator:
    num_processes = 1
    sync_gradients = True
    is_main_process = True

    def gather(self, x):
        return x

    def gather_for_metrics(self, x):
        return x

    def reduce(self, x, reduction="sum"):
        return x


class _FakeTrainer:
    def __init__(self, logp, *, loss_type, level, epsilon, epsilon_high, delta, beta, max_completion_length):
        self._logp = logp
        self.loss_type = loss_type
        self.importance_sampling_level = level
        # GRPOTrainer.__init__: epsilon_low = args.epsilon; epsilon_high = args.epsilon_high or args.epsilon
        self.epsilon_low = epsilon
        self.epsilon_high = epsilon if epsilon_high is None else epsilon_high
        self.beta = beta
        self.max_completion_length = max_completion_length
        self.top_entropy_quantile = 1.0
        self.off_policy_mask_threshold = None
        self.use_vllm = False
        self.vllm_importance_sampling_correction = False
        self.aux_loss_enabled = False
        self._entropy_bonus_enabled = False
        self.current_gradient_accumulation_steps = 1
        self.accelerator = _Accelerator()
        self.model = types.SimpleNamespace(training=True)
        self._metrics = defaultdict(lambda: defaultdict(list))
        self.args = types.SimpleNamespace(
            delta=delta,
            use_bias_correction_kl=False,
            steps_per_generation=1,
            sapo_temperature_pos=CONFIG_DEFAULTS["sapo_temperature_pos"],
            sapo_temperature_neg=CONFIG_DEFAULTS["sapo_temperature_neg"],
        )

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, **kwargs):
        assert logits_to_keep == self._logp.shape[1]
        return self._logp, torch.zeros_like(self._logp.detach()), None

    def metric(self, name):
        values = self._metrics["train"][name]
        assert len(values) == 1, (name, values)
        return values[0]


pytestmark = pytest.mark.usefixtures("single_torch_thread")  # conftest.py: one torch thread for this module


# ---------------------------------------------------------------------------------------------------------
# Random batches
# ---------------------------------------------------------------------------------------------------------
def make_batch(seed: int, adv_dim: int):
    g = torch.Generator().manual_seed(seed)

    def randint(lo, hi):  # inclusive
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    B, T = randint(1, 8), randint(1, 12)
    # Row lengths: plenty of empty and length-1 rows.
    u = torch.rand(B, generator=g)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths = torch.where(u < 0.15, 0, torch.where(u < 0.3, 1, lengths))
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).to(DTYPE)
    if seed % 4 == 3:  # non-contiguous masks (e.g. tool-output tokens masked out)
        mask = mask * (torch.rand(B, T, generator=g) < 0.7).to(DTYPE)

    # Log-ratio spread: per-row offset + per-token noise, at three scales so that the sequence-level (GSPO)
    # ratio also leaves the trust region, and CISPO's absolute cap 5.0 is exceeded sometimes.
    scale = (0.3, 1.0, 2.5)[seed % 3]
    old_logp = -5.0 * torch.rand(B, T, generator=g, dtype=DTYPE)
    log_ratio = scale * (0.6 * torch.randn(B, 1, generator=g, dtype=DTYPE) + torch.randn(B, T, generator=g, dtype=DTYPE))
    logp = old_logp + log_ratio
    ref_logp = logp + 0.5 * torch.randn(B, T, generator=g, dtype=DTYPE)

    if adv_dim == 1:
        adv = torch.randn(B, generator=g, dtype=DTYPE)
    else:
        adv = torch.randn(B, T, generator=g, dtype=DTYPE)
    adv = torch.where(torch.rand(adv.shape, generator=g) < 0.1, 0.0, adv)  # some exact zeros
    return dict(logp=logp, old_logp=old_logp, ref_logp=ref_logp, adv=adv, mask=mask, B=B, T=T, randint=randint)


def run_trl(batch, cfg):
    B, T = batch["B"], batch["T"]
    logp = batch["logp"].clone().requires_grad_(True)
    fake = _FakeTrainer(
        logp,
        loss_type=cfg["loss_type"],
        level=cfg["level"],
        epsilon=cfg["epsilon"],
        epsilon_high=cfg["epsilon_high"],
        delta=cfg["delta"],
        beta=cfg["beta"],
        max_completion_length=cfg["max_completion_length"],
    )
    inputs = {
        "prompt_ids": torch.zeros(B, 2, dtype=torch.long),
        "prompt_mask": torch.ones(B, 2, dtype=DTYPE),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": batch["mask"],
        "advantages": batch["adv"],
        "old_per_token_logps": batch["old_logp"],
        "ref_per_token_logps": batch["ref_logp"] if cfg["beta"] != 0.0 else None,
        # As TRL computes it for one process, no gradient accumulation: the batch's token count.
        "num_items_in_batch": torch.as_tensor(
            cfg["num_items_in_batch"] if cfg["num_items_in_batch"] is not None else batch["mask"].sum(), dtype=DTYPE
        ),
    }
    if "tool_mask" in batch:  # multi-turn: TRL's loss acts on completion_mask * tool_mask
        inputs["tool_mask"] = batch["tool_mask"]
    loss = GRPOTrainer._compute_loss(fake, fake.model, inputs)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad, fake


def run_minigrpo(batch, cfg):
    logp = batch["logp"].clone().requires_grad_(True)
    loss, stats = policy_loss(
        logp,
        batch["old_logp"],
        batch["adv"],
        batch["mask"] * batch.get("tool_mask", 1.0),  # the policy's tokens: tool output masked out
        loss_type=cfg["loss_type"],
        importance_sampling_level=cfg["level"],
        epsilon=cfg["epsilon"],
        epsilon_high=cfg["epsilon_high"],
        delta=cfg["delta"],
        beta=cfg["beta"],
        ref_logp=batch["ref_logp"] if cfg["beta"] != 0.0 else None,
        max_completion_length=cfg["max_completion_length"],
        num_items_in_batch=cfg["num_items_in_batch"],
        kl_estimator="k3",
    )
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad, stats


class _Lazy:
    def __init__(self, fn):
        self.fn = fn

    def __str__(self):
        return self.fn()


def describe(seed, batch, cfg):
    keep = {k: (v.tolist() if torch.is_tensor(v) else v) for k, v in batch.items() if k not in ("randint",)}
    return f"seed={seed} cfg={cfg}\ninputs={keep}"


# ---------------------------------------------------------------------------------------------------------
# The configurations: each its own test id.
# ---------------------------------------------------------------------------------------------------------
BASE = dict(epsilon=0.2, epsilon_high=None, delta=None, beta=0.0, num_items_in_batch=None)
VARIANTS = {
    "clip": {},
    "clip_higher": dict(epsilon_high=0.28),
    "delta": dict(delta=1.5),
    "kl": dict(beta=0.04),
    "all": dict(epsilon=0.1, epsilon_high=0.28, delta=1.5, beta=0.04),
}
CISPO_VARIANTS = {
    # TRL's default: epsilon_high unset falls back to epsilon = 0.2, used as the absolute cap. minigrpo's unset
    # default is 5.0 instead (cispo.py), so TRL's behaviour is checked with the 0.2 passed explicitly.
    "eps_high_default": dict(epsilon_high=0.2),
    "eps_max_5": dict(epsilon_high=5.0),
    "eps_max_5_kl": dict(epsilon_high=5.0, beta=0.04),
    "eps_max_1.28": dict(epsilon_high=1.28),
}
SAPO_VARIANTS = {"default": {}, "kl": dict(beta=0.04)}
# dapo/cispo also with a num_items_in_batch larger than the batch's own token count (TRL passes the whole
# generation batch's count), to check that minigrpo's `num_items_in_batch` means the same as TRL's.
VARIANTS_BY_LOSS = {
    **{lt: VARIANTS for lt in CLIP_FAMILY},
    "dapo": {**VARIANTS, "num_items": dict(num_items_in_batch="extra")},
    "cispo": {**CISPO_VARIANTS, "num_items": dict(epsilon_high=5.0, num_items_in_batch="extra")},
    "sapo": SAPO_VARIANTS,
}


# Per-token advantages (B, T) only change broadcasting: run them on a subset of the variants, to keep the
# file's runtime down (importing TRL's trainer alone takes ~7 s of CPU).
ADV_2D_VARIANTS = {"clip", "all", "eps_high_default", "eps_max_5_kl", "default", "kl"}


def _cases():
    for loss_type, variants in VARIANTS_BY_LOSS.items():
        for level in ("token", "sequence"):
            for adv_dim in (1, 2):
                for name, over in variants.items():
                    if adv_dim == 2 and name not in ADV_2D_VARIANTS:
                        continue
                    yield pytest.param(
                        loss_type, level, adv_dim, {**BASE, **over}, id=f"{loss_type}-{level}-adv{adv_dim}d-{name}"
                    )


@pytest.mark.parametrize("loss_type,level,adv_dim,variant", list(_cases()))
def test_policy_loss_matches_trl(loss_type, level, adv_dim, variant):
    seen = defaultdict(float)
    for seed in range(N_SEEDS):
        batch = make_batch(seed, adv_dim)
        T = batch["T"]
        cfg = dict(variant, loss_type=loss_type, level=level)
        cfg["max_completion_length"] = T if seed % 2 == 0 else T + batch["randint"](1, 5)
        if cfg["num_items_in_batch"] == "extra":
            cfg["num_items_in_batch"] = float(batch["mask"].sum()) + batch["randint"](0, 20)
        where = _Lazy(lambda: describe(seed, batch, cfg))  # formatted only if an assertion fails

        trl_loss, trl_grad, fake = run_trl(batch, cfg)
        mg_loss, mg_grad, stats = run_minigrpo(batch, cfg)

        torch.testing.assert_close(mg_loss, trl_loss, **TOL, msg=lambda m: f"loss differs from TRL: {m}\n{where}")
        torch.testing.assert_close(mg_grad, trl_grad, **TOL, msg=lambda m: f"gradient differs from TRL: {m}\n{where}")

        # TRL's metric helper decides "one value per sequence" from x.shape[1] == 1, so with T == 1 it also
        # averages token-level clip flags and the per-token kl over all B rows, padding included (a quirk of
        # TRL's logging only; its loss is right). The conventions agree when nothing is padded.
        metrics_comparable = T > 1 or bool(batch["mask"].all())
        if not metrics_comparable:
            seen["t1_padded_metric_skips"] += 1
        elif loss_type in CLIP_FAMILY:
            for key in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"):
                assert float(stats[key]) == pytest.approx(fake.metric(key), abs=1e-5), f"{key}\n{where}"
                seen[key] += fake.metric(key)
        elif loss_type == "cispo":
            # TRL logs CISPO's one-sided cap as cispo_clip_ratio; minigrpo reports it as the high clip ratio.
            assert float(stats["clip_ratio/high_mean"]) == pytest.approx(fake.metric("cispo_clip_ratio"), abs=1e-5), f"{where}"
            assert float(stats["clip_ratio/low_mean"]) == 0.0, f"{where}"
            seen["cispo_clip_ratio"] += fake.metric("cispo_clip_ratio")
        if cfg["beta"] != 0.0 and metrics_comparable:
            assert float(stats["kl"]) == pytest.approx(fake.metric("kl"), rel=1e-5, abs=1e-5), f"kl\n{where}"
            seen["kl"] += fake.metric("kl")

        # Bookkeeping so that the test fails if the random inputs stop exercising what they claim to.
        mask = batch["mask"]
        seen["empty_rows"] += float((mask.sum(-1) == 0).sum())
        seen["len1_rows"] += float((mask.sum(-1) == 1).sum())
        if cfg["delta"] is not None:
            log_ratio = (batch["logp"] - batch["old_logp"]) * mask
            if level == "sequence":
                log_ratio = (log_ratio.sum(-1) / mask.sum(-1).clamp(min=1)).unsqueeze(-1).expand_as(mask)
            adv = batch["adv"] if adv_dim == 2 else batch["adv"].unsqueeze(-1).expand_as(mask)
            seen["delta_active"] += float(((log_ratio > math.log(cfg["delta"])) & (adv < 0) & (mask > 0)).sum())

    assert seen["empty_rows"] > 0 and seen["len1_rows"] > 0, dict(seen)
    if loss_type in CLIP_FAMILY:
        assert seen["clip_ratio/low_mean"] > 0 and seen["clip_ratio/high_mean"] > 0, dict(seen)
    if loss_type == "cispo":
        assert seen["cispo_clip_ratio"] > 0, dict(seen)
    if variant["delta"] is not None:
        assert seen["delta_active"] > 0, dict(seen)
    if variant["beta"] != 0.0:
        assert seen["kl"] > 0, dict(seen)


@pytest.mark.parametrize("loss_type", list(VARIANTS_BY_LOSS))
def test_policy_loss_with_a_tool_mask_matches_trl(loss_type):
    """Multi-turn completions: tool-output tokens (tool_mask 0) are left out of the loss, as TRL 1.16 does."""
    for seed in range(8):
        batch = make_batch(seed, 1)
        g = torch.Generator().manual_seed(100 + seed)
        batch["tool_mask"] = (torch.rand(batch["B"], batch["T"], generator=g) < 0.6).to(DTYPE)
        cfg = dict(BASE, loss_type=loss_type, level="token", max_completion_length=batch["T"],
                   epsilon_high=5.0 if loss_type == "cispo" else None,
                   num_items_in_batch=float((batch["mask"] * batch["tool_mask"]).sum()))
        trl_loss, trl_grad, _ = run_trl(batch, cfg)
        mg_loss, mg_grad, _ = run_minigrpo(batch, cfg)
        torch.testing.assert_close(mg_loss, trl_loss, **TOL)
        torch.testing.assert_close(mg_grad, trl_grad, **TOL)
        assert (mg_grad * (1 - batch["tool_mask"])).abs().sum() == 0  # not one tool token learns
