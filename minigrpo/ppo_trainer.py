"""The PPO-with-a-critic training loop: trainer.train's loop with GRPO's group baseline replaced by a value network.

    for each step:
        sample    G completions for each of (generation_batch_size / G) prompts      collect.collect_batch
        score     every completion with every reward function                          rewards.py, tasks/
        targets   V(s_t) of the critic, GAE advantages A_t and returns, per token     ppo_critic.ppo_targets
        optimise  num_ppo_epochs x num_mini_batches steps of pg_loss + vf_coef vf_loss  ppo_critic.ppo_update
        log       one JSON line of metrics: GRPO's names, plus the critic's              metrics.jsonl

It is built for one comparison (notebook 06): the same task, model, sampler, rollout, rewards, learning rate and
evaluation as `trainer.train`, so that a GRPO run and a PPO run differ only in where the baseline comes from.
Prompts are still sampled G at a time, which PPO does not need, so that GRPO's group-relative advantage can be
computed on the very same batch and its variance logged beside GAE's (`adv_var/*`).

metrics.jsonl has trainer.train's names (reward, accuracy, eval/accuracy_greedy, completions/*, entropy,
clip_ratio/*, grad_norm, step_seconds, ...; `advantages` holds PPO's raw GAE advantage of each completion's first
token) plus, all measured on the step's batch:
    pg_loss, vf_loss, vf_clipfrac, value_mean      the two losses and the critic's clipping (ppo_critic.value_loss)
    value/v0_mse, value/v0_bias, value/v0_mean     the critic's prediction V(s_0) of each completion's reward, made
    value/explained_variance                       before the update, against the reward (critic_diagnostics)
    adv_var/gae_t0, adv_var/gae_tokens             variance over the batch of GAE's A_0, and of A_t over all tokens
    adv_var/grpo, adv_var/grpo_unscaled            ... of GRPO's group z-score, and of R - mean(group)
    adv_var/reward                                 ... of R itself (no baseline); grpo_advantages: GRPO's, per row

Settings: every field of `Config` that means the same thing (task, seed, max_steps, generation_batch_size,
num_generations, temperature, learning_rate, lr_scheduler_type, max_grad_norm, eval_*, output_dir, ...), plus a
`PPOConfig` for what only PPO has, with TRL's PPOConfig names. GRPO's objective fields (loss_type, epsilon_high,
beta, scale_rewards, ...) do not apply; `epsilon` is PPO's cliprange.

What this loop simplifies, on purpose:
  * One process, one device, one optimizer over policy and critic (the critic in its own param group, with its own
    learning rate), one backward pass of the summed loss; no checkpoints or resuming.
  * The KL penalty (kl_coef > 0) is folded into the per-token reward against a frozen copy of the starting policy,
    as in InstructGPT. Default 0: GRPO's default here is beta = 0, and the comparison should differ in one thing.
  * Completions that no reward function can score are an error, not a zero-advantage row as in GRPO: a critic
    needs a return to regress on.
"""

import math
import time
from dataclasses import dataclass
from statistics import fmean

import torch
from tqdm.auto import tqdm

from . import advantages
from .advantages import group_advantages
from .batch import PromptSampler
from .collect import collect_batch
from .config import Config, ConfigError, FlagsConfig
from .evaluate import eval_due, evaluator
from .generation.engine_mismatch import sampler_correction
from .loading.models import parameter_counts, reference_policy, resolve_device
from .logprobs import completion_logprobs
from .metrics import gather_batch, step_metrics
from .parallel import processes
from .persistence.run_log import RunLog, write_config
from .ppo_critic import ValueModel, ppo_targets, ppo_update
from .rewards import RewardError, reward_names
from .run import finish_run, load_run, make_engine, make_optimizer

__all__ = ["PPOConfig", "train_ppo", "CONFIG_KEYS"]

# The Config keys train_ppo reads (the ones _check refuses with a reason included). Every other key belongs to what PPO
# does without: the GRPO family's loss variants, its several updates per batch, reference model and tools. `minigrpo
# ppo` refuses those flags instead of ignoring them (tests/test_ppo_trainer.py checks this list against a run's reads).
CONFIG_KEYS = frozenset({
    "model_name_or_path", "task", "answer_grader", "dataset_name", "dataset_config", "dataset_train_split",
    "dataset_test_split", "eval_dataset_name", "max_prompt_length", "max_completion_length", "chat_template_kwargs",
    "reward_funcs", "reward_weights", "reward_timeout", "overlong_buffer_len",
    "num_generations", "generation_batch_size", "temperature", "top_p", "top_k", "max_steps", "seed", "device",
    "use_vllm", "vllm_gpu_memory_utilization", "vllm_enable_sleep_mode", "shared_prefix",
    "vllm_importance_sampling_correction", "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_min",
    "vllm_importance_sampling_clip_max",
    "epsilon", "learning_rate", "lr_scheduler_type", "warmup_steps", "adam_beta1", "adam_beta2", "weight_decay",
    "max_grad_norm", "kl_in_reward",
    "advantage_estimator", "scale_rewards", "std_type", "multi_objective_aggregation", "pass_k",  # grpo_advantages
    "dtype", "bf16", "gradient_checkpointing", "use_peft", "lora_r", "lora_alpha", "lora_dropout",
    "lora_target_modules", "load_in_4bit", "bnb_4bit_quant_type", "use_bnb_nested_quant",
    "eval_steps", "eval_limit", "eval_num_problems", "eval_num_samples", "logging_steps", "log_completions",
    "log_completions_groups", "report_to", "output_dir", "overwrite_output_dir", "save_model",
    # refused by _check, each with its reason
    "beta", "fp16", "dynamic_sampling", "mask_truncated_completions", "num_remains_in_group", "resume_from_checkpoint",
    "save_steps", "fsdp", "fsdp_config",
})


@dataclass
class PPOConfig(FlagsConfig):
    """What PPO has and GRPO does not, with TRL's PPOConfig names. The defaults were chosen on think_addition.

    Tried briefly (30 steps, seed 0, greedy accuracy on 200 test problems at step 30, with samples that differed
    from GRPO's from step 1 on, as building the critic then moved the sampling RNG; GRPO reached 73.5% there): lam 0.95 gave 70.5% (critic lr 1e-4) and 72.0% (1e-3), lam 1
    gave 73.0% (1e-4) and 79.0% (1e-3). The shipped PPO run (notebook 06) is at 74.0% at step 30. All learn; one
    seed cannot rank them (a difference of two runs has a standard error of ~4.5 points). So the choices follow
    reasons:

    * lam = 1 (TRL: 0.95). The reward sits on the last token and gamma = 1, so with lam = 1 token t's advantage is
      R - V(s_t). With lam = 0.95 and a critic that knows nothing yet (V = 0), token t gets lam^(T-1-t) R: the
      first token of a 30-token completion, where this policy decides whether to think, sees 0.95^29 = 23% of it.
      VC-PPO (Yuan et al. 2025) calls this reward signal decay and trains its critic with lam = 1 for it.
    * critic_learning_rate = 1e-3 (TRL: the policy's, here 1e-4). The zero-initialised head starts at V = 0 while
      the reward is ~0.3; at 1e-4 its V(s_0) stays 0.3-0.4 below the batch's mean reward for ~15 steps (a lagging
      critic, `value/v0_bias`), at 1e-3 it is within ~0.1 after 5 steps. Accuracy hardly differs: whitening
      subtracts the batch's mean advantage, so a critic that is off by a constant costs little.
    * vf_coef = 0.1 (TRL's). With the critic in its own Adam param group its size matters only through the shared
      gradient clip: Adam undoes a constant scale of the gradient.
    * kl_coef = 0 (TRL: 0.05) and num_ppo_epochs = 1 (TRL: 4): GRPO's beta = 0 and its one optimizer step per
      batch, so that the two runs have the same budget and differ in the baseline only.
    """

    vf_coef: float = 0.1  # weight of the value loss in the summed loss
    gamma: float = 1.0  # discount per token; 1 = the completion's reward counts in full at every token
    lam: float = 1.0  # GAE's lambda: 1 = Monte Carlo, A_t = R - V(s_t); 0 = one-step TD errors (TRL: 0.95)
    cliprange_value: float = 0.2  # the critic may move at most this far from V_old per batch (PPO2)
    kl_coef: float = 0.0  # KL penalty in the reward against the starting policy (0 = no reference model)
    whiten_advantages: bool = True  # A_t -> (A_t - mean) / std over the batch's tokens (TRL always does)
    critic_learning_rate: float | None = 1e-3  # None = the policy's learning_rate
    num_ppo_epochs: int = 1  # passes over each batch
    num_mini_batches: int = 1  # optimizer steps per pass

    def __post_init__(self):
        for key in ("gamma", "lam"):
            if not 0 <= getattr(self, key) <= 1:
                raise ConfigError(f"{key}: must be in [0, 1], got {getattr(self, key)!r}")
        for key in ("vf_coef", "kl_coef"):
            if not (math.isfinite(getattr(self, key)) and getattr(self, key) >= 0):
                raise ConfigError(f"{key}: must be a finite number >= 0, got {getattr(self, key)!r}")
        if not (math.isfinite(self.cliprange_value) and self.cliprange_value > 0):
            raise ConfigError(f"cliprange_value: must be > 0, got {self.cliprange_value!r}")
        if self.critic_learning_rate is not None and not (math.isfinite(self.critic_learning_rate)
                                                          and self.critic_learning_rate > 0):
            raise ConfigError(f"critic_learning_rate: must be > 0 (or None), got {self.critic_learning_rate!r}")
        for key in ("num_ppo_epochs", "num_mini_batches"):
            if not (isinstance(getattr(self, key), int) and getattr(self, key) >= 1):
                raise ConfigError(f"{key}: must be an integer >= 1, got {getattr(self, key)!r}")


def _check(cfg: Config, ppo: PPOConfig) -> None:
    """One-line errors for the Config settings this loop does not honour, rather than silently ignoring them."""
    unsupported = {"resume_from_checkpoint": None, "save_steps": 0, "dynamic_sampling": False, "beta": 0.0,
                   "mask_truncated_completions": False, "load_in_4bit": False, "num_remains_in_group": None,
                   "top_p": 1.0, "top_k": 0,  # a truncated sampler's log-probs: the GRPO family's (truncation.py)
                   "fp16": False}  # loss scaling is the GRPO family's and SFT's (mixed_precision.py); bf16 works
    if processes.launched_processes() > 1:
        raise ConfigError("train_ppo: one process only (several processes: minigrpo train, the GRPO family)")
    if cfg.fsdp:  # the critic (ppo_critic.ValueModel, a second decoder) is neither wrapped nor sharded
        raise ConfigError("fsdp: not supported by train_ppo (one process, critic unsharded); shard GRPO-family runs "
                          "with minigrpo train --fsdp full_shard")
    for key, default in unsupported.items():
        if getattr(cfg, key) != default:
            raise ConfigError(f"{key}: not supported by train_ppo (PPO's KL coefficient is PPOConfig.kl_coef)"
                              if key == "beta" else f"{key}: not supported by train_ppo")
    if advantages.ESTIMATOR_NEEDS.get(cfg.advantage_estimator):  # the logged GRPO-family advantage: rewards only
        raise ConfigError(f"advantage_estimator: {cfg.advantage_estimator} is not supported by train_ppo")
    if cfg.generation_batch_size % ppo.num_mini_batches:
        raise ConfigError(f"num_mini_batches: {ppo.num_mini_batches} does not divide generation_batch_size="
                          f"{cfg.generation_batch_size}")


def train_ppo(cfg: Config, ppo: PPOConfig | None = None, *, reward_funcs: list | None = None,
              progress: bool = True) -> dict:
    """Train with PPO and a critic, evaluate before and after, write output_dir/{config.yaml, metrics.jsonl,
    summary.json, plots/} like trainer.train. config.yaml holds the Config's fields and a `ppo:` section.

    reward_funcs: your own reward functions (TRL's signature, see rewards.py); they replace cfg.reward_funcs.
    """
    ppo = ppo or PPOConfig()
    _check(cfg, ppo)
    run = load_run(cfg, resolve_device(cfg.device), reward_funcs,  # seeded: the task, the policy, rows, rewards
                   updates_per_step=ppo.num_ppo_epochs * ppo.num_mini_batches)  # optimizer steps a batch
    model, tokenizer, task, max_len, device = run.model, run.tokenizer, run.task, run.max_completion_length, run.device
    sampling_rng = torch.get_rng_state()  # building the critic must not move the stream the samples come from:
    value_model = ValueModel(model).to(device)  # the policy's decoder, copied, with a zero-initialised scalar head
    torch.set_rng_state(sampling_rng)  # ... so PPO's first batch is GRPO's first batch, sample for sample
    ref_model = reference_policy(model) if ppo.kl_coef > 0 else None
    engine = make_engine(cfg, model, tokenizer, [r["prompt"] for r in run.train_rows], max_len)
    critic_lr = ppo.critic_learning_rate or cfg.learning_rate
    optimizer, scheduler = make_optimizer(cfg, [  # the critic in its own param group; the same schedule for both
        {"params": [p for p in model.parameters() if p.requires_grad], "lr": cfg.learning_rate},
        {"params": [p for p in value_model.parameters() if p.requires_grad], "lr": critic_lr}])
    sampler = PromptSampler(run.train_rows, cfg.seed)
    write_config(run.out, cfg.to_dict(), algorithm="ppo", ppo=ppo.to_dict())
    log = RunLog(run.out, reward_names(run.reward_funcs), **cfg.log_options())
    evaluate_on = evaluator(model, tokenizer, task, max_len, cfg.temperature, cfg.chat_template_kwargs)
    on_policy = ppo.num_ppo_epochs == 1 and ppo.num_mini_batches == 1  # the ratio is 1: no old_logp forward

    before = evaluate_on(run.test_rows, num_samples=cfg.eval_num_samples)
    wall_seconds = 0.0
    bar = tqdm(range(1, cfg.max_steps + 1), total=cfg.max_steps, desc="ppo", disable=not progress, dynamic_ncols=True)
    for step in bar:
        t0 = time.perf_counter()
        # 1-2. Sample and score, exactly as GRPO does (collect_batch also computes GRPO's advantage: logged only).
        with run.autocast():
            batch = collect_batch(cfg, engine, sampler, run.reward_funcs, run.reward_weights, max_len,
                                  reward_logs=run.reward_logs.at(step))
        t_generate = time.perf_counter() - t0
        rewards = every_completion_scored(batch.rewards, step).to(device)  # (N,)
        ids = {k: getattr(batch, k).to(device) for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}

        # 3. Targets, before any update: old log-probs, the critic's V(s_t), GAE advantages and returns.
        model.eval()
        value_model.eval()
        with run.autocast():
            ref_logp = None if ref_model is None else completion_logprobs(ref_model, *ids.values(),
                                                                          temperature=cfg.temperature)[0]
            targets = ppo_targets(model, value_model, ids, rewards, ref_logp=ref_logp, kl_coef=ppo.kl_coef,
                                  gamma=ppo.gamma, lam=ppo.lam, whiten_advantages=ppo.whiten_advantages,
                                  temperature=cfg.temperature,
                                  need_old_logp=not on_policy or batch.sampling_logp is not None)
        # vLLM sampled: its log-probs against ours, and TRL's importance weight on each token, as in train().
        targets["is_weight"], sampling_stats = sampler_correction(
            targets["old_logp"], batch.sampling_logp, ids["completion_mask"], **cfg.sampler_correction_options())

        # 4. Optimise policy and critic together.
        model.train()
        value_model.train()
        step_stats = ppo_update(model, value_model, optimizer, ids, targets, cliprange=cfg.epsilon,
                                cliprange_value=ppo.cliprange_value, vf_coef=ppo.vf_coef,
                                num_ppo_epochs=ppo.num_ppo_epochs, num_mini_batches=ppo.num_mini_batches,
                                temperature=cfg.temperature, max_grad_norm=cfg.max_grad_norm, autocast=run.autocast)
        engine.sync_weights()
        learning_rate = scheduler.get_last_lr()[0]
        scheduler.step()
        step_seconds = time.perf_counter() - t0
        wall_seconds += step_seconds

        # 5. Log one line: GRPO's names, the critic's, and both estimators' advantage variances on this batch.
        row, correct = ppo_step_metrics(batch, targets, step_stats, task, log.reward_names, cfg.num_generations)
        row = {"step": step, **row, **run.reward_logs.take_metrics(row)}  # and what reward functions logged
        row.update(learning_rate=learning_rate, critic_learning_rate=critic_lr * learning_rate / cfg.learning_rate,
                   step_seconds=step_seconds, generate_seconds=t_generate,
                   tokens_per_second=batch.completion_mask.sum().item() / step_seconds, **sampling_stats)
        if task.graded and eval_due(step, cfg.eval_steps, cfg.max_steps):
            row["eval/accuracy_greedy"] = evaluate_on(run.test_rows[: cfg.eval_num_problems])["accuracy_greedy"]
        log.log(step, row, batch, correct)
        bar.set_postfix(reward=f"{row['reward']:.2f}", v0_bias=f"{row['value/v0_bias']:+.2f}")
    log.close()

    after = evaluate_on(run.test_rows, num_samples=cfg.eval_num_samples)
    from .lab.plots import plot_critic_runs

    # The policy only is saved: the critic is a training device, not a product.
    return finish_run(cfg, task, model, tokenizer, run.out, before=before, after=after,
                      num_test_problems=len(run.test_rows), wall_seconds=wall_seconds, device=device,
                      plot_extra=plot_critic_runs, **ppo_summary(model, value_model, ppo))


def ppo_step_metrics(batch, targets: dict, step_stats: list[dict], task, reward_names: list[str],
                     group_size: int) -> tuple[dict, list[bool]]:
    """One step's metrics (and each completion's correctness): GRPO's names, with `advantages` = PPO's raw GAE
    advantage of each completion's first token (batch.adv is set to it, so the logged completions show it too), then
    the critic's losses and diagnostics, and the variance of each estimator's advantages on this same batch."""
    grpo_adv = batch.adv  # group_advantages(rewards, G) as GRPO would train on it, (N,)
    batch.adv = targets["raw_adv"][:, 0].cpu()
    gathered = gather_batch(batch, task)
    row = step_metrics(gathered, step_stats, reward_names)
    row.update({k: fmean(s[k] for s in step_stats) for k in ("pg_loss", "vf_loss", "vf_clipfrac", "value_mean")})
    row.update(targets["stats"])
    centred, _ = group_advantages(batch.rewards, group_size, scale="none")  # r_i - mean of its group (Dr. GRPO's)
    row.update({"adv_var/grpo": grpo_adv.var(unbiased=False).item(),
                "adv_var/grpo_unscaled": centred.var(unbiased=False).item(),
                "adv_var/reward": batch.rewards.var(unbiased=False).item(),
                "grpo_advantages": [round(a, 4) for a in grpo_adv.tolist()]})
    return row, gathered["correct"].tolist()


def every_completion_scored(rewards: torch.Tensor, step: int) -> torch.Tensor:
    """rewards, or a RewardError where a completion has none (NaN: no reward function applies): PPO's critic needs
    a reward for every completion (GRPO leaves such a completion out of its group's statistics)."""
    if rewards.isnan().any():
        raise RewardError(f"step {step}: {int(rewards.isnan().sum())} completions have no reward (no reward "
                          "function applies); PPO's critic needs one for every completion")
    return rewards


def ppo_summary(model, value_model, ppo: PPOConfig) -> dict:
    """What summary.json adds for a PPO run: the algorithm, and parameter counts of policy and critic."""
    critic_trainable, critic_total = parameter_counts(value_model)
    trainable_params, total_params = parameter_counts(model)
    return dict(algorithm="ppo", loss_type="ppo", trainable_params=trainable_params + critic_trainable,
                total_params=total_params + critic_total, policy_params=total_params, critic_params=critic_total,
                ppo=ppo.to_dict())
