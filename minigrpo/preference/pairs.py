"""Preference data in TRL's formats, and pairs made from a checker's labels.

TRL's preference rows (its RewardTrainer and DPOTrainer read them), standard or conversational:

    explicit prompt   {"prompt": "38+85=", "chosen": "<think>...</think>123", "rejected": "<think></think>113"}
    implicit prompt   {"chosen": "38+85=<think>...</think>123", "rejected": "38+85=<think></think>113"}
    conversational    each value a list of {"role", "content"} messages instead of a string
    with a margin     any of the above plus "margin": 1.5 (how much clearer the preference is; bradley_terry.py)

and its unpaired (pointwise) rows, one completion with a label: {"prompt": ..., "completion": ..., "label": true}.

A checker gives labels, not preferences. `pair_right_with_wrong` turns the labelled samples of one prompt into
pairs: every right completion preferred to a wrong one of the same prompt (a prompt with none right, or none wrong,
gives no pair: there is nothing to compare there).
"""

import random

from ..tasks.sources import DataError

__all__ = ["preference_pair", "pair_right_with_wrong"]


def preference_pair(row: dict) -> dict:
    """A preference row -> {"prompt", "chosen", "rejected", "margin"} with the prompt explicit (margin None when the
    row has none). An implicit prompt is the longest common prefix of chosen and rejected, messages or characters,
    less a space it ends with (TRL's `extract_prompt`). A row without chosen and rejected is a one-line DataError."""
    if "chosen" not in row or "rejected" not in row:
        raise DataError(f"a preference row needs 'chosen' and 'rejected' (and optionally 'prompt', 'margin'); "
                        f"got the keys {sorted(row)}")
    prompt, chosen, rejected = row.get("prompt"), row["chosen"], row["rejected"]
    if prompt is None:
        shared = 0
        while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
            shared += 1
        if shared and isinstance(chosen, str) and chosen[shared - 1] == " ":  # the space goes with the completion
            shared -= 1
        prompt, chosen, rejected = chosen[:shared], chosen[shared:], rejected[shared:]
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected, "margin": row.get("margin")}


def pair_right_with_wrong(prompt, completions: list, correct: list[bool], rng: random.Random) -> list[dict]:
    """Preference rows (explicit prompt) from one prompt's labelled samples: max(#right, #wrong) pairs, the right
    and the wrong each shuffled and the shorter list cycled, so that every sample is in at least one pair. No pair
    when all are right or all wrong."""
    right = [c for c, ok in zip(completions, correct, strict=True) if ok]
    wrong = [c for c, ok in zip(completions, correct, strict=True) if not ok]
    if not right or not wrong:
        return []
    rng.shuffle(right)
    rng.shuffle(wrong)
    n = max(len(right), len(wrong))
    return [{"prompt": prompt, "chosen": right[i % len(right)], "rejected": wrong[i % len(wrong)]} for i in range(n)]
