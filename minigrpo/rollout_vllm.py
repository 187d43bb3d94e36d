"""vLLM as the rollout engine, colocated with training on one CUDA GPU (`use_vllm`, extra `minigrpo[vllm]`).

NOT TESTED by minigrpo's tests or CI: vLLM needs a CUDA GPU and could not be installed or run where minigrpo is
developed. What is tested is the engine contract (engines.py, with the HF-generate engine) and
`rollout_from_ids`, the padding this engine relies on. Treat this file as a starting point that follows a
known-good recipe, not as a verified feature.

The recipe is TRL 1.16's colocate mode (trl/generation/vllm_generation.py), which supports vLLM 0.22.0 to 0.31.0:
  * one `vllm.LLM` in the training process, on the same GPU: distributed_executor_backend="external_launcher"
    (RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set for a world of one), tensor_parallel_size=1,
    gpu_memory_utilization=0.3 (TRL's default: vLLM reserves that fraction of the GPU for weights + KV cache,
    the rest is the trainer's), max_num_batched_tokens=4096, logprobs_mode="processed_logprobs";
  * sampling: SamplingParams(n=G, temperature, top_p, top_k=0, min_p=0.0, repetition_penalty=1.0,
    max_tokens=max_completion_length, stop_token_ids=the eos ids) — the policy's own softmax, like GenerateEngine;
  * weights: after each batch's optimizer steps, every parameter is pushed with
    `llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights([(name, tensor)])`; for LoRA the
    adapter is merged into the base first (peft `merge_adapter`), pushed under the base names, then unmerged;
    then `llm.reset_prefix_cache()` so no KV computed with the old weights is reused.
Not done here, unlike TRL: server mode, sleep mode, tensor parallelism, the importance-sampling correction for
the small mismatch between vLLM's and the trainer's log-probs, and 4-bit bases (refused with a clear error).
"""

import os

import torch

from .engines import rollout_from_ids
from .models import is_lora, is_quantized
from .rollout import Rollout, eos_token_ids

VLLM_VERSIONS = ">=0.22.0,<=0.31.0"  # the range TRL 1.16 checks for (trl.import_utils.is_vllm_available)


def import_vllm():
    """`import vllm`, or an ImportError that says what to do instead."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(
            f"use_vllm: vLLM is not installed. It needs Linux and a CUDA GPU: pip install 'minigrpo[vllm]' "
            f"(vllm{VLLM_VERSIONS}). Without it, leave use_vllm off: the policy's own decode loop samples instead."
        ) from exc
    return vllm


class VLLMEngine:
    """Generates with a colocated vLLM engine and copies the policy's weights into it (see the module docstring)."""

    def __init__(self, model, tokenizer, *, gpu_memory_utilization: float = 0.3, max_model_len: int | None = None,
                 seed: int = 0):
        vllm = import_vllm()
        if not torch.cuda.is_available():
            raise RuntimeError("use_vllm: vLLM needs a CUDA GPU, and torch sees none")
        if is_quantized(model):
            raise ValueError("use_vllm: a 4-bit (load_in_4bit) base is not supported by minigrpo's vLLM engine")
        for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "localhost",
                           "MASTER_PORT": "29511"}.items():
            os.environ.setdefault(key, value)
        self.model, self.tokenizer, self.vllm = model, tokenizer, vllm
        base = model.peft_config["default"].base_model_name_or_path if is_lora(model) else model.name_or_path
        self.llm = vllm.LLM(
            model=str(base), tensor_parallel_size=1, gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len, distributed_executor_backend="external_launcher", seed=seed,
            max_num_batched_tokens=4096, logprobs_mode="processed_logprobs",
            dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        )
        self.sync_weights()  # the policy may already differ from the files on disk (e.g. resumed)

    def generate(self, prompts, *, num_generations, max_completion_length, temperature=1.0, top_p=1.0) -> Rollout:
        eos_ids = eos_token_ids(self.model, self.tokenizer)
        params = self.vllm.SamplingParams(
            n=num_generations, temperature=temperature, top_p=top_p, top_k=0, min_p=0.0, repetition_penalty=1.0,
            max_tokens=max_completion_length, stop_token_ids=eos_ids,
        )
        prompt_ids = self.tokenizer(prompts)["input_ids"]  # with the tokenizer's special tokens, as generate sees them
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], sampling_params=params,
                                    use_tqdm=False)
        completion_ids = []
        for out in outputs:  # one RequestOutput per prompt, with n completions: grouped as the contract wants
            for sample in out.outputs:
                ids = list(sample.token_ids)
                if sample.finish_reason == "stop" and (not ids or ids[-1] not in eos_ids):
                    ids.append(eos_ids[0])  # stopped on an eos that vLLM left out of token_ids
                completion_ids.append(ids)
        return rollout_from_ids(prompt_ids, completion_ids, self.tokenizer, eos_ids, num_generations,
                                max_completion_length)

    @torch.no_grad()
    def sync_weights(self) -> None:
        runner = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        model = self.model
        if is_lora(model):
            model.merge_adapter()  # W <- W + (alpha/r) B A in place, undone below
            try:
                for name, param in model.named_parameters():
                    if model.prefix in name or "original_module" in name:
                        continue  # the adapter's own A and B: already inside the merged W
                    name = name.removeprefix("base_model.model.").replace(".base_layer", "")
                    runner.load_weights([(name.replace("modules_to_save.default.", ""), param.data)])
            finally:
                model.unmerge_adapter()
        else:
            for name, param in model.named_parameters():
                runner.load_weights([(name, param.data)])
        self.llm.reset_prefix_cache()
