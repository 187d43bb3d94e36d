"""Loading a policy: any Hugging Face causal LM, by local directory or hub name.

The default everywhere is a tiny Llama shipped under data/models/<task>/ (built by
scripts/make_tiny_world.py), so nothing needs the internet. A hub name such as "Qwen/Qwen2.5-0.5B-Instruct"
works the same way on a machine that can reach the hub.
"""

import os
from pathlib import Path

import torch

from .config import ConfigError


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: 'cuda' was asked for but torch sees no CUDA GPU")
    return torch.device(device)


def load_model_and_tokenizer(name_or_path: str | os.PathLike, device: str | torch.device = "cpu"):
    """(model, tokenizer) in float32 on `device`, tokenizer padding on the left (for generation).

    A path that looks local (exists, or starts with '.', '/', '~') must exist; a hub name that cannot be
    fetched (offline, unknown) raises one line saying so rather than a long stack of HTTP errors.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name = str(name_or_path)
    local = Path(name).expanduser()
    looks_local = local.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1
    if looks_local and not local.is_dir():
        raise FileNotFoundError(f"model_name_or_path: {name} is not a directory")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(local) if looks_local else name)
        model = AutoModelForCausalLM.from_pretrained(str(local) if looks_local else name, dtype=torch.float32)
    except OSError as exc:
        from huggingface_hub import is_offline_mode

        hint = " (HF_HUB_OFFLINE is set, so the hub was not asked)" if is_offline_mode() else ""
        raise OSError(
            f"model_name_or_path: could not load {name!r} — not a local model directory and not fetchable "
            f"from the hub{hint}. Pass a directory saved with save_pretrained, or omit it to use the shipped tiny model."
        ) from exc
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device), tokenizer
