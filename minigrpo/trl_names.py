"""TRL's names that minigrpo's Config does not take, and the one line each gets: a TRL field that changes nothing
minigrpo computes (IGNORED), one minigrpo does not have (UNSUPPORTED: accepted at TRL's default only), one it holds
under another name or count (TRL_RENAMED). config.py's load_config and grpo_config.py's GRPOConfig read them.
"""

from .errors import did_you_mean

__all__ = ["IGNORED", "UNSUPPORTED", "ALLOWED_VALUES", "TRL_RENAMED", "trl_advice", "unknown_key_line"]

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
    if key not in UNSUPPORTED:
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


def unknown_key_line(key: str, value=None, known=()) -> str:
    """The one line for a key minigrpo's Config does not have: TRL's name for one it has (TRL_RENAMED), a TRL field
    it does not have (UNSUPPORTED, IGNORED), or a typo ("did you mean" one of `known`, the keys Config takes)."""
    if key in TRL_RENAMED:
        return (f"{key}: TRL's name; minigrpo's Config has {TRL_RENAMED[key]}, and minigrpo.GRPOConfig takes {key} "
                f"as TRL does")
    if key in UNSUPPORTED:
        return f"{key}: TRL's field, not in minigrpo ({UNSUPPORTED[key][1]})"
    if key in IGNORED:
        return f"{key}: TRL's field; it changes nothing minigrpo computes: leave it out"
    hint = did_you_mean(key, sorted(known))
    return f"{key}: unknown config key" + (f"; {hint}" if hint else "")
