"""`minigrpo memory`: the peak memory of one training step, for four ways to train the same model.

    grpo-full    GRPO, every weight trained (weights + gradients + Adam's two moments, all in `dtype`)
    grpo-lora    GRPO, LoRA adapter only (frozen base; gradients and moments for A and B only)
    grpo-qlora   GRPO, LoRA on a 4-bit nf4 base with double quantization (bitsandbytes)
    ppo-critic   PPO with a value network the same size as the policy (ppo_critic.py), both fully trained

GRPO's claim to fame is dropping PPO's critic; DeepSeekMath (Shao et al. 2024, section 4.1) motivates it by the
critic's memory, and write-ups quote "about 40% less". This command measures it instead of quoting it, and
prints the ratio GRPO (full) / PPO (critic). Every setup runs in a fresh Python process, so one setup's
allocations cannot leak into the next one's peak.

What is measured, exactly (see peak_memory.py):
  * CUDA: torch.cuda.max_memory_allocated over the process — weights, gradients, optimizer state, activations.
  * CPU: the process's peak resident set size (VmHWM). It includes Python and the libraries (a few hundred MB,
    the same for every setup), so the table also shows "model + step": the peak minus the RSS just before the
    model is built, once every library (and the architecture's modeling code) is imported and the peak has been
    reset to the current RSS (Linux /proc/self/clear_refs). The ratio is taken on that. It still includes
    what the CPU runtime allocates on first use (oneDNN/OpenMP buffers, allocator arenas): tens of MB, which
    dominate on the tiny model and vanish on real shapes.
What is simplified: the rollout is replaced by random token ids of a fixed length (every setup sees the same
shapes; random weights would stop at random lengths), and rewards are random 0/1. Generation's KV cache at
these shapes is far smaller than the activations the training forward keeps for backward, and is the same in
every setup. A "step" is measured over `--steps 2` optimizer steps, because Adam's moments are created in the
first optimizer step: the second step is the first one that holds weights, moments, activations and gradients
at once, as every later step does. No gradient checkpointing anywhere.

Shapes: "tiny" is the shipped model (data/models/think_addition); the Qwen2.5 shapes are built from a Qwen2Config
with the published sizes and random weights (no download), saved once to a temporary directory.
"qwen2.5-0.5b-2l" keeps Qwen2.5-0.5B's width and 151,936-token vocabulary but only 2 of its 24 blocks: a shape
a 2-core CPU measures in minutes.
"""

import functools
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

QWEN2_5 = {  # from the published config.json files of Qwen/Qwen2.5-0.5B and Qwen/Qwen2.5-1.5B
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2),
}
QWEN2_5["qwen2.5-0.5b-2l"] = {**QWEN2_5["qwen2.5-0.5b"], "num_hidden_layers": 2}
QWEN2_5["qwen2.5-7b"] = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                             num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False)  # Qwen/Qwen2.5-7B
QWEN3 = {  # from the published config.json of Qwen/Qwen3-0.6B
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128),
}
SHAPES = ("tiny", *QWEN2_5, *QWEN3)
HUB_SHAPES = {  # hub names the recipes use -> their shape, so `--recipe` needs no download
    "Qwen/Qwen2.5-0.5B-Instruct": "qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B": "qwen2.5-0.5b",
    "Qwen/Qwen2.5-1.5B-Instruct": "qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B": "qwen2.5-1.5b", "Qwen/Qwen3-0.6B": "qwen3-0.6b",
    "Qwen/Qwen2.5-7B-Instruct": "qwen2.5-7b", "Qwen/Qwen2.5-7B": "qwen2.5-7b",
}
SETUPS = {
    "grpo-full": "GRPO full fine-tune",
    "grpo-lora": "GRPO LoRA",
    "grpo-qlora": "GRPO QLoRA (nf4)",
    "ppo-critic": "PPO + critic",
}
RESULT_MARKER = "MINIGRPO_MEMORY_RESULT "


def qwen_config(shape: str):
    """The Qwen2Config (Qwen3Config) of a Qwen2.5 (Qwen3) shape: the published sizes, nothing downloaded."""
    from transformers import Qwen2Config, Qwen3Config

    if shape not in QWEN2_5 and shape not in QWEN3:
        raise ValueError(f"shape: {shape!r} is not one of {', '.join([*QWEN2_5, *QWEN3])}")
    config_class, sizes = (Qwen2Config, QWEN2_5[shape]) if shape in QWEN2_5 else (Qwen3Config, QWEN3[shape])
    return config_class(**{"vocab_size": 151936, "max_position_embeddings": 32768, "tie_word_embeddings": True,
                           "rope_theta": 1e6, "rms_norm_eps": 1e-6, **sizes})


def shape_dir(shape: str, workdir: str | os.PathLike, device: str = "cpu") -> Path:
    """A model directory for `shape`: the shipped tiny model, or a random Qwen2.5-shaped model saved in workdir.
    device: where the random weights are drawn (a GPU draws a 1.5B model in a second, a CPU in a minute)."""
    if shape == "tiny":
        from ..tasks import get_task

        return get_task("think_addition").model_dir
    from transformers import AutoModelForCausalLM

    config = qwen_config(shape)
    path = Path(workdir) / shape
    if not (path / "config.json").exists():
        torch.manual_seed(0)
        with torch.device(device):  # saved in bfloat16 to halve the disk; every setup loads it in its own dtype
            AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(path)
    return path


def shape_config(shape: str):
    """The model config of a shape: the shipped tiny model's config.json, or a Qwen2.5 shape's published sizes."""
    if shape == "tiny":
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(shape_dir("tiny", "."))
    return qwen_config(shape)


NF4_BITS = {False: 4 + 32 / 64, True: 4 + 8 / 64 + 32 / (64 * 256)}  # bits per weight, by use_bnb_nested_quant


def estimate_static_bytes(config, *, weight_bytes: float = 4, lora_r: int = 16, target_modules=None,
                          nested_quant: bool = True) -> dict[str, dict]:
    """The floor of a training step, per setup of SETUPS: weights + gradients + AdamW's two moments, in bytes.

    Activations are not in it (they depend on batch and length; `measure` sees them). Counted from the shapes of
    a model built on the meta device (no memory), with p = all parameters, q = the weights of the linear layers
    LoRA targets (the ones bitsandbytes makes 4-bit), a = LoRA's r (d_in + d_out) per targeted layer, w = weight_bytes:

        grpo-full    weights p w        gradients p w   AdamW moments 2 p w
        grpo-lora    weights (p + a) w  gradients a w   AdamW moments 2 a w
        grpo-qlora   weights (p - q + a) w + q nf4/8    (nf4: 4.5 bits a weight, 4.127 with double
                                                        quantization; QLoRA, Dettmers et al. 2023, section 3)
                     gradients a w      AdamW moments 2 a w
        ppo-critic   grpo-full for the policy and for a critic of the same decoder with a scalar head

    AdamW keeps its moments in the parameters' dtype, hence w for them too. Every number in w bytes: what a run
    whose every weight is in that dtype holds (peft's float32 adapter: `recipe_floor`). Each row also gives
    matmul_weights, the weights the blocks' linear layers and the output head multiply with (q + the head's V H):
    what 16-bit autocast copies when they are float32 (`recipe_floor`).
    """
    from transformers import AutoModelForCausalLM

    from ..loading.models import default_lora_target_modules

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    targets = target_modules or default_lora_target_modules(model)
    head = model.get_output_embeddings()
    linears = [m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not head
               and (targets == "all-linear" or name.rsplit(".", 1)[-1] in targets)]
    p = sum(t.numel() for t in model.parameters())
    q = sum(m.weight.numel() for m in linears)
    a = sum(lora_r * (m.in_features + m.out_features) for m in linears)
    critic = sum(t.numel() for t in model.get_decoder().parameters()) + config.hidden_size + 1
    w = weight_bytes

    def row(weights, trainable, total):
        grads, moments = trainable * w, 2 * trainable * w
        return {"weights": weights, "gradients": grads, "optimizer": moments, "total": weights + grads + moments,
                "trainable_params": trainable, "total_params": total, "matmul_weights": q + head.weight.numel()}

    return {
        "grpo-full": row(p * w, p, p),
        "grpo-lora": row((p + a) * w, a, p + a),
        "grpo-qlora": row((p - q + a) * w + q * NF4_BITS[nested_quant] / 8, a, p + a),
        "ppo-critic": row((p + critic) * w, p + critic, p + critic),
    }


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def recipe_floor(cfg, prompt_length: int = 200, gpu_bytes: int | None = None) -> dict:
    """The memory of a training run's config (a recipe), computed from its shapes, not measured:

        static       what `estimate_static_bytes` counts for its setup (full / LoRA / QLoRA, in its dtype), with
                     what peft keeps in float32 whatever the dtype: LoRA's A and B (its autocast_adapter_dtype),
                     and for a 4-bit base every weight bitsandbytes does not quantize (prepare_model_for_kbit_training
                     casts them: the embeddings, tied to the head, and the norms; tests/test_memory.py checks both
                     on a loaded model); plus a frozen reference copy without LoRA when beta > 0 or a reward is
                     learned (its drift is logged)
        reward       each reward model of reward_funcs (reward_models/outcome.py): its weights in the dtype it was saved
        models       in; it runs without gradient, so its activations are one forward's, freed before the update
        autocast     float32 weights trained under bf16 / fp16 (full fine-tuning, dtype float32): autocast's 16-bit
                     copy of every weight a matrix product uses, which the product keeps for backward (2 bytes x
                     `matmul_weights`; with gradient_checkpointing one block's and the head's)
        logits       the output head's working set: logprobs.py runs the head over blocks of tokens and never holds
                     more than one block's logits (BLOCK_ELEMENTS, 220 tokens x V at Qwen's vocabulary), its softmax
                     and, in backward, its gradient: 3 float32 copies of a block (the whole mini-batch's logits,
                     mini-batch x max_completion_length x V, if that is smaller)
        activations  an estimate of what the forward keeps for backward: 34 h bytes per token and layer with 16-bit
                     activations and an attention kernel that stores no score matrix (Korthikanti et al. 2022,
                     "Reducing Activation Recomputation", eq. 2 less its 5 a s term), doubled in float32, for a
                     micro-batch of (prompt_length + max_completion_length)-token sequences, each distinct
                     prompt counted once (shared_prefix; `distinct_prompts`) plus every row's copy of its prompt's
                     keys and values (2 x kv heads x head size values per prompt token and layer); with
                     gradient_checkpointing, each layer's input (h values per token) plus one layer's 34 h

    With use_vllm, what vLLM's engine must hold (`vllm_engine_bytes`) beside the trainer, and the share of a GPU of
    gpu_bytes it reserves for that (vllm_gpu_memory_utilization x gpu_bytes, taken up front: the trainer gets
    the rest).

    Left out: the decode loop's KV cache while sampling (without vLLM), the CUDA context (~0.5 GB), allocator
    slack and fragmentation.
    """
    from ..reward_models.outcome import is_reward_model
    from ..tasks import get_task

    name = cfg.model_name_or_path
    if name in HUB_SHAPES:
        config = qwen_config(HUB_SHAPES[name])
    else:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(name or get_task(cfg.task).model_dir)
    setup = "grpo-qlora" if cfg.load_in_4bit else "grpo-lora" if cfg.use_peft else "grpo-full"
    static = functools.partial(estimate_static_bytes, config, lora_r=cfg.lora_r, target_modules=cfg.lora_target_modules,
                               nested_quant=cfg.use_bnb_nested_quant)
    row = static(weight_bytes=DTYPE_BYTES[cfg.dtype])[setup]
    if cfg.use_peft:  # the adapter in float32; with 4 bits, every weight not quantized too
        as_float32 = static(weight_bytes=4)[setup]
        adapter = row["trainable_params"]
        weights = as_float32["weights"] if cfg.load_in_4bit else row["weights"] + adapter * (4 - DTYPE_BYTES[cfg.dtype])
        row = {**as_float32, "weights": weights, "total": weights + as_float32["gradients"] + as_float32["optimizer"]}
    reward_models = [entry for entry in cfg.reward_funcs if is_reward_model(entry)]
    with_reference = (cfg.beta > 0 or reward_models) and not cfg.use_peft  # with LoRA: the adapter switched off
    reference = row["total_params"] * DTYPE_BYTES[cfg.dtype] if with_reference else 0
    reward_model_weights = sum(reward_model_bytes(entry) for entry in reward_models)
    completion_length = cfg.max_completion_length or get_task(cfg.task).max_completion_length
    mini_batch = cfg.generation_batch_size // cfg.steps_per_generation // cfg.gradient_accumulation_steps  # per pass
    from ..logprobs import BLOCK_ELEMENTS
    from ..loading.models import kv_size

    block_tokens = min(max(1, BLOCK_ELEMENTS // config.vocab_size), mini_batch * completion_length)
    logits = 3 * block_tokens * config.vocab_size * 4
    activation_bytes = 2 if (cfg.bf16 or cfg.fp16 or cfg.dtype != "float32") else 4
    autocast_copies = 0
    if (cfg.bf16 or cfg.fp16) and cfg.dtype == "float32" and not cfg.use_peft:
        head = config.vocab_size * config.hidden_size
        layers_held = 1 if cfg.gradient_checkpointing else config.num_hidden_layers  # their copies live at once
        block_weights = (row["matmul_weights"] - head) * layers_held // config.num_hidden_layers
        autocast_copies = 2 * (block_weights + head)
    prompts = (distinct_prompts(mini_batch, cfg.num_generations, cfg.generation_batch_size, cfg.steps_per_generation)
               if cfg.shared_prefix else mini_batch)
    tokens = prompts * prompt_length + mini_batch * completion_length  # through the model, each prompt once if shared
    layer_bytes = 34 * config.hidden_size * activation_bytes // 2  # per token: Korthikanti's 34 h in 16 bits
    # shared: each row attends to its own copy of its prompt's keys and values (2 kv_size per prompt token)
    prompt_kv_copies = mini_batch * prompt_length * 2 * kv_size(config) * activation_bytes if cfg.shared_prefix else 0
    if cfg.gradient_checkpointing:  # every layer's input kept, one layer's activations at a time (recomputed)
        activations = tokens * (config.num_hidden_layers * config.hidden_size * activation_bytes + layer_bytes)
        activations += prompt_kv_copies  # one layer's at a time
    else:
        activations = (tokens * layer_bytes + prompt_kv_copies) * config.num_hidden_layers
    floor = {"setup": setup, **row, "reference": reference, "logits": logits, "activations": activations,
             "autocast_copies": autocast_copies, "reward_models": reward_model_weights, "block_tokens": block_tokens,
             "mini_batch": mini_batch, "completion_length": completion_length, "prompt_length": prompt_length,
             "prompts": prompts,
             "floor": row["total"] + reference + logits + activations + autocast_copies + reward_model_weights}
    if cfg.use_vllm:
        floor["vllm"] = vllm_engine_bytes(config, row["total_params"] - row["trainable_params"] * cfg.use_peft,
                                          DTYPE_BYTES[cfg.dtype], cfg.generation_batch_size,
                                          prompt_length + completion_length)
        floor["vllm_share"] = cfg.vllm_gpu_memory_utilization * gpu_bytes if gpu_bytes else None
        floor["gpu_bytes"] = gpu_bytes
    return floor


def reward_model_bytes(name_or_path) -> int:
    """A reward model's weights in bytes, from its config (a model built on the meta device: no memory, no weights
    read), in the dtype it was saved in, as reward_models/outcome.py loads it."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(str(name_or_path))
    with torch.device("meta"):
        model = AutoModelForSequenceClassification.from_config(config)
    dtype = str(getattr(config, "dtype", None) or "float32").removeprefix("torch.")
    return sum(t.numel() for t in model.parameters()) * DTYPE_BYTES.get(dtype, 4)


def vllm_engine_bytes(config, base_params: int, dtype_bytes: int, sequences: int, sequence_length: int) -> dict:
    """What vLLM's engine holds, from the shapes: its copy of the base weights in the policy's dtype (a QLoRA base
    dequantized once: 16 bits, not 4; rollout_vllm.py) and the keys and values of one batch of sequences at full
    length (2 x layers x kv heads x head size values per token), in bytes. CUDA graphs and vLLM's own slack are
    not counted."""
    from ..loading.models import kv_size

    weights = base_params * dtype_bytes
    kv_cache = sequences * sequence_length * 2 * config.num_hidden_layers * kv_size(config) * dtype_bytes
    return {"weights": weights, "kv_cache": kv_cache, "total": weights + kv_cache}


def distinct_prompts(micro_batch: int, group_size: int, generation_batch_size: int, steps_per_generation: int) -> int:
    """The most distinct prompts one micro-batch of the training pass holds. trainer.grpo_update cuts a mini-batch's
    rows, sorted (groups are consecutive rows), into micro-batches: with one mini-batch per generation (all rows)
    m consecutive rows span ceil(m / G) groups when they line up with them, one more when not; a mini-batch drawn
    at random from several holds parts of up to every group."""
    if steps_per_generation > 1:
        return min(micro_batch, generation_batch_size // group_size)
    aligned = micro_batch % group_size == 0 or group_size % micro_batch == 0
    return -(-micro_batch // group_size) + (0 if aligned else 1)


def format_recipe_table(path: str, floor: dict) -> str:
    """One recipe's floor as a Markdown table (GiB)."""
    gib = lambda b: f"{b / 2**30:.2f}"  # noqa: E731
    rows = [("weights", floor["weights"]), ("gradients", floor["gradients"]), ("AdamW moments", floor["optimizer"]),
            ("reference model (beta > 0 or a learned reward, no LoRA)", floor["reference"]),
            ("reward models' weights (no gradient)", floor["reward_models"]),
            (f"logits, one block of the head ({floor['block_tokens']} tokens x vocabulary, 3 float32 copies)",
             floor["logits"]),
            (f"activations, estimated ({floor['prompts']} x {floor['prompt_length']} prompt + {floor['mini_batch']} x "
             f"{floor['completion_length']} completion tokens)", floor["activations"])]
    if floor["autocast_copies"]:
        rows.append(("16-bit copies of the float32 weights (autocast, kept for backward)", floor["autocast_copies"]))
    rows.append(("**total**", floor["floor"]))
    lines = [f"`{path}` ({floor['setup']}: {floor['trainable_params']:,} trainable of {floor['total_params']:,})", "",
             "| part | GiB |", "|---|---|"] + [f"| {name} | {gib(b)} |" for name, b in rows]
    if "vllm" in floor:
        vllm = floor["vllm"]
        lines += [f"| vLLM: its copy of the base weights (16 bits) | {gib(vllm['weights'])} |",
                  f"| vLLM: KV cache of one batch at full length | {gib(vllm['kv_cache'])} |",
                  f"| **vLLM needs** | {gib(vllm['total'])} |"]
        if floor["vllm_share"]:
            share, gpu = floor["vllm_share"], floor["gpu_bytes"]
            fits = vllm["total"] <= share and floor["floor"] <= gpu - share
            lines += ["", f"On a GPU of {gpu / 2**30:.0f} GiB vLLM reserves {share / 2**30:.2f} GiB "
                          f"(vllm_gpu_memory_utilization), leaving the trainer {(gpu - share) / 2**30:.2f} GiB: "
                          + ("both fit." if fits else "does not fit.")]
    return "\n".join(lines)


def synthetic_batch(vocab_size: int, batch_size: int, prompt_length: int, completion_length: int, seed: int = 0):
    """Random prompt and completion ids of fixed lengths, and random 0/1 rewards: a stand-in for a rollout."""
    g = torch.Generator().manual_seed(seed)
    return {
        "prompt_ids": torch.randint(3, vocab_size, (batch_size, prompt_length), generator=g),
        "prompt_mask": torch.ones(batch_size, prompt_length, dtype=torch.long),
        "completion_ids": torch.randint(3, vocab_size, (batch_size, completion_length), generator=g),
        "completion_mask": torch.ones(batch_size, completion_length),
    }, torch.randint(0, 2, (batch_size,), generator=g).float()


def grpo_step(model, optimizer, batch, rewards, group_size: int, ref_model=None, beta: float = 0.0) -> float:
    """One GRPO optimizer step on a given batch, with the trainer's own update (`trainer.grpo_update`; on-policy,
    so old_logp = logp.detach()). Returns the loss."""
    from ..advantages import group_advantages
    from ..batch import Batch
    from ..config import Config
    from ..logprobs import LogprobForward, completion_logprobs
    from ..trainer import grpo_update

    ids = [batch[k] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")]
    adv, _ = group_advantages(rewards, group_size)
    ref_logp = None
    if ref_model is not None:
        with torch.no_grad():
            ref_logp = completion_logprobs(ref_model, *ids)[0]
    cfg = Config(num_generations=group_size, generation_batch_size=len(rewards), beta=beta)
    inputs = Batch.of_completions(*ids, adv=adv.to(ids[0].device), ref_logp=ref_logp)
    return grpo_update(LogprobForward(model), optimizer, inputs, cfg, max_completion_length=ids[2].shape[1])[0]["loss"]


def measure_recipe_step(cfg, device: str = "cpu", prompt_length: int = 200, steps: int = 2) -> dict:
    """The memory of cfg's training step, measured, beside `recipe_floor`'s prediction for the same shapes.

    cfg.model_name_or_path must be a local directory (for a recipe's hub model, a random model of its shape:
    `shape_dir`). The policy is loaded as the trainer loads it (run.load_policy: full, LoRA or QLoRA, dtype,
    gradient checkpointing); the batch is generation_batch_size random completions of max_completion_length tokens
    in groups of num_generations on prompt_length-token prompts (what `recipe_floor` assumes), and the update is the
    trainer's own (`trainer.grpo_update`: its micro-batches, autocast, fp16's scaler), `steps` times; the last one
    is measured (AdamW's moments exist from the first). What is left out is what recipe_floor leaves out: sampling
    and its KV cache, vLLM, the reference's forward (ref_logp is given).

    Returns {"peak_bytes": the peak over the measured step above what was live before the model was built
    (CUDA: allocated tensors, so weights, gradients, moments and activations; a CPU: the resident set),
    "predicted": recipe_floor(cfg, prompt_length), "seconds"}.
    """
    from ..batch import Batch
    from ..logprobs import LogprobForward
    from ..mixed_precision import autocast_dtype, grad_scaler
    from ..loading.peak_memory import current_memory_bytes, peak_memory_bytes, reset_peak_memory
    from ..run import load_policy
    from ..tasks import get_task
    from ..trainer import grpo_update

    device = torch.device(device)
    completion_length = cfg.max_completion_length or get_task(cfg.task).max_completion_length
    N, G = cfg.generation_batch_size, cfg.num_generations
    gc.collect()  # what an earlier model left (reference cycles) is freed; what is still live is the baseline
    reset_peak_memory(device)
    baseline = current_memory_bytes(device)
    t0 = time.perf_counter()
    model, _ = load_policy(cfg, cfg.model_name_or_path, device)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.learning_rate)
    batch, _ = synthetic_batch(model.config.vocab_size, N // G, prompt_length, completion_length)
    prompt_ids, prompt_mask = (batch[k].repeat_interleave(G, dim=0) for k in ("prompt_ids", "prompt_mask"))
    completions, _ = synthetic_batch(model.config.vocab_size, N, 1, completion_length, seed=1)
    inputs = Batch.of_completions(prompt_ids, prompt_mask, completions["completion_ids"],
                                  completions["completion_mask"], adv=torch.randn(N)).to(device)
    if cfg.beta > 0 and not cfg.kl_in_reward:
        inputs.ref_logp = torch.zeros(N, completion_length, device=device)
    dtype = autocast_dtype(cfg.bf16, cfg.fp16)
    autocast = functools.partial(torch.autocast, device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)
    scaler = grad_scaler(device, enabled=cfg.fp16)
    for step in range(steps):
        if step == steps - 1:
            reset_peak_memory(device)
        grpo_update(LogprobForward(model), optimizer, inputs, cfg, max_completion_length=completion_length,
                    autocast=autocast,
                    scaler=scaler)
    peak = peak_memory_bytes(device) - baseline
    del model, optimizer, inputs
    return {"peak_bytes": peak, "predicted": recipe_floor(cfg, prompt_length), "seconds": time.perf_counter() - t0}


def _import_model_code(model_dir: str) -> None:
    """Import every library a setup will use (and the architecture's modeling code) before the baseline, so
    that "model + step" counts the model and the step, not the import of the code that builds them."""
    import bitsandbytes  # noqa: F401
    import peft  # noqa: F401
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING

    config_class = type(AutoConfig.from_pretrained(model_dir))
    MODEL_FOR_CAUSAL_LM_MAPPING[config_class], MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING[config_class]


def measure_setup(setup: str, model_dir: str, *, device: str = "cpu", dtype: str = "float32", batch_size: int = 8,
                  num_generations: int = 8, prompt_length: int = 32, completion_length: int = 64, steps: int = 2,
                  beta: float = 0.0, lora_r: int = 16, reward_model: bool = False) -> dict:
    """Build one setup and run `steps` training steps; returns its parameter counts and peak memory.

    reward_model: a reward model of the policy's shape (its body under a scalar head, in `dtype`) scores each step's
    batch without gradient, as reward_models/ does, and the policy's start is kept for the drift (no copy with LoRA).
    Meant to run alone in a fresh process (`measure` does that): the peak is the process's, from its start.
    """
    from ..loading.models import add_lora, load_model, parameter_counts, reference_policy
    from ..loading.peak_memory import peak_memory_bytes, reset_peak_memory
    from ..ppo_critic import ValueModel, ppo_step

    device = torch.device(device)
    _import_model_code(model_dir)
    reset_peak_memory(device)
    baseline = torch.cuda.memory_allocated(device) if device.type == "cuda" else peak_memory_bytes(device)
    t0 = time.perf_counter()
    if setup == "grpo-qlora":
        model = add_lora(load_model(model_dir, device, dtype=dtype, load_in_4bit=True, use_bnb_nested_quant=True),
                         r=lora_r, alpha=2 * lora_r)
    elif setup == "grpo-lora":
        model = add_lora(load_model(model_dir, device, dtype=dtype), r=lora_r, alpha=2 * lora_r)
    elif setup in ("grpo-full", "ppo-critic"):
        model = load_model(model_dir, device, dtype=dtype)
    else:
        raise ValueError(f"setup: {setup!r} is not one of {', '.join(SETUPS)}")
    ref_model = reference_policy(model) if beta > 0 or reward_model else None
    scorer = _reward_model_of_shape(model_dir, device, dtype) if reward_model else None
    critic = ValueModel(model).to(device) if setup == "ppo-critic" else None
    trainable, total = parameter_counts(model)
    total += sum(p.numel() for p in scorer.parameters()) if scorer is not None else 0  # held, not trained
    params = [p for p in model.parameters() if p.requires_grad]
    if critic is not None:
        params += list(critic.parameters())
        trainable, total = trainable + sum(p.numel() for p in critic.parameters()), total + sum(
            p.numel() for p in critic.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-6)
    batch, rewards = synthetic_batch(model.config.vocab_size, batch_size, prompt_length, completion_length)
    batch, rewards = {k: v.to(device) for k, v in batch.items()}, rewards.to(device)
    for _ in range(steps):
        if scorer is not None:
            with torch.no_grad():
                scorer(input_ids=torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)).logits
        if critic is None:
            grpo_step(model, optimizer, batch, rewards, num_generations, ref_model, beta)
        else:
            ref_logp = None
            if ref_model is not None:
                from ..logprobs import completion_logprobs

                with torch.no_grad():
                    ref_logp = completion_logprobs(ref_model, *batch.values())[0]
            ppo_step(model, critic, optimizer, batch, rewards, ref_logp=ref_logp, kl_coef=beta or 0.05)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {"setup": setup, "trainable_params": trainable, "total_params": total,
            "peak_bytes": peak_memory_bytes(device), "baseline_bytes": baseline,
            "seconds": round(time.perf_counter() - t0, 2)}


def _reward_model_of_shape(model_dir: str, device, dtype: str):
    """The policy's body under a fresh scalar head: a reward model of the same shape (reward_models/ scores it)."""
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    from ..loading.models import DTYPES

    hf_logging.set_verbosity_error()  # the new head's "newly initialized" note
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1, dtype=DTYPES[dtype])
    model.config.pad_token_id = model.config.pad_token_id or 0
    return model.to(device).eval().requires_grad_(False)


def measure(shape: str, setups=tuple(SETUPS), *, workdir=None, **kwargs) -> list[dict]:
    """Measure every setup on `shape`, each in a fresh subprocess. kwargs go to `measure_setup`."""
    with tempfile.TemporaryDirectory(prefix="minigrpo-memory-") as tmp:
        model_dir = str(shape_dir(shape, workdir or tmp))
        package_parent = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([package_parent, os.environ.get("PYTHONPATH", "")])}
        results = []
        for setup in setups:
            request = json.dumps({"setup": setup, "model_dir": model_dir, **kwargs})
            proc = subprocess.run([sys.executable, "-m", "minigrpo.lab.memory_cli", "--child", request],
                                  capture_output=True, text=True, env=env)
            lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_MARKER)]
            if proc.returncode != 0 or not lines:
                raise RuntimeError(f"memory: setup {setup} on {shape} failed:\n{proc.stderr[-3000:]}")
            results.append({"shape": shape, **json.loads(lines[-1][len(RESULT_MARKER):])})
        return results


def grpo_ppo_ratio(results: list[dict], device: str) -> float | None:
    """Full-fine-tune GRPO's memory over PPO-with-critic's (CPU: on peak minus baseline, CUDA: on the peak)."""
    by_setup = {r["setup"]: r for r in results}
    if "grpo-full" not in by_setup or "ppo-critic" not in by_setup:
        return None
    used = lambda r: r["peak_bytes"] - (r["baseline_bytes"] if device == "cpu" else 0)  # noqa: E731
    return used(by_setup["grpo-full"]) / used(by_setup["ppo-critic"])


def format_table(results: list[dict], device: str) -> str:
    """A plain-text table of one shape's results, then the GRPO/PPO ratio."""
    mib = lambda b: f"{b / 2**20:,.1f}"  # noqa: E731
    peak_name = "peak RSS MiB" if device == "cpu" else "peak alloc MiB"
    head = f"{'setup':22s} {'trainable':>13s} {'total':>13s} {peak_name:>15s}"
    head += f" {'model+step MiB':>15s}" if device == "cpu" else ""
    lines = [head + f" {'seconds':>8s}", "-" * len(head + " " * 9)]
    for r in results:
        line = f"{SETUPS[r['setup']]:22s} {r['trainable_params']:>13,d} {r['total_params']:>13,d} {mib(r['peak_bytes']):>15s}"
        line += f" {mib(r['peak_bytes'] - r['baseline_bytes']):>15s}" if device == "cpu" else ""
        lines.append(line + f" {r['seconds']:>8.1f}")
    ratio = grpo_ppo_ratio(results, device)
    if ratio is not None:
        basis = "model+step" if device == "cpu" else "peak allocated"
        lines.append(f"GRPO/PPO memory ratio: {ratio:.2f} (full-fine-tune GRPO / PPO with critic, on {basis}: "
                     f"{1 - ratio:.0%} less)")
    return "\n".join(lines)
