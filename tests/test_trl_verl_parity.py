"""Parity with TRL and verl for the variants tests/test_trl_parity.py does not cover, in value and gradient.

TRL 1.16 (`GRPOTrainer._compute_loss`, called unbound on a fake trainer as in tests/test_trl_parity.py): luspo,
vespo (with and without the vLLM sampler weights), off_policy_mask_threshold, top_entropy_quantile,
entropy_coef and use_bias_correction_kl. verl's core_algos (`pip install --no-deps -r tests/verl-requirements.txt`,
part of the README's test command): dual-clip (= minigrpo's delta), gpg, clip_cov, kl_cov, dppo_tv, dppo_kl, dro, and
the advantage estimators reinforce_plus_plus(_baseline), opo, grpo_passk, gpg, gdpo, remax, optimal_token_baseline and
tir_optimal_token_baseline. Float64, many random batches per case.
"""

import math
import types
import warnings

import numpy as np
import pytest
import torch

from minigrpo.advantages import (gpg_advantages, grpo_passk_advantages, normalize_then_sum_advantages,
                                 opo_advantages, optimal_token_baseline_advantages, reinforce_pp_advantages,
                                 reinforce_pp_baseline_advantages, remax_advantages)
from minigrpo.objectives import policy_loss

N_SEEDS = 40
TOL = dict(rtol=1e-6, atol=1e-6)
DTYPE = torch.float64


pytestmark = pytest.mark.usefixtures("single_torch_thread")  # conftest.py: one torch thread for this module


def make_batch(seed: int, adv_dim: int = 1):
    """Random (B, T) log-probs with ragged, sometimes empty rows; advantages with some exact zeros."""
    g = torch.Generator().manual_seed(seed)
    B, T = int(torch.randint(2, 9, (1,), generator=g)), int(torch.randint(2, 13, (1,), generator=g))
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[0] = T  # at least one full row
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).to(DTYPE)
    scale = (0.3, 1.0, 2.0)[seed % 3]
    old_logp = -4.0 * torch.rand(B, T, generator=g, dtype=DTYPE) - 0.05
    logp = old_logp + scale * (0.5 * torch.randn(B, 1, generator=g, dtype=DTYPE) + torch.randn(B, T, generator=g,
                                                                                               dtype=DTYPE))
    sampling_logp = old_logp + 0.3 * torch.randn(B, T, generator=g, dtype=DTYPE)
    ref_logp = logp + 0.5 * torch.randn(B, T, generator=g, dtype=DTYPE)
    adv = torch.randn((B,) if adv_dim == 1 else (B, T), generator=g, dtype=DTYPE)
    adv = torch.where(torch.rand(adv.shape, generator=g) < 0.1, 0.0, adv)
    entropies = 3.0 * torch.rand(B, T, generator=g, dtype=DTYPE)
    return dict(logp=logp, old_logp=old_logp, sampling_logp=sampling_logp, ref_logp=ref_logp, adv=adv, mask=mask,
                entropies=entropies, B=B, T=T)


# ---------------------------------------------------------------------------------------------------------
# TRL
# ---------------------------------------------------------------------------------------------------------
class TestTRL:
    @pytest.fixture(autouse=True, scope="class")
    @classmethod
    def _trl(cls):
        pytest.importorskip("trl")
        grpo_trainer = pytest.importorskip("trl.trainer.grpo_trainer")
        cls.GRPOTrainer = grpo_trainer.GRPOTrainer

    def fake(self, logp, entropies, cfg):
        """A `self` for GRPOTrainer._compute_loss: the attributes it reads on the paths exercised here."""
        T = self.GRPOTrainer

        class Accelerator:
            num_processes = 1
            sync_gradients = True

            gather = gather_for_metrics = staticmethod(lambda x: x)
            reduce = staticmethod(lambda x, reduction="sum": x)
            pad_across_processes = staticmethod(lambda x, dim=0, pad_index=0, pad_first=False: x)

        class Fake:
            get_high_entropy_mask = T.get_high_entropy_mask
            get_off_policy_mask = staticmethod(T.get_off_policy_mask)
            get_gamma_weights = staticmethod(T.get_gamma_weights)

            def _get_per_token_logps_and_entropies(self, *args, **kwargs):
                return logp, entropies, None

        fake = Fake()
        fake.loss_type, fake.importance_sampling_level = cfg["loss_type"], cfg["level"]
        fake.epsilon_low, fake.epsilon_high = 0.2, 0.28
        fake.beta, fake.max_completion_length = cfg.get("beta", 0.0), None
        fake.top_entropy_quantile = cfg.get("top_entropy_quantile", 1.0)
        fake.off_policy_mask_threshold = cfg.get("off_policy_mask_threshold")
        fake.use_vllm = fake.vllm_importance_sampling_correction = cfg.get("is_weights", False)
        fake.entropy_coef, fake.use_adaptive_entropy = cfg.get("entropy_coef", 0.0), False
        fake._entropy_bonus_enabled = fake.entropy_coef != 0.0
        fake.aux_loss_enabled, fake.current_gradient_accumulation_steps = False, 1
        fake.accelerator, fake.model = Accelerator(), types.SimpleNamespace(training=True)
        from collections import defaultdict

        fake._metrics = defaultdict(lambda: defaultdict(list))
        fake.args = types.SimpleNamespace(delta=None, use_bias_correction_kl=cfg.get("use_bias_correction_kl", False),
                                          steps_per_generation=1, vespo_k_pos=2.0, vespo_lambda_pos=3.0,
                                          vespo_k_neg=3.0, vespo_lambda_neg=2.0)
        return fake

    def run_both(self, batch, cfg):
        B, T, mask = batch["B"], batch["T"], batch["mask"]
        is_weights = None
        if cfg.get("is_weights"):
            # A sequence-level (B, 1) or token-level (B, T) sampler weight, 1 on padding (engine_mismatch.py's).
            g = torch.Generator().manual_seed(B * 100 + T)
            shape = (B, 1) if cfg["is_weights"] == "sequence" else (B, T)
            is_weights = torch.exp(0.3 * torch.randn(shape, generator=g, dtype=DTYPE))
            is_weights = is_weights if shape[1] == 1 else torch.where(mask.bool(), is_weights, 1.0)
        needs_entropy = cfg.get("top_entropy_quantile", 1.0) < 1.0 or cfg.get("entropy_coef", 0.0) != 0.0

        logp = batch["logp"].clone().requires_grad_(True)
        entropies = batch["entropies"].clone().requires_grad_(True)
        fake = self.fake(logp, entropies, cfg)
        inputs = {"prompt_ids": torch.zeros(B, 2, dtype=torch.long), "prompt_mask": torch.ones(B, 2, dtype=DTYPE),
                  "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask,
                  "advantages": batch["adv"], "old_per_token_logps": batch["old_logp"],
                  "ref_per_token_logps": batch["ref_logp"] if cfg.get("beta") else None,
                  "num_items_in_batch": mask.sum()}
        if cfg.get("sampling"):
            inputs["sampling_per_token_logps"] = batch["sampling_logp"]
        if is_weights is not None:
            inputs["importance_sampling_ratio"] = is_weights
        trl_loss = self.GRPOTrainer._compute_loss(fake, fake.model, inputs)
        trl_grads = torch.autograd.grad(trl_loss, [logp, entropies], allow_unused=True)

        logp = batch["logp"].clone().requires_grad_(True)
        entropies = batch["entropies"].clone().requires_grad_(True)
        mg_loss, stats = policy_loss(
            logp, batch["old_logp"], batch["adv"], mask, loss_type=cfg["loss_type"],
            importance_sampling_level=cfg["level"], epsilon=0.2, epsilon_high=0.28, beta=cfg.get("beta", 0.0),
            ref_logp=batch["ref_logp"] if cfg.get("beta") else None,
            use_bias_correction_kl=cfg.get("use_bias_correction_kl", False), token_weights=is_weights,
            off_policy_mask_threshold=cfg.get("off_policy_mask_threshold"),
            sampling_logp=batch["sampling_logp"] if cfg.get("sampling") else None,
            entropies=entropies if needs_entropy else None, top_entropy_quantile=cfg.get("top_entropy_quantile", 1.0),
            entropy_coef=cfg.get("entropy_coef", 0.0))
        mg_grads = torch.autograd.grad(mg_loss, [logp, entropies], allow_unused=True)
        return (trl_loss, trl_grads, fake), (mg_loss, mg_grads, stats)

    CASES = {
        "luspo-sequence": dict(loss_type="luspo", level="sequence"),
        "luspo-token": dict(loss_type="luspo", level="token"),
        "luspo-sequence-kl": dict(loss_type="luspo", level="sequence", beta=0.04),
        "vespo-token": dict(loss_type="vespo", level="token"),
        "vespo-sequence-kl": dict(loss_type="vespo", level="sequence", beta=0.04),
        "vespo-token-is-weights": dict(loss_type="vespo", level="token", is_weights="token"),
        "vespo-sequence-is-weights": dict(loss_type="vespo", level="token", is_weights="sequence"),
        "off-policy-mask-grpo": dict(loss_type="grpo", level="token", off_policy_mask_threshold=0.3),
        "off-policy-mask-dapo-sampler": dict(loss_type="dapo", level="token", off_policy_mask_threshold=0.2,
                                             sampling=True),
        "off-policy-mask-sequence": dict(loss_type="grpo", level="sequence", off_policy_mask_threshold=0.3),
        "top-entropy-grpo": dict(loss_type="grpo", level="token", top_entropy_quantile=0.2),
        "top-entropy-dapo-kl": dict(loss_type="dapo", level="token", top_entropy_quantile=0.5, beta=0.04),
        "top-entropy-sequence": dict(loss_type="grpo", level="sequence", top_entropy_quantile=0.0),
        "entropy-bonus-grpo": dict(loss_type="grpo", level="token", entropy_coef=0.01),
        "entropy-bonus-top-entropy-dapo": dict(loss_type="dapo", level="token", entropy_coef=0.05,
                                               top_entropy_quantile=0.3),
        "bias-corrected-kl-token": dict(loss_type="grpo", level="token", beta=0.04, use_bias_correction_kl=True),
        "bias-corrected-kl-sequence": dict(loss_type="dapo", level="sequence", beta=0.1, use_bias_correction_kl=True),
        "everything-dapo": dict(loss_type="dapo", level="token", beta=0.04, use_bias_correction_kl=True,
                                off_policy_mask_threshold=0.3, top_entropy_quantile=0.4, entropy_coef=0.02,
                                is_weights="token"),
    }

    @pytest.mark.parametrize("name", list(CASES))
    @pytest.mark.parametrize("adv_dim", [1, 2])
    def test_policy_loss_matches_trl(self, name, adv_dim):
        cfg = self.CASES[name]
        masked_somewhere = 0.0
        for seed in range(N_SEEDS):
            batch = make_batch(seed, adv_dim)
            (trl_loss, trl_grads, fake), (mg_loss, mg_grads, stats) = self.run_both(batch, cfg)
            where = f"{name} seed={seed}"
            torch.testing.assert_close(mg_loss.detach(), trl_loss.detach(), **TOL, msg=lambda m: f"loss {where}: {m}")
            for mine, theirs in zip(mg_grads, trl_grads):
                if theirs is None:
                    assert mine is None or (mine == 0).all(), where
                else:
                    torch.testing.assert_close(mine, theirs, **TOL, msg=lambda m: f"gradient {where}: {m}")
            if cfg["loss_type"] == "vespo":
                assert stats["vespo/phi_seq_mean"] == pytest.approx(fake._metrics["train"]["vespo/phi_seq_mean"][0],
                                                                    abs=1e-6), where
            if cfg.get("beta"):
                assert stats["kl"] == pytest.approx(fake._metrics["train"]["kl"][0], abs=1e-6), where
            masked_somewhere += 1 - stats.get("off_policy_mask/kept_frac", 1.0)
            masked_somewhere += 1 - stats.get("entropy_mask/kept_frac", 1.0)
        if "off_policy_mask_threshold" in cfg or cfg.get("top_entropy_quantile", 1.0) < 1.0:
            assert masked_somewhere > 0, "the random batches never exercised the mask"


# ---------------------------------------------------------------------------------------------------------
# verl
# ---------------------------------------------------------------------------------------------------------
class _VerlConfig(dict):
    """verl's policy-loss functions read config.x, config.get("x") and config.policy_loss.x."""

    __getattr__ = dict.get


@pytest.fixture(scope="module")
def core_algos():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pytest.importorskip("verl.trainer.ppo.core_algos")


def verl_actor_config(**policy_loss_fields):
    return _VerlConfig(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0,
                       global_batch_info={}, policy_loss=_VerlConfig(**policy_loss_fields))


VERL_LOSSES = {
    # name: (verl loss_mode, verl policy_loss fields, minigrpo kwargs)
    "dual-clip-is-delta": ("vanilla", {}, dict(loss_type="dapo", delta=3.0)),
    "gpg": ("gpg", {}, dict(loss_type="gpg")),
    "clip_cov": ("clip_cov", dict(clip_cov_ratio=0.2, clip_cov_lb=0.0, clip_cov_ub=2.0),
                 dict(loss_type="clip_cov", clip_cov_ratio=0.2, clip_cov_lb=0.0, clip_cov_ub=2.0)),
    "kl_cov": ("kl_cov", dict(kl_cov_ratio=0.2, ppo_kl_coef=1.0), dict(loss_type="kl_cov", kl_cov_ratio=0.2)),
}


@pytest.mark.parametrize("name", list(VERL_LOSSES))
def test_policy_loss_matches_verl(core_algos, name):
    mode, fields, kwargs = VERL_LOSSES[name]
    verl_loss_fn = core_algos.get_policy_loss_fn(mode)
    seen = 0.0
    for seed in range(N_SEEDS):
        batch = make_batch(seed)
        mask = batch["mask"]
        adv_tokens = batch["adv"].unsqueeze(-1).expand_as(mask).contiguous()  # verl's advantages are (B, T)
        # verl reads garbage-free padding; give it the same zeros minigrpo puts there
        logp = torch.where(mask.bool(), batch["logp"], 0.0).requires_grad_(True)
        old = torch.where(mask.bool(), batch["old_logp"], 0.0)
        torch.manual_seed(seed)  # Clip-Cov's random pick: verl uses the global generator
        verl_loss, _ = verl_loss_fn(old, logp, adv_tokens, mask, "token-mean", verl_actor_config(**fields))
        (verl_grad,) = torch.autograd.grad(verl_loss, logp)

        logp_mg = batch["logp"].clone().requires_grad_(True)
        torch.manual_seed(seed)
        mg_loss, stats = policy_loss(logp_mg, batch["old_logp"], batch["adv"], mask, epsilon=0.2, epsilon_high=0.28,
                                     **kwargs)
        (mg_grad,) = torch.autograd.grad(mg_loss, logp_mg)
        torch.testing.assert_close(mg_loss.detach(), verl_loss.detach(), **TOL,
                                   msg=lambda m: f"{name} seed={seed}: {m}")
        torch.testing.assert_close(mg_grad, verl_grad, **TOL, msg=lambda m: f"{name} gradient seed={seed}: {m}")
        seen += stats.get("clip_cov/detached_frac", 0.0) + stats.get("kl_cov/penalised_frac", 0.0)
        if name == "dual-clip-is-delta":
            log_ratio = (batch["logp"] - batch["old_logp"]) * mask
            seen += float(((log_ratio > math.log(3.0)) & (adv_tokens < 0)).sum())
    assert name == "gpg" or seen > 0, "the random batches never exercised the variant"


def _verl_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """verl's token_level_rewards: each completion's reward on its last token."""
    token_rewards = torch.zeros_like(mask)
    last = (mask.sum(-1) - 1).clamp(min=0).long()
    token_rewards[torch.arange(len(rewards)), last] = rewards * (mask.sum(-1) > 0)
    return token_rewards


def _reward_batch(seed: int, G: int, values=(0.0, 1.0, 0.5, 2.0)):
    g = torch.Generator().manual_seed(seed)
    P, T = int(torch.randint(2, 6, (1,), generator=g)), int(torch.randint(1, 8, (1,), generator=g))
    N = P * G
    rewards = torch.tensor(values, dtype=DTYPE)[torch.randint(len(values), (N,), generator=g)]
    lengths = torch.randint(1, T + 1, (N,), generator=g)
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).to(DTYPE)
    index = np.repeat(np.arange(P), G)
    return rewards, mask, index


@pytest.mark.parametrize("G", [2, 4, 5])
def test_advantages_match_verl(core_algos, G):
    config = _VerlConfig(gamma=1.0, norm_adv_by_std_in_grpo=True)
    for seed in range(N_SEEDS):
        rewards, mask, index = _reward_batch(seed, G)
        token_rewards = _verl_rewards(rewards, mask)
        where = f"G={G} seed={seed}"

        verl_adv, _ = core_algos.compute_reinforce_plus_plus_outcome_advantage(token_rewards.clone(), mask,
                                                                                config=config)
        torch.testing.assert_close(reinforce_pp_advantages(rewards, mask), verl_adv, **TOL, msg=where)
        verl_adv, _ = core_algos.compute_reinforce_plus_plus_outcome_advantage(
            token_rewards.clone(), mask, config=_VerlConfig(gamma=0.7))
        torch.testing.assert_close(reinforce_pp_advantages(rewards, mask, gamma=0.7), verl_adv, **TOL, msg=where)

        verl_adv, _ = core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(token_rewards.clone(), mask,
                                                                                         index, config=config)
        mine = reinforce_pp_baseline_advantages(rewards, G, mask).unsqueeze(-1) * mask
        torch.testing.assert_close(mine, verl_adv, **TOL, msg=where)

        verl_adv, _ = core_algos.compute_opo_outcome_advantage(token_rewards.clone(), mask, index, config=config)
        mine = opo_advantages(rewards, G, mask.sum(-1)).unsqueeze(-1) * mask
        torch.testing.assert_close(mine, verl_adv, **TOL, msg=where)

        verl_adv, _ = core_algos.compute_grpo_passk_outcome_advantage(token_rewards.clone(), mask, index,
                                                                       config=config)
        mine = grpo_passk_advantages(rewards, G, eps=1e-6).unsqueeze(-1) * mask
        torch.testing.assert_close(mine, verl_adv, **TOL, msg=where)


@pytest.mark.parametrize("G", [2, 4])
def test_gpg_advantages_match_verl_where_both_count_the_same(core_algos, G):
    # verl's alpha counts non-zero raw rewards, GPG's the completions of informative groups: they agree when every
    # all-equal group is all zeros and informative groups hold no zero reward (rewards 1..3 there).
    for seed in range(N_SEEDS):
        rewards, mask, index = _reward_batch(seed, G, values=(1.0, 2.0, 3.0))
        grouped = rewards.view(-1, G)
        grouped[torch.arange(len(grouped)) % 2 == 1] = 0.0  # every other group all zeros
        grouped[(grouped == grouped[:, :1]).all(1)] = 0.0  # any other all-equal group too
        verl_adv, _ = core_algos.compute_gpg_outcome_advantage(_verl_rewards(rewards, mask), mask, index)
        mine = gpg_advantages(rewards, G).unsqueeze(-1) * mask
        torch.testing.assert_close(mine, verl_adv, **TOL, msg=f"G={G} seed={seed}")


def test_gdpo_matches_verl_with_one_token_per_completion(core_algos):
    # verl whitens the weighted sum over tokens; with one token per completion that is TRL's batch normalisation
    # (sample std). verl's eps: 1e-6 in the group step, rsqrt(var + 1e-8) in the batch step.
    G = 4
    for seed in range(N_SEEDS):
        g = torch.Generator().manual_seed(seed)
        P = int(torch.randint(2, 6, (1,), generator=g))
        per_func = torch.stack([torch.randint(0, 2, (P * G,), generator=g).to(DTYPE),
                                torch.randint(0, 4, (P * G,), generator=g).to(DTYPE) / 3], dim=1)  # (N, K)
        weights = [1.0, 0.5]
        mask = torch.ones(P * G, 1, dtype=DTYPE)
        batch = {"prompts": torch.zeros(P * G, 3), "attention_mask": torch.ones(P * G, 4, dtype=torch.long)}
        non_tensor = {"a": per_func[:, 0].numpy(), "b": per_func[:, 1].numpy()}
        config = _VerlConfig(gdpo_reward_keys=["a", "b"], gdpo_reward_weights=weights)
        verl_adv, _ = core_algos.compute_gdpo_outcome_advantage(torch.zeros(P * G, 1), mask, np.repeat(np.arange(P), G),
                                                                config=config, non_tensor_batch=non_tensor, batch=batch)
        mine = normalize_then_sum_advantages(per_func, G, torch.tensor(weights), eps=1e-6)
        # verl's float32 rewards: compare at float32 precision
        torch.testing.assert_close(mine.float(), verl_adv.squeeze(-1).float(), rtol=1e-4, atol=1e-4,
                                   msg=f"seed={seed}")


# ---------------------------------------------------------------------------------------------------------
# verl: DPPO-Binary-TV / -KL and DRO (losses), ReMax and the optimal token baseline (estimators)
# ---------------------------------------------------------------------------------------------------------
def _full_rows(batch):
    """The same batch with every row as long as the longest: no padding at all."""
    return {**batch, "mask": torch.ones_like(batch["mask"])}


# loss_mode: [(its verl fields, minigrpo's kwargs)], several thresholds each; verl reads the divergence thresholds
# from clip_ratio_low / clip_ratio_high and the truncation cap from clip_ratio_c, minigrpo from epsilon /
# epsilon_high / delta (None: dppo's default 20, verl's function default).
NEW_VERL_LOSSES = {
    "dppo_tv": [(dict(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=20.0), dict(epsilon=0.2)),
                (dict(clip_ratio_low=0.15, clip_ratio_high=0.15, clip_ratio_c=20.0), dict(epsilon=0.15, delta=20.0)),
                (dict(clip_ratio_low=0.05, clip_ratio_high=0.3, clip_ratio_c=3.0),
                 dict(epsilon=0.05, epsilon_high=0.3, delta=3.0))],
    "dppo_kl": [(dict(clip_ratio_low=0.05, clip_ratio_high=0.05, clip_ratio_c=20.0), dict(epsilon=0.05)),
                (dict(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=20.0), dict(epsilon=0.2)),
                (dict(clip_ratio_low=0.01, clip_ratio_high=0.1, clip_ratio_c=2.0),
                 dict(epsilon=0.01, epsilon_high=0.1, delta=2.0))],
    "dro": [(dict(dro_beta=0.05), dict(dro_beta=0.05)), (dict(dro_beta=1.0), dict(dro_beta=1.0)),
            (dict(dro_beta=0.003), dict(dro_beta=0.003))],
}


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("mode", list(NEW_VERL_LOSSES))
def test_dppo_and_dro_match_verl(core_algos, mode, padded):
    verl_loss_fn = core_algos.get_policy_loss_fn(mode)
    masked = 0.0
    for setting, (fields, kwargs) in enumerate(NEW_VERL_LOSSES[mode]):
        policy_fields = {"dro_beta": fields["dro_beta"]} if mode == "dro" else {}
        config = _VerlConfig(clip_ratio=0.2, clip_ratio_low=fields.get("clip_ratio_low", 0.2),
                             clip_ratio_high=fields.get("clip_ratio_high", 0.2),
                             clip_ratio_c=fields.get("clip_ratio_c", 3.0), global_batch_info={},
                             policy_loss=_VerlConfig(**policy_fields))
        for seed in range(N_SEEDS):
            batch = make_batch(seed) if padded else _full_rows(make_batch(seed))
            mask = batch["mask"]
            adv_tokens = batch["adv"].unsqueeze(-1).expand_as(mask).contiguous()  # verl's advantages are (B, T)
            logp = torch.where(mask.bool(), batch["logp"], 0.0).requires_grad_(True)  # verl's padding holds 0
            old = torch.where(mask.bool(), batch["old_logp"], 0.0)
            verl_loss, verl_metrics = verl_loss_fn(old, logp, adv_tokens, mask, "token-mean", config)
            (verl_grad,) = torch.autograd.grad(verl_loss, logp)

            logp_mg = batch["logp"].clone().requires_grad_(True)
            mg_loss, stats = policy_loss(logp_mg, batch["old_logp"], batch["adv"], mask, loss_type=mode, **kwargs)
            (mg_grad,) = torch.autograd.grad(mg_loss, logp_mg)
            where = f"{mode} setting {setting} seed={seed}"
            torch.testing.assert_close(mg_loss.detach(), verl_loss.detach(), **TOL, msg=lambda m: f"{where}: {m}")
            torch.testing.assert_close(mg_grad, verl_grad, **TOL, msg=lambda m: f"{where} gradient: {m}")
            if mode != "dro":
                masked += stats["clip_ratio/region_mean"] + stats["dppo/truncated_frac"]
                if (adv_tokens[mask.bool()] != 0).all():  # verl also counts A = 0 tokens; minigrpo, no gradient: no
                    assert stats["clip_ratio/region_mean"] == pytest.approx(verl_metrics["actor/pg_clipfrac"], abs=1e-9)
                    assert stats["dppo/truncated_frac"] == pytest.approx(verl_metrics["actor/pg_clipfrac_lower"],
                                                                         abs=1e-9)
    assert mode == "dro" or masked > 0, "the random batches never exercised the trust region or the truncation"


def _token_stats_batch(seed: int, G: int, holes: bool, padded: bool = True):
    """Rewards with no all-equal group unless by chance, ragged lengths (padded) or all full, sampling-policy
    log-probs and sum pi^2 that a distribution could have (sum pi^2 >= pi^2), and with holes a tool mask inside the
    completions."""
    rewards, mask, index = _reward_batch(seed, G, values=(0.0, 1.0, 0.5, 2.0, 3.0))
    mask = mask if padded else torch.ones_like(mask)
    g = torch.Generator().manual_seed(1000 + seed)
    old_logp = -3.0 * torch.rand(mask.shape, generator=g, dtype=DTYPE)
    pi = old_logp.exp()
    sum_pi_squared = pi**2 + (1 - pi) ** 2 * torch.rand(mask.shape, generator=g, dtype=DTYPE)
    if holes:  # tool output: 0 inside a completion, never its first token
        tool = (torch.rand(mask.shape, generator=g) < 0.3).to(DTYPE)
        tool[:, 0] = 0
        mask = mask * (1 - tool)
    return rewards, mask, index, old_logp, sum_pi_squared


def _last_token_rewards(rewards, mask):
    """verl's token_level_rewards for a completion whose last token may follow tool output: on its last policy token."""
    positions = torch.arange(1, mask.shape[1] + 1, dtype=DTYPE)
    last = (mask * positions).argmax(-1)
    token_rewards = torch.zeros_like(mask)
    token_rewards[torch.arange(len(rewards)), last] = rewards
    return token_rewards


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("holes", [False, True], ids=["contiguous", "tool-mask"])
@pytest.mark.parametrize("G", [2, 4, 5])
def test_optimal_token_baseline_matches_verl(core_algos, G, holes, padded):
    informative_rows = 0
    for seed in range(N_SEEDS):
        rewards, mask, index, old_logp, sum_pi_squared = _token_stats_batch(seed, G, holes, padded)
        token_rewards = _last_token_rewards(rewards, mask)
        grouped = rewards.view(-1, G)
        informative = ~(grouped == grouped[:, :1]).all(1).repeat_interleave(G)  # verl leaves residues elsewhere
        for name, verl_fn, tools_form in (
                ("optimal_token_baseline", core_algos.compute_optimal_token_baseline_advantage, False),
                ("tir_optimal_token_baseline", core_algos.compute_multi_turn_optimal_token_baseline_advantage, True)):
            verl_adv, _ = verl_fn(token_rewards.clone(), mask, index, old_logp, sum_pi_squared)
            mine = optimal_token_baseline_advantages(rewards, old_logp, sum_pi_squared, mask, G,
                                                     policy_tokens_only=tools_form)
            where = f"{name} G={G} seed={seed}"
            torch.testing.assert_close(mine[informative], verl_adv[informative], **TOL, msg=lambda m: f"{where}: {m}")
            assert (mine[~informative] == 0).all(), where  # no signal, exactly 0
            assert (mine[mask == 0] == 0).all(), where  # tool output and padding get none
        informative_rows += int(informative.sum())
    assert informative_rows > 0


@pytest.mark.parametrize("G", [1, 2, 4])
def test_remax_matches_verl(core_algos, G):
    for seed in range(N_SEEDS):
        rewards, mask, index = _reward_batch(seed, G)
        greedy = torch.tensor((0.0, 1.0, 0.5, 2.0), dtype=DTYPE)[torch.randint(4, (len(rewards) // G,))]
        verl_adv, _ = core_algos.compute_remax_outcome_advantage(_verl_rewards(rewards, mask), greedy.repeat_interleave(G),
                                                                 mask)
        mine = remax_advantages(rewards, greedy, G).unsqueeze(-1) * mask
        torch.testing.assert_close(mine, verl_adv, **TOL, msg=f"G={G} seed={seed}")
