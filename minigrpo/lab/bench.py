"""`minigrpo bench --against trl`: the same GRPO step through minigrpo and through TRL's GRPOTrainer, side by side.

One process, one run. Both sides get the same model weights, the same prompts in the same order, the same G,
max_completion_length, loss_type, learning rate and reward function (the task's correctness reward), with
beta = 0, num_iterations = 1, float32, a constant learning rate, and for TRL bf16=False,
gradient_checkpointing=False, use_vllm=False, optim adamw_torch (the same torch AdamW minigrpo uses).

What is timed, per optimizer step:
    rollout   sample G completions per prompt, score them, group advantages
              (minigrpo: `collect_batch`; TRL: `_generate_and_score_completions`)
    training  everything else in the step: log-probs, loss, backward, clip, optimizer step
    step      rollout + training (TRL: from its `on_step_begin` to its `on_step_end` callback)

TRL runs its own `train()` loop; a callback times each of its steps and, right after each one, runs and times
minigrpo's step on the same prompts, so the two sides alternate (TRL, minigrpo, TRL, minigrpo, ...) and see the
same machine load. The first `--warmup` steps are not counted. Wall time and CPU time (process_time) are both
reported: on a shared machine CPU time is the steadier of the two. Peak memory is measured on one extra,
untimed step per side (see `PeakMemory`).

Loss check: on one batch TRL generated, TRL's `compute_loss` and minigrpo's `completion_logprobs` +
`policy_loss` run on the same weights; the losses, the per-token log-probs and the gradients are compared.

Prompts: the task's (`--task`); `--task countdown --shape qwen2.5-0.5b` gives a real recipe's (DeepSeek-R1's system
prompt and a Countdown question through the stand-in's chat template and tokenizer, ~224 tokens: the task ships
no model, so its tokenizer is the stand-in's, standin.py).

Then the rollout alone: minigrpo's `sample_completions` (its own decode loop) against `sample_completions_hf`
(HF `model.generate`, same settings: pure sampling, top_k=0), decode tokens per second and their ratio.

TRL is imported here only, lazily: `pip install -e ".[bench]"` (also in `.[dev]`). `--against vllm` times the rollout
alone against vLLM instead (bench_vllm.py); `--reward-model` the scoring of a batch by a reward model against TRL's
(bench_reward_model.py).
"""

import argparse
import contextlib
import math
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from ..collect import collect_batch
from ..config import Config
from ..generation.engines import GenerateEngine
from ..loading.models import load_model_and_tokenizer, load_tokenizer
from ..loading.peak_memory import PeakMemory
from ..logprobs import LogprobForward, completion_logprobs
from ..objectives import policy_loss
from ..prompts import encode_prompts
from ..rollout import sample_completions, sample_completions_hf
from ..tasks import get_task
from ..trainer import grpo_update

__all__ = ["SHAPES", "main"]

# Larger model shapes with random weights (the shipped tokenizer; ids it does not know decode to nothing).
# "test" is a very small model for the test suite.
SHAPES = {
    "test": dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=2),
    "llama-small": dict(model_type="llama", hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                        num_attention_heads=8, num_key_value_heads=8, vocab_size=32000),
    # Qwen2.5-0.5B's shapes (152k vocabulary, GQA 14/2); use --num-layers to cut its 24 layers on a CPU.
    "qwen2.5-0.5b": dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, rope_theta=1e6,
                         rms_norm_eps=1e-6),
}


# ---------------------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------------------
class Clock:
    """Wall time (perf_counter) and CPU time of this process (process_time) since `start()`."""

    def start(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def stop(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall, time.process_time() - self.cpu


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------------------------
# The two sides
# ---------------------------------------------------------------------------------------------------------
class _InOrder:
    """collect_batch's prompt sampler, serving fixed rows: the prompts TRL's sequential dataloader takes."""

    def __init__(self, rows):
        self.rows = rows

    def take(self, n):
        assert n == len(self.rows)
        return self.rows


def minigrpo_step(model, tokenizer, optimizer, task, cfg: Config, rows, reward_funcs, device,
                  autocast=contextlib.nullcontext) -> dict:
    """One minigrpo optimizer step, made of the trainer's own pieces, as `trainer.train()` runs it with
    num_iterations = steps_per_generation = 1 and beta = 0 (so no old or reference log-probs are computed).
    autocast: the run's 16-bit autocast (bf16), around sampling and the update as in train()."""
    clock = Clock().start()
    with warnings.catch_warnings(), autocast():  # a benchmark samples to its set lengths on purpose: no note
        warnings.filterwarnings("ignore", message="over half of a batch's completions", category=UserWarning)
        batch = collect_batch(cfg, GenerateEngine(model, tokenizer), _InOrder(rows), reward_funcs,
                              [1.0] * len(reward_funcs), cfg.max_completion_length)
    _sync(device)
    rollout = clock.stop()
    inputs = batch.to(device)
    inputs.loss_mask = inputs.policy_mask
    model.train()
    stats = grpo_update(LogprobForward(model), optimizer, inputs, cfg, max_completion_length=cfg.max_completion_length,
                        autocast=autocast)
    _sync(device)
    step = clock.stop()
    return {"rollout": rollout, "step": step, "tokens": int(inputs.loss_mask.sum().item()), "loss": stats[0]["loss"],
            "inputs": inputs}


def make_trl_trainer(model_dir, tokenizer, rows, task, args, out_dir, callback, reward_funcs=None,
                     reward_processing_classes=None):
    """TRL's GRPOTrainer on the same rows and settings (float32 weights; bf16 autocast where args.bf16; a LoRA
    adapter of r 16, alpha 32, dropout 0.05 on every linear layer of the blocks where args.lora, as minigrpo's);
    reward_funcs, else the task's correctness reward."""
    try:
        import trl
        from datasets import Dataset
    except ImportError as exc:
        raise SystemExit(
            f"minigrpo bench --against trl needs trl and datasets ({exc}). Install them with "
            '`pip install -e ".[bench]"` (or `pip install trl==1.16.0`).'
        ) from exc
    from transformers import AutoModelForCausalLM, PrinterCallback

    # TRL 1.16 reads transformers' deprecated `is_gradient_checkpointing` around every generation of its steps
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    with warnings.catch_warnings():  # transformers renamed gradient_checkpointing; TRL still sets it
        warnings.simplefilter("ignore", FutureWarning)
        config = trl.GRPOConfig(
            output_dir=str(out_dir), report_to="none", save_strategy="no", logging_steps=10**6, disable_tqdm=True,
            per_device_train_batch_size=args.prompts * args.num_generations, gradient_accumulation_steps=1,
            steps_per_generation=1, num_iterations=1, num_generations=args.num_generations,
            max_completion_length=args.max_completion_length, temperature=args.temperature, top_p=1.0, top_k=0,
            loss_type=args.loss_type, beta=0.0, epsilon=0.2, scale_rewards="group",
            learning_rate=args.learning_rate, lr_scheduler_type="constant", warmup_steps=0, optim="adamw_torch",
            weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0,
            bf16=getattr(args, "bf16", False), fp16=False, gradient_checkpointing=False, use_vllm=False,
            use_cpu=args.device == "cpu",
            shuffle_dataset=False, max_steps=args.warmup + args.steps + 1, seed=args.seed,
            dataloader_num_workers=0, log_completions=False,
        )
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        peft_config = None
        if getattr(args, "lora", False):
            from peft import LoraConfig

            from ..loading.models import default_lora_target_modules

            peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, bias="none", task_type="CAUSAL_LM",
                                     target_modules=default_lora_target_modules(model))
        trainer = trl.GRPOTrainer(
            model=model, reward_funcs=reward_funcs or [task.correctness_reward], args=config, peft_config=peft_config,
            train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
            callbacks=[callback] if callback else None, reward_processing_classes=reward_processing_classes,
        )
    trainer.remove_callback(PrinterCallback)  # its end-of-training log line would land in the middle of our table
    return trainer


def _trl_callback_class():
    from transformers import TrainerCallback

    class Interleave(TrainerCallback):
        """Times each TRL step (peak memory on step `memory_step`); after it, outside the timer, calls
        `after(step_index, wall_and_cpu, peak)`, which runs minigrpo's step."""

        def __init__(self, device, after, memory_step):
            self.device, self.after, self.memory_step, self.step_index = device, after, memory_step, 0

        def on_step_begin(self, args, state, control, **kw):
            self.memory = PeakMemory(self.device) if self.step_index == self.memory_step else None
            if self.memory is not None:
                self.memory.__enter__()
            self.clock = Clock().start()

        def on_step_end(self, args, state, control, **kw):
            _sync(self.device)
            step = self.clock.stop()
            if self.memory is not None:
                self.memory.__exit__(None, None, None)
            self.after(self.step_index, step, self.memory and self.memory.peak)
            self.step_index += 1

    return Interleave


# ---------------------------------------------------------------------------------------------------------
# The loss check
# ---------------------------------------------------------------------------------------------------------
def loss_check(trainer, inputs, args) -> dict:
    """TRL's compute_loss vs minigrpo's completion_logprobs + policy_loss, same batch, same weights."""
    model = trainer.model
    model.train()
    adv = inputs["advantages"]
    note = "TRL's advantages"
    if not adv.abs().gt(0).any():  # random weights: all rewards 0, every advantage 0; check with random ones
        adv = torch.randn(adv.shape, generator=torch.Generator().manual_seed(0)).to(adv.device)
        inputs = {**inputs, "advantages": adv}
        note = "random advantages (all of TRL's were 0)"
    ids = [inputs[k] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")]
    mask = ids[3].float()

    model.zero_grad(set_to_none=True)
    trl_loss = trainer.compute_loss(model, inputs)
    trl_loss.backward()
    trl_grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    with torch.no_grad():
        trl_logp, _, _ = trainer._get_per_token_logps_and_entropies(
            model, torch.cat([ids[0], ids[2]], dim=1), torch.cat([ids[1], ids[3]], dim=1), ids[2].shape[1])

    model.zero_grad(set_to_none=True)
    logp, _ = completion_logprobs(model, *ids, temperature=args.temperature)
    mg_loss, _ = policy_loss(logp, logp.detach(), adv, mask, loss_type=args.loss_type, epsilon=0.2,
                             max_completion_length=args.max_completion_length, num_items_in_batch=mask.sum())
    mg_loss.backward()
    mg_grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return {
        "trl": trl_loss.item(), "minigrpo": mg_loss.item(), "note": note,
        "logp_max_abs_diff": ((logp.detach() - trl_logp) * mask).abs().max().item(),
        "grad_rel_diff": ((mg_grad - trl_grad).norm() / trl_grad.norm().clamp(min=1e-30)).item(),
    }


# ---------------------------------------------------------------------------------------------------------
# Rollout alone: sample_completions vs HF generate
# ---------------------------------------------------------------------------------------------------------
def rollout_comparison(model, tokenizer, rows, args, device) -> dict:
    """Decode tokens/s of sample_completions and of HF generate, interleaved, warm-up excluded."""
    times = {"minigrpo": [], "hf": []}
    n = args.prompts
    for rep in range(args.warmup + args.steps):
        prompts = [r["prompt"] for r in rows[rep * n:(rep + 1) * n]]
        for side in ("minigrpo", "hf") if rep % 2 == 0 else ("hf", "minigrpo"):
            sample = sample_completions if side == "minigrpo" else sample_completions_hf
            clock = Clock().start()
            roll = sample(model, tokenizer, prompts, num_generations=args.num_generations,
                          max_completion_length=args.max_completion_length, temperature=args.temperature)
            _sync(device)
            tokens = int(roll.completion_mask.sum())
            wall, cpu = clock.stop()
            if rep >= args.warmup:
                times[side].append((tokens / wall, tokens / cpu))
    return times


# ---------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------
def _stats(values):
    values = list(values)
    if not values:
        return math.nan, math.nan, math.nan
    return statistics.median(values), min(values), max(values)


def _fmt(values, unit="s", scale=1.0):
    med, lo, hi = _stats(v * scale for v in values)
    digits = 3 if unit == "s" else 0
    return f"{med:.{digits}f} [{lo:.{digits}f}-{hi:.{digits}f}]"


def _mib(x):
    return "n/a" if x is None else f"{x / 2**20:.0f} MiB"


def task_tokenizer(task, tmp: Path):
    """(tokenizer, where it came from): the task's shipped model's, else the stand-in's (standin.py: Qwen2.5's
    chat template, a small vocabulary), built in tmp, for tasks meant for a hub model (countdown, gsm8k)."""
    if (Path(task.model_dir) / "config.json").is_file():
        return load_tokenizer(task.model_dir), "task's model"
    from .standin import make_standin_chat_model

    return load_tokenizer(make_standin_chat_model(tmp / "standin")), "stand-in"


def build_model_dir(args, task, tokenizer, tmp: Path) -> Path:
    if args.model:
        return Path(args.model)
    if args.shape == "tiny":
        if not (Path(task.model_dir) / "config.json").is_file():
            raise SystemExit(f"minigrpo bench: the {task.name} task ships no model; give --shape (e.g. qwen2.5-0.5b)")
        return task.model_dir
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = dict(SHAPES[args.shape])
    model_type = shape.pop("model_type")
    shape.setdefault("vocab_size", len(tokenizer))
    if args.num_layers:
        shape["num_hidden_layers"] = args.num_layers
    config = AutoConfig.for_model(
        model_type, **shape, max_position_embeddings=512, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    path = tmp / f"random-{args.shape}"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    del model
    return path


def parse_args(argv):
    p = argparse.ArgumentParser(prog="minigrpo bench", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--against", choices=["trl", "vllm"], default="trl",
                   help="trl: the GRPO step against TRL's GRPOTrainer; vllm: rollout tokens/s against vLLM (bench_vllm.py)")
    p.add_argument("--task", default="think_addition")
    p.add_argument("--shape", default="tiny", choices=["tiny", *SHAPES],
                   help="tiny = the task's shipped model; others: that config with random weights")
    p.add_argument("--num-layers", type=int, default=None, help="override the shape's layer count")
    p.add_argument("--model", default=None, help="a model directory instead of --shape")
    p.add_argument("--prompts", type=int, default=16, help="prompts per step")
    p.add_argument("--num-generations", type=int, default=8, help="G")
    p.add_argument("--max-completion-length", type=int, default=48)
    p.add_argument("--loss-type", default="grpo")
    p.add_argument("--learning-rate", type=float, default=1e-4)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=5, help="timed steps per side")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1 = steady on a shared CPU)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-rollout", action="store_true", help="skip the sample_completions vs HF generate part")
    p.add_argument("--reward-model", nargs="?", const="policy-shape", default=None, metavar="PATH",
                   help="instead: scoring one batch with a reward model (PATH, else the policy's body under a scalar "
                        "head), minigrpo vs TRL's _calculate_rewards (bench_reward_model.py)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.against != "trl":  # `minigrpo bench --against vllm` is bench_vllm.main (cli.py sends it there)
        raise SystemExit(f"minigrpo bench: --against {args.against} is run by bench_vllm.main")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    task = get_task(args.task)
    n_steps = args.warmup + args.steps + 1  # + 1 untimed step for peak memory
    rows = task.load("train")[: n_steps * args.prompts]
    if len(rows) < n_steps * args.prompts:
        raise SystemExit(f"the {task.name} train split has {len(rows)} rows, fewer than steps x prompts")

    with tempfile.TemporaryDirectory(prefix="minigrpo-bench-") as tmp:
        tokenizer, tokenizer_source = task_tokenizer(task, Path(tmp))
        model_dir = build_model_dir(args, task, tokenizer, Path(tmp))
        model, tokenizer = load_model_and_tokenizer(model_dir, device)
        n_params = sum(p.numel() for p in model.parameters())
        cfg = Config(
            model_name_or_path=str(model_dir), task=task.name, num_generations=args.num_generations,
            generation_batch_size=args.prompts * args.num_generations, max_completion_length=args.max_completion_length,
            temperature=args.temperature, loss_type=args.loss_type, learning_rate=args.learning_rate, beta=0.0,
            seed=args.seed,
        )
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, betas=(0.9, 0.999), weight_decay=0.0)
        reward_funcs = [task.correctness_reward]

        results = {"minigrpo": [], "trl": []}
        memory = {}
        captured = {}

        def run_minigrpo(index, trl_step, trl_peak):
            """Called right after TRL's step `index`: record it, then run minigrpo's step on the same prompts."""
            trl_rollout, trl_tokens = captured.pop("rollout_time"), captured.pop("tokens")
            step_rows = rows[index * args.prompts:(index + 1) * args.prompts]
            torch.manual_seed(args.seed + index)
            if index == n_steps - 1:  # the untimed memory step
                with PeakMemory(device) as peak:
                    minigrpo_step(model, tokenizer, optimizer, task, cfg, step_rows, reward_funcs, device)
                memory.update(minigrpo=peak.peak, trl=trl_peak)
                return
            out = minigrpo_step(model, tokenizer, optimizer, task, cfg, step_rows, reward_funcs, device)
            out.pop("inputs")
            if index >= args.warmup:
                results["trl"].append({"rollout": trl_rollout, "step": trl_step, "tokens": trl_tokens})
                results["minigrpo"].append(out)

        callback = _trl_callback_class()(device, run_minigrpo, memory_step=n_steps - 1)
        trainer = make_trl_trainer(model_dir, tokenizer, rows, task, args, Path(tmp) / "trl", callback)
        generate_and_score = trainer._generate_and_score_completions

        def timed_generate_and_score(inputs):
            clock = Clock().start()
            out = generate_and_score(inputs)
            _sync(device)
            captured["rollout_time"] = clock.stop()
            captured["tokens"] = int(out["completion_mask"].sum().item())
            if "batch" not in captured:
                captured["batch"] = {k: v.clone() if torch.is_tensor(v) else v for k, v in out.items()}
            return out

        trainer._generate_and_score_completions = timed_generate_and_score

        import transformers
        import trl

        P, G, L = args.prompts, args.num_generations, args.max_completion_length
        print(f"minigrpo bench --against trl: one GRPO step, {args.steps} timed steps per side after {args.warmup} "
              f"warm-up, interleaved")
        print(f"  model {model_dir if args.shape == 'tiny' or args.model else args.shape + ' (random weights)'}: "
              f"{n_params / 1e6:.1f}M params, {model.config.num_hidden_layers} layers, hidden "
              f"{model.config.hidden_size}, vocab {model.config.vocab_size}")
        print(f"  {P} prompts x G={G} = {P * G} completions, max_completion_length {L}, loss_type {args.loss_type}, "
              f"beta 0, num_iterations 1, lr {args.learning_rate} constant, float32, temperature {args.temperature}, "
              f"top_p 1, top_k 0; TRL: bf16=False, gradient_checkpointing=False, use_vllm=False, optim adamw_torch")
        prompt_tokens = [len(ids) for ids in encode_prompts(tokenizer, [row["prompt"] for row in rows])]
        print(f"  prompts: {task.name}'s, through the {tokenizer_source}'s tokenizer (and chat template), "
              f"{min(prompt_tokens)}-{max(prompt_tokens)} tokens")
        print(f"  device {device}, torch threads {torch.get_num_threads()}, torch {torch.__version__}, "
              f"transformers {transformers.__version__}, trl {trl.__version__}")
        sys.stdout.flush()

        trainer.train()

        check = loss_check(trainer, captured["batch"], args)
        rollout = None if args.no_rollout else rollout_comparison(model, tokenizer, rows, args, device)

    report(results, memory, check, rollout)
    return 0


def report(results, memory, check, rollout):
    mg, tr = results["minigrpo"], results["trl"]

    def column(side, key, i):  # i: 0 wall, 1 cpu
        if key == "training":
            return [r["step"][i] - r["rollout"][i] for r in side]
        return [r[key][i] for r in side]

    print()
    print(f"{'':34s} {'minigrpo':>24s} {'TRL':>24s} {'minigrpo/TRL':>13s}")
    rows = []
    for label, key, i in [
        ("step time, wall (s)", "step", 0), ("step time, CPU (s)", "step", 1),
        ("rollout time, wall (s)", "rollout", 0), ("rollout time, CPU (s)", "rollout", 1),
        ("training time, wall (s)", "training", 0), ("training time, CPU (s)", "training", 1),
    ]:
        a, b = column(mg, key, i), column(tr, key, i)
        ratio = _stats(a)[0] / _stats(b)[0]
        rows.append((label, ratio))
        print(f"{label:34s} {_fmt(a):>24s} {_fmt(b):>24s} {ratio:>13.2f}")
    tps = lambda side: [r["tokens"] / r["step"][0] for r in side]  # noqa: E731
    ratio_tps = _stats(tps(mg))[0] / _stats(tps(tr))[0]
    print(f"{'completion tokens/s (step, wall)':34s} {_fmt(tps(mg), ''):>24s} {_fmt(tps(tr), ''):>24s} {ratio_tps:>13.2f}")
    tokens = lambda side: [r["tokens"] for r in side]  # noqa: E731
    print(f"{'completion tokens per step':34s} {_fmt(tokens(mg), ''):>24s} {_fmt(tokens(tr), ''):>24s}")
    mem_ratio = (memory.get("minigrpo") or math.nan) / (memory.get("trl") or math.nan)
    print(f"{'peak step memory':34s} {_mib(memory.get('minigrpo')):>24s} {_mib(memory.get('trl')):>24s} "
          f"{mem_ratio:>13.2f}")
    print("  (median [min-max] over the timed steps; memory: peak above the step's start, one extra step per side;"
          " CPU: RSS sampled every ms)")
    print()
    print(f"loss check on one TRL batch, same weights ({check['note']}): minigrpo {check['minigrpo']:.6e}, "
          f"TRL {check['trl']:.6e}, |difference| {abs(check['minigrpo'] - check['trl']):.2e}; "
          f"per-token log-prob max |difference| {check['logp_max_abs_diff']:.2e}; "
          f"gradient relative difference {check['grad_rel_diff']:.2e}")
    if rollout is not None:
        a, b = rollout["minigrpo"], rollout["hf"]
        wall = _stats(x[0] for x in a)[0] / _stats(x[0] for x in b)[0]
        cpu = _stats(x[1] for x in a)[0] / _stats(x[1] for x in b)[0]
        print(f"rollout alone, decode tokens/s (wall): sample_completions {_fmt([x[0] for x in a], '')}, "
              f"HF generate {_fmt([x[0] for x in b], '')}")
    print()
    names = {"step": "step time", "rollout": "rollout time", "training": "training time"}
    for (label, ratio), key in zip(rows, ["step", "step_cpu", "rollout", "rollout_cpu", "training", "training_cpu"]):
        name = names[key.removesuffix("_cpu")] + (" (CPU)" if key.endswith("_cpu") else "")
        print(f"{name} ratio minigrpo/trl: {ratio:.2f}")
    print(f"tokens/s ratio minigrpo/trl: {ratio_tps:.2f}")
    print(f"peak memory ratio minigrpo/trl: {mem_ratio:.2f}")
    print(f"loss difference minigrpo-trl: {check['minigrpo'] - check['trl']:.2e}")
    if rollout is not None:
        print(f"decode tokens/s ratio sample_completions/hf_generate: {wall:.2f} (wall), {cpu:.2f} (CPU)")
