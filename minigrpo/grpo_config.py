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
    warmup_steps W (optimizer steps)               warmup_steps = W // (S / A x num_iterations) + 1 batches: the
                                                   learning rate is set once a batch, (step + 1) / warmup_steps of
                                                   the peak, which it reaches in the batch that holds TRL's (TRL
                                                   starts from 0 and reaches it at optimizer step W), then decays
                                                   linearly to 0 at max_steps as TRL's does (run.lr_lambda)
    warmup_, logging_, save_, eval_steps below 1   (transformers 5) a fraction of the run's optimizer steps, then
                                                   as above
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
from .trl_names import IGNORED, TRL_RENAMED, UNSUPPORTED, trl_advice, unknown_key_line  # noqa: F401 - also here

__all__ = ["GRPOConfig", "UNSUPPORTED", "IGNORED", "TRL_RENAMED", "trl_advice", "unknown_key_line"]


# model_init_kwargs' entries that change nothing at these values (from_pretrained's defaults), as TRL's scripts set them
INIT_DEFAULTS = {"revision": (None, "main"), "trust_remote_code": (False,), "attn_implementation": (None,),
                 "device_map": (None,), "quantization_config": (None,)}


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
    # TRL (transformers 5): optimizer steps of linear warm-up; below 1, a fraction of the run's optimizer steps
    warmup_steps: float = 0
    save_steps: float = 500  # TRL: checkpoint every N optimizer steps (save_strategy "steps"; below 1: a fraction)
    save_strategy: str = "steps"  # TRL: "no", "steps" or "epoch"
    save_total_limit: int | None = None  # keep the newest N checkpoints (None: all, TRL's default)
    eval_strategy: str = "no"  # TRL: "no" (minigrpo still evaluates before and after), "steps" or "epoch"
    eval_steps: float | None = None  # TRL: with eval_strategy "steps", every N optimizer steps (None: logging_steps)
    logging_steps: float = 10  # print one line of metrics every N optimizer steps (TRL's default 10; below 1: a fraction)
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
        self._normalise_values()  # strings read as flags are, None where a value is needed refused
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
        prompts = generation // self.num_generations
        epoch = max(1, (num_train_rows or prompts) // max(1, prompts))  # batches per pass over the prompts
        steps = (max(1, math.ceil(self.max_steps / updates)) if self.max_steps > 0
                 else max(1, math.ceil(self.num_train_epochs * epoch)))

        for key in ("warmup_steps", "logging_steps", "save_steps", "eval_steps"):
            if getattr(self, key) is not None and not getattr(self, key) >= 0:
                raise ConfigError(f"{key}: must be >= 0, got {getattr(self, key)!r}")

        def optimizer_steps(value: float) -> int:  # transformers 5: below 1, a fraction of the run's
            return math.ceil(value * steps * updates) if value < 1 else int(value)

        def batches(value: float) -> int:  # TRL's optimizer steps as minigrpo's batches
            return max(1, math.ceil(optimizer_steps(value) / updates))

        # warm-up: minigrpo's factor (step + 1) / warmup_steps peaks at batch warmup_steps - 1 (counting from 0),
        # the batch that holds TRL's peak, optimizer step warmup_steps
        warmup = int(optimizer_steps(self.warmup_steps) // updates) + 1 if self.warmup_steps else 0

        values.update(
            generation_batch_size=generation, steps_per_generation=S // A, max_steps=steps,
            eval_steps=self._every(self.eval_strategy, self.eval_steps or self.logging_steps, epoch, batches),
            save_steps=self._every(self.save_strategy, self.save_steps, epoch, batches),
            logging_steps=batches(self.logging_steps) if self.logging_steps else 0,
            warmup_steps=warmup,
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
        words = [word for item in ([self.fsdp] if isinstance(self.fsdp, str) else self.fsdp or []) for word in
                 item.split()]
        if words and "full_shard" not in words:
            raise ConfigError(f"fsdp: {self.fsdp!r}: minigrpo shards with FSDP2's full_shard only (--fsdp full_shard)")
        return "full_shard" if words else ""

    def _dtype(self) -> str:
        init = {key: value for key, value in (self.model_init_kwargs or {}).items()
                if value not in INIT_DEFAULTS.get(key, ())}  # TRL's grpo.py sets these, at from_pretrained's defaults
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
