"""Loading a policy: any Hugging Face causal LM, by local directory or hub name, optionally as LoRA or QLoRA.

The default everywhere is a tiny Llama shipped under data/models/<task>/ (built by
scripts/make_tiny_world.py), so nothing needs the internet. A hub name such as "Qwen/Qwen2.5-0.5B-Instruct"
works the same way on a machine that can reach the hub.

What fits on one consumer GPU (8-24 GB) is decided here, not in the trainer:
  * LoRA (`use_peft`, peft): the weights W stay frozen and only a low-rank update is trained,
    W x + (alpha / r) * B A x with A (r, d_in), B (d_out, r), B = 0 at the start. Adam's two moments and the
    gradients exist for A and B only. (Hu et al. 2021, "LoRA", section 4.1.)
  * QLoRA (`load_in_4bit`, bitsandbytes): the frozen W is stored as 4-bit NormalFloat (nf4), optionally with
    its quantization constants quantized too (double quantization), and dequantized to the compute dtype
    block by block inside each matmul. (Dettmers et al. 2023, "QLoRA", section 3.)
  * The reference policy of the KL term is the same base with the adapter switched off: no second copy.
peft and bitsandbytes do the work; this file only decides what to ask them for.
"""

import contextlib
import copy
import json
import logging
import os
import warnings
from pathlib import Path

import torch

from ..errors import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# bitsandbytes (imported by peft and transformers) warns on every CPU with AVX512-BF16 that an optional kernel
# package is missing; minigrpo keeps 4-bit layers off that kernel anyway (load_model), so the note is noise.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)

# Every linear layer of the transformer blocks (attention and MLP), as the QLoRA paper recommends
# (section 4: "LoRA on all linear layers is critical to match full fine-tuning"). peft's own default for
# Llama/Qwen2 is q_proj and v_proj only. The output head is left out: it is tied to the embeddings here.
LORA_TARGET_MODULES = {
    "llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "qwen2": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "qwen3": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "mistral": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "gemma": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],
    "gpt2": ["c_attn", "c_proj", "c_fc"],
}


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: 'cuda' was asked for but torch sees no CUDA GPU")
    return torch.device(device)


def _local_or_hub(name_or_path: str | os.PathLike) -> str:
    """A path that looks local (exists, or starts with '.', '/', '~') must exist; a hub name is passed on.

    A local directory must hold a model (config.json) or a LoRA adapter (adapter_config.json, loaded onto its
    base): anything else would reach transformers, whose "Unrecognized model" error is a traceback, not a line.
    """
    name = str(name_or_path)
    local = Path(name).expanduser()
    looks_local = local.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1
    if looks_local and not local.is_dir():
        raise FileNotFoundError(f"model_name_or_path: {name} is not a directory")
    if looks_local and not any((local / f).is_file() for f in ("config.json", "adapter_config.json")):
        raise FileNotFoundError(f"model_name_or_path: {name} holds no config.json (nor adapter_config.json), so it "
                                f"is not a model directory; pass a directory saved with save_pretrained")
    return str(local) if looks_local else name


def _unfetchable(name: str, exc: Exception) -> FileNotFoundError:
    from huggingface_hub import is_offline_mode

    hint = " (HF_HUB_OFFLINE is set, so the hub was not asked)" if is_offline_mode() else ""
    return FileNotFoundError(
        f"model_name_or_path: could not load {name!r} — not a local model directory and not fetchable "
        f"from the hub{hint}. Pass a directory saved with save_pretrained, or omit it to use the shipped tiny model."
    )


def load_tokenizer(name_or_path: str | os.PathLike):
    """The tokenizer, padding on the left (for generation), with a pad token (eos if it has none)."""
    from transformers import AutoTokenizer

    name = _local_or_hub(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
    except OSError as exc:
        raise _unfetchable(name, exc) from exc
    return prepare_tokenizer(tokenizer)


def prepare_tokenizer(tokenizer):
    """A tokenizer made ready for generation, in place: padding on the left, a pad token (eos if it has none).
    Also for one handed over from Python (TRL's processing_class)."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


@contextlib.contextmanager
def _quiet_new_head(quiet: bool):
    """While inside (when quiet), transformers' load report stays silent: a classifier started from a causal LM's
    body is meant to get a new head, and the report's "MISSING ... newly initialized" would read as a fault."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    if quiet:
        hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def load_model(
    name_or_path: str | os.PathLike,
    device: str | torch.device = "cpu",
    *,
    dtype: str = "float32",
    load_in_4bit: bool = False,
    bnb_4bit_quant_type: str = "nf4",
    use_bnb_nested_quant: bool = False,
    num_labels: int | None = None,
    per_token: bool = False,
):
    """A causal LM on `device`, its weights in `dtype`, or its linear layers in 4 bits (bitsandbytes). With
    num_labels, a sequence classifier instead (a reward model: num_labels=1), its head new if the checkpoint has none;
    with per_token too, a token classifier (a process reward model: num_labels=2, two logits at every token).

    With load_in_4bit, every nn.Linear of the blocks becomes a bitsandbytes Linear4bit (the output head and the
    embeddings stay in `dtype`), and `dtype` is the compute dtype the 4-bit blocks are dequantized to — as in
    TRL's ModelConfig, where one `dtype` field serves both. bitsandbytes >= 0.45 runs this on the CPU too.
    A directory holding a LoRA adapter (adapter_config.json) loads its base model with the adapter on top.
    """
    from transformers import (AutoModelForCausalLM, AutoModelForSequenceClassification,
                              AutoModelForTokenClassification, BitsAndBytesConfig)

    name = _local_or_hub(name_or_path)
    kwargs = {"dtype": DTYPES[dtype]} | ({"num_labels": num_labels} if num_labels else {})
    model_class = ((AutoModelForTokenClassification if per_token else AutoModelForSequenceClassification) if num_labels
                   else AutoModelForCausalLM)
    if load_in_4bit:
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type=bnb_4bit_quant_type,
            bnb_4bit_use_double_quant=use_bnb_nested_quant, bnb_4bit_compute_dtype=DTYPES[dtype],
        )
        kwargs["device_map"] = {"": str(device)}  # quantized weights are placed while loading, never moved
        if per_token:  # a token classifier's head ("score") stays in dtype, as the causal LM's output head does
            kwargs["quantization_config"].llm_int8_skip_modules = ["score", "classifier"]
    try:
        with _quiet_new_head(bool(num_labels)):
            model = model_class.from_pretrained(name, **kwargs)
    except OSError as exc:
        raise _unfetchable(name, exc) from exc
    if not load_in_4bit:
        return model.to(device)
    # bitsandbytes >= 0.49 on a CPU with AVX512-BF16: the first forward in eval mode (every rollout) repacks a
    # Linear4bit's weight for an inference kernel that has no backward, and keeps it so; training forwards after
    # it run that kernel too, and the gradient through the frozen base is silently lost (measured: the LoRA
    # gradients' norm fell from 767 to 171 on the shipped model; with a bias, Qwen2's q/k/v, it crashes). Keep
    # every 4-bit layer on the differentiable path.
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False
    return model


def load_model_and_tokenizer(name_or_path: str | os.PathLike, device: str | torch.device = "cpu", **model_kwargs):
    """(model, tokenizer): `load_model` (float32 unless told otherwise) and `load_tokenizer` from one place."""
    return load_model(name_or_path, device, **model_kwargs), load_tokenizer(name_or_path)


def default_lora_target_modules(model) -> list[str] | str:
    """The LoRA targets for this architecture: every linear layer of the blocks (see LORA_TARGET_MODULES).

    An architecture not in the table gets peft's "all-linear" (every nn.Linear but the output head).
    """
    return LORA_TARGET_MODULES.get(getattr(model.config, "model_type", None), "all-linear")


@contextlib.contextmanager
def peft_wrapping():
    """peft (0.21) asks transformers (>= 5.20) for `is_gradient_checkpointing` whenever it wraps a model, a name
    transformers now deprecates with a FutureWarning on every LoRA run; the answer is the same under the new name, so
    the note is silenced here, and only here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def add_lora(model, *, r: int = 16, alpha: float = 32, dropout: float = 0.05, target_modules=None,
             task_type: str = "CAUSAL_LM"):
    """Freeze `model` and wrap it in a peft LoRA adapter; only the adapter's A and B are trainable (and, with
    task_type "SEQ_CLS", a sequence classifier's new head, which peft then trains and saves whole).

    A 4-bit model first goes through peft's `prepare_model_for_kbit_training`, which freezes it and keeps the
    layers that are not quantized (norms, embeddings) in float32 for stable training. Gradient checkpointing is
    left off: it trades compute for memory and would change what `minigrpo memory` compares.
    """
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if getattr(model, "is_loaded_in_4bit", False):
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    lora = LoraConfig(
        r=r, lora_alpha=alpha, lora_dropout=dropout, bias="none", task_type=task_type,
        target_modules=target_modules or default_lora_target_modules(model),
    )
    with peft_wrapping():
        return get_peft_model(model, lora)


def enable_gradient_checkpointing(model):
    """Gradient (activation) checkpointing, as TRL turns it on: each decoder block keeps only its input in forward
    and recomputes its activations in backward (torch.utils.checkpoint, use_reentrant=False). Activation memory
    falls from all blocks' to one block's, for about one more forward pass of compute. Active in train() mode only;
    generation and no-grad log-probs (eval() mode) are unchanged.

    With LoRA/QLoRA (peft) the frozen embedding's output gets requires_grad (peft's enable_input_require_grads, as
    TRL does), so that a checkpointed block always has an input to send gradients to."""
    base = model.get_base_model() if is_lora(model) else model
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise ConfigError(f"gradient_checkpointing: {type(base).__name__} does not support it; set it false")
    kwargs = {"use_reentrant": False}
    if hasattr(base, "activation_checkpointing_enable"):  # newer transformers; the old name warns that it is deprecated
        base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if is_lora(model):
        model.enable_input_require_grads()
    return model


def adapter_base(name_or_path: str | os.PathLike) -> str | None:
    """The base model of a LoRA adapter directory (from its adapter_config.json); None for anything else."""
    path = Path(str(name_or_path)).expanduser()
    if not (path / "adapter_config.json").is_file() or (path / "config.json").is_file():
        return None
    return json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")


def is_lora(model) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def is_quantized(model) -> bool:
    """True when the base weights are 4-bit (bitsandbytes Linear4bit), with or without a LoRA adapter."""
    return any(type(m).__name__ == "Linear4bit" for m in model.modules())


class AdapterDisabled:
    """The reference policy of a LoRA run: the policy itself with its adapter switched off for the call.

    The base weights never change during LoRA training, so "the starting policy" is exactly the base model.
    Called like a model (`ref(input_ids=...)`), it costs one forward pass and no memory beyond it.
    """

    def __init__(self, peft_model):
        self.peft_model = peft_model
        self.config = peft_model.config  # read by callers that build a KV cache for it (logprobs.py)

    def __call__(self, *args, **kwargs):
        with self.peft_model.disable_adapter():
            return self.peft_model(*args, **kwargs)


def reference_policy(model):
    """The frozen reference of the KL term: the adapter-free base for LoRA, else a copy of the starting weights."""
    if is_lora(model):
        return AdapterDisabled(model)
    return copy.deepcopy(model).eval().requires_grad_(False)


@torch.no_grad()
def refresh_reference(ref_model, model, alpha: float) -> None:
    """TRL's sync_ref_model (TR-DPO, Gorbatovski et al. 2024): move the frozen reference toward the policy,

        theta_ref <- alpha * theta + (1 - alpha) * theta_ref          parameter by parameter

    so a long run's KL penalty anchors to a recent policy rather than the start. Full fine-tuning only (with LoRA
    the reference is the base with the adapter off; config.py refuses the combination)."""
    for ref_p, p in zip(ref_model.parameters(), model.parameters(), strict=True):
        ref_p.mul_(1 - alpha).add_(p.detach().to(ref_p.dtype), alpha=alpha)


def kv_size(config) -> int:
    """Values per token and layer in the keys (or the values) of attention: kv heads x head size."""
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return kv_heads * (getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def parameter_counts(model) -> tuple[int, int]:
    """(trainable, total) parameters. A 4-bit weight counts as the number of weights it stores, not bytes."""
    if is_lora(model):
        return model.get_nb_trainable_parameters()  # peft knows that a Params4bit packs two weights per byte
    total = sum(p.numel() for p in model.parameters())
    return sum(p.numel() for p in model.parameters() if p.requires_grad), total


def save_policy(model, tokenizer, out_dir: str | os.PathLike, *, base_name_or_path=None, dtype: str = "float32",
                state_dict: dict | None = None):
    """Save what was trained, loadable with `from_pretrained`; returns the directories written.

    Full fine-tuning: `out_dir` holds the model (save_pretrained format) and the tokenizer.
    LoRA: `out_dir` holds the adapter (adapter_config.json + adapter_model.safetensors, a few MB), loadable
    with `PeftModel.from_pretrained(base, out_dir)`; `<out_dir>_merged` holds a plain model with the update
    folded into the weights, W + (alpha / r) B A. The merge is done on the base reloaded from
    `base_name_or_path` in `dtype`, never on the trained model: for QLoRA that base is the float original, not
    its 4-bit copy (a 4-bit weight cannot hold W + BA exactly), so the merged model's outputs differ from the
    4-bit policy's by the quantization error of W — they equal a float base with the adapter on top.
    state_dict: the weights to write instead of the model's own (a sharded model's, gathered whole).
    """
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir, **({} if state_dict is None else {"state_dict": state_dict}))
    tokenizer.save_pretrained(out_dir)
    if not is_lora(model):
        return [out_dir]
    from peft import PeftModel

    base_name_or_path = base_name_or_path or model.peft_config["default"].base_model_name_or_path
    base_name_or_path = adapter_base(base_name_or_path) or base_name_or_path  # trained on from an adapter: its base
    base = load_model(base_name_or_path, "cpu", dtype=dtype)
    with peft_wrapping():
        merged = PeftModel.from_pretrained(base, out_dir).merge_and_unload()
    merged_dir = out_dir.with_name(out_dir.name + "_merged")
    merged.save_pretrained(merged_dir)
    tokenizer.save_pretrained(merged_dir)
    return [out_dir, merged_dir]
