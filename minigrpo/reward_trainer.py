"""Training a reward model: from a policy's samples labelled by a checker, or from preference pairs in TRL's format.

    rows     TRL's preference rows (Bradley–Terry), labelled completions (BCE) or         preference/pairs.py
             step-labelled ones (a process reward model: TRL's former PRMTrainer's rows)
             or made here: the policy samples the task's prompts, the task's checker     sample_labelled,
             labels each completion (or each step), right is paired with wrong per prompt  labelled_pairs
    model    the policy's body (default: the task's warm start) under a scalar head (a     run.load_policy
             two-class head on every token for a PRM), all weights, LoRA or QLoRA
    loop     epochs of shuffled mini-batches: scores with the gradient, the objective's     REWARD_OBJECTIVES,
             loss, AdamW with the Config's schedule, the gradient clipped                  preference/bradley_terry.py
    judge    held-out pairwise accuracy and AUC                                            evaluate_reward_model
    save     output_dir: the model and its tokenizer, which AutoModelForSequenceClassification and TRL load
             unchanged (LoRA: merged into the weights, the adapter beside it in adapter/); metrics.jsonl, summary.json

    minigrpo reward-model --out runs/rm --loss bce --learning-rate 1e-3      # sampled from the warm start
    minigrpo train --reward-funcs runs/rm,correctness --reward-weights 1,0    # GRPO on it, the checker watched
    minigrpo reward-model --out runs/prm --loss step_labels --step-separator , # a PRM on the step checker's labels

What it simplifies: one process, no checkpoints. Texts are tokenized as the GRPO trainer will score them (prompt +
completion, no special tokens added; reward_models/), not as TRL's RewardTrainer does (it appends eos and adds the
tokenizer's special tokens, while TRL's GRPOTrainer scores without them): a reward model is trained on what it reads.

A data format is an entry of REWARD_OBJECTIVES: how a row becomes the texts it scores and its targets, how a batch
of token ids becomes scores, and the loss on them. "step_labels" is a process reward model's (Math-Shepherd, TRL's
former PRMTrainer): rows {"prompt", "completions": [step, ...], "labels": [bool, ...]}, each step followed by the
score token `step_separator`, the labels at those tokens (-100 elsewhere), cross-entropy of a two-class token head
(preference/step_labels.py). The token ids are reward_models.process.prm_ids' (the steps fenced as plain text), so the
saved model drops into ProcessRewardModel (same score token, same chat template or none) and scores what it was
trained on.
"""

import dataclasses
import json
import math
import random
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import Config, ConfigError, FlagsConfig
from .generation.engines import GenerateEngine
from .loading.models import is_lora, is_quantized, load_model, load_model_and_tokenizer, peft_wrapping, resolve_device
from .metrics import json_line
from .parallel import processes
from .persistence.run_log import write_config
from .preference import (bradley_terry_loss, pair_right_with_wrong, pointwise_bce_loss, preference_pair, roc_auc,
                         step_label_loss)
from .preference.step_labels import IGNORE_INDEX
from .reward_models.process import ProcessRewardModel, prm_ids, save_prm_settings, score_token_id
from .prompts import completions_for_rewards
from .reward_models.outcome import RewardModel, reward_texts, sequence_scores
from .run import claim_output_dir, load_policy, make_optimizer, policy_path, refuse_unsupported
from .step_rewards import StepRewards
from .tasks import get_task
from .tasks.sources import read_dataset

__all__ = ["RewardConfig", "RewardObjective", "REWARD_OBJECTIVES", "train_reward_model", "sample_labelled",
           "labelled_pairs", "evaluate_reward_model", "save_reward_model", "epoch_batches", "sample_step_labelled",
           "step_labelled_row", "evaluate_process_reward_model"]


# The Config keys train_reward_model reads (its docstring says what for; RewardConfig's fields are its own). Every other
# key is a GRPO setting it would silently ignore: `minigrpo reward-model` refuses those flags (tests/test_reward_trainer.py
# checks this list against the keys a run reads).
CONFIG_KEYS = frozenset({
    "model_name_or_path", "task", "dataset_name", "dataset_config", "dataset_train_split", "dataset_test_split",
    "use_peft", "load_in_4bit", "bnb_4bit_quant_type", "use_bnb_nested_quant", "lora_r", "lora_alpha", "lora_dropout",
    "lora_target_modules", "dtype", "gradient_checkpointing", "seed", "learning_rate", "lr_scheduler_type",
    "warmup_steps", "adam_beta1", "adam_beta2", "weight_decay", "max_grad_norm", "eval_steps", "output_dir",
    "overwrite_output_dir", "device", "chat_template_kwargs",
    "num_generations", "temperature", "max_completion_length",  # the policy's samples, without rows or a dataset
})


@dataclass
class RewardConfig(FlagsConfig):
    """What training a reward model adds to the run's Config, with TRL's RewardConfig names where it has them."""

    # minigrpo: "bradley_terry" on preference pairs, "bce" on labelled completions, "step_labels" on step-labelled
    # ones (a process reward model, a two-class head on every token)
    loss: str = "bradley_terry"
    # TRL's PRMConfig: the token written after each step, where its label sits and its score is read ("step_labels"
    # only; one token of the tokenizer; "<extra_0>" is Qwen2.5-Math-PRM's, "," suits think_addition's scratchpad)
    step_separator: str = "<extra_0>"
    center_rewards_coefficient: float | None = None  # TRL: + c * mean (r_c + r_r)^2 (Bradley–Terry only)
    num_train_epochs: float = 1.0  # passes over the training rows (TRL's default is 3)
    per_device_train_batch_size: int = 64  # pairs (or labelled completions) per optimizer step (TRL's: 8)
    max_length: int | None = 1024  # TRL: rows whose text (prompt + completion) is longer are dropped
    # minigrpo, without a dataset: the policy's samples of this many of the task's train prompts (num_generations
    # each, at the Config's temperature), labelled by the task's checker
    num_prompts: int = 250
    eval_num_prompts: int = 100  # minigrpo, without a dataset: test prompts sampled so, for held-out AUC and accuracy

    def __post_init__(self):
        if self.loss not in REWARD_OBJECTIVES:
            raise ConfigError(f"loss: {self.loss!r} is not one of {', '.join(REWARD_OBJECTIVES)}")
        if not self.step_separator:
            raise ConfigError("step_separator: must be a token, got an empty string")
        if self.center_rewards_coefficient is not None and self.loss != "bradley_terry":
            raise ConfigError("center_rewards_coefficient: a Bradley–Terry term; the bce loss fixes the scale itself")
        for key in ("num_train_epochs", "per_device_train_batch_size", "num_prompts", "eval_num_prompts"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"{key}: must be > 0, got {getattr(self, key)!r}")


# ---------------------------------------------------------------------------------------------------------
# Data formats: how a row trains
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RewardObjective:
    """One data format: `examples(row)` -> {"prompts": [...], "completions": [...], **targets} (the texts it scores,
    in order), `encode(tokenizer, example, reward_cfg, chat_template_kwargs)` -> the token ids of its texts,
    `scores(model, tokenizer, ids)` -> the scores of a batch's texts, `loss(scores, examples, reward_cfg)`
    -> (loss, stats); `head` the model's: "sequence" (one score per text) or "token" (two logits per token)."""

    examples: Callable[[dict], dict]
    loss: Callable
    scores: Callable = sequence_scores
    encode: Callable | None = None  # None: the texts as reward_models/outcome.py reads them
    head: str = "sequence"


def _pair_example(row: dict) -> dict:
    pair = preference_pair(row)
    return {"prompts": [pair["prompt"]] * 2, "completions": [pair["chosen"], pair["rejected"]],
            "margin": pair["margin"]}


def _pair_loss(scores: torch.Tensor, examples: list[dict], reward_cfg: RewardConfig):
    margins = [e["margin"] for e in examples]
    margin = None if all(m is None for m in margins) else torch.tensor([m or 0.0 for m in margins]).to(scores)
    return bradley_terry_loss(scores[0::2], scores[1::2], margin, reward_cfg.center_rewards_coefficient)


def _labelled_example(row: dict) -> dict:
    if "label" not in row or "completion" not in row:
        raise ConfigError(f"loss: bce trains on labelled rows {{'prompt', 'completion', 'label'}}; got the keys "
                          f"{sorted(row)}")
    return {"prompts": [row["prompt"]], "completions": [row["completion"]], "label": float(row["label"])}


def _labelled_loss(scores: torch.Tensor, examples: list[dict], reward_cfg: RewardConfig):
    return pointwise_bce_loss(scores, torch.tensor([e["label"] for e in examples]).to(scores))


def _step_example(row: dict) -> dict:
    """TRL's former PRMTrainer's row: {"prompt", "completions": [step, ...], "labels": [bool, ...]}."""
    if not {"prompt", "completions", "labels"} <= set(row):
        raise ConfigError(f"loss: step_labels trains on step-labelled rows {{'prompt', 'completions', 'labels'}}; got "
                          f"the keys {sorted(row)}")
    steps, labels = row["completions"], row["labels"]
    if not isinstance(steps, list) or not isinstance(labels, list) or len(steps) != len(labels) or not steps:
        raise ConfigError(f"loss: step_labels needs one label per step, at least one step; got "
                          f"{len(steps) if isinstance(steps, list) else steps!r} steps and "
                          f"{len(labels) if isinstance(labels, list) else labels!r} labels")
    return {"prompts": [row["prompt"]], "completions": [list(map(str, steps))],
            "labels": [int(bool(x)) for x in labels]}


def _step_encode(tokenizer, example: dict, reward_cfg: "RewardConfig", chat_template_kwargs=None) -> list[list[int]]:
    """The PRM's token ids (reward_models.process.prm_ids: the prompt, each step as plain text followed by the score
    token), and example["token_labels"]: each step's label at its score token, IGNORE_INDEX everywhere else."""
    try:
        score_id = score_token_id(tokenizer, reward_cfg.step_separator)
    except ValueError as exc:
        raise ConfigError(f"step_separator: {exc}") from None
    (prompt,), (steps,), labels = example["prompts"], example["completions"], example["labels"]
    try:
        ids = prm_ids(tokenizer, prompt, steps, reward_cfg.step_separator)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    positions = [t for t, i in enumerate(ids) if i == score_id][-len(steps):]  # the last ones: the steps' own
    if len(positions) != len(steps):
        raise ConfigError(f"step_separator: {len(positions)} score tokens found for {len(steps)} steps (the tokenizer "
                          f"merges {reward_cfg.step_separator!r} with the text beside it)")
    token_labels = [IGNORE_INDEX] * len(ids)
    for position, label in zip(positions, labels):
        token_labels[position] = label
    example["token_labels"] = [token_labels]
    return [ids]


def token_logits(model, tokenizer, ids: list[list[int]]) -> torch.Tensor:
    """(N, L, 2) the token classifier's logits of each sequence, right-padded to the longest, with the gradient."""
    device = next(model.parameters()).device
    batch = tokenizer.pad({"input_ids": ids}, padding_side="right", return_tensors="pt").to(device)
    return model(**batch).logits


def _step_loss(logits: torch.Tensor, examples: list[dict], reward_cfg: RewardConfig):
    width = logits.shape[1]
    labels = torch.tensor([row + [IGNORE_INDEX] * (width - len(row)) for e in examples for row in e["token_labels"]],
                          device=logits.device)  # (N, L)
    return step_label_loss(logits, labels)


REWARD_OBJECTIVES = {
    "bradley_terry": RewardObjective(_pair_example, _pair_loss),
    "bce": RewardObjective(_labelled_example, _labelled_loss),
    "step_labels": RewardObjective(_step_example, _step_loss, token_logits, _step_encode, head="token"),
}


def encode_examples(objective: RewardObjective, tokenizer, rows: list[dict], max_length: int | None,
                    chat_template_kwargs: dict | None = None, reward_cfg: "RewardConfig | None" = None) -> list[dict]:
    """Each row as its objective's example with "ids", the token ids of its texts as reward_models/outcome.py reads them
    (a PRM: as ProcessRewardModel reads them); rows with a text longer than max_length dropped (TRL)."""
    examples = []
    for row in rows:
        example = objective.examples(row)
        if objective.encode is not None:
            example["ids"] = objective.encode(tokenizer, example, reward_cfg or RewardConfig(), chat_template_kwargs)
        else:
            texts = reward_texts(tokenizer, example["prompts"], example["completions"], chat_template_kwargs)
            example["ids"] = tokenizer(texts, add_special_tokens=False)["input_ids"]
        if max_length is None or max(map(len, example["ids"])) <= max_length:
            examples.append(example)
    return examples


# ---------------------------------------------------------------------------------------------------------
# Rows from a policy and a checker
# ---------------------------------------------------------------------------------------------------------
def sample_labelled(model, tokenizer, task, rows: list[dict], *, num_generations: int, max_completion_length: int,
                    temperature: float = 1.0, chat_template_kwargs: dict | None = None,
                    prompts_per_call: int = 64) -> list[dict]:
    """num_generations completions of each row's prompt from `model`, each labelled by the task's checker:
    [{"prompt", "completion", "label"}] (TRL's unpaired preference rows), grouped by prompt."""
    engine = GenerateEngine(model, tokenizer, chat_template_kwargs)
    labelled = []
    for start in range(0, len(rows), prompts_per_call):
        part = rows[start:start + prompts_per_call]
        roll = engine.generate([r["prompt"] for r in part], num_generations=num_generations,
                               max_completion_length=max_completion_length, temperature=temperature)
        repeated = [r for r in part for _ in range(num_generations)]
        completions = completions_for_rewards([r["prompt"] for r in repeated], roll.completions)
        labelled += [{"prompt": r["prompt"], "completion": c, "label": bool(task.grade(c, r))}
                     for r, c in zip(repeated, completions, strict=True)]
    return labelled


def step_labelled_row(prompt, completion: str, steps: StepRewards) -> dict:
    """A step checker's verdict on one completion as a PRM's training row (TRL's former PRMTrainer's format):
    {"prompt", "completions": the steps' text, completion[ends[k-1]:ends[k]], "labels": reward >= 1/2 for each}.

        step_labelled_row("471+586=", "<think>1+6=7,7+8=14,4+5+1=10</think>1047", scratchpad_steps(..., False))
        -> {"completions": ["<think>1+6=7,", "7+8=14,", "4+5+1=10</think>", "1047"],
            "labels": [True, False, True, False], ...}"""
    starts = [0, *steps.ends[:-1]]
    return {"prompt": prompt, "completions": [completion[a:b] for a, b in zip(starts, steps.ends)],
            "labels": [float(r) >= 0.5 for r in steps.rewards]}


def sample_step_labelled(model, tokenizer, task, rows: list[dict], *, checker: Callable, num_generations: int,
                         max_completion_length: int, temperature: float = 1.0,
                         chat_template_kwargs: dict | None = None) -> list[dict]:
    """num_generations completions of each row's prompt from `model`, each cut into steps and each step labelled by
    `checker(prompt, completion) -> StepRewards` (Math-Shepherd's labels, from a rule instead of rollouts):
    [{"prompt", "completions", "labels"}] (step_labelled_row). A completion the checker cannot grade is left out.
    For think_addition, checker = scratchpad_steps(..., grade_missing=False): its steps are scratchpad_split's,
    the cut ProcessRewardModel(split=scratchpad_split) scores."""
    labelled = sample_labelled(model, tokenizer, task, rows, num_generations=num_generations, temperature=temperature,
                               max_completion_length=max_completion_length, chat_template_kwargs=chat_template_kwargs)
    out = []
    for row in labelled:
        steps = checker(row["prompt"], row["completion"])
        if steps is not None and len(steps):
            out.append(step_labelled_row(row["prompt"], row["completion"], steps))
    return out


def task_step_checker(task) -> Callable:
    """The checker whose labels a PRM of `task` learns: think_addition's scratchpad checker, the written steps
    and the answer (scratchpad_split's cut, which a PRM can score: a column not written has no text to score)."""
    from .tasks.think_addition import ThinkAdditionTask, scratchpad_steps

    if not isinstance(task, ThinkAdditionTask):
        raise ConfigError(f"loss: step_labels from the policy's samples needs a step checker; task {task.name!r} has "
                          f"none (give step-labelled rows with --dataset)")
    return lambda prompt, completion: scratchpad_steps(prompt, completion, grade_missing=False)


def prm_split(cfg: Config) -> str | None:
    """The name (reward_models.process.step_splits) of the cut a PRM trained on the task's own samples scores the
    policy's text with: think_addition's scratchpad; None (cut on the separator) for rows from a dataset."""
    return "think_addition" if not cfg.dataset_name and cfg.task == "think_addition" else None


def labelled_pairs(labelled: list[dict], seed: int = 0) -> list[dict]:
    """Preference rows from labelled ones: per prompt, right paired with wrong (preference.pair_right_with_wrong)."""
    by_prompt = defaultdict(list)
    for row in labelled:
        by_prompt[json.dumps(row["prompt"])].append(row)
    rng, pairs = random.Random(seed), []
    for group in by_prompt.values():
        pairs += pair_right_with_wrong(group[0]["prompt"], [r["completion"] for r in group],
                                       [bool(r["label"]) for r in group], rng)
    return pairs


# ---------------------------------------------------------------------------------------------------------
# Judging it
# ---------------------------------------------------------------------------------------------------------
def evaluate_reward_model(reward_model: RewardModel, rows: list[dict]) -> dict:
    """Held-out quality. Preference rows: pairwise accuracy (chosen scored higher) and the AUC of chosen against
    rejected scores. Labelled rows: the AUC of right against wrong, the accuracy of sigmoid(r) > 1/2 (meaningful
    for a BCE-trained model), and pairwise accuracy over every right-wrong pair of the same prompt."""
    if "chosen" in rows[0]:
        pairs = [preference_pair(r) for r in rows]
        chosen = torch.tensor(reward_model([p["prompt"] for p in pairs], [p["chosen"] for p in pairs]))
        rejected = torch.tensor(reward_model([p["prompt"] for p in pairs], [p["rejected"] for p in pairs]))
        labels = torch.cat([torch.ones(len(pairs)), torch.zeros(len(pairs))])
        return {"pairwise_accuracy": (chosen > rejected).float().mean().item(), "num_pairs": len(pairs),
                "auc": roc_auc(torch.cat([chosen, rejected]), labels)}
    scores = torch.tensor(reward_model([r["prompt"] for r in rows], [r["completion"] for r in rows]))
    labels = torch.tensor([bool(r["label"]) for r in rows])
    by_prompt = defaultdict(list)
    for i, row in enumerate(rows):
        by_prompt[json.dumps(row["prompt"])].append(i)
    wins = [(scores[i] > scores[j]).item() for group in by_prompt.values() for i in group for j in group
            if labels[i] and not labels[j]]
    return {"auc": roc_auc(scores, labels), "accuracy": ((scores > 0) == labels).float().mean().item(),
            "pairwise_accuracy": sum(wins) / len(wins) if wins else math.nan, "num_pairs": len(wins),
            "num_completions": len(rows)}


def evaluate_process_reward_model(prm: ProcessRewardModel, rows: list[dict]) -> dict:
    """Held-out quality of a PRM on step-labelled rows: the AUC of right steps against wrong ones, the step accuracy
    of P(right) > 1/2, and the mean P(right) of right and of wrong steps."""
    scores = prm.step_probabilities([prm.prm_ids(r["prompt"], r["completions"]) for r in rows])
    p = torch.tensor([q for r, s in zip(rows, scores) for q in s[-len(r["completions"]):]])
    labels = torch.tensor([bool(x) for r in rows for x in r["labels"]])
    return {"auc": roc_auc(p, labels), "step_accuracy": ((p > 0.5) == labels).float().mean().item(),
            "p_right_of_right_steps": p[labels].mean().item() if labels.any() else math.nan,
            "p_right_of_wrong_steps": p[~labels].mean().item() if (~labels).any() else math.nan,
            "num_steps": len(labels)}


# ---------------------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------------------
def train_reward_model(cfg: Config, reward_cfg: RewardConfig | None = None, *, train_rows: list[dict] | None = None,
                       eval_rows: list[dict] | None = None, progress: bool = True) -> dict:
    """Train a reward model and save it into cfg.output_dir; returns the summary (also summary.json).

    From the Config: model_name_or_path (the body to start from; default the task's shipped warm start), task,
    dataset_name (TRL-format rows: preference pairs for bradley_terry, labelled completions for bce, step-labelled
    completions for step_labels; its test split judges), use_peft / load_in_4bit / lora_* / dtype, seed,
    learning_rate and its schedule, AdamW's settings, max_grad_norm, eval_steps, output_dir, device; without rows or
    a dataset, num_generations, temperature and max_completion_length for the policy's samples (`load_rows`). train_rows, eval_rows: the rows themselves.
    """
    reward_cfg = reward_cfg or RewardConfig()
    if processes.launched_processes() > 1:
        raise ConfigError("train_reward_model: one process only")
    refuse_unsupported(cfg, "train_reward_model")  # what the loop would otherwise silently ignore
    out = claim_output_dir(cfg)  # before any work: another run's results there are refused (or overwrite_output_dir)
    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    if train_rows is None:
        train_rows, eval_rows = load_rows(cfg, reward_cfg, device)
    objective = REWARD_OBJECTIVES[reward_cfg.loss]
    per_token = objective.head == "token"
    num_labels = 2 if per_token else 1  # a PRM's two classes per token, a reward model's one score per text
    model, tokenizer = load_policy(cfg, policy_path(cfg, get_task(cfg.task)), device, num_labels=num_labels,
                                   per_token=per_token)
    model.config.get_text_config().pad_token_id = tokenizer.pad_token_id  # where the model finds the last token
    examples = encode_examples(objective, tokenizer, train_rows, reward_cfg.max_length, cfg.chat_template_kwargs,
                               reward_cfg)
    if not examples:
        raise ConfigError("train_reward_model: no training rows (none given, or all longer than max_length)")
    batch_size = reward_cfg.per_device_train_batch_size
    num_steps = max(1, round(math.ceil(len(examples) / batch_size) * reward_cfg.num_train_epochs))
    optimizer, scheduler = make_optimizer(dataclasses.replace(cfg, max_steps=num_steps),
                                          [p for p in model.parameters() if p.requires_grad])
    if per_token:  # read back exactly as GRPO will read it
        judge = lambda: evaluate_process_reward_model(  # noqa: E731
            ProcessRewardModel(model, tokenizer, score_token=reward_cfg.step_separator), eval_rows)
    else:
        judge = lambda: evaluate_reward_model(RewardModel(model, tokenizer, name="rm"), eval_rows)  # noqa: E731
    write_config(out, cfg.to_dict(), algorithm="reward_model", reward=reward_cfg.to_dict())
    (out / "metrics.jsonl").write_text("")
    log, t_start = [], time.perf_counter()
    for step, rows in enumerate(epoch_batches(len(examples), batch_size, num_steps, cfg.seed), start=1):
        t0, batch = time.perf_counter(), [examples[i] for i in rows]
        model.train()
        scores = objective.scores(model, tokenizer, [ids for e in batch for ids in e["ids"]])
        loss, stats = objective.loss(scores.float(), batch, reward_cfg)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm).item()
        optimizer.step()
        row = {"step": step, "epoch": step * batch_size / len(examples), "loss": loss.item(), **stats,
               "grad_norm": grad_norm, "learning_rate": scheduler.get_last_lr()[0],
               "step_seconds": time.perf_counter() - t0}
        scheduler.step()
        if eval_rows and cfg.eval_steps and (step % cfg.eval_steps == 0 or step == num_steps):
            row.update({f"eval/{k}": v for k, v in judge().items()})
        log.append(row)
        _log_line(out, row, progress)
    summary = {"loss": reward_cfg.loss, "train_rows": len(examples), "steps": num_steps,
               "wall_seconds": round(time.perf_counter() - t_start, 2), "eval": judge() if eval_rows else None,
               "output_dir": str(out)}
    save_reward_model(model, tokenizer, out, base=policy_path(cfg, get_task(cfg.task)), dtype=cfg.dtype,
                      num_labels=num_labels, per_token=per_token)
    if per_token:  # how GRPO reads it back (--reward-funcs DIR): the score token, and the task's cut of its steps
        save_prm_settings(out, score_token=reward_cfg.step_separator, split=prm_split(cfg))
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def load_rows(cfg: Config, reward_cfg: RewardConfig, device) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows): cfg.dataset_name's splits, else the policy's labelled samples of the task's
    prompts (pairs for bradley_terry; step-labelled for step_labels; held out: labelled completions of test prompts)."""
    if cfg.dataset_name:
        return (read_dataset(cfg.dataset_name, cfg.dataset_train_split, cfg.dataset_config),
                read_dataset(cfg.dataset_name, cfg.dataset_test_split, cfg.dataset_config))
    task = get_task(cfg.task)
    if not task.graded:
        raise ConfigError(f"task: the {task.name} task has no answers to label the policy's samples with; give "
                          f"labelled rows in TRL's format with --dataset")
    model, tokenizer = load_model_and_tokenizer(policy_path(cfg, task), device, dtype=cfg.dtype)
    rng = random.Random(cfg.seed)
    steps = reward_cfg.loss == "step_labels"
    checker = task_step_checker(task) if steps else None

    def sample(split: str, num_prompts: int) -> list[dict]:
        rows = task.load(split)
        kwargs = dict(num_generations=cfg.num_generations, temperature=cfg.temperature,
                      max_completion_length=cfg.max_completion_length or task.max_completion_length,
                      chat_template_kwargs=cfg.chat_template_kwargs)
        rows = rng.sample(rows, min(num_prompts, len(rows)))
        return (sample_step_labelled(model, tokenizer, task, rows, checker=checker, **kwargs) if steps
                else sample_labelled(model, tokenizer, task, rows, **kwargs))

    train = sample(cfg.dataset_train_split, reward_cfg.num_prompts)
    held_out = sample(cfg.dataset_test_split, reward_cfg.eval_num_prompts)
    return (labelled_pairs(train, cfg.seed) if reward_cfg.loss == "bradley_terry" else train), held_out


def epoch_batches(num_rows: int, batch_size: int, num_steps: int, seed: int):
    """num_steps mini-batches of row indices: the rows shuffled each epoch (seeded), cut in batch_size pieces (a
    batch that would run past an epoch's end is completed from the next epoch's shuffle)."""
    rng, order = random.Random(seed), []
    for _ in range(num_steps):
        while len(order) < min(batch_size, num_rows) or not order:
            fresh = list(range(num_rows))
            rng.shuffle(fresh)
            order += fresh
        batch, order = order[:batch_size], order[batch_size:]
        yield batch


def _log_line(out: Path, row: dict, progress: bool) -> None:
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json_line(row))
    if progress and "eval/auc" in row:
        accuracy = ("step accuracy", row["eval/step_accuracy"]) if "eval/step_accuracy" in row else \
            ("pairwise accuracy", row["eval/pairwise_accuracy"])
        print(f"reward model step {row['step']:4d}  loss {row['loss']:.4f}  held-out AUC {row['eval/auc']:.3f}  "
              f"{accuracy[0]} {accuracy[1]:.3f}", flush=True)


def save_reward_model(model, tokenizer, out, *, base, dtype: str = "float32", num_labels: int = 1,
                      per_token: bool = False) -> None:
    """The reward model in `out` as AutoModelForSequenceClassification (and TRL) load it: its weights and config
    (pad_token_id set), its tokenizer (padding on the right, as it reads). LoRA: merged into the weights, the adapter
    kept in out/adapter; QLoRA: merged into the float base reloaded from `base` (a 4-bit weight cannot hold W + BA)."""
    tokenizer.padding_side = "right"
    if is_lora(model):
        from peft import PeftModel

        model.save_pretrained(out / "adapter")
        if is_quantized(model):
            with peft_wrapping():
                model = PeftModel.from_pretrained(load_model(base, "cpu", dtype=dtype, num_labels=num_labels,
                                                             per_token=per_token), out / "adapter")
        model = model.merge_and_unload()
        model.config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
