"""The engines that sample completions, apart from the step that uses them (rollout.py, the decode loop).

    engines.py          the interface the loop samples through: GenerateEngine (rollout.py's decode loop),
                        RolloutEngine; sampling options
    decode_step.py      one decoding step that calls the model's layers directly (Llama, Qwen2, Qwen3; LoRA, 4-bit)
    kv_cache.py         the decode loop's key/value cache
    rollout_vllm.py     vLLM colocated in the trainer's process, its weights synced after each batch's updates
    engine_mismatch.py  an engine's log-probs against ours, and TRL's importance-sampling correction for them
"""
