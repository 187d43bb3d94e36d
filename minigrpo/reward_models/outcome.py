"""A learned reward model as a reward function, given where TRL users give one: `reward_funcs=["path/to/rm"]`, a
loaded sequence-classification model, or `--reward-funcs path/to/rm,correctness`.

A reward model is a transformer with a scalar head (`AutoModelForSequenceClassification`, `num_labels=1`): it reads
the prompt and the completion and outputs one number, the hidden state of the text's last token times a vector.
It is scored exactly as TRL 1.16's GRPOTrainer scores it (`_calculate_rewards`):

    text   = prompt + completion                          a standard (string) prompt
           = chat_template(prompt messages + completion)  a conversational one: the whole conversation rendered
    ids    = tokenizer(texts, padding right, add_special_tokens=False)     the model's own tokenizer
    reward = model(ids).logits[:, 0]                      no gradient (inference mode)

TRL pads the whole batch to its longest text; here two things make the same scores cheaper (a row's score depends
on its own tokens only, up to its last one):
  - the G completions of a prompt begin with the same tokens (the prompt's): each distinct prefix runs once and the
    rest of each text runs on its keys and values (shared_prefix_scores, with the policy's own shared-prompt forward,
    logprobs.completion_hidden_states) — about a quarter of the compute on the main job's batch;
  - rows of similar length are scored together, each chunk padded to its own longest (logprobs.length_chunks): the
    compute of the real tokens rather than of the padding — completions of 8 to 48 tokens waste half a padded batch.
A model that is not a plain transformers sequence classifier (under an adapter, say) takes the second only.

The last token is found by the model itself, as the last one that is not padding (`config.pad_token_id`, set
from the tokenizer's pad token), so a tokenizer without a pad token cannot score a padded batch: refused in one
line, as are a model that is not a sequence classifier and a head with more than one output. A NaN score is
rewards.py's unscorable completion (kept out of its group's baseline, advantage 0, counted in `frac_reward_nan`),
and said once in a warning.

Its weight in `reward_weights` may be 0: it is then scored and logged (`rewards/<name>/mean`) without being
trained on, so a learned reward can be watched beside the checker that trains, or the reverse.
"""

import json
import os
import warnings
from pathlib import Path

import torch

from ..logprobs import completion_hidden_states, length_chunks
from ..prompts import is_conversational, left_pad, right_pad
from ..rewards import RewardError
from .process import PRM_SETTINGS, load_process_reward_model

__all__ = ["RewardModel", "RewardEnsemble", "load_reward_model", "is_reward_model", "reward_texts", "sequence_scores",
           "shared_prefix_lengths", "shared_prefix_scores"]


class RewardModel:
    """A reward function with TRL's signature, f(prompts, completions, **row) -> list[float], backed by a
    sequence-classification model and its tokenizer. `learned = True` tells the trainer to log the policy's drift.

    chat_template_kwargs: passed to the chat template for conversational rows (the run's own). name: what
    metrics.jsonl logs it under (default: TRL's, the last part of the model's name_or_path)."""

    learned = True  # the trainer logs KL(pi || pi_init) when a reward is learned (trainer.py, drift)

    def __init__(self, model, tokenizer, *, chat_template_kwargs: dict | None = None, name: str | None = None):
        check_reward_model(model, tokenizer, name or "reward model")
        self.model = model.eval()  # scored in inference mode: no gradient, whatever its parameters ask
        self.tokenizer = tokenizer
        model.config.get_text_config().pad_token_id = tokenizer.pad_token_id  # how the model finds the last token
        self.chat_template_kwargs = chat_template_kwargs or {}
        self.__name__ = name or _model_name(model)  # TRL's: the model id's last part, e.g. rewards/rm/mean
        self.warned_nan = False

    @property
    def name_or_path(self) -> str:
        """Where the model came from (config.yaml names the reward function by it: rewards.reward_func_name)."""
        return str(getattr(self.model, "name_or_path", "") or "")

    def to(self, device) -> "RewardModel":
        """The model on `device` (the run's), unless its weights were placed while loading (4-bit)."""
        if not getattr(self.model, "is_loaded_in_4bit", False):
            self.model.to(device)
        return self

    def texts(self, prompts: list, completions: list) -> list[str]:
        return reward_texts(self.tokenizer, prompts, completions, self.chat_template_kwargs)

    @torch.inference_mode()  # as TRL: no autograd bookkeeping at all (the scores leave as floats)
    def score(self, texts: list[str], prompts: list | None = None) -> torch.Tensor:
        """(N,) float32 scores of whole texts, on the CPU. prompts: the prompt of each text (rows with the same
        prompt compute the tokens they share once, see shared_prefix_lengths)."""
        ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        prefix_lengths = None if prompts is None else shared_prefix_lengths(ids, prompts)
        return sequence_scores(self.model, self.tokenizer, ids, prefix_lengths=prefix_lengths).float().cpu()

    def __call__(self, prompts, completions, **row) -> list[float]:
        scores = self.score(self.texts(prompts, completions), prompts)
        if not self.warned_nan and scores.isnan().any():
            self.warned_nan = True
            warnings.warn(f"reward model {self.__name__!r} scored {int(scores.isnan().sum())} of {len(scores)} "
                          f"completions NaN: each is unscorable (advantage 0, counted in frac_reward_nan)",
                          stacklevel=2)
        return scores.tolist()


class RewardEnsemble:
    """Several learned rewards as one reward function: for each completion the minimum (or the mean) of their scores.
    The minimum is a conservative reward: the policy must fool every member at once to gain (Coste et al. 2023,
    "Reward Model Ensembles Help Mitigate Overoptimization"). Members: RewardModels (or any reward functions)."""

    learned = True

    def __init__(self, members: list, reduce: str = "min", name: str = "ensemble"):
        if reduce not in ("min", "mean") or not members:
            raise RewardError(f"{name}: reduce must be 'min' or 'mean', over at least one member")
        self.members, self.reduce, self.__name__ = members, reduce, name

    def to(self, device) -> "RewardEnsemble":
        for member in self.members:
            if hasattr(member, "to"):
                member.to(device)
        return self

    def __call__(self, prompts, completions, **row) -> list[float]:
        scores = torch.tensor([member(prompts, completions, **row) for member in self.members])  # (K, N)
        return (scores.amin(0) if self.reduce == "min" else scores.mean(0)).tolist()


def reward_texts(tokenizer, prompts: list, completions: list, chat_template_kwargs: dict | None = None) -> list[str]:
    """What a reward model reads (TRL's): prompt + completion, or the conversation through the chat template."""
    if not is_conversational(prompts[0]):
        return [p + c for p, c in zip(prompts, completions, strict=True)]
    return [tokenizer.apply_chat_template(p + c, tokenize=False, **(chat_template_kwargs or {}))
            for p, c in zip(prompts, completions, strict=True)]


def sequence_scores(model, tokenizer, ids: list[list[int]], *, prefix_lengths: list[int] | None = None) -> torch.Tensor:
    """(N,) the model's score of each token sequence (its logits[:, 0]), with the gradient when one is being taken:
    rows of similar length go through together, each chunk right-padded to its own longest (see the docstring).
    prefix_lengths: row i's first prefix_lengths[i] tokens are the same as those of the other rows of its group
    (shared_prefix_lengths); where the model allows it, each distinct prefix then runs once (shared_prefix_scores)."""
    if prefix_lengths is not None and _can_share_prefixes(model):
        scores = shared_prefix_scores(model, tokenizer.pad_token_id, ids, prefix_lengths)
        if scores is not None:
            return scores
    device = next(model.parameters()).device
    by_length = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    chunks = []  # length_chunks' search is quadratic in the rows: run it on blocks of 256 rows sorted by length
    for start in range(0, len(ids), 256):
        block = by_length[start:start + 256]
        chunks += [[block[j] for j in rows] for rows in length_chunks([0] * len(block), [len(ids[i]) for i in block])]
    pad = lambda rows: tokenizer.pad({"input_ids": [ids[i] for i in rows]}, padding_side="right",  # noqa: E731
                                     return_tensors="pt").to(device)
    scores = torch.cat([model(**pad(rows)).logits[:, 0] for rows in chunks])  # (N,) chunk by chunk
    order = torch.tensor([i for rows in chunks for i in rows], device=scores.device)
    return scores[order.argsort()]  # back in the rows' order


def shared_prefix_lengths(ids: list[list[int]], prompts: list) -> list[int]:
    """For each row, the number of leading tokens it shares with every other row of the same prompt (the G
    completions of a group begin with the same prompt tokens), at most its length minus one. Found on the token ids
    themselves, not by tokenizing the prompt alone: a tokenizer may merge the prompt's last characters with the
    completion's first ones."""
    groups = {}
    for i, prompt in enumerate(prompts):
        groups.setdefault(repr(prompt), []).append(i)  # repr: a conversational prompt is a list of dicts
    lengths = [0] * len(ids)
    for rows in groups.values():
        first, shared = ids[rows[0]], max(min(len(ids[i]) for i in rows) - 1, 0)
        for i in rows[1:]:
            shared = next((k for k, (a, b) in enumerate(zip(first[:shared], ids[i])) if a != b), shared)
        for i in rows:
            lengths[i] = shared
    return lengths


def shared_prefix_scores(model, pad_token_id: int, ids: list[list[int]], prefix_lengths: list[int]):
    """(N,) the same scores as model(ids padded right).logits[:, 0], each distinct prefix computed once.

    The model's score of a row is score(h[last]): its head applied to the final hidden state of the row's last
    token that is not the pad token (transformers' ...ForSequenceClassification; TRL pads right with that token).
    A causal model's h[last] depends on the tokens up to `last` only, so each row is cut there and split into its
    prefix, run once per distinct prefix, and the rest, run on the prefix's keys and values
    (logprobs.completion_hidden_states, the policy's own shared-prompt forward). That function returns the state
    that predicts each token of the rest, the one before it; so one placeholder token is appended to each row, and
    the state that predicts it is h[last]. Padding costs no compute: rows run in length groups, as there.
    None where a row has no prefix to share (one real token): the padded path scores such a batch."""
    decoder, device = getattr(model, model.base_model_prefix), next(model.parameters()).device
    ends = [max((k for k, token in enumerate(row) if token != pad_token_id), default=0) + 1 for row in ids]
    prefixes = [row[:min(p, end - 1)] for row, p, end in zip(ids, prefix_lengths, ends)]
    if not all(prefixes):  # an empty prefix would be a prompt row with no token to attend to
        return None
    rests = [row[len(prefix):end] + [pad_token_id] for row, prefix, end in zip(ids, prefixes, ends)]  # + placeholder
    prompt_ids, prompt_mask = (x.to(device) for x in left_pad(prefixes, pad_token_id))  # (N, P) each
    rest_ids, rest_mask = (x.to(device) for x in right_pad(rests, pad_token_id))  # (N, T) each
    hidden = completion_hidden_states(decoder, model.config, prompt_ids, prompt_mask, rest_ids, rest_mask)  # (N, T, H)
    last = torch.tensor([len(x) - 1 for x in rests], device=device)  # the placeholder's index: h[last] predicts it
    return model.score(hidden[torch.arange(len(ids), device=device), last])[:, 0]  # (N,)


def _can_share_prefixes(model) -> bool:
    """A plain transformers sequence classifier (a decoder, then a linear `score` on the last non-pad state), not
    one wrapped by peft, say: those take the padded path, which needs nothing of their inner layout."""
    from transformers.modeling_layers import GenericForSequenceClassification

    return isinstance(model, GenericForSequenceClassification) and type(model.score) is torch.nn.Linear


def is_reward_model(entry) -> bool:
    """True for what `load_reward_model` takes: a loaded torch module, or a string that names a directory (or a hub
    id, with a "/") rather than a built-in reward ("correctness", ...) or your own ("module:function")."""
    if isinstance(entry, torch.nn.Module):
        return True
    if not isinstance(entry, (str, os.PathLike)):
        return False
    name = str(entry)
    return Path(name).expanduser().is_dir() or ("/" in name and ":" not in name and not name.endswith(".py"))


def load_reward_model(entry, device: str | torch.device = "cpu", *, tokenizer=None,
                      chat_template_kwargs: dict | None = None):
    """A RewardModel from a directory saved with save_pretrained (a hub id where the hub is reachable) or from a
    loaded model (its tokenizer loaded from the model's name_or_path unless given, as TRL does). Loaded as TRL
    loads it, AutoModelForSequenceClassification in the dtype it was saved in, then placed on `device`. A directory
    holding process_reward_model.json (a PRM `minigrpo reward-model --loss step_labels` saved) gives its
    ProcessRewardModel instead (process.load_process_reward_model): step rewards, for advantage_estimator process."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    if isinstance(entry, torch.nn.Module):
        model, source = entry, getattr(entry.config, "_name_or_path", None)
    elif (Path(str(entry)).expanduser() / PRM_SETTINGS).is_file():  # a process reward model minigrpo trained
        return load_process_reward_model(Path(str(entry)).expanduser(), device)
    else:
        source = _checked_directory(str(entry))
        try:
            model = AutoModelForSequenceClassification.from_pretrained(source, dtype="auto")
        except OSError as exc:  # a hub id that is not there, or no hub
            raise RewardError(f"reward_funcs: could not load {source!r}: not a local directory and not fetchable "
                              f"from the hub") from exc
    if tokenizer is None:
        if not source:
            raise RewardError("reward_funcs: a loaded reward model without a name_or_path needs its tokenizer: "
                              "pass RewardModel(model, tokenizer)")
        tokenizer = AutoTokenizer.from_pretrained(source)
    return RewardModel(model.to(device), tokenizer, chat_template_kwargs=chat_template_kwargs)


def check_reward_model(model, tokenizer, name: str) -> None:
    """One-line RewardErrors for what cannot score: not a sequence classifier, not one output, no pad token."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft model: the model it wraps
    kind = type(base).__name__
    if not kind.endswith("ForSequenceClassification"):
        raise RewardError(f"reward_funcs: {name} is a {kind}, not a sequence-classification model (a reward model "
                          f"is an AutoModelForSequenceClassification with num_labels=1; `minigrpo reward-model` "
                          f"trains one)")
    if base.config.num_labels != 1:
        raise RewardError(f"reward_funcs: {name} has num_labels={base.config.num_labels}; a reward model outputs one "
                          f"score (num_labels=1)")
    if tokenizer.pad_token_id is None:
        raise RewardError(f"reward_funcs: the tokenizer of {name} has no pad token, so the model cannot find each "
                          f"text's last token in a padded batch; set one (tokenizer.pad_token = tokenizer.eos_token, "
                          f"as TRL does) and save it with the model")


def _checked_directory(name: str) -> str:
    """The reward model's directory, checked before transformers sees it (its own errors are tracebacks)."""
    path = Path(name).expanduser()
    if not path.exists() and (name.startswith((".", "/", "~")) or name.count("/") != 1):
        raise RewardError(f"reward_funcs: {name} is neither a built-in reward, a directory nor a hub id")
    if not path.exists():
        return name  # a hub id, e.g. OpenAssistant/reward-model-deberta-v3-large
    config = path / "config.json"
    if not config.is_file():
        raise RewardError(f"reward_funcs: {name} holds no config.json, so it is not a model directory")
    architectures = json.loads(config.read_text()).get("architectures") or ["(no architectures in config.json)"]
    if not any(a.endswith("ForSequenceClassification") for a in architectures):
        raise RewardError(f"reward_funcs: {name} is a {architectures[0]}, not a sequence-classification model (a "
                          f"reward model is an AutoModelForSequenceClassification with num_labels=1, a process reward "
                          f"model a token classifier with {PRM_SETTINGS}; `minigrpo reward-model` trains either)")
    return str(path)


def _model_name(model) -> str:
    return str(getattr(model.config, "_name_or_path", "") or type(model).__name__).rstrip("/").split("/")[-1]
