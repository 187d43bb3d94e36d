"""TRL's GRPOTrainer, as a thin door to minigrpo's `train()`: the same arguments, the same objects, no second loop.

TRL's quick start runs with its import changed:

    from datasets import load_dataset
    from minigrpo import GRPOTrainer                  # was: from trl import GRPOTrainer
    from trl.rewards import accuracy_reward

    dataset = load_dataset("trl-lib/DeepMath-103K", split="train")
    trainer = GRPOTrainer(model="Qwen/Qwen2-0.5B-Instruct", reward_funcs=accuracy_reward, train_dataset=dataset)
    trainer.train()

What it accepts, as TRL does: `model` a hub id, a local path or a loaded model; `reward_funcs` one or a list of
functions with TRL's signature, reward names or "module:function" specs (rewards.build_reward_funcs), or reward
models: a directory, a hub id or a loaded sequence-classification model (reward_models/outcome.py), each scored with the
tokenizer given in `reward_processing_classes` (None: the one saved beside it); `reward_weights` in args; `args` a
GRPOConfig (TRL's names, grpo_config.py) or minigrpo's Config; `train_dataset` / `eval_dataset` a datasets.Dataset
or a list of rows (TRL's "prompt" column, a string or chat messages, and any other columns for the reward
functions); `processing_class` the tokenizer; `peft_config` a peft LoraConfig (its r, lora_alpha, lora_dropout,
target_modules); `quantization_config` a 4-bit BitsAndBytesConfig (QLoRA); `tools` and `environment_factory` as in TRL. Without an eval_dataset the last tenth of
train_dataset is held out for minigrpo's before / after evaluation, as for a single file (said when training
starts). What minigrpo does not have (callbacks, optimizers, rollout_func) is refused in one line.

`train()` calls `minigrpo.trainer.train(config, ...)`, the loop a student reads, and returns its summary (accuracy
before and after, steps, time); the run's folder holds config.yaml (what ran, in minigrpo's names), metrics.jsonl,
completions.jsonl, summary.json, plots/ and the model.
"""

import dataclasses
import json
import os
import sys
from pathlib import Path

from .config import Config, ConfigError
from .grpo_config import GRPOConfig

__all__ = ["GRPOTrainer"]


class GRPOTrainer:
    """TRL's GRPOTrainer signature over minigrpo's train(). See the module's docstring."""

    def __init__(self, model, reward_funcs, args: GRPOConfig | Config | None = None, train_dataset=None,
                 eval_dataset=None, processing_class=None, reward_processing_classes=None, callbacks=None,
                 optimizers=(None, None), quantization_config=None, peft_config=None, tools=None, rollout_func=None,
                 environment_factory=None):
        refused = {"callbacks": (callbacks, "minigrpo has no callbacks: read metrics.jsonl, or report_to"),
                   "optimizers": (None if optimizers == (None, None) else optimizers,
                                  "minigrpo makes AdamW and its schedule from the config (learning_rate, ...)"),
                   "rollout_func": (rollout_func, "minigrpo samples with its decode loop, vLLM or tools")}
        for name, (value, instead) in refused.items():
            if value is not None:
                raise ConfigError(f"{name}: TRL's argument, not in minigrpo ({instead})")
        if isinstance(eval_dataset, dict):
            raise ConfigError("eval_dataset: a dict of datasets; minigrpo evaluates on one: pass one of them")
        model_name = model if isinstance(model, (str, Path)) else getattr(model, "name_or_path", "") or "model"
        if args is None:  # as TRL names the folder
            args = GRPOConfig(f"{Path(str(model_name)).name}-GRPO")
        changes = {"model_name_or_path": str(model)} if isinstance(model, (str, Path)) else {}
        if isinstance(args, GRPOConfig) and args.task is None and train_dataset is not None:
            # your rows: their final answers graded ("answer", or TRL's "solution"), else scored by the rewards alone
            changes["task"] = "answer" if has_answers(train_dataset) else "prompts"
        changes |= lora_fields(peft_config) | quantization_fields(quantization_config)
        self.args = dataclasses.replace(args, **changes) if changes else args
        self._model = None if isinstance(model, (str, Path)) else model  # a loaded model is trained in place
        reward_funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        self.reward_funcs = with_processing_classes(reward_funcs, reward_processing_classes,
                                                    getattr(self.args, "chat_template_kwargs", None))
        self.train_dataset, self.eval_dataset, self.processing_class = train_dataset, eval_dataset, processing_class
        self.tools, self.environment_factory = tools, environment_factory
        self.summary: dict | None = None

    @property
    def model(self):
        """The model: the one given, trained in place; given a name, None before training and after it the trained
        model as saved (output_dir/model, loaded on first use on the run's device and in its dtype; a LoRA run's
        adapter as a peft PeftModel on its base, merge_and_unload()-able; a QLoRA run's base is loaded unquantized)."""
        if self._model is None and self.summary is not None and self.saved_model_dir().exists():
            from .loading.models import DTYPES, load_model, resolve_device

            cfg, saved = self.config(), self.saved_model_dir()
            if (saved / "adapter_config.json").exists():
                from peft import AutoPeftModelForCausalLM

                self._model = AutoPeftModelForCausalLM.from_pretrained(saved, dtype=DTYPES[cfg.dtype]).to(
                    resolve_device(cfg.device))
            else:
                self._model = load_model(saved, resolve_device(cfg.device), dtype=cfg.dtype)
        return self._model

    def holds_out(self) -> bool:
        """Whether rows are held out of train_dataset for evaluation: not for a task with nothing to grade."""
        from .tasks import get_task

        return get_task(self.args.task or "think_addition").graded

    def saved_model_dir(self) -> Path:
        return Path(self.config().output_dir) / "model"

    def config(self, resume_from_checkpoint: bool | str | None = None) -> Config:
        """The Config train() runs with: GRPOConfig's TRL counts turned into minigrpo's, for this dataset's size.
        resume_from_checkpoint: TRL's: True = the newest checkpoint in output_dir, or a path."""
        cfg = self.args
        if isinstance(cfg, GRPOConfig):
            from .tasks.sources import held_out_size

            rows = None
            if self.train_dataset is not None:
                rows = len(self.train_dataset)
                rows -= held_out_size(rows) if self.eval_dataset is None and self.holds_out() else 0
            world_size = int(os.environ.get("WORLD_SIZE", "1"))  # set by accelerate launch / torchrun
            cfg = cfg.to_config(num_train_rows=rows, world_size=world_size, reward_funcs=self.reward_funcs)
        if resume_from_checkpoint:
            resume = cfg.output_dir if resume_from_checkpoint is True else str(resume_from_checkpoint)
            cfg = dataclasses.replace(cfg, resume_from_checkpoint=resume)
        return cfg

    def train(self, resume_from_checkpoint: bool | str | None = None) -> "TrainResult | None":
        """Train with minigrpo's train(); returns its summary, which also reads as TRL's TrainOutput (global_step,
        training_loss, metrics). Ctrl-C stops with one line naming the newest checkpoint and how to resume
        (trainer.train(resume_from_checkpoint=True)), and returns None."""
        from .persistence.checkpoint import stopped_line
        from .parallel.processes import say
        from .trainer import train

        cfg = self.config(resume_from_checkpoint)
        if self.train_dataset is not None and self.eval_dataset is None and self.holds_out():
            say("GRPOTrainer: no eval_dataset, so the last tenth of train_dataset is held out for the evaluation "
                "before and after training")
        prompts = cfg.generation_batch_size // cfg.num_generations
        say(f"GRPOTrainer: {cfg.max_steps} step{'s' * (cfg.max_steps != 1)} of {cfg.generation_batch_size} "
            f"completions ({prompts} prompt{'s' * (prompts != 1)} x {cfg.num_generations}), loss {cfg.loss_type}, "
            f"into {cfg.output_dir}")
        progress = not getattr(self.args, "disable_tqdm", False)
        try:
            summary = train(cfg, reward_funcs=self.reward_funcs, tools=self.tools,
                            environment_factory=self.environment_factory, progress=progress, model=self._model,
                            processing_class=self.processing_class, train_dataset=self.train_dataset,
                            eval_dataset=self.eval_dataset)
        except KeyboardInterrupt:
            print(stopped_line(Path(cfg.output_dir), "trainer.train(resume_from_checkpoint=True)"), file=sys.stderr)
            return None
        updates = cfg.steps_per_generation * cfg.num_iterations
        self.summary = TrainResult(summary, global_step=summary["steps"] * updates, run_dir=Path(cfg.output_dir))
        return self.summary

    def save_model(self, output_dir: str | None = None) -> Path:
        """TRL's save_model: minigrpo saved the trained model (or adapter) into output_dir/model when training
        ended. Into another folder it is copied; into the run's folder itself, as TRL saves there, its files are
        linked in (hard links: no second copy on disk; copies where the file system cannot link), so that
        from_pretrained(output_dir) loads it. Returns the folder given (output_dir/model without one)."""
        import shutil

        saved = self.saved_model_dir()
        if output_dir is None or Path(output_dir).resolve() == saved.resolve():
            return saved
        if Path(output_dir).resolve() != saved.parent.resolve():
            shutil.copytree(saved, output_dir, dirs_exist_ok=True)
            return Path(output_dir)
        for file in (f for f in saved.iterdir() if f.is_file()):
            target = saved.parent / file.name
            target.unlink(missing_ok=True)
            try:
                os.link(file, target)
            except OSError:
                shutil.copy2(file, target)
        return saved.parent


def has_answers(rows) -> bool:
    """Whether a dataset's rows carry final answers to grade: an "answer" or TRL's "solution" column."""
    columns = rows.column_names if hasattr(rows, "column_names") else list(rows[0]) if len(rows) else []
    return "answer" in columns or "solution" in columns


class TrainResult(dict):
    """train()'s summary (accuracy before and after, steps, time: summary.json), which also reads as TRL's
    TrainOutput: global_step (optimizer steps, as TRL counts), training_loss (the mean of the logged losses) and
    metrics (train_runtime, train_loss, and the summary's numbers)."""

    def __init__(self, summary: dict, *, global_step: int, run_dir: Path):
        super().__init__(summary)
        lines = (run_dir / "metrics.jsonl").read_text().splitlines() if (run_dir / "metrics.jsonl").exists() else []
        losses = [m["loss"] for m in map(json.loads, lines) if m.get("loss") is not None]
        self.global_step = global_step
        self.training_loss = sum(losses) / len(losses) if losses else float("nan")
        self.metrics = {"train_runtime": summary.get("wall_seconds"), "train_loss": self.training_loss,
                        **{k: v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}}


def with_processing_classes(reward_funcs: list, processing_classes, chat_template_kwargs: dict | None) -> list:
    """TRL's reward_processing_classes: one tokenizer (or None) per reward function, or one for a single function.
    A reward model's (a path or a loaded sequence-classification model) is the tokenizer it scores with: the pair
    is made a RewardModel here (reward_models/; train() places it on the run's device). None, and an entry beside
    a reward function that is not a model, are ignored, as TRL does: a reward model's own tokenizer is loaded."""
    if processing_classes is None:
        return reward_funcs
    classes = processing_classes if isinstance(processing_classes, (list, tuple)) else [processing_classes]
    if len(classes) != len(reward_funcs):
        raise ConfigError(f"reward_processing_classes: {len(classes)} for {len(reward_funcs)} reward functions (one "
                          f"per reward function, None where it is not a model)")
    from .reward_models.outcome import is_reward_model, load_reward_model

    return [load_reward_model(func, tokenizer=tokenizer, chat_template_kwargs=chat_template_kwargs)
            if tokenizer is not None and is_reward_model(func) else func
            for func, tokenizer in zip(reward_funcs, classes, strict=True)]


def quantization_fields(quantization_config) -> dict:
    """TRL's quantization_config, a transformers BitsAndBytesConfig, as minigrpo's fields: load_in_4bit,
    bnb_4bit_quant_type, use_bnb_nested_quant (the compute dtype is the config's dtype). 8 bits is one line."""
    if quantization_config is None:
        return {}
    if not getattr(quantization_config, "load_in_4bit", False):
        raise ConfigError("quantization_config: minigrpo quantizes to 4 bits only (QLoRA: load_in_4bit=True)")
    return {"load_in_4bit": True, "bnb_4bit_quant_type": quantization_config.bnb_4bit_quant_type,
            "use_bnb_nested_quant": bool(quantization_config.bnb_4bit_use_double_quant)}


def lora_fields(peft_config) -> dict:
    """A peft LoraConfig as minigrpo's fields (TRL's ModelConfig names): use_peft, lora_r, lora_alpha, lora_dropout,
    lora_target_modules. What minigrpo's LoRA does not do (DoRA, rsLoRA, biases, modules_to_save) is one line."""
    if peft_config is None:
        return {}
    for option, off in (("use_dora", False), ("use_rslora", False), ("bias", "none"), ("modules_to_save", None)):
        if getattr(peft_config, option, off) not in (off, None):
            raise ConfigError(f"peft_config: {option}={getattr(peft_config, option)!r} is not in minigrpo's LoRA "
                              "(plain LoRA on the blocks' linear layers: r, lora_alpha, lora_dropout, target_modules)")
    targets = peft_config.target_modules
    targets = sorted(targets) if isinstance(targets, (set, list, tuple)) else targets
    return {"use_peft": True, "lora_r": peft_config.r, "lora_alpha": peft_config.lora_alpha,
            "lora_dropout": peft_config.lora_dropout, "lora_target_modules": targets}
