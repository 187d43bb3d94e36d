"""PPO with a critic: GAE and the clipped value loss by hand, then a real step on a tiny random model."""

import math

import pytest
import torch

from minigrpo.loading.models import load_model
from minigrpo.ppo_critic import (ValueModel, completion_values, critic_diagnostics, gae, ppo_step, ppo_targets,
                                 terminal_rewards, value_loss, whiten)
from minigrpo.rewards import RewardError


def test_terminal_rewards_sit_on_the_last_real_token():
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    out = terminal_rewards(torch.tensor([1.0, 2.0]), mask)
    assert torch.equal(out, torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]]))


def test_gae_by_hand():
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.2, 0.1], [0.3, 0.4, 9.0]])  # 9.0 sits on padding: must not leak in
    token_rewards = terminal_rewards(torch.tensor([1.0, 0.0]), mask)
    # lam = 1, gamma = 1: A_t = R - V_t (Monte Carlo return minus the baseline), returns = R.
    adv, returns = gae(token_rewards, values, mask, gamma=1.0, lam=1.0)
    assert torch.allclose(adv, torch.tensor([[0.5, 0.8, 0.9], [-0.3, -0.4, 0.0]]))
    assert torch.allclose(returns, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    # lam = 0: one-step TD errors, A_t = r_t + V_{t+1} - V_t, with V = 0 after the last token.
    adv, _ = gae(token_rewards, values, mask, gamma=1.0, lam=0.0)
    assert torch.allclose(adv, torch.tensor([[-0.3, -0.1, 0.9], [0.1, -0.4, 0.0]]))


def test_gae_with_a_zero_critic_and_lam_1_gives_every_token_the_reward():
    """gamma = lam = 1, V = 0: A_t = R for every real token — PPO's advantage is REINFORCE's without a baseline."""
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    rewards = torch.tensor([1.0, 0.0, 0.5])
    adv, returns = gae(terminal_rewards(rewards, mask), torch.zeros_like(mask), mask, gamma=1.0, lam=1.0)
    assert torch.equal(adv, rewards[:, None] * mask) and torch.equal(returns, rewards[:, None] * mask)
    # lam = 0.95 with the same zero critic: token t gets lam^(T-1-t) R, so the first token of a 30-token
    # completion sees 0.95^29 = 23% of its reward until the critic learns to carry it.
    adv, _ = gae(terminal_rewards(rewards, mask), torch.zeros_like(mask), mask, gamma=1.0, lam=0.95)
    assert torch.allclose(adv[0], 0.95 ** torch.tensor([3.0, 2.0, 1.0, 0.0]))


def test_critic_diagnostics_by_hand():
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    old_values = torch.tensor([[0.25, 0.5], [0.75, 9.0]])  # V(s_0) = 0.25 and 0.75
    rewards = torch.tensor([1.0, 0.0])
    raw_adv, returns = gae(terminal_rewards(rewards, mask), old_values * mask, mask, gamma=1.0, lam=1.0)
    stats = critic_diagnostics(old_values, raw_adv, returns, rewards, mask)
    assert stats["value/v0_mse"] == pytest.approx((0.75**2 + 0.75**2) / 2)  # errors -0.75 and +0.75
    assert stats["value/v0_bias"] == pytest.approx(0.0) and stats["value/v0_mean"] == pytest.approx(0.5)
    assert stats["adv_var/gae_t0"] == pytest.approx(0.75**2)  # A_0 = R - V(s_0) = +0.75, -0.75
    # returns over real tokens (1, 1, 0), residuals R - V = (0.75, 0.5, -0.75): 1 - Var(res) / Var(returns)
    res, ret = torch.tensor([0.75, 0.5, -0.75]), torch.tensor([1.0, 1.0, 0.0])
    expected = 1 - res.var(unbiased=False) / ret.var(unbiased=False)
    assert stats["value/explained_variance"] == pytest.approx(expected.item())


def test_gae_equals_the_discounted_sum_of_td_errors():
    torch.manual_seed(0)
    B, T, gamma, lam = 3, 6, 0.9, 0.8
    mask = (torch.arange(T) < torch.tensor([[6], [4], [1]])).float()
    values, token_rewards = torch.randn(B, T), torch.randn(B, T) * mask
    adv, _ = gae(token_rewards, values, mask, gamma, lam)
    for i in range(B):
        n = int(mask[i].sum())
        v = torch.cat([values[i, :n], torch.zeros(1)])
        delta = token_rewards[i, :n] + gamma * v[1:] - v[:-1]
        expected = [sum((gamma * lam) ** k * delta[t + k] for k in range(n - t)) for t in range(n)]
        assert torch.allclose(adv[i, :n], torch.stack(expected), atol=1e-5)
        assert (adv[i, n:] == 0).all()


def test_value_loss_clips_the_move_from_the_old_value():
    mask = torch.ones(1, 2)
    old = torch.tensor([[0.0, 0.0]])
    returns = torch.tensor([[1.0, 1.0]])
    values = torch.tensor([[0.5, -0.5]], requires_grad=True)
    loss, stats = value_loss(values, old, returns, mask, cliprange_value=0.2)
    # token 1: max((0.5-1)^2, (0.2-1)^2) = 0.64 (clipped wins); token 2: max((-0.5-1)^2, (-0.2-1)^2) = 2.25
    assert loss.item() == pytest.approx(0.5 * (0.64 + 2.25) / 2)
    assert stats["vf_clipfrac"] == 0.5
    loss.backward()
    assert values.grad[0, 0] == 0.0 and values.grad[0, 1] != 0.0  # the clipped token gets no gradient


def test_whiten_is_zero_mean_unit_sample_std_over_real_tokens():
    # Real tokens 1..5: mean 3, sample variance (4 + 1 + 0 + 1 + 4) / (5 - 1) = 2.5, as TRL's masked_whiten.
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    x = whiten(torch.tensor([[1.0, 2.0, 99.0], [3.0, 4.0, 5.0]]), mask)
    assert x[1, 2].item() == pytest.approx(2 / math.sqrt(2.5))
    real = x[mask.bool()]
    assert real.mean().abs() < 1e-6 and (real.std() - 1).abs() < 1e-5 and x[0, 2] == 0


def fixed_batch(vocab_size, B=8, P=5, T=6):
    torch.manual_seed(0)
    completion_mask = (torch.arange(T) < torch.randint(2, T + 1, (B, 1))).float()
    return {
        "prompt_ids": torch.randint(3, vocab_size, (B, P)), "prompt_mask": torch.ones(B, P, dtype=torch.long),
        "completion_ids": torch.randint(3, vocab_size, (B, T)) * completion_mask.long(),
        "completion_mask": completion_mask,
    }, torch.tensor([1.0, 0.0] * (B // 2))


def test_ppo_step_runs_and_the_value_loss_falls_on_a_fixed_batch(random_model_dir):
    policy = load_model(random_model_dir)
    critic = ValueModel(policy)
    assert sum(p.numel() for p in critic.parameters()) == sum(p.numel() for p in policy.model.parameters()) + 33
    batch, rewards = fixed_batch(policy.config.vocab_size)
    assert completion_values(critic, *batch.values()).shape == batch["completion_mask"].shape
    optimizer = torch.optim.AdamW([*policy.parameters(), *critic.parameters()], lr=3e-3)
    before = [p.detach().clone() for p in policy.parameters()]
    history = [ppo_step(policy, critic, optimizer, batch, rewards, num_ppo_epochs=2, num_mini_batches=2)
               for _ in range(15)]
    assert all(torch.isfinite(torch.tensor(list(h.values()))).all() for h in history)
    assert history[-1]["vf_loss"] < 0.5 * history[0]["vf_loss"]
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters()))  # the policy moved too


def test_kl_penalty_in_the_reward_changes_the_advantages(random_model_dir):
    policy = load_model(random_model_dir)
    critic = ValueModel(policy)
    batch, rewards = fixed_batch(policy.config.vocab_size)
    optimizer = torch.optim.SGD([*policy.parameters(), *critic.parameters()], lr=0.0)
    ref_logp = torch.zeros_like(batch["completion_mask"]) - 5.0  # a reference that finds every token unlikely
    plain = ppo_step(policy, critic, optimizer, batch, rewards)
    penalised = ppo_step(policy, critic, optimizer, batch, rewards, ref_logp=ref_logp, kl_coef=0.1)
    assert penalised["returns_mean"] != pytest.approx(plain["returns_mean"])


def test_ppo_targets_refuse_nan_rewards(random_model_dir):
    policy = load_model(random_model_dir)
    batch, rewards = fixed_batch(policy.config.vocab_size)
    rewards[2] = float("nan")
    with pytest.raises(RewardError, match="^rewards: PPO needs a finite reward for every completion, got 1 NaN"):
        ppo_targets(policy, ValueModel(policy), batch, rewards)


def test_completion_values_match_one_padded_forward(random_model_dir):
    """Length chunks (padding trimmed) give the values of the plain padded batch, and 0 on padding."""
    policy = load_model(random_model_dir)
    critic = ValueModel(policy)
    torch.nn.init.normal_(critic.value_head.weight)  # a non-zero head, so the values say something
    batch, _ = fixed_batch(policy.config.vocab_size)
    batch["prompt_mask"][:3, :2] = 0  # left padding on some prompts
    ids, mask = list(batch.values()), batch["completion_mask"]
    input_ids = torch.cat([ids[0], ids[2]], dim=1)
    attention_mask = torch.cat([ids[1], mask.long()], dim=1)
    padded = critic(input_ids, attention_mask, (attention_mask.cumsum(1) - 1).clamp(min=0))[:, -mask.shape[1] - 1:-1]
    assert torch.allclose(completion_values(critic, *ids), padded * mask, atol=1e-5)
