"""The errors minigrpo raises for input it cannot use, and how the CLI tells them from bugs.

Each module keeps its own error class beside the checks that raise it (ConfigError in config.py, DataError in
tasks/sources.py, RewardError in rewards.py, CheckpointError in checkpoint.py, ...); each also derives from
MinigrpoError. `minigrpo train` prints such an error as one line and exits 2: the message names what to fix (a
config key, a file and line, a reward function and the completion it failed on). Any other exception is a bug,
in minigrpo or in a module you edited, and the CLI lets it through with its traceback.
"""

__all__ = ["MinigrpoError", "UsageError"]


class MinigrpoError(Exception):
    """Input minigrpo cannot use; the message, one line, names what to change."""


class UsageError(MinigrpoError, ValueError):
    """A command's argument outside Config that does not fit (`minigrpo show --step 7` for a run of 2 steps)."""
