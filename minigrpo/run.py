"""A run's set-up from its Config, and its wrap-up, shared by the trainers (trainer.py, ppo_trainer.py, sft.py,
dpo_trainer.py, reward_trainer.py): which model, which rows and reward functions, the output folder, the optimizer
and its schedule, the engine that samples, and what is written at the end. Like the trainers, these read the
Config; what they call takes values.

    device = ...                          (trainer: joins the process group first)
    check the settings                    (each trainer its own: what it cannot honour is a one-line error)
    run = load_run(cfg, device, ...)      seeded; the task, the policy, its rows and rewards, the output folder
    ... the trainer's own loop ...
    finish_run(...)                       save the policy, summary.json, plots/

What the loop does with them sits in the room of its job, one call away:

    persistence/checkpoint.py   start_or_resume, save_step_checkpoint (--resume, save_steps)
    persistence/run_log.py      RunLog (metrics.jsonl, completions.jsonl), write_config (config.yaml)
    evaluate.py                 evaluator (evaluate() with the run's settings), eval_due
    tools/setup.py              tool_setup: the run's tools, a worker, their limits
    generation/engine_mismatch.py   sampler_correction: the sampler's log-probs against ours
"""

import dataclasses
import json
import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .config import Config, ConfigError
from .generation.engines import GenerateEngine, RolloutEngine
from .reward_models.judge import LLMJudge
from .loading.models import (adapter_base, add_lora, enable_gradient_checkpointing, is_lora, is_quantized, load_model,
                     load_tokenizer, parameter_counts, peft_wrapping, prepare_tokenizer, save_policy)
from .loading.peak_memory import peak_memory_bytes
from .metrics import finite_or_none
from .mixed_precision import autocast_dtype, grad_scaler
from .parallel import processes
from .parallel.processes import say
from .prompts import encode_prompts
from .reward_models.outcome import RewardEnsemble, RewardModel, is_reward_model, load_reward_model
from .reward_logs import RewardLogs
from .rewards import build_reward_funcs, reward_func_name
from .sandbox.user_code import callable_name
from .tasks import Task, get_task
from .tasks.sources import dataset_rows, describe_rows, hold_out, read_dataset

__all__ = ["RunSetup", "load_run", "load_policy", "make_engine", "policy_path", "prepare_task", "resolve_reward_funcs",
           "make_optimizer", "lr_lambda", "run_summary", "finish_run", "claim_output_dir", "record_inputs", "run_rows",
           "RUN_FILES"]


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
    fp16: bool = False
    scaler: torch.amp.GradScaler | None = None  # fp16's loss scaler (mixed_precision.py), part of every checkpoint
    # trainer_state, log_metric, log_extra: what TRL hands reward functions besides the data (reward_logs.py)
    reward_logs: RewardLogs = field(default_factory=RewardLogs)

    @property
    def logs_drift(self) -> bool:
        """Whether the run logs its drift from the start, KL(pi || pi_init): when a reward is learned (a reward
        model, a judge), which a policy can over-optimize."""
        return any(getattr(f, "learned", False) for f in self.reward_funcs)

    @property
    def compute_dtype(self) -> torch.dtype | None:
        """The 16-bit dtype the forward passes run in (bf16: bfloat16, fp16: float16), None for the weights' own."""
        return autocast_dtype(self.bf16, self.fp16)

    def autocast(self):
        """16-bit autocast for the forward passes when the run asks for it (bf16, fp16), else a no-op context."""
        dtype = self.compute_dtype
        return torch.autocast(self.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def load_run(cfg: Config, device: torch.device, reward_funcs: list | None = None, *, model=None,
             processing_class=None, train_rows: list[dict] | None = None, eval_rows: list[dict] | None = None,
             updates_per_step: int = 1) -> RunSetup:
    """Seed, load the task and the policy (full, LoRA or QLoRA), read and check the rows and reward functions
    (prepare_task), claim the output folder (claim_output_dir). With W processes each rank is then re-seeded on its
    own stream, so that the ranks start from identical weights but sample different completions.

    model, processing_class, train_rows, eval_rows: what train() was handed from Python (TRL's names), used
    instead of loading the model, its tokenizer, or the rows of dataset_name. updates_per_step: optimizer steps per
    step (batch), for the trainer_state reward functions get (TRL counts optimizer steps)."""
    refuse_trl_config(cfg)
    torch.manual_seed(cfg.seed)  # the same on every rank: identical starting weights (and LoRA initialisation)
    random.seed(cfg.seed)
    task = get_task(cfg.task, answer_grader=cfg.answer_grader)
    model, tokenizer = load_policy(cfg, policy_path(cfg, task), device, model=model, tokenizer=processing_class)
    if processes.world_size() > 1:
        torch.manual_seed(cfg.seed + processes.rank())
    train_rows, test_rows = run_rows(cfg, task, train_rows, eval_rows)
    train_rows, test_rows, reward_funcs, weights, max_len = prepare_task(cfg, task, tokenizer, model.config,
                                                                         reward_funcs, train_rows, test_rows, device)
    out = claim_output_dir(cfg)  # a used folder is refused before anything is written
    reward_logs = RewardLogs.for_run(cfg.max_steps, updates_per_step, epoch_steps=len(train_rows) /
                                     max(1, cfg.generation_batch_size // cfg.num_generations))
    return RunSetup(device, task, model, tokenizer, train_rows, test_rows, reward_funcs, weights, max_len, out,
                    cfg.bf16, cfg.fp16, grad_scaler(device, enabled=cfg.fp16), reward_logs)


# Config settings the SFT, reward-model and DPO loops do not honour (no sampling engine, no checkpoints, one process)
SINGLE_PASS_UNSUPPORTED = {"use_vllm": False, "fsdp": "", "fsdp_config": None, "resume_from_checkpoint": None,
                           "save_steps": 0, "report_to": None}


def refuse_unsupported(cfg: Config, loop: str) -> None:
    """One line for a SINGLE_PASS_UNSUPPORTED setting away from its default: what `loop` would otherwise ignore."""
    for key, default in SINGLE_PASS_UNSUPPORTED.items():
        if getattr(cfg, key) != default:
            raise ConfigError(f"{key}: not supported by {loop}")


def refuse_trl_config(cfg) -> None:
    """A GRPOConfig holds TRL's meanings (per_device_train_batch_size, max_steps in optimizer steps, ...), not the
    loop's: one line that says where it goes."""
    from .grpo_config import GRPOConfig

    if isinstance(cfg, GRPOConfig):
        raise ConfigError("GRPOConfig: TRL's field meanings; give it to GRPOTrainer(args=...), or pass "
                          "args.to_config(number of training rows) to train()")


# What a run writes into output_dir (trainers, run_log.py's report_to folders, finish_run). The files are minigrpo's
# own names: a folder holding one of them holds a run; the folders (model, plots, wandb, ...) are common names that a
# user's own project may hold too, so they alone do not make a run, and are never deleted unless a run's file is there.
RUN_LOG_FILES = ("config.yaml", "metrics.jsonl", "completions.jsonl", "summary.json")
RUN_FILES = (*RUN_LOG_FILES, "checkpoints", "model", "model_merged", "plots", "tensorboard", "wandb")


def _holds_results(out: Path) -> bool:
    """A run there got somewhere: a summary, a logged step, a checkpoint or a saved model. A run that stopped before
    its first step (a reward function that raised at once, say) leaves only its config and empty logs."""
    logged = any((out / name).is_file() and (out / name).stat().st_size > 0
                 for name in ("metrics.jsonl", "completions.jsonl"))
    return logged or any((out / name).exists() for name in ("summary.json", "checkpoints", "model", "model_merged"))


def claim_output_dir(cfg: Config) -> Path:
    """output_dir, made, for a run that may write there. Refused in one line when it holds another run's results,
    unless this run resumes that one (resume_from_checkpoint in it) or overwrite_output_dir asks to replace it (what
    that run wrote, RUN_FILES, is deleted first; other files are left alone). A run that stopped before its first
    step is replaced without asking (nothing of it is lost). A folder that holds RUN_FILES' folders (model, plots,
    wandb, ...) but no run's files is someone else's: refused, and never deleted. Rank 0 decides for every process,
    before any of them writes."""
    out = Path(cfg.output_dir)
    problem = None
    if processes.is_main():
        if out.exists() and not out.is_dir():
            problem = f"output_dir: {out} is a file, not a folder; nothing was written. Choose another output_dir (--out)"
        elif any(p.exists() and not p.is_dir() for p in out.parents):
            problem = f"output_dir: {out} lies under a file, not a folder; nothing was written. Choose another output_dir (--out)"
        else:
            problem = _claim(cfg, out)
    problem = processes.broadcast_object(problem)
    if problem:
        raise ConfigError(problem)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"output_dir: cannot make {out} ({error.strerror}); choose another output_dir (--out)") from None
    return out


def _claim(cfg: Config, out: Path) -> str | None:
    """claim_output_dir's decision on rank 0: None (write there; what must go is gone) or the one-line refusal."""
    found = [name for name in RUN_FILES if (out / name).exists()]
    if not found:
        return None
    resumed = Path(cfg.resume_from_checkpoint).resolve() if cfg.resume_from_checkpoint else None
    if resumed is not None and out.resolve() in (resumed, *resumed.parents):
        return None
    if not any(name in RUN_LOG_FILES for name in found):
        return (f"output_dir: {out} holds {', '.join(found)} but no run of minigrpo's (no {', '.join(RUN_LOG_FILES)}), "
                f"and a run would write into them; nothing was written or deleted. Choose another output_dir (--out)")
    if cfg.overwrite_output_dir or not _holds_results(out):
        for name in found:
            shutil.rmtree(out / name) if (out / name).is_dir() else (out / name).unlink()
        return None
    resume = (f", continue that run with resume_from_checkpoint (--resume {out})"
              if any((out / "checkpoints").glob("*")) else "")
    return (f"output_dir: {out} holds another run's results ({', '.join(found)}); nothing was written. Choose another "
            f"output_dir (--out){resume}, or replace it with overwrite_output_dir (--overwrite-output-dir)")


def record_inputs(cfg: Config, reward_funcs=None, tools=None, model=None, train_dataset=None, eval_dataset=None
                  ) -> tuple[Config, list[dict] | None, list[dict] | None]:
    """What train() was handed from Python, named in the Config it runs with, so that config.yaml and the
    checkpoints record what ran: reward functions and tools by name (rewards.reward_func_name, "module:function"),
    a model by the path it was loaded from, datasets described by their rows (sources.describe_rows). Returns that
    Config and the datasets as lists of rows (None where none was given)."""
    refuse_trl_config(cfg)
    changes = {}
    if reward_funcs is not None:
        changes["reward_funcs"] = [f if isinstance(f, str) else reward_func_name(f) for f in reward_funcs]
    if tools is not None:
        changes["tools"] = [t if isinstance(t, str) else callable_name(t) for t in tools]
    if model is not None:
        changes["model_name_or_path"] = getattr(model, "name_or_path", "") or f"<{type(model).__name__} object>"
    rows = {}
    for key, argument, dataset in (("dataset_name", "train_dataset", train_dataset),
                                   ("eval_dataset_name", "eval_dataset", eval_dataset)):
        rows[key] = None if dataset is None else dataset_rows(dataset, argument)
        if rows[key] is not None:
            changes[key] = describe_rows(rows[key], argument)
    cfg = dataclasses.replace(cfg, **changes) if changes else cfg
    return cfg, rows["dataset_name"], rows["eval_dataset_name"]


def run_rows(cfg: Config, task: Task, train_rows: list[dict] | None = None, eval_rows: list[dict] | None = None
             ) -> tuple[list[dict], list[dict]]:
    """(train rows, test rows): the rows handed over from Python, else dataset_name's (the task's own by default);
    the test rows from eval_rows, else eval_dataset_name (a file: all its rows), else dataset_name's test split. Rows
    handed over without eval_rows are one pool, held out as a file is: its last tenth (sources.hold_out)."""
    if train_rows is not None:
        train_rows = task.checked_rows(train_rows, "train_dataset")
        if eval_rows is None and cfg.eval_dataset_name is None:  # nothing to grade (the prompts task): all train
            train_rows, eval_rows = hold_out(train_rows) if task.graded else (train_rows, [])
    else:
        train_rows = task.load(cfg.dataset_train_split, cfg.dataset_name, cfg.dataset_config)
    if eval_rows is not None:
        return train_rows, task.checked_rows(eval_rows, "eval_dataset")
    if cfg.eval_dataset_name is not None:
        name = cfg.eval_dataset_name
        split = None if Path(name).is_file() else cfg.dataset_test_split
        eval_rows = read_dataset(name, split, cfg.dataset_config)
        return train_rows, task.checked_rows(eval_rows, f"eval_dataset_name: {name}")
    return train_rows, task.load(cfg.dataset_test_split, cfg.dataset_name, cfg.dataset_config)



def load_policy(cfg, name_or_path: str | os.PathLike, device: torch.device, num_labels: int | None = None, *,
                model=None, tokenizer=None, per_token: bool = False):
    """(model, tokenizer) as the config asks: full weights, LoRA (`use_peft`) or QLoRA (`load_in_4bit` too). With
    num_labels, a sequence classifier on the same body (a reward model being trained: reward_trainer.py), or with
    per_token a token classifier (a process reward model).

    name_or_path may be a LoRA adapter (a run's model/ with use_peft): training then continues that adapter on
    its base. Without use_peft an adapter is refused in one line: its merged model is what to train fully.
    model, tokenizer: a model (and its tokenizer) handed over from Python, used instead of loading name_or_path."""
    if model is not None:
        return given_policy(cfg, model, tokenizer, device)
    base = adapter_base(name_or_path)
    if base is not None and not cfg.use_peft:
        raise ConfigError(f"model_name_or_path: {name_or_path} is a LoRA adapter (on {base}); continue training it "
                          f"with use_peft, or train all weights of its merged model (minigrpo writes it beside the "
                          f"adapter, as {Path(name_or_path).name}_merged)")
    model = load_model(
        base or name_or_path, device, dtype=cfg.dtype, load_in_4bit=cfg.load_in_4bit,
        bnb_4bit_quant_type=cfg.bnb_4bit_quant_type, use_bnb_nested_quant=cfg.use_bnb_nested_quant,
        num_labels=num_labels, per_token=per_token,
    )
    if cfg.use_peft and base is not None:  # the adapter's own r, alpha and targets: cfg's lora_* do not apply
        from peft import PeftModel, prepare_model_for_kbit_training

        if getattr(model, "is_loaded_in_4bit", False):
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        with peft_wrapping():
            model = PeftModel.from_pretrained(model, str(name_or_path), is_trainable=True)
    elif cfg.use_peft:
        model = add_lora(model, r=cfg.lora_r, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout,
                         target_modules=cfg.lora_target_modules,
                         task_type=("TOKEN_CLS" if per_token else "SEQ_CLS") if num_labels else "CAUSAL_LM")
    if cfg.gradient_checkpointing or (cfg.fsdp_config or {}).get("activation_checkpointing"):  # the same thing
        enable_gradient_checkpointing(model)
    return model, load_tokenizer(name_or_path) if tokenizer is None else prepare_tokenizer(tokenizer)


def given_policy(cfg, model, tokenizer, device: torch.device):
    """A model handed over from Python (TRL's model=<a loaded model>), made ready as load_policy makes one: on the
    run's device, with a LoRA adapter added (use_peft; a peft model is trained as it is) and gradient checkpointing
    as asked. Its tokenizer: the one given (TRL's processing_class), else the one saved beside the model."""
    if cfg.load_in_4bit and not is_quantized(model):
        raise ConfigError("load_in_4bit: quantizes the weights while they load; pass the model's name or path "
                          "instead of the loaded model")
    if not is_quantized(model):  # 4-bit weights were placed while loading and are never moved
        model.to(device)
    if cfg.use_peft and not is_lora(model):
        model = add_lora(model, r=cfg.lora_r, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout,
                         target_modules=cfg.lora_target_modules)
    if cfg.gradient_checkpointing or (cfg.fsdp_config or {}).get("activation_checkpointing"):
        enable_gradient_checkpointing(model)
    return model, load_tokenizer(model.name_or_path) if tokenizer is None else prepare_tokenizer(tokenizer)


def make_engine(cfg, model, tokenizer, prompts: list | None = None, max_completion_length: int | None = None, *,
                factory=None) -> RolloutEngine:
    """The engine that samples: factory(model, tokenizer) when given (train's engine_factory: your own engine,
    e.g. lab/cast_engine.py's CastEngine), else the one the config asks for: vLLM with `use_vllm`, else the
    policy's own decode loop.

    prompts, max_completion_length: the run's training prompts and completion budget; vLLM sizes its context
    (max_model_len) and KV cache to the longest prompt plus the completion (else to the model's context)."""
    if factory is not None:
        return factory(model, tokenizer)
    if cfg.use_vllm:
        from .generation.rollout_vllm import VLLMEngine  # imports vllm itself, with a clear error when it is missing

        max_model_len = None
        if prompts and max_completion_length:
            longest = max(len(ids) for ids in encode_prompts(tokenizer, prompts, cfg.chat_template_kwargs))
            max_model_len = longest + max_completion_length
        return VLLMEngine(model, tokenizer, max_model_len=max_model_len, seed=cfg.seed,
                          chat_template_kwargs=cfg.chat_template_kwargs, enable_sleep_mode=cfg.vllm_enable_sleep_mode,
                          gpu_memory_utilization=cfg.vllm_gpu_memory_utilization)
    return GenerateEngine(model, tokenizer, cfg.chat_template_kwargs)



def run_summary(cfg, task, model_name, *, before: dict, after: dict, num_test_problems: int, wall_seconds: float,
                device, quantized: bool, params: tuple[int, int], peak_memory_bytes: int, **extra) -> dict:
    """summary.json: the run's settings that matter for comparing runs, accuracy and completion length before
    and after training, cost. extra: what one trainer adds (PPO: its critic's size and settings)."""
    return finite_or_none({
        "task": task.name, "model": str(model_name), "dataset": cfg.dataset_name,
        "loss_type": extra["loss_type"] if "loss_type" in extra else cfg.loss_type,  # PPO's is "ppo"
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



def policy_path(cfg: Config, task: Task):
    """The model to train: cfg.model_name_or_path, else the task's shipped tiny model (addition tasks only)."""
    if cfg.model_name_or_path is None and not task.model_dir.exists():
        raise ConfigError(f"model_name_or_path: the task {task.name!r} ships no model; pass one with --model "
                          f"(a local directory or a hub name such as Qwen/Qwen2.5-0.5B-Instruct)")
    return cfg.model_name_or_path or task.model_dir


def prepare_task(cfg: Config, task: Task, tokenizer, model_config, reward_funcs: list | None = None,
                 train_rows: list[dict] | None = None, test_rows: list[dict] | None = None,
                 device: torch.device | str = "cpu"):
    """The run's rows and reward functions, checked before any step: (train_rows, test_rows, reward_funcs,
    reward_weights, max_completion_length). The rows are run_rows' (read from dataset_name when not given); the
    training rows whose prompt is longer than max_prompt_length are left out (how many is printed), the test rows
    cut to eval_limit. reward_funcs (else cfg.reward_funcs) may mix functions, names and reward models
    (`resolve_reward_funcs`); those load on `device`. One-line ConfigError for an empty split, a weight count that
    does not match, or prompts that leave no room for the completion in the model's context."""
    max_len = cfg.max_completion_length or task.max_completion_length
    reward_funcs = resolve_reward_funcs(cfg, task, max_len, cfg.reward_funcs if reward_funcs is None else reward_funcs,
                                        device)
    weights = cfg.reward_weights or [1.0] * len(reward_funcs)
    if len(weights) != len(reward_funcs):
        raise ConfigError(f"reward_weights: {len(weights)} weights for {len(reward_funcs)} reward functions")
    if train_rows is None or test_rows is None:
        train_rows, test_rows = run_rows(cfg, task)
    test_rows = test_rows[: cfg.eval_limit]
    context = getattr(model_config, "max_position_embeddings", None)
    checked = {}
    for split, rows in (("train", train_rows), ("test", test_rows)):  # training and evaluation both sample max_len
        if split == "test" and not task.graded:  # nothing to evaluate (the prompts task)
            checked[split] = []
            continue
        if not rows:
            raise ConfigError(f"task: the {split} split of {cfg.dataset_name or task.name!r} is empty")
        prompt_lengths = [len(ids) for ids in encode_prompts(tokenizer, [r["prompt"] for r in rows],
                                                             cfg.chat_template_kwargs)]
        if split == "train" and cfg.max_prompt_length is not None:
            rows, prompt_lengths = drop_long_prompts(rows, prompt_lengths, cfg.max_prompt_length)
        if context is not None and max(prompt_lengths) + max_len > context:
            raise ConfigError(
                f"max_completion_length: prompt ({max(prompt_lengths)} tokens) + completion ({max_len}) exceeds "
                f"the model's context of {context} tokens"
            )
        checked[split] = rows
    return checked["train"], checked["test"], reward_funcs, weights, max_len


def drop_long_prompts(rows: list[dict], prompt_lengths: list[int], max_prompt_length: int):
    """(rows, prompt lengths) without the rows whose prompt has more than max_prompt_length tokens; how many were
    left out is printed, and none left is a one-line ConfigError."""
    kept = [i for i, n in enumerate(prompt_lengths) if n <= max_prompt_length]
    if not kept:
        raise ConfigError(f"max_prompt_length: every training prompt is longer than {max_prompt_length} tokens "
                          f"(the shortest has {min(prompt_lengths)})")
    if len(kept) < len(rows):
        say(f"max_prompt_length {max_prompt_length}: {len(rows) - len(kept)} of {len(rows)} training prompts are "
            "longer and are left out")
    return [rows[i] for i in kept], [prompt_lengths[i] for i in kept]


def resolve_reward_funcs(cfg: Config, task: Task, max_len: int, entries: list, device) -> list:
    """TRL's reward_funcs entries, each made a reward function: a callable as it is; a reward model's directory
    (or hub id) or a loaded sequence-classification model, a RewardModel on the run's device (reward_models/; a
    RewardModel, RewardEnsemble or LLMJudge given is moved there); any other string, a name or "module:function"
    (rewards.build_reward_funcs)."""
    funcs = []
    for entry in entries:
        if isinstance(entry, (RewardModel, RewardEnsemble, LLMJudge)):
            funcs.append(entry.to(device))
        elif is_reward_model(entry):
            funcs.append(load_reward_model(entry, device, chat_template_kwargs=cfg.chat_template_kwargs))
        else:
            funcs += build_reward_funcs([entry], task, max_len, overlong_buffer_len=cfg.overlong_buffer_len,
                                        seed=cfg.seed)
    return funcs


def lr_lambda(cfg: Config):
    """The learning rate's factor at each step (batch, counted from 0), transformers' schedules stepped once a batch:

        warm-up W > 0     (step + 1) / W              rising to 1 at step W - 1, the peak (transformers: from 0)
        then constant     1
        or linear         (T - step) / (T - peak)     from 1 at the peak (W - 1, or 0 without warm-up) to 0 at T
    """
    def factor(step: int) -> float:
        peak = max(cfg.warmup_steps - 1, 0)
        if step < peak:
            return (step + 1) / cfg.warmup_steps
        if cfg.lr_scheduler_type != "linear":
            return 1.0
        return max(0.0, (cfg.max_steps - step) / max(1, cfg.max_steps - peak))

    return factor


def make_optimizer(cfg: Config, params) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW with the config's settings (params: parameters, or param groups with their own lr) and its schedule.
    The scheduler steps once per batch, the optimizer once per mini-batch."""
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2),
                                  weight_decay=cfg.weight_decay)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))







def finish_run(cfg: Config, task: Task, model, tokenizer, out: Path, *, before: dict, after: dict,
               num_test_problems: int, wall_seconds: float, device, plot_extra=None, state_dict=None,
               **extra) -> dict:
    """After the last step (main process): save the policy, write summary.json and the plots; returns the summary.

    Peak memory is read before saving: merging a LoRA adapter reloads the base model. extra: what one trainer
    adds to the summary; plot_extra(run_dirs, plots_dir): its own plots. state_dict: the whole model's, gathered
    from its shards (FSDP2, parallel/processes.full_state_dict), saved instead of the model's own."""
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
