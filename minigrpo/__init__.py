"""minigrpo: GRPO and its variants, written from scratch to be read.

    from minigrpo import GRPOConfig, GRPOTrainer     # TRL's names (grpo_config.py, grpo_trainer.py)
    from minigrpo.config import Config               # minigrpo's own
    from minigrpo.trainer import train               # the loop both run

The top of the package is one training step and its math, in the order a step runs:

    trainer.py        train(), the loop a student reads top to bottom; grpo_update(), its inner loop
    collect.py        steps 1-3: sample (rollout.py, the decode loop), score (rewards.py, tasks/), advantages
    batch.py          the Batch one step fills: ids, masks, rewards, advantages, log-probs
    advantages.py     the advantage estimators, each beside its formula
    logprobs.py       log pi of the completion tokens; LogprobForward, the one object every log-prob goes through
    objectives/       the loss types (one file each), the aggregations, policy_loss
    kl.py, truncation.py, mixed_precision.py, metrics.py, evaluate.py, prompts.py   the step's other pieces
    step_rewards.py   process supervision: a reward per step, mapped onto the tokens; preference/, the math of
                      learned rewards (Bradley-Terry, DPO, best-of-n, over-optimization)
    config.py         every option, once; errors.py, the one-line errors; cli.py, `minigrpo ...`
    run.py            the set-up and wrap-up the loops share (trainer.py; ppo_trainer.py, sft.py, reward_trainer.py,
                      dpo_trainer.py)

The machinery is in rooms named for their jobs, one call away:

    generation/       the engines that sample: the decode loop's interface, its step and KV cache, vLLM, and the
                      correction for an engine whose log-probs differ from ours
    parallel/         several processes: processes.py (the loop's one seam; trivial with one process) and
                      ddp_fsdp.py (torch's DDP / FSDP2, imported only when W > 1)
    sandbox/          code minigrpo did not write (reasoning-gym's scorers, math-verify, the python tool, your
                      reward and tool modules), loaded by name or run in a worker process with limits
    persistence/      checkpoints and exact resume, the run's logs (metrics.jsonl, completions.jsonl)
    loading/          models (full, LoRA, QLoRA, the reference), tokenizers, chat templates, device memory
    reward_models/    rewards read from a model: a trained reward model (outcome.py), a process reward model
                      (process.py), an LLM judge (judge.py)
    tasks/, tools/    the tasks (generators, files, the hub, reasoning-gym) and GRPO with tools
    lab/              apart: benchmarks, memory measurement, plots, `minigrpo show`, stand-ins, notebook helpers
"""

__version__ = "0.1.0"
__all__ = ["GRPOConfig", "GRPOTrainer"]


def __getattr__(name: str):
    """GRPOConfig and GRPOTrainer, imported when first asked for: `import minigrpo` stays light (no torch)."""
    if name == "GRPOConfig":
        from .grpo_config import GRPOConfig

        return GRPOConfig
    if name == "GRPOTrainer":
        from .grpo_trainer import GRPOTrainer

        return GRPOTrainer
    raise AttributeError(f"module 'minigrpo' has no attribute {name!r}")
