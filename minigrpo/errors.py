"""The errors minigrpo raises for input it cannot use, and how the CLI tells them from bugs.

ConfigError lives here, since every floor of the package raises it (a config key that does not fit: config.py's
validation, the models, the engines, the tasks, the tools). The other modules keep their own error class beside
the checks that raise it (DataError in tasks/sources.py, RewardError in rewards.py, CheckpointError in
persistence/checkpoint.py, ...); each derives from MinigrpoError. `minigrpo train` prints such an error as one
line and exits 2: the message names what to fix (a config key, a file and line, a reward function and the
completion it failed on). Any other exception is a bug, in minigrpo or in a module you edited, and the CLI lets it
through with its traceback.
"""

__all__ = ["MinigrpoError", "ConfigError", "UsageError", "did_you_mean"]


class MinigrpoError(Exception):
    """Input minigrpo cannot use; the message, one line, names what to change."""


class UsageError(MinigrpoError, ValueError):
    """A command's argument outside Config that does not fit (`minigrpo show --step 7` for a run of 2 steps)."""


class ConfigError(MinigrpoError, ValueError):
    """A config key that does not exist or a value that does not fit it (config.py's validation, and wherever a
    value is first used: a model, an engine, a task, a tool)."""


def did_you_mean(word: str, candidates) -> str:
    """ "did you mean X?" for the closest candidate (difflib), or "" when none is close."""
    import difflib

    close = difflib.get_close_matches(word, [str(c) for c in candidates], n=1, cutoff=0.6)
    return f"did you mean {close[0]}?" if close else ""
