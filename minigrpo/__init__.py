"""minigrpo: GRPO and its variants, written from scratch to be read.

    from minigrpo import GRPOConfig, GRPOTrainer     # TRL's names (grpo_config.py, grpo_trainer.py)
    from minigrpo.config import Config               # minigrpo's own
    from minigrpo.trainer import train               # the loop both run
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
