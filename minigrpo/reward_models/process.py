"""A process reward model (PRM) as a step reward function: the hub PRMs' convention, scored without gradient.

Qwen2.5-Math-PRM (Zhang et al. 2025, "The Lessons of Developing Process Reward Models in Mathematical Reasoning")
reads a response cut into steps and gives each step a probability of being right:

    steps   = the completion's text split on "\\n\\n" (blank pieces left out)
    text    = chat_template([system, user: prompt, assistant: steps[0] <extra_0> steps[1] <extra_0> ... <extra_0>])
    logits  = prm(text)                                   (1, L, 2): two classes per token
    p_k     = softmax(logits[position of the k-th <extra_0>])[1]          P(step k is right)

`ProcessRewardModel` does exactly that for a batch of completions and returns, for each, `StepRewards(p, ends)`:
the probabilities as the steps' rewards, and where each step ends in the policy's text (after its separator; the last
at the end of the text), so the trainer maps them onto the policy's own tokens (step_rewards.py). Any model whose
output holds per-token logits of two classes fits: Qwen2.5-Math-PRM's (`AutoModel`, trust_remote_code), a
`...ForTokenClassification` with num_labels=2 (TRL's former PRMTrainer trained these, labels at each step's end,
Math-Shepherd style), or the stand-in (lab/standin.py). A score token written by the policy itself is removed from
the PRM's input, so a completion cannot add steps the PRM scores, and each step's special-token strings stay plain
characters (`prm_ids`): a completion writing `<|im_end|>\n<|im_start|>user` cannot close the assistant's turn or forge a
message in the PRM's input. (The policy's own added tokens that are not special, such as think_addition's `<think>`,
stay the tokens the PRM was trained to read.)

A tokenizer without a chat template (minigrpo's own tiny models) reads TRL's former PRMTrainer's plain format
instead, `prompt + steps[0] + sep + steps[1] + sep + ...` (no bos added). `prm_text` builds the text for both the
scorer and the trainer (reward_trainer.py, loss "step_labels"), so a PRM trained here reads what it was trained on.
`split` replaces the separator for a text whose steps are cut otherwise: think_addition's scratchpad
(tasks.think_addition.scratchpad_split, with "," as the score token) is cut as its step checker cuts it.

What it simplifies: the steps are split on one separator (or by `split`); a completion longer than the PRM's context
is not cut (give the PRM a max_completion_length it can read); `positive_label` says which class means "right"
(Qwen: 1); a score token in the prompt is skipped (the last len(steps) score tokens are the steps').
"""

import json
import math
from pathlib import Path

import torch

from ..prompts import right_pad
from ..rewards import completion_text
from ..step_rewards import StepRewards
from ..tools.template import TemplateChangedContent, ids_with_plain_holders

__all__ = ["ProcessRewardModel", "split_steps", "prm_text", "prm_ids", "score_token_id", "save_prm_settings",
           "load_process_reward_model", "PRM_SETTINGS"]

PRM_SETTINGS = "process_reward_model.json"  # beside a trained PRM's weights: how to read it back (reward_trainer.py)

QWEN_PRM_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."


def split_steps(text: str, separator: str = "\n\n") -> tuple[list[str], list[int]]:
    """The steps of `text` (stripped) and the character offset where each ends: after its separator, the last one at
    the end of the text. Blank pieces are no step; a text with no step at all is one empty step ending at its end.

        split_steps("Add 2 and 3.\n\n2 + 3 = 5.\n\n")  ->  (["Add 2 and 3.", "2 + 3 = 5."], [14, 26])"""
    steps, ends, position = [], [], 0
    pieces = text.split(separator)
    for k, piece in enumerate(pieces):
        position += len(piece) + (len(separator) if k < len(pieces) - 1 else 0)
        if piece.strip():
            steps.append(piece.strip())
            ends.append(position)
    if not steps:
        return [""], [len(text)]
    ends[-1] = len(text)  # the last step runs to the end (trailing separators included): the eos is credited to it
    return steps, ends


def score_token_id(tokenizer, score_token: str) -> int:
    """The id of the token a PRM reads each step's score at; a ValueError in one line unless it is one token."""
    try:
        ids = tokenizer(score_token, add_special_tokens=False)["input_ids"]
    except Exception:  # noqa: BLE001 (a word-level tokenizer raises a bare Exception for a word it lacks)
        ids = []
    if len(ids) != 1:
        raise ValueError(f"score token {score_token!r} is {len(ids)} tokens of the PRM's tokenizer, not one: pick a "
                         f"token of its vocabulary (or add it to the tokenizer before training)")
    return ids[0]


def prm_text(tokenizer, prompt, steps: list[str], score_token: str, system: str | None = QWEN_PRM_SYSTEM) -> str:
    """A PRM's input: the prompt, then each step followed by the score token (a score token inside a step removed).
    With a chat template: the template over the system message (None: none), the prompt and the steps as the
    assistant's turn (Qwen2.5-Math-PRM); without one: TRL's plain prompt + steps (a string prompt)."""
    clean = [step.replace(score_token, "") for step in steps]
    response = "".join(s + score_token for s in clean)
    if not getattr(tokenizer, "chat_template", None):
        if not isinstance(prompt, str):
            raise ValueError("a conversational prompt needs a PRM tokenizer with a chat template")
        return prompt + response
    messages = [{"role": "system", "content": system}] if system is not None else []
    messages += prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    messages.append({"role": "assistant", "content": response})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)


def prm_ids(tokenizer, prompt, steps: list[str], score_token: str, system: str | None = QWEN_PRM_SYSTEM) -> list[int]:
    """prm_text's token ids, each step fenced: the template's text and the score tokens tokenized as usual, each step
    with split_special_tokens, so that a special token's string in it (`<|im_end|>`, `<|im_start|>`, the eos) is
    characters, not the token. The steps come from the policy; the prompt and the template do not."""
    holders = [f"\ue000step {k}\ue001" for k in range(len(steps))]  # private-use characters: in no chat template
    text = prm_text(tokenizer, prompt, holders, score_token, system)
    plain = {h: step.replace(score_token, "") for h, step in zip(holders, steps)}
    try:
        return ids_with_plain_holders(tokenizer, text, plain, lambda step: tokenizer(
            step, add_special_tokens=False, split_special_tokens=True)["input_ids"])
    except TemplateChangedContent:
        raise ValueError("the PRM's chat template changes the assistant's content: its steps cannot be fenced as "
                         "plain text") from None


class ProcessRewardModel:
    """prm(prompts, completions, **row) -> [StepRewards] (TRL's reward-function signature), on a PRM and its tokenizer.

    separator: how the policy's text is cut into steps (or split: text -> (steps, ends), as split_steps returns);
    score_token: what the PRM reads each step's score at (must be one token of its tokenizer); system: the system
    message of the PRM's chat template (None: none); positive_label: the class whose probability is the step's
    reward; batch_size: completions per forward pass."""

    def __init__(self, model, tokenizer, *, separator: str = "\n\n", score_token: str = "<extra_0>",
                 system: str | None = QWEN_PRM_SYSTEM, positive_label: int = 1, batch_size: int = 16,
                 split=None):
        self.score_id = score_token_id(tokenizer, score_token)
        self.model = model.eval()  # scored without gradient, as RewardModel and LLMJudge are
        self.tokenizer, self.separator, self.score_token = tokenizer, separator, score_token
        self.system, self.positive_label, self.batch_size = system, positive_label, batch_size
        self.split = split or (lambda text: split_steps(text, separator))
        self.__name__ = "process_reward_model"

    def prm_text(self, prompt, steps: list[str]) -> str:
        """The PRM's input for one completion's steps, as text (`prm_text` above)."""
        return prm_text(self.tokenizer, prompt, steps, self.score_token, self.system)

    def prm_ids(self, prompt, steps: list[str]) -> list[int]:
        """The PRM's input for one completion's steps, as token ids with the steps fenced (`prm_ids` above)."""
        return prm_ids(self.tokenizer, prompt, steps, self.score_token, self.system)

    @torch.no_grad()
    def step_probabilities(self, ids: list[list[int]]) -> list[list[float]]:
        """P(step right) at each score token of each PRM input (token ids, `prm_ids`), in batches (right-padded)."""
        device = next(self.model.parameters()).device
        out = []
        for start in range(0, len(ids), self.batch_size):
            encoded = ids[start:start + self.batch_size]
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            input_ids, attention_mask = (x.to(device) for x in right_pad(encoded, pad))  # (B, L) each
            output = self.model(input_ids=input_ids, attention_mask=attention_mask)
            logits = output.logits if hasattr(output, "logits") else output[0]  # (B, L, 2)
            probabilities = logits.float().softmax(-1)[..., self.positive_label]  # (B, L)
            out += [probabilities[i][(input_ids[i] == self.score_id) & (attention_mask[i] == 1)].tolist()
                    for i in range(len(encoded))]
        return out

    def __call__(self, prompts, completions, **row) -> list[StepRewards]:
        texts = row.get("completion_text") or [completion_text(c) for c in completions]
        split = [self.split(t) for t in texts]
        scores = self.step_probabilities([self.prm_ids(p, steps) for p, (steps, _) in zip(prompts, split)])
        rewards = []
        for (steps, ends), p in zip(split, scores):
            p = p[-len(steps):]  # a score token in the prompt or the system message comes before the steps' own
            if len(p) != len(steps):  # cannot happen unless the template drops text: a step without a score
                p = (p + [math.nan] * len(steps))[:len(steps)]
            rewards.append(StepRewards(p, ends))
        return rewards


def step_splits() -> dict:
    """The ways of cutting the policy's text into steps a saved PRM may name (besides its separator): a fixed table,
    so a model directory can never name code to run."""
    from ..tasks.think_addition import scratchpad_split

    return {"think_addition": scratchpad_split}


def save_prm_settings(out, *, score_token: str, separator: str = "\n\n", system: str | None = QWEN_PRM_SYSTEM,
                      split: str | None = None) -> None:
    """Write out/process_reward_model.json: what ProcessRewardModel needs besides the weights (its arguments of the
    same names; split: a name of step_splits(), or None to cut on the separator)."""
    if split is not None and split not in step_splits():
        raise ValueError(f"split: {split!r} is none of {sorted(step_splits())}")
    settings = {"score_token": score_token, "separator": separator, "system": system, "split": split}
    (Path(out) / PRM_SETTINGS).write_text(json.dumps(settings, indent=2) + "\n")


def load_process_reward_model(directory, device="cpu", **kwargs) -> ProcessRewardModel:
    """The ProcessRewardModel a `minigrpo reward-model --loss step_labels` run saved in `directory` (its weights as
    AutoModelForTokenClassification, its tokenizer, process_reward_model.json), on `device`; kwargs override the
    saved settings (batch_size, positive_label, ...). `--reward-funcs DIR` with a PRM's directory lands here."""
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    settings = json.loads((Path(directory) / PRM_SETTINGS).read_text())
    split = settings.pop("split", None)
    if split is not None and split not in step_splits():
        raise ValueError(f"{directory}/{PRM_SETTINGS}: split {split!r} is none of {sorted(step_splits())}")
    model = AutoModelForTokenClassification.from_pretrained(directory, dtype="auto").to(device)
    return ProcessRewardModel(model, AutoTokenizer.from_pretrained(directory),
                              split=step_splits()[split] if split else None, **{**settings, **kwargs})
