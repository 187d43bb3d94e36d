"""PPO with a learned critic: the baseline GRPO removes (Schulman et al. 2017; as used for LLMs by
Ouyang et al. 2022, "InstructGPT", and Huang et al. 2024, "The N+ Implementation Details of RLHF with PPO").

GRPO estimates each completion's baseline from its group: A_i = (r_i - mean(r)) / std(r). PPO learns it instead:
a value network V_phi(s_t) predicts, at every completion token, the return still to come, and the advantage of
token t is Generalised Advantage Estimation (Schulman et al. 2016, "GAE", eq. 16) over the completion:

    r_t      = R (the completion's reward) on its last token, 0 before it; minus beta (log pi - log pi_ref)_t
               on every token when a reference policy is given (the KL penalty in the reward, InstructGPT eq. 2)
    delta_t  = r_t + gamma V(s_{t+1}) - V(s_t)            V(s_{T_i}) = 0 after the last token
    A_t      = sum_l (gamma lam)^l delta_{t+l}           returns_t = A_t + V(s_t)

    policy loss  = PPO-clip on rho_t = pi / pi_old with the per-token A_t, averaged over all tokens (bnpo)
    value loss   = 1/2 mean_t max( (V - returns)^2, (clip(V, V_old - c, V_old + c) - returns)^2 )
    loss         = policy loss + vf_coef * value loss

The value network is "the same size as the policy": a copy of the policy's transformer (its `get_decoder()`)
with a scalar head in place of the vocabulary head, initialised from the policy as is common in RLHF. Its
weights, gradients and Adam moments are what GRPO saves (`minigrpo memory` measures how much).

What this file simplifies, on purpose: one process; the policy and the critic share one optimizer and one
backward pass (separate losses, summed); rewards are not whitened; names and defaults follow TRL's PPOConfig
(gamma 1.0, lam 0.95, cliprange 0.2, cliprange_value 0.2, vf_coef 0.1). Sampling is the caller's
(`rollout.sample_completions`), so a notebook can run GRPO and PPO on the same rollouts.
"""

import copy

import torch
from torch import nn

from .logprobs import completion_logprobs
from .objectives import policy_loss
from .objectives.common import masked_mean

__all__ = ["ValueModel", "completion_values", "terminal_rewards", "gae", "whiten", "value_loss", "ppo_step"]


class ValueModel(nn.Module):
    """V_phi(s): the policy's transformer, copied, with a scalar head on its last hidden state."""

    def __init__(self, policy):
        super().__init__()
        self.backbone = copy.deepcopy(policy.get_decoder())  # Llama/Qwen2: the decoder stack without lm_head
        self.value_head = nn.Linear(policy.config.hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)  # V = 0 everywhere at the start: no made-up baseline
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids, attention_mask=None, position_ids=None) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
        return self.value_head(hidden.last_hidden_state).squeeze(-1)  # (B, L)


def completion_values(value_model, prompt_ids, prompt_mask, completion_ids, completion_mask) -> torch.Tensor:
    """V(s_t) for every completion position t: the value of the state *before* token t is chosen, (B, T).

    Same alignment as `completion_logprobs`: the hidden state at position P + t - 1 (the last prompt token for
    t = 0) has seen q and o_<t, which is the state in which o_t is chosen.
    """
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (B, P + T)
    attention_mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    T = completion_ids.shape[1]
    values = value_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)  # (B, P+T)
    return values[:, -T - 1:-1].float()  # (B, T)


def terminal_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) sequence rewards -> (B, T) per-token rewards: R on each completion's last token, 0 elsewhere."""
    last = (mask.sum(-1).long() - 1).clamp(min=0)  # index of the last real token (eos included)
    token_rewards = torch.zeros_like(mask, dtype=torch.float32)
    token_rewards[torch.arange(mask.shape[0]), last] = rewards.float()
    return token_rewards * mask


def gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 0.95):
    """Generalised Advantage Estimation over right-padded completions. Returns (adv, returns), both (B, T).

    delta_t = r_t + gamma V_{t+1} - V_t and A_t = delta_t + gamma lam A_{t+1}, run backwards; the position after
    a completion's last token is terminal (V = 0, no bootstrap), padding gets 0.
    """
    T = token_rewards.shape[1]
    mask = mask.float()
    adv = torch.zeros_like(values)
    next_adv = torch.zeros_like(values[:, 0])
    for t in reversed(range(T)):
        not_last = mask[:, t + 1] if t + 1 < T else torch.zeros_like(mask[:, 0])  # 0 when t is the last token
        next_value = values[:, t + 1] * not_last if t + 1 < T else torch.zeros_like(values[:, 0])
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        next_adv = (delta + gamma * lam * not_last * next_adv) * mask[:, t]
        adv[:, t] = next_adv
    returns = (adv + values) * mask
    return adv, returns


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the batch's real tokens (TRL's `masked_whiten`); padding stays 0."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    return (x - mean) * torch.rsqrt(var + eps) * mask


def value_loss(values, old_values, returns, mask, cliprange_value: float = 0.2) -> tuple[torch.Tensor, dict]:
    """Clipped value loss (PPO2's, as in TRL): the critic may not move more than c from V_old per batch.

    values/old_values/returns/mask: (B, T). Returns the loss and {vf_clipfrac, value_mean}.
    """
    values_clipped = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)
    vf_loss_unclipped = (values - returns) ** 2
    vf_loss_clipped = (values_clipped - returns) ** 2
    loss = 0.5 * masked_mean(torch.max(vf_loss_unclipped, vf_loss_clipped), mask)
    with torch.no_grad():
        stats = {"vf_clipfrac": masked_mean((vf_loss_clipped > vf_loss_unclipped).float(), mask).item(),
                 "value_mean": masked_mean(values, mask).item()}
    return loss, stats


def ppo_step(
    policy,
    value_model,
    optimizer,
    batch: dict,
    rewards: torch.Tensor,
    *,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.05,
    gamma: float = 1.0,
    lam: float = 0.95,
    cliprange: float = 0.2,
    cliprange_value: float = 0.2,
    vf_coef: float = 0.1,
    num_ppo_epochs: int = 1,
    num_mini_batches: int = 1,
    temperature: float = 1.0,
    max_grad_norm: float = 1.0,
) -> dict[str, float]:
    """One PPO update on a batch of sampled completions: num_ppo_epochs x num_mini_batches optimizer steps.

    batch: prompt_ids, prompt_mask (B, P) and completion_ids, completion_mask (B, T), as `Rollout` has them.
    rewards: (B,) one scalar per completion. ref_logp: (B, T) log pi_ref, for the KL penalty in the reward.
    optimizer: over the policy's and the value model's trainable parameters. Returns the last mini-batch's
    stats plus the batch's mean advantage (before whitening) and return.
    """
    ids = [batch[k] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")]
    mask = ids[3].float()
    with torch.no_grad():
        old_logp, _ = completion_logprobs(policy, *ids, temperature=temperature)  # (B, T)
        old_values = completion_values(value_model, *ids)  # (B, T)
        token_rewards = terminal_rewards(rewards, mask)
        if ref_logp is not None:
            token_rewards = token_rewards - kl_coef * (old_logp - ref_logp) * mask  # k1 KL in the reward
        raw_adv, returns = gae(token_rewards, old_values, mask, gamma, lam)
        adv = whiten(raw_adv, mask)  # (B, T), mean 0 and std 1 over the batch's tokens

    params = [p for group in optimizer.param_groups for p in group["params"]]
    B = mask.shape[0]
    for _ in range(num_ppo_epochs):
        for mb in torch.randperm(B).split(max(1, B // num_mini_batches)):
            mb_ids = [t[mb] for t in ids]
            logp, _ = completion_logprobs(policy, *mb_ids, temperature=temperature)
            values = completion_values(value_model, *mb_ids)
            pg_loss, stats = policy_loss(logp, old_logp[mb], adv[mb], mask[mb], loss_type="bnpo", epsilon=cliprange)
            vf_loss, vf_stats = value_loss(values, old_values[mb], returns[mb], mask[mb], cliprange_value)
            loss = pg_loss + vf_coef * vf_loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm).item()
            optimizer.step()
    stats.update(vf_stats, pg_loss=pg_loss.item(), vf_loss=vf_loss.item(), loss=loss.item(), grad_norm=grad_norm,
                 advantages_mean=masked_mean(raw_adv, mask).item(), returns_mean=masked_mean(returns, mask).item())
    return stats
