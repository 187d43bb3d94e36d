"""minigrpo: GRPO and its variants, written from scratch to be read."""

__version__ = "0.1.0"
