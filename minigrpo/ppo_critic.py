"""PPO with a learned critic: the baseline GRPO removes (Schulman et al. 2017; as used for LLMs by
Ouyang et al. 2022, "InstructGPT", and Huang et al. 2024, "The N+ Implementation Details of RLHF with PPO").

GRPO estimates each completion's baseline from its group: A_i = (r_i - mean(r)) / std(r). PPO learns it instead:
a value network V_phi(s_t) predicts, at every completion token, the return still to come, and the advantage of
token t is Generalised Advantage Estimation (Schulman et al. 2016, "GAE", eq. 16) over the completion:

    r_t      = R (the completion's reward) on its last token, 0 before it; minus kl_coef (log pi - log pi_ref)_t
               on every token when a reference policy is given (the KL penalty in the reward, InstructGPT eq. 2)
    delta_t  = r_t + gamma V(s_{t+1}) - V(s_t)            V(s_{T_i}) = 0 after the last token
    A_t      = sum_l (gamma lam)^l delta_{t+l}           returns_t = A_t + V(s_t)

    policy loss  = PPO-clip on rho_t = pi / pi_old with the per-token A_t, averaged over all tokens (bnpo)
    value loss   = 1/2 mean_t max( (V - returns)^2, (clip(V, V_old - c, V_old + c) - returns)^2 )
    loss         = policy loss + vf_coef * value loss

The value network is "the same size as the policy": a copy of the policy's transformer (its `get_decoder()`)
with a scalar head in place of the vocabulary head, initialised from the policy as is common in RLHF. Its
weights, gradients and Adam moments are what GRPO saves (`minigrpo memory` measures how much).

In code: `ppo_targets` fixes everything before the update (old log-probs, V_old, GAE, returns, and
`critic_diagnostics`: the critic's error on the batch it has not trained on yet), `ppo_update` takes the optimizer
steps, and `ppo_step` is the two in a row. The loop around them is `ppo_trainer.train_ppo`.

What this file simplifies, on purpose: one process; the policy and the critic share one optimizer (param groups
may give them different learning rates) and one backward pass (separate losses, summed); rewards are not
whitened (advantages are, optionally). The functions' defaults are TRL's PPOConfig's (gamma 1.0, lam 0.95,
cliprange 0.2, cliprange_value 0.2, vf_coef 0.1, kl_coef 0.05); `ppo_trainer.PPOConfig` chooses its own for
think_addition and says why. Sampling is the caller's, so a notebook can run GRPO and PPO on the same rollouts.
"""

import contextlib
import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from .logprobs import completion_logprobs, trimmed_chunks
from .objectives import policy_loss
from .objectives.common import masked_mean
from .rewards import RewardError

__all__ = ["ValueModel", "completion_values", "terminal_rewards", "gae", "whiten", "value_loss", "critic_diagnostics",
           "ppo_targets", "ppo_update", "ppo_step"]


class ValueModel(nn.Module):
    """V_phi(s): the policy's transformer, copied, with a scalar head on its last hidden state.

    The head starts at zero, so V = 0 everywhere until the critic has trained. A LoRA policy (peft) is copied with
    its adapter: the critic then trains its own adapter and its head, and its copy of the base stays frozen.
    """

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
    t = 0) has seen q and o_<t, which is the state in which o_t is chosen. Also as there, rows run in chunks of
    similar length, each trimmed to its own longest prompt and completion (`logprobs.trimmed_chunks`), so padding
    costs no compute; positions outside the completion mask come back as 0.
    """
    P, T = prompt_ids.shape[1], completion_ids.shape[1]
    chunks, inverse = trimmed_chunks(prompt_mask, completion_mask)
    parts = []
    for idx, p, t in chunks:
        input_ids = torch.cat([prompt_ids[idx, P - p:], completion_ids[idx, :t]], dim=1)  # (b, p + t)
        mask = completion_mask[idx, :t]
        attention_mask = torch.cat([prompt_mask[idx, P - p:], mask.to(prompt_mask.dtype)], dim=1)
        position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)  # real tokens only, as in generate()
        values = value_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)  # (b, p+t)
        parts.append(F.pad(values[:, -t - 1:-1].float() * mask, (0, T - t)))
    return torch.cat(parts)[inverse]  # (B, T), in the caller's row order


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
    """(x - mean) / std over the batch's real tokens (TRL's `masked_whiten`); padding stays 0.

    std is the sample std, sum (x - mean)^2 / (N - 1) over the N real tokens, as TRL's `masked_var(unbiased=True)`
    (N = 1 divides by 1 instead of 0).
    """
    n_tokens = mask.sum()
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask) * n_tokens / (n_tokens - 1).clamp(min=1)  # Bessel's N / (N - 1)
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


def critic_diagnostics(old_values, raw_adv, returns, rewards, mask) -> dict[str, float]:
    """How good the critic is, measured on a batch *before* it trains on it (so: on completions it has not seen).

    old_values, raw_adv, returns, mask: (B, T); rewards: (B,). The first completion token's value V(s_0) is the
    critic's prediction of the whole completion's reward R, made from the prompt alone:

        value/v0_mse    mean_i (V_i(s_0) - R_i)^2     its error; >= the reward's own noise, p(1 - p) per prompt
        value/v0_bias   mean_i (V_i(s_0) - R_i)       < 0: the critic expects less than the policy now earns (lag)
        value/v0_mean   mean_i V_i(s_0)               to draw against the batch's mean reward
        value/explained_variance   1 - Var(returns - V) / Var(returns), over tokens (1 = perfect, 0 = a constant)
        adv_var/gae_t0      Var_i A_i(s_0)            the raw GAE advantage of each completion's first token
        adv_var/gae_tokens  Var over all real tokens of the raw GAE advantage A_t
    Variances are over the batch (population, 1/N), before whitening.
    """
    v0, a0, real = old_values[:, 0], raw_adv[:, 0], mask.bool()
    error = v0 - rewards.float()
    residual, target = (returns - old_values)[real], returns[real]
    explained = 1 - residual.var(unbiased=False) / target.var(unbiased=False).clamp(min=1e-8)
    return {
        "value/v0_mse": error.pow(2).mean().item(), "value/v0_bias": error.mean().item(),
        "value/v0_mean": v0.mean().item(), "value/explained_variance": explained.item(),
        "adv_var/gae_t0": a0.var(unbiased=False).item(), "adv_var/gae_tokens": raw_adv[real].var(unbiased=False).item(),
    }


@torch.no_grad()
def ppo_targets(policy, value_model, batch: dict, rewards: torch.Tensor, *, ref_logp: torch.Tensor | None = None,
                kl_coef: float = 0.0, gamma: float = 1.0, lam: float = 0.95, whiten_advantages: bool = True,
                temperature: float = 1.0, need_old_logp: bool = True) -> dict:
    """Everything PPO fixes before it updates: old log-probs and values, per-token rewards, GAE, returns.

    batch: prompt_ids, prompt_mask (B, P) and completion_ids, completion_mask (B, T), as `Rollout` has them.
    rewards: (B,) one finite scalar per completion. ref_logp: (B, T) log pi_ref, for the KL penalty in the reward.
    need_old_logp=False (one epoch, one mini-batch: the update is on-policy) skips the policy's forward pass here;
    the update then uses logp.detach() as old_logp, like trainer.py, and the ratio is exactly 1 in value.
    Returns {old_logp (or None), old_values, raw_adv, adv, returns} (all (B, T)) and "stats", critic_diagnostics.
    """
    if not torch.isfinite(rewards).all():
        bad = int((~rewards.isfinite()).sum())
        raise RewardError(f"rewards: PPO needs a finite reward for every completion, got {bad} NaN/inf "
                         "(an unscorable completion?)")
    ids = [batch[k] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")]
    mask = ids[3].float()
    with_kl = ref_logp is not None and kl_coef > 0  # the KL penalty needs log pi_old even when the update does not
    old_logp = completion_logprobs(policy, *ids, temperature=temperature)[0] if need_old_logp or with_kl else None
    old_values = completion_values(value_model, *ids)  # (B, T), V(s_t) before the update
    token_rewards = terminal_rewards(rewards, mask)  # (B, T)
    if with_kl:
        token_rewards = token_rewards - kl_coef * (old_logp - ref_logp) * mask  # k1 KL in the reward
    raw_adv, returns = gae(token_rewards, old_values, mask, gamma, lam)  # (B, T) each
    adv = whiten(raw_adv, mask) if whiten_advantages else raw_adv  # whitened: mean 0, std 1 over the batch's tokens
    stats = critic_diagnostics(old_values, raw_adv, returns, rewards, mask)
    return {"old_logp": old_logp if need_old_logp else None, "old_values": old_values, "raw_adv": raw_adv, "adv": adv,
            "returns": returns, "stats": stats}


def ppo_update(policy, value_model, optimizer, batch: dict, targets: dict, *, cliprange: float = 0.2,
               cliprange_value: float = 0.2, vf_coef: float = 0.1, num_ppo_epochs: int = 1, num_mini_batches: int = 1,
               temperature: float = 1.0, max_grad_norm: float = 1.0, autocast=contextlib.nullcontext) -> list[dict]:
    """num_ppo_epochs x num_mini_batches optimizer steps on `targets` (from ppo_targets). One stats dict per step.

    loss = pg_loss + vf_coef * vf_loss; one optimizer over both networks (its param groups may give the critic
    its own learning rate), one gradient clip over both, as TRL does.
    """
    ids = [batch[k] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")]
    mask = ids[3].float()
    old_logp, old_values, adv, returns = (targets[k] for k in ("old_logp", "old_values", "adv", "returns"))
    is_weight = targets.get("is_weight")  # (B, T) or (B, 1): vLLM's sampling correction (engine_mismatch.py), or None
    params = [p for group in optimizer.param_groups for p in group["params"]]
    B, history = mask.shape[0], []
    for _ in range(num_ppo_epochs):
        for mb in torch.randperm(B).split(max(1, B // num_mini_batches)):
            mb_ids = [t[mb] for t in ids]
            with autocast():
                logp, entropy = completion_logprobs(policy, *mb_ids, temperature=temperature, with_entropy=True)
                values = completion_values(value_model, *mb_ids)  # (b, T)
            mb_old_logp = logp.detach() if old_logp is None else old_logp[mb]
            pg_loss, stats = policy_loss(logp, mb_old_logp, adv[mb], mask[mb], loss_type="bnpo", epsilon=cliprange,
                                         token_weights=None if is_weight is None else is_weight[mb])
            vf_loss, vf_stats = value_loss(values, old_values[mb], returns[mb], mask[mb], cliprange_value)
            loss = pg_loss + vf_coef * vf_loss
            if not torch.isfinite(loss):
                raise FloatingPointError(f"PPO: the loss is {loss.item()} (pg {pg_loss.item()}, vf {vf_loss.item()}) "
                                         "— stopping before the weights are changed")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm).item()
            if not math.isfinite(grad_norm):  # a finite loss can still have an inf/nan gradient
                raise FloatingPointError(f"PPO: the gradient norm is {grad_norm} — stopping before the weights "
                                         "are changed")
            optimizer.step()
            stats.update(vf_stats, pg_loss=pg_loss.item(), vf_loss=vf_loss.item(), loss=loss.item(),
                         grad_norm=grad_norm, entropy=masked_mean(entropy, mask[mb]).item())
            history.append(stats)
    return history


def ppo_step(policy, value_model, optimizer, batch: dict, rewards: torch.Tensor, *, ref_logp=None,
             kl_coef: float = 0.05, gamma: float = 1.0, lam: float = 0.95, cliprange: float = 0.2,
             cliprange_value: float = 0.2, vf_coef: float = 0.1, num_ppo_epochs: int = 1, num_mini_batches: int = 1,
             temperature: float = 1.0, max_grad_norm: float = 1.0, whiten_advantages: bool = True) -> dict[str, float]:
    """One PPO update on a batch of sampled completions: `ppo_targets`, then `ppo_update`.

    Returns the last mini-batch's stats, the critic's diagnostics (measured before the update) and the batch's
    mean advantage (before whitening) and return. ppo_trainer.train_ppo is the loop around it.
    """
    targets = ppo_targets(policy, value_model, batch, rewards, ref_logp=ref_logp, kl_coef=kl_coef, gamma=gamma, lam=lam,
                          whiten_advantages=whiten_advantages, temperature=temperature)
    history = ppo_update(policy, value_model, optimizer, batch, targets, cliprange=cliprange,
                         cliprange_value=cliprange_value, vf_coef=vf_coef, num_ppo_epochs=num_ppo_epochs,
                         num_mini_batches=num_mini_batches, temperature=temperature, max_grad_norm=max_grad_norm)
    mask = batch["completion_mask"].float()
    return {**history[-1], **targets["stats"], "advantages_mean": masked_mean(targets["raw_adv"], mask).item(),
            "returns_mean": masked_mean(targets["returns"], mask).item()}
