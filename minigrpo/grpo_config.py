"""TRL's GRPOConfig on minigrpo's Config: a TRL script or YAML file carries over with its import changed.

    from minigrpo import GRPOConfig, GRPOTrainer       # was: from trl import GRPOConfig, GRPOTrainer

`GRPOConfig` takes TRL 1.16's field names with TRL's meanings and TRL's defaults, and every field of minigrpo's
`Config` besides (task, shared_prefix, advantage_estimator, ...). `GRPOTrainer` turns it into the Config that runs
(`to_config`, which needs the number of training rows for num_train_epochs); config.yaml records that Config, in
minigrpo's names. Where TRL and minigrpo count differently:

    TRL                                            minigrpo's Config
    per_device_train_batch_size B,                 generation_batch_size = B x processes x S completions per
    steps_per_generation S (None: A),              batch; steps_per_generation = S / A optimizer steps per batch;
    gradient_accumulation_steps A                  gradient_accumulation_steps = A micro-batches per optimizer step
    generation_batch_size (None: B x processes x S)  generation_batch_size (then S = it / (B x processes))
    max_steps (optimizer steps; -1: epochs)        max_steps in batches: ceil(max_steps / (S / A x num_iterations))
    num_train_epochs                               max_steps = ceil(epochs x (training rows // prompts per batch))
    eval_strategy "no" / "steps" / "epoch",        eval_steps (0: before and after training only; TRL evaluates
    eval_steps (None: logging_steps)               nothing then), in batches
    save_strategy "no" / "steps" / "epoch"         save_steps (0: no checkpoints), in batches
    logging_steps                                  logging_steps (a printed line), in batches; metrics.jsonl
                                                   holds every step either way
    bf16 None                                      True on a GPU, False on the CPU and with fp16 (TRL: not fp16)
    use_bias_correction_kl True                    only with beta > 0 (no KL term, nothing to correct)
    scale_rewards True / False                     "group" / "none"
    report_to "none", a name or a list             report_to (None, or the list)
    fsdp "full_shard auto_wrap"                    fsdp "full_shard" (FSDP2, every block)
    model_init_kwargs {"dtype": "bfloat16"}        dtype
    sapo_temperature_pos / _neg                    loss_options (with loss_type sapo)
    use_cpu                                        device "cpu"
    disable_tqdm                                   train(progress=...)

One default differs on purpose: log_completions is True (minigrpo writes completions.jsonl, which `minigrpo show`
reads; TRL's False only keeps them off the console). TRL's fields that change nothing minigrpo computes
(dataloader workers, log levels, per_device_eval_batch_size, ...) are accepted and ignored (IGNORED); those that
would change the run but minigrpo does not have are accepted at TRL's default only, and refused otherwise in one
line that says what to use instead (UNSUPPORTED). A name TRL does not have either gets "did you mean".
"""

import dataclasses
import math
from dataclasses import dataclass

from .config import Config, ConfigError, did_you_mean

__all__ = ["GRPOConfig", "UNSUPPORTED", "IGNORED", "TRL_RENAMED", "trl_advice", "unknown_key_line"]

# TRL fields that change nothing minigrpo computes: accepted at any value, and ignored.
IGNORED = frozenset({
    "per_device_eval_batch_size", "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers",
    "dataloader_prefetch_factor", "dataloader_multiprocessing_context", "logging_strategy", "logging_first_step",
    "log_on_each_node", "logging_nan_inf_filter", "log_level", "log_level_replica", "run_name", "project",
    "skip_memory_metrics", "do_train", "do_eval", "do_predict", "local_rank", "remove_unused_columns", "ddp_timeout",
    "ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers", "ddp_static_graph", "ddp_backend",
    "eval_on_start", "include_num_input_tokens_seen", "debug", "trackio_space_id", "trackio_bucket_id",
    "trackio_static_space_id", "save_on_each_node", "log_multimodal", "num_completions_to_print",
    "log_unique_prompts", "eval_do_concat_batches", "eval_use_gather_object", "prediction_loss_only",
    "include_for_metrics", "batch_eval_metrics", "eval_accumulation_steps", "length_column_name", "label_names",
    "average_tokens_across_devices",  # minigrpo's token normaliser is over all processes already (trainer.py)
})

_HUB = "minigrpo does not upload: push output_dir/model yourself (`hf upload NAME output_dir/model`)"
_KERNELS = "minigrpo runs plain PyTorch; leave it out"
_SAMPLING = ("it would change the distribution the completions are sampled from, which the loss's log-probs must "
             "match; minigrpo samples with temperature, top_p and top_k")
_VLLM_SERVER = "minigrpo runs vLLM in the trainer's process only (vllm_mode colocate, use_vllm)"
_ENTROPY = "minigrpo's entropy bonus has a fixed coefficient: entropy_coef"
_EVAL = "minigrpo evaluates greedy accuracy every eval_steps batches on eval_num_problems problems"

# TRL fields minigrpo does not have, with TRL's default (accepted) and what to use instead of any other value.
UNSUPPORTED = {
    "lr_scheduler_kwargs": (None, "lr_scheduler_type is constant or linear, with warmup_steps"),
    "optim": ("adamw_torch_fused", "minigrpo's optimizer is torch's AdamW (adamw_torch / adamw_torch_fused)"),
    "optim_args": (None, "set AdamW's learning_rate, adam_beta1, adam_beta2, weight_decay"),
    "optim_target_modules": (None, "minigrpo trains every trainable weight (use_peft: the adapter's)"),
    "adam_epsilon": (1e-8, "minigrpo's AdamW uses eps 1e-8"),
    "label_smoothing_factor": (0.0, "there are no labels in GRPO"),
    "tf32": (None, "set torch.backends.cuda.matmul.allow_tf32 yourself"),
    "bf16_full_eval": (False, "evaluation runs in the training dtype (bf16: autocast)"),
    "fp16_full_eval": (False, "evaluation runs in the training dtype (bf16 / fp16: autocast)"),
    "activation_checkpointing": (None, "use gradient_checkpointing"),
    "activation_checkpointing_kwargs": (None, "use gradient_checkpointing"),
    "gradient_checkpointing_kwargs": (None, "minigrpo's gradient_checkpointing is non-reentrant "
                                            "(use_reentrant=False) with no other options"),
    "torch_compile": (False, _KERNELS), "torch_compile_backend": (None, _KERNELS),
    "torch_compile_mode": (None, _KERNELS), "use_liger_kernel": (False, _KERNELS),
    "liger_kernel_config": (None, _KERNELS), "cast_lm_head_to_fp32": (False, _KERNELS),
    "use_cache": (False, "minigrpo decodes with its own KV cache and trains without one"),
    "neftune_noise_alpha": (None, "not a GRPO setting; leave it out"),
    "torch_empty_cache_steps": (None, "leave it out"), "auto_find_batch_size": (False, "set the batch sizes"),
    "eval_delay": (0, _EVAL), "num_generations_eval": (None, "set eval_num_samples (samples per problem)"),
    "load_best_model_at_end": (False, "minigrpo saves the final model; checkpoints keep earlier steps"),
    "metric_for_best_model": (None, "minigrpo saves the final model"), "greater_is_better": (None, "leave it out"),
    "save_only_model": (False, "checkpoints hold what an exact resume needs (optimizer, RNGs)"),
    "enable_jit_checkpoint": (False, "leave it out"),
    "restore_callback_states_from_checkpoint": (False, "leave it out"),
    "ignore_data_skip": (False, "a resumed run continues the prompt order exactly"),
    "full_determinism": (False, "minigrpo is seeded (seed); OMP_NUM_THREADS=1 for bit-identical CPU reruns"),
    "data_seed": (None, "seed sets the prompt order too"),
    "accelerator_config": (None, "minigrpo uses torch's DDP / FSDP2 directly (fsdp)"),
    "parallelism_config": (None, "minigrpo uses torch's DDP / FSDP2 directly (fsdp)"),
    "deepspeed": (None, "minigrpo shards with torch's FSDP2: fsdp full_shard"),
    "ds3_gather_for_generation": (True, "minigrpo shards with torch's FSDP2: fsdp full_shard"),
    "push_to_hub": (False, _HUB), "hub_token": (None, _HUB), "hub_private_repo": (None, _HUB),
    "hub_model_id": (None, _HUB), "hub_strategy": ("every_save", _HUB), "hub_always_push": (False, _HUB),
    "hub_revision": (None, _HUB), "log_completions_hub_repo": (None, _HUB),
    "dataloader_drop_last": (False, "minigrpo draws whole batches from endless shuffled passes"),
    "dataloader_in_order": (True, "leave it out"),
    "train_sampling_strategy": ("random", "minigrpo shuffles each pass over the prompts (seed)"),
    "shuffle_dataset": (True, "minigrpo shuffles each pass over the prompts (seed)"),
    "pad_to_multiple_of": ("auto", "leave it out"),
    "trust_remote_code": (False, "minigrpo loads transformers' own model classes only"),
    "router_aux_loss_coef": (None, "mixture-of-experts routing losses are not in minigrpo"),
    "disable_dropout": (False, "minigrpo samples and computes old log-probs in eval mode (no dropout); the "
                               "training pass keeps the model's dropout"),
    "min_p": (None, _SAMPLING), "generation_kwargs": (None, _SAMPLING), "repetition_penalty": (1.0, _SAMPLING),
    "cache_implementation": (None, "minigrpo's decode loop keeps its own KV cache (kv_cache.py)"),
    "use_transformers_continuous_batching": (False, "minigrpo samples with its own decode loop or vLLM"),
    "transformers_continuous_batching_config": (None, "minigrpo samples with its own decode loop or vLLM"),
    "use_transformers_paged": (False, "minigrpo samples with its own decode loop or vLLM"),
    "vllm_mode": ("colocate", _VLLM_SERVER), "vllm_model_impl": ("vllm", "leave it out"),
    "vllm_structured_outputs_regex": (None, _SAMPLING), "vllm_server_base_url": (None, _VLLM_SERVER),
    "vllm_server_host": ("0.0.0.0", _VLLM_SERVER), "vllm_server_port": (8000, _VLLM_SERVER),
    "vllm_server_timeout": (240.0, _VLLM_SERVER), "vllm_group_port": (51216, _VLLM_SERVER),
    "vllm_max_model_length": (None, "minigrpo sizes vLLM's context to the longest prompt + max_completion_length"),
    "vllm_tensor_parallel_size": (1, "minigrpo's vLLM engine runs on one device per process"),
    "vllm_importance_sampling_cap": (None, "use vllm_importance_sampling_clip_max"),
    "use_adaptive_entropy": (False, _ENTROPY), "entropy_coef_min": (0.0, _ENTROPY),
    "entropy_coef_max": (1.0, _ENTROPY), "entropy_coef_delta": (0.005, _ENTROPY), "entropy_target": (0.2, _ENTROPY),
}
ALLOWED_VALUES = {  # TRL values that mean what minigrpo does anyway
    "optim": ("adamw_torch", "adamw_torch_fused"),
    "gradient_checkpointing_kwargs": (None, {"use_reentrant": False}),
    "vllm_mode": ("colocate",),
}


def trl_advice(key: str, value=None) -> str | None:
    """The one line for a TRL field minigrpo does not have (None when `value` is allowed, or the key is not TRL's):
    "<key>: TRL's field, not in minigrpo (<what to use instead>)"."""
    if key not in UNSUPPORTED or key in Config.__dataclass_fields__:  # a field minigrpo gained meanwhile
        return None
    default, instead = UNSUPPORTED[key]
    if value == default or value in ALLOWED_VALUES.get(key, ()):
        return None
    shown = "" if value is None else f" {value!r}"
    return f"{key}{shown}: TRL's field, not in minigrpo ({instead})"


# TRL's names for what minigrpo's Config holds under another name or count: what a `minigrpo train` flag or a YAML
# key says instead (GRPOConfig itself takes them, as TRL does).
TRL_RENAMED = {
    "per_device_train_batch_size": "generation_batch_size (completions per batch, = per_device_train_batch_size x "
                                   "processes x steps_per_generation)",
    "num_train_epochs": "max_steps (batches: epochs x training rows / prompts per batch)",
    "eval_strategy": "eval_steps (0: evaluate before and after training only)",
    "save_strategy": "save_steps (0: no checkpoints)",
    "model_init_kwargs": "dtype (the weights' dtype at load)",
    "sapo_temperature_pos": 'loss_options (e.g. {"sapo_temperature_pos": 1.0})',
    "sapo_temperature_neg": 'loss_options (e.g. {"sapo_temperature_neg": 1.05})',
    "use_cpu": "device cpu",
    "disable_tqdm": "train(cfg, progress=False)",
}


def unknown_key_line(key: str, value=None) -> str:
    """The one line for a key minigrpo's Config does not have: TRL's name for one it has (TRL_RENAMED), a TRL field
    it does not have (UNSUPPORTED, IGNORED), or a typo ("did you mean")."""
    if key in TRL_RENAMED:
        return (f"{key}: TRL's name; minigrpo's Config has {TRL_RENAMED[key]}, and minigrpo.GRPOConfig takes {key} "
                f"as TRL does")
    if key in UNSUPPORTED:
        return f"{key}: TRL's field, not in minigrpo ({UNSUPPORTED[key][1]})"
    if key in IGNORED:
        return f"{key}: TRL's field; it changes nothing minigrpo computes: leave it out"
    from .config import ALIASES

    hint = did_you_mean(key, sorted(set(Config.__dataclass_fields__) | set(ALIASES)))
    return f"{key}: unknown config key" + (f"; {hint}" if hint else "")


@dataclass(init=False)
class GRPOConfig(Config):
    """TRL's GRPOConfig: TRL's names, meanings and defaults; every minigrpo Config field besides. See the module's
    docstring for how it maps onto the Config that runs."""

    # --- TRL's names, meanings and defaults (mapped onto minigrpo's Config by to_config) ---
    output_dir: str | None = None  # the run's folder; None: "trainer_output" (GRPOTrainer without args: MODEL-GRPO)
    # None: "answer" (your rows' final answers, graded; TRL's "solution" column counts as the answer) when
    # GRPOTrainer is given a train_dataset, else think_addition (the shipped tiny world)
    task: str | None = None
    per_device_train_batch_size: int = 8  # TRL: completions per process per micro-batch (B)
    # TRL: micro-batches per generated batch (S; None: gradient_accumulation_steps); a batch is then B x processes
    # x S completions, and S / gradient_accumulation_steps optimizer steps
    steps_per_generation: int | None = None
    generation_batch_size: int | None = None  # TRL: completions per generated batch (None: B x processes x S)
    num_train_epochs: float = 3.0  # TRL: passes over the training prompts, when max_steps is -1
    max_steps: int = -1  # TRL: optimizer steps (-1: from num_train_epochs)
    max_completion_length: int | None = 512  # tokens per completion (TRL's default)
    learning_rate: float = 1e-6  # AdamW's peak learning rate (TRL's default)
    lr_scheduler_type: str = "linear"  # constant (with warmup_steps; TRL's constant_with_warmup) or linear
    loss_type: str = "dapo"  # an entry of objectives.LOSSES (TRL's default: dapo)
    seed: int = 42
    bf16: bool | None = None  # autocast to bfloat16; None: on a GPU, not on the CPU (TRL: always)
    gradient_checkpointing: bool = True  # recompute activations in backward (TRL's default)
    # DeepSeek-V3.2's unbiased KL (TRL's default True); it applies only with beta > 0
    use_bias_correction_kl: bool = True
    scale_rewards: str = "group"  # group, batch, none (TRL also takes True = group, False = none)
    save_steps: int = 500  # TRL: checkpoint every N optimizer steps (with save_strategy "steps")
    save_strategy: str = "steps"  # TRL: "no", "steps" or "epoch"
    save_total_limit: int | None = None  # keep the newest N checkpoints (None: all, TRL's default)
    eval_strategy: str = "no"  # TRL: "no" (minigrpo still evaluates before and after), "steps" or "epoch"
    eval_steps: int | None = None  # TRL: with eval_strategy "steps", every N optimizer steps (None: logging_steps)
    logging_steps: int = 10  # print one line of metrics every N optimizer steps (TRL's default 10)
    report_to: None | str | list[str] = "none"  # TRL: "none", "tensorboard", "wandb", or a list of them
    fsdp: None | str | list[str] = None  # TRL: "full_shard ..." (FSDP2 on every block) or None
    model_init_kwargs: dict | None = None  # TRL: from_pretrained's arguments; minigrpo reads "dtype" / "torch_dtype"
    sapo_temperature_pos: float = 1.0  # SAPO's gate temperature for A > 0 (loss_type sapo)
    sapo_temperature_neg: float = 1.05  # ... and for A <= 0
    use_cpu: bool = False  # train on the CPU even when a GPU is there
    disable_tqdm: bool | None = None  # no progress bars (GRPOTrainer's train(progress=False))

    def __init__(self, output_dir: str | None = None, **kwargs):
        """Any field by name (TRL's or minigrpo's); TRL's fields that minigrpo ignores are accepted (IGNORED), those
        it lacks are accepted at TRL's default and refused otherwise, in one line (UNSUPPORTED)."""
        known = {f.name for f in dataclasses.fields(self)}
        for key in list(kwargs):
            if key in known:
                continue
            value = kwargs.pop(key)
            advice = trl_advice(key, value)
            if advice:
                raise ConfigError(advice)
            if key not in IGNORED and key not in UNSUPPORTED:
                hint = did_you_mean(key, sorted(known | IGNORED | set(UNSUPPORTED)))
                raise ConfigError(f"{key}: not a GRPOConfig field" + (f"; {hint}" if hint else ""))
        for f in dataclasses.fields(self):
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            setattr(self, f.name, kwargs.get(f.name, default))
        self.output_dir = output_dir if output_dir is not None else kwargs.get("output_dir")
        self.__post_init__()

    def validate(self) -> None:
        """Construction checks the mapping and every value, as the Config would (the number of training rows is
        not known yet: max_steps -1 is checked as one batch)."""
        for key, allowed in (("save_strategy", ("no", "steps", "epoch")), ("eval_strategy", ("no", "steps", "epoch"))):
            if getattr(self, key) not in allowed:
                raise ConfigError(f"{key}: {getattr(self, key)!r} is not one of {', '.join(allowed)} (minigrpo keeps "
                                  "the final model, not the best one)")
        # TRL's reward_weights are for GRPOTrainer's reward_funcs, unknown here (checked against them in to_config)
        weights = self.reward_weights
        stand_ins = None if weights is None or len(weights) == len(self.reward_funcs) else ["correctness"] * len(weights)
        self.to_config(num_train_rows=None, reward_funcs=stand_ins)

    def to_config(self, num_train_rows: int | None, world_size: int = 1, reward_funcs: list | None = None) -> Config:
        """The Config that runs: TRL's counts turned into minigrpo's (the module's table). num_train_rows: the
        prompts one epoch passes over (None: max_steps -1 counts as one batch, for checking only); world_size:
        the processes (TRL's per-device sizes are per process); reward_funcs: GRPOTrainer's (TRL keeps them out of
        its config), named in the Config, whose reward_weights are checked against them (None: the config's own)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(Config)}
        if reward_funcs is not None:
            from .rewards import reward_func_name

            values["reward_funcs"] = [f if isinstance(f, str) else reward_func_name(f) for f in reward_funcs]
        A, B = self.gradient_accumulation_steps, self.per_device_train_batch_size
        for key in ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations"):
            if not isinstance(getattr(self, key), int) or getattr(self, key) < 1:
                raise ConfigError(f"{key}: must be an integer >= 1, got {getattr(self, key)!r}")
        S = self.steps_per_generation or (self.generation_batch_size // (B * world_size)
                                          if self.generation_batch_size else A)
        generation = self.generation_batch_size or B * world_size * S
        if generation != B * world_size * S or S % A:
            raise ConfigError(f"steps_per_generation: TRL's counts micro-batches of per_device_train_batch_size={B}; "
                              f"a batch of {generation} completions over {world_size} process(es) needs it to be a "
                              f"multiple of gradient_accumulation_steps={A} (got {S})")
        updates = S // A * self.num_iterations  # optimizer steps per generated batch: TRL counts these
        batches = lambda optimizer_steps: max(1, math.ceil(optimizer_steps / updates))  # noqa: E731
        prompts = generation // self.num_generations
        epoch = max(1, (num_train_rows or prompts) // max(1, prompts))  # batches per pass over the prompts
        steps = batches(self.max_steps) if self.max_steps > 0 else max(1, math.ceil(self.num_train_epochs * epoch))
        values.update(
            generation_batch_size=generation, steps_per_generation=S // A, max_steps=steps,
            eval_steps=self._every(self.eval_strategy, self.eval_steps or self.logging_steps, epoch, batches),
            save_steps=self._every(self.save_strategy, self.save_steps, epoch, batches),
            logging_steps=batches(self.logging_steps) if self.logging_steps else 0,
            task=self.task or "think_addition", report_to=self.report_to, fsdp=self._fsdp(),
            scale_rewards={True: "group", False: "none"}.get(self.scale_rewards, self.scale_rewards),
            bf16=self._bf16(), use_bias_correction_kl=self.use_bias_correction_kl and self.beta > 0,
            device="cpu" if self.use_cpu else self.device, dtype=self._dtype(), output_dir=self.output_dir or
            "trainer_output", loss_options=self._loss_options())
        return Config(**values)

    @staticmethod
    def _every(strategy: str, optimizer_steps: int, epoch: int, batches) -> int:
        """TRL's *_strategy and *_steps as minigrpo's every-N-batches (0: never)."""
        return 0 if strategy == "no" else epoch if strategy == "epoch" else batches(optimizer_steps)

    def _bf16(self) -> bool:
        if self.bf16 is not None:
            return self.bf16
        if self.fp16:  # TRL too: bf16 None means not fp16
            return False
        import torch

        return torch.cuda.is_available() and not self.use_cpu and self.device != "cpu"

    def _fsdp(self) -> str:
        words = self.fsdp.split() if isinstance(self.fsdp, str) else list(self.fsdp or [])
        if words and "full_shard" not in words:
            raise ConfigError(f"fsdp: {self.fsdp!r}: minigrpo shards with FSDP2's full_shard only (--fsdp full_shard)")
        return "full_shard" if words else ""

    def _dtype(self) -> str:
        init = dict(self.model_init_kwargs or {})
        dtype = init.pop("dtype", init.pop("torch_dtype", None))
        if init:
            raise ConfigError(f"model_init_kwargs: minigrpo reads dtype only (set use_peft, load_in_4bit, ... as "
                              f"fields), not {', '.join(init)}")
        dtype = str(dtype).removeprefix("torch.") if dtype is not None else self.dtype
        if dtype == "auto":
            raise ConfigError("model_init_kwargs: dtype 'auto' is not read; name it (float32, bfloat16, float16)")
        return dtype

    def _loss_options(self) -> dict | None:
        if self.loss_type != "sapo":
            return self.loss_options
        return {"sapo_temperature_pos": self.sapo_temperature_pos, "sapo_temperature_neg": self.sapo_temperature_neg,
                **(self.loss_options or {})}
