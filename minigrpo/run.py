"""A run's set-up and wrap-up, shared by the three trainers (trainer.py, ppo_trainer.py, sft.py): which model,
which rows and reward functions, the optimizer and its schedule, the rollout engine, a fresh start or a resume, how
to evaluate, the sampler's log-probs against ours, and what is written at the end. Like the trainers, these read
the Config; what they call (models.py, engines.py, checkpoint.py, ...) takes values.

    device = ...                          (trainer: joins the process group first)
    check the settings                    (each trainer its own: what it cannot honour is a one-line error)
    run = load_run(cfg, device, ...)      seeded; the task, the policy, its rows and rewards, the output folder
    ... the trainer's own loop ...
    finish_run(...)                       save the policy, summary.json, plots/
"""

import dataclasses
import functools
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from . import distributed
from .batch import ToolSetup
from .checkpoint import CheckpointError, latest_checkpoint, list_checkpoints, load_checkpoint, truncate_metrics
from .config import Config, ConfigError
from .engine_mismatch import importance_weights, mismatch_stats
from .engines import GenerateEngine, RolloutEngine
from .evaluate import evaluate
from .metrics import finite_or_none
from .models import (adapter_base, add_lora, enable_gradient_checkpointing, is_quantized, load_model, load_tokenizer,
                     parameter_counts, peft_wrapping, save_policy)
from .peak_memory import peak_memory_bytes
from .prompts import encode_prompts
from .rewards import build_reward_funcs, reward_names
from .rollout import eos_token_ids
from .run_log import RunLog
from .tasks import Task, get_task
from .tools import EnvironmentPool, ToolWorker, environment_tools, load_tools, tool_schemas

__all__ = ["RunSetup", "load_run", "load_policy", "make_engine", "start_or_resume", "write_config", "open_log",
           "policy_path", "prepare_task", "make_optimizer", "lr_lambda", "evaluator", "eval_due", "vllm_correction",
           "run_summary", "finish_run", "tool_setup"]


@dataclass
class RunSetup:
    """What a trainer starts from (load_run): the task, the policy to train, the rows, the reward functions with
    their weights, the completion budget resolved from the task, and the output folder (made)."""

    device: torch.device
    task: Task
    model: torch.nn.Module
    tokenizer: object
    train_rows: list[dict]
    test_rows: list[dict]
    reward_funcs: list
    reward_weights: list[float]
    max_completion_length: int  # cfg.max_completion_length, else the task's
    out: Path
    bf16: bool = False

    def autocast(self):
        """bfloat16 autocast for the forward passes when the run asks for it (bf16), else a no-op context."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)


def load_run(cfg: Config, device: torch.device, reward_funcs: list | None = None) -> RunSetup:
    """Seed, load the task and the policy (full, LoRA or QLoRA), read and check the rows and reward functions
    (prepare_task), make the output folder. With W processes each rank is then re-seeded on its own stream, so that
    the ranks start from identical weights but sample different completions."""
    torch.manual_seed(cfg.seed)  # the same on every rank: identical starting weights (and LoRA initialisation)
    random.seed(cfg.seed)
    task = get_task(cfg.task, answer_grader=cfg.answer_grader)
    model, tokenizer = load_policy(cfg, policy_path(cfg, task), device)
    if distributed.world_size() > 1:
        torch.manual_seed(cfg.seed + distributed.rank())
    train_rows, test_rows, reward_funcs, weights, max_len = prepare_task(cfg, task, tokenizer, model.config,
                                                                         reward_funcs)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    return RunSetup(device, task, model, tokenizer, train_rows, test_rows, reward_funcs, weights, max_len, out,
                    cfg.bf16)


def write_config(out: Path, cfg: Config, **extra) -> None:
    """output_dir/config.yaml: the Config's fields (then `extra`, which may override one), in field order."""
    (out / "config.yaml").write_text(yaml.safe_dump({**cfg.to_dict(), **extra}, sort_keys=False))


def load_policy(cfg, name_or_path: str | os.PathLike, device: torch.device):
    """(model, tokenizer) as the config asks: full weights, LoRA (`use_peft`) or QLoRA (`load_in_4bit` too).

    name_or_path may be a LoRA adapter (a run's model/ with use_peft): training then continues that adapter on
    its base. Without use_peft an adapter is refused in one line: its merged model is what to train fully."""
    base = adapter_base(name_or_path)
    if base is not None and not cfg.use_peft:
        raise ConfigError(f"model_name_or_path: {name_or_path} is a LoRA adapter (on {base}); continue training it "
                          f"with use_peft, or train all weights of its merged model (minigrpo writes it beside the "
                          f"adapter, as {Path(name_or_path).name}_merged)")
    model = load_model(
        base or name_or_path, device, dtype=cfg.dtype, load_in_4bit=cfg.load_in_4bit,
        bnb_4bit_quant_type=cfg.bnb_4bit_quant_type, use_bnb_nested_quant=cfg.use_bnb_nested_quant,
    )
    if cfg.use_peft and base is not None:  # the adapter's own r, alpha and targets: cfg's lora_* do not apply
        from peft import PeftModel, prepare_model_for_kbit_training

        if getattr(model, "is_loaded_in_4bit", False):
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        with peft_wrapping():
            model = PeftModel.from_pretrained(model, str(name_or_path), is_trainable=True)
    elif cfg.use_peft:
        model = add_lora(model, r=cfg.lora_r, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout,
                         target_modules=cfg.lora_target_modules)
    if cfg.gradient_checkpointing or (cfg.fsdp_config or {}).get("activation_checkpointing"):  # the same thing
        enable_gradient_checkpointing(model)
    return model, load_tokenizer(name_or_path)


def make_engine(cfg, model, tokenizer, prompts: list | None = None, max_completion_length: int | None = None
                ) -> RolloutEngine:
    """The engine the config asks for: vLLM with `use_vllm`, else the policy's own decode loop.

    prompts, max_completion_length: the run's training prompts and completion budget; vLLM sizes its context
    (max_model_len) and KV cache to the longest prompt plus the completion (else to the model's context)."""
    if cfg.use_vllm:
        from .rollout_vllm import VLLMEngine  # imports vllm itself, with a clear error when it is missing

        max_model_len = None
        if prompts and max_completion_length:
            longest = max(len(ids) for ids in encode_prompts(tokenizer, prompts, cfg.chat_template_kwargs))
            max_model_len = longest + max_completion_length
        return VLLMEngine(model, tokenizer, max_model_len=max_model_len, seed=cfg.seed,
                          chat_template_kwargs=cfg.chat_template_kwargs, enable_sleep_mode=cfg.vllm_enable_sleep_mode,
                          gpu_memory_utilization=cfg.vllm_gpu_memory_utilization)
    return GenerateEngine(model, tokenizer, cfg.chat_template_kwargs)


def start_or_resume(cfg, out: Path, **training_objects) -> tuple[int, dict]:
    """(step to start after, what the loop carries between steps): (0, fresh) or, with --resume, the newest
    checkpoint restored into model, optimizer, scheduler, RNGs, sampler and reward functions, and the run's
    metrics.jsonl and completions.jsonl cut back to its step. A fresh run refuses a directory that holds
    another run's checkpoints."""
    if cfg.resume_from_checkpoint:
        ckpt = latest_checkpoint(cfg.resume_from_checkpoint)
        defaults = {f.name: f.default for f in dataclasses.fields(cfg) if f.default is not dataclasses.MISSING}
        start_step, run_state = load_checkpoint(ckpt, **training_objects, config=cfg.to_dict(),
                                                rank=distributed.rank(), world_size=distributed.world_size(),
                                                config_defaults=defaults)
        if distributed.is_main():
            for name in ("metrics.jsonl", "completions.jsonl"):
                truncate_metrics(ckpt.parent.parent / name, start_step, copy_to=out / name)
        return start_step, run_state
    if list_checkpoints(out / "checkpoints"):
        raise CheckpointError(f"output_dir: {out} holds checkpoints of an earlier run; continue it with "
                              f"--resume {out}, or choose another --out")
    return 0, {"wall_seconds": 0.0, "before": None}  # "before": the evaluation before step 1


def run_summary(cfg, task, model_name, *, before: dict, after: dict, num_test_problems: int, wall_seconds: float,
                device, quantized: bool, params: tuple[int, int], peak_memory_bytes: int, **extra) -> dict:
    """summary.json: the run's settings that matter for comparing runs, accuracy and completion length before
    and after training, cost. extra: what one trainer adds (PPO: its critic's size and settings)."""
    return finite_or_none({
        "task": task.name, "model": str(model_name), "dataset": cfg.dataset_name, "loss_type": cfg.loss_type,
        "seed": cfg.seed, "steps": cfg.max_steps, "wall_seconds": round(wall_seconds, 2),
        "accuracy_before": before["accuracy_greedy"], "accuracy_after": after["accuracy_greedy"],
        "accuracy_before_sampled": before.get("accuracy_sampled"), "accuracy_after_sampled": after.get("accuracy_sampled"),
        "completion_length_before": before["mean_length_greedy"], "completion_length_after": after["mean_length_greedy"],
        "eval_before": before, "eval_after": after, "num_test_problems": num_test_problems,
        "device": str(device), "torch": torch.__version__,
        "quantized": quantized, "trainable_params": params[0], "total_params": params[1],
        "peak_memory_bytes": peak_memory_bytes,  # CUDA peak allocated, or the process's peak RSS on CPU
        **extra,
    })


def open_log(cfg: Config, out: Path, reward_funcs: list, *, resume_step: int = 0, enabled: bool = True) -> RunLog:
    """The run's metrics.jsonl and completions.jsonl (and report_to's loggers), as the Config asks."""
    return RunLog(out, reward_names(reward_funcs), group_size=cfg.group_size, log_completions=cfg.log_completions,
                  log_completions_groups=cfg.log_completions_groups, report_to=cfg.report_to, config=cfg.to_dict(),
                  resume_step=resume_step, enabled=enabled)


def policy_path(cfg: Config, task: Task):
    """The model to train: cfg.model_name_or_path, else the task's shipped tiny model (addition tasks only)."""
    if cfg.model_name_or_path is None and not task.model_dir.exists():
        raise ConfigError(f"model_name_or_path: the task {task.name!r} ships no model; pass one with --model "
                          f"(a local directory or a hub name such as Qwen/Qwen2.5-0.5B-Instruct)")
    return cfg.model_name_or_path or task.model_dir


def prepare_task(cfg: Config, task: Task, tokenizer, model_config, reward_funcs: list | None = None):
    """The run's rows and reward functions, checked before any step: (train_rows, test_rows, reward_funcs,
    reward_weights, max_completion_length). One-line ConfigError for an empty split, a weight count that does
    not match, or prompts that leave no room for the completion in the model's context."""
    max_len = cfg.max_completion_length or task.max_completion_length
    if reward_funcs is None:
        reward_funcs = build_reward_funcs(cfg.reward_funcs, task, max_len, overlong_buffer_len=cfg.overlong_buffer_len,
                                          seed=cfg.seed)
    weights = cfg.reward_weights or [1.0] * len(reward_funcs)
    if len(weights) != len(reward_funcs):
        raise ConfigError(f"reward_weights: {len(weights)} weights for {len(reward_funcs)} reward functions")
    load = lambda split: task.load(split, cfg.dataset_name, cfg.dataset_config)  # noqa: E731
    train_rows, test_rows = load(cfg.dataset_train_split), load(cfg.dataset_test_split)[: cfg.eval_limit]
    for split, rows in (("train", train_rows), ("test", test_rows)):
        if not rows:
            raise ConfigError(f"task: the {split} split of {cfg.dataset_name or task.name!r} is empty")
    context = getattr(model_config, "max_position_embeddings", None)
    for rows in (train_rows, test_rows):  # training and evaluation both sample up to max_len tokens
        prompt_ids = encode_prompts(tokenizer, [r["prompt"] for r in rows], cfg.chat_template_kwargs)
        longest_prompt = max(len(ids) for ids in prompt_ids)
        if context is not None and longest_prompt + max_len > context:
            raise ConfigError(
                f"max_completion_length: prompt ({longest_prompt} tokens) + completion ({max_len}) exceeds "
                f"the model's context of {context} tokens"
            )
    return train_rows, test_rows, reward_funcs, weights, max_len


def lr_lambda(cfg: Config):
    """The learning rate's factor at each optimizer step: linear warm-up, then constant or linear decay to 0."""
    def factor(step: int) -> float:
        warm = min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else 1.0
        decay = max(0.0, 1 - step / cfg.max_steps) if cfg.lr_scheduler_type == "linear" else 1.0
        return warm * decay

    return factor


def make_optimizer(cfg: Config, params) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW with the config's settings (params: parameters, or param groups with their own lr) and its schedule.
    The scheduler steps once per batch, the optimizer once per mini-batch."""
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2),
                                  weight_decay=cfg.weight_decay)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))


def evaluator(cfg: Config, model, tokenizer, task: Task, max_completion_length: int, tools=None):
    """evaluate() with this run's settings: its sampling temperature, completion budget, chat template and tools."""
    return functools.partial(evaluate, model, tokenizer, task, temperature=cfg.temperature,
                             max_completion_length=max_completion_length, chat_template_kwargs=cfg.chat_template_kwargs,
                             tools=tools)


def eval_due(cfg: Config, step: int) -> bool:
    """Whether this step ends with a greedy evaluation: every eval_steps steps, and the last step (0 = never)."""
    return bool(cfg.eval_steps) and (step % cfg.eval_steps == 0 or step == cfg.max_steps)


def vllm_correction(cfg: Config, old_logp, sampling_logp, loss_mask) -> tuple[torch.Tensor | None, dict]:
    """With an engine that returns its sampling log-probs (vLLM): TRL's importance weight per token (None when
    switched off) and the sampling/* mismatch statistics. Without one: (None, {})."""
    if sampling_logp is None:
        return None, {}
    sampling_logp = sampling_logp.to(old_logp.device)
    is_weight = None
    if cfg.vllm_importance_sampling_correction:
        is_weight = importance_weights(old_logp, sampling_logp, loss_mask, mode=cfg.vllm_importance_sampling_mode,
                                       clip_min=cfg.vllm_importance_sampling_clip_min,
                                       clip_max=cfg.vllm_importance_sampling_clip_max)
    return is_weight, mismatch_stats(old_logp, sampling_logp, loss_mask, is_weight, cfg.vllm_importance_sampling_mode)


def tool_setup(cfg: Config, task: Task, tools: list | None, model, tokenizer,
               environment_factory=None) -> ToolSetup | None:
    """The run's tools (train's `tools=`, else cfg.tools, else the task's own) with a worker to run them, and the
    environments environment_factory makes (one per completion, tools/environment.py), or None for neither.
    A function without a usable schema (type hints, a docstring) is a one-line error here, before any step."""
    if tools is None:
        tools = load_tools(cfg.tools) if cfg.tools else getattr(task, "tools", None)
    if not tools and environment_factory is None:
        return None
    tools = list(tools or [])
    environments = EnvironmentPool(environment_factory) if environment_factory is not None else None
    tool_schemas(tools + ([] if environments is None else list(environment_tools(environments.example).values())))
    worker = ToolWorker({tool.__name__: tool for tool in tools}, max_output_chars=cfg.max_tool_output_chars)
    max_iterations = cfg.max_tool_calling_iterations
    if max_iterations is None:  # the task's own limit, if it has one
        max_iterations = getattr(task, "max_tool_calling_iterations", None)
    return ToolSetup(tools, worker, eos_token_ids(model, tokenizer), max_iterations, cfg.tool_timeout,
                     cfg.max_tool_output_chars, environments)


def finish_run(cfg: Config, task: Task, model, tokenizer, out: Path, *, before: dict, after: dict,
               num_test_problems: int, wall_seconds: float, device, plot_extra=None, state_dict=None,
               **extra) -> dict:
    """After the last step (main process): save the policy, write summary.json and the plots; returns the summary.

    Peak memory is read before saving: merging a LoRA adapter reloads the base model. extra: what one trainer
    adds to the summary; plot_extra(run_dirs, plots_dir): its own plots. state_dict: the whole model's, gathered
    from its shards (FSDP2, distributed.full_state_dict), saved instead of the model's own."""
    peak_memory = peak_memory_bytes(device)
    params = parameter_counts(model)
    if cfg.save_model:  # LoRA: the adapter in model/, the merged model in model_merged/
        save_policy(model, tokenizer, out / "model", base_name_or_path=policy_path(cfg, task), dtype=cfg.dtype,
                    state_dict=state_dict)
    summary = run_summary(cfg, task, policy_path(cfg, task), before=before, after=after,
                          num_test_problems=num_test_problems, wall_seconds=wall_seconds, device=device,
                          quantized=is_quantized(model), params=params, peak_memory_bytes=peak_memory, **extra)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False))
    from .lab.plots import plot_runs  # matplotlib, only when a run ends

    plot_runs([out], out / "plots")
    if plot_extra is not None:
        plot_extra([out], out / "plots")
    return summary
