"""DPO, the offline contrast: the policy trained on fixed preference pairs, nothing sampled (preference/dpo.py).

    before      each pair's completions scored by the starting policy: log pi_ref(y_c | x), log pi_ref(y_r | x),
                once (TRL's precompute_ref_log_probs), so no second copy of the model is ever held
    each step   a mini-batch of pairs: log pi(y | x) summed over each completion's tokens (logprobs.py, the same
                forward GRPO trains with), the DPO loss on beta log pi / pi_ref, AdamW, the gradient clipped
    log, save   metrics.jsonl (loss, rewards/chosen, rewards/rejected, rewards/accuracies, rewards/margins, TRL's
                names), greedy held-out accuracy every eval_steps, then summary.json, plots/, model/ as GRPO's runs

A completion is its text's tokens followed by eos, as the policy writes it when it samples (GRPO trains on exactly
those ids), after its prompt encoded as GRPO encodes it (prompts.py: a chat template for conversational rows).
What it simplifies: one process, no checkpoints, pairs held in memory, the sigmoid loss only (TRL's default).
"""

import dataclasses
import json
import math
import time
from dataclasses import dataclass

import torch

from .config import Config, ConfigError
from .evaluate import evaluator
from .loading.models import resolve_device
from .logprobs import completion_logprobs
from .parallel import processes
from .persistence.run_log import write_config
from .preference import dpo_loss, preference_pair
from .prompts import encode_prompts, left_pad, right_pad
from .reward_trainer import epoch_batches
from .rewards import completion_text
from .run import finish_run, load_run, make_optimizer, refuse_unsupported

__all__ = ["DPOConfig", "train_dpo", "encode_pairs", "sequence_logprobs"]


@dataclass
class DPOConfig:
    """What DPO adds to the run's Config, with TRL's DPOConfig names."""

    beta: float = 0.1  # the implicit reward's scale, beta log pi / pi_ref (the KL's weight in the RLHF objective)
    num_train_epochs: float = 1.0  # passes over the pairs
    per_device_train_batch_size: int = 16  # pairs per optimizer step

    def __post_init__(self):
        for key in ("beta", "num_train_epochs", "per_device_train_batch_size"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"{key}: must be > 0, got {getattr(self, key)!r}")


def encode_pairs(tokenizer, pairs: list[dict], chat_template_kwargs: dict | None = None) -> list[dict]:
    """TRL preference rows -> {"prompt_ids", "chosen_ids", "rejected_ids"}: the prompt as GRPO encodes it, each
    completion's text tokens plus eos, as the policy samples them."""
    rows = [preference_pair(r) for r in pairs]
    prompt_ids = encode_prompts(tokenizer, [r["prompt"] for r in rows], chat_template_kwargs)
    completion = lambda c: tokenizer(completion_text(c), add_special_tokens=False)["input_ids"] + [  # noqa: E731
        tokenizer.eos_token_id]
    return [{"prompt_ids": p, "chosen_ids": completion(r["chosen"]), "rejected_ids": completion(r["rejected"])}
            for p, r in zip(prompt_ids, rows, strict=True)]


def sequence_logprobs(model, tokenizer, encoded: list[dict]) -> torch.Tensor:
    """(2P,) log pi(y | x) summed over each completion's tokens: the P chosen completions, then the P rejected."""
    device = next(model.parameters()).device
    prompts = [e["prompt_ids"] for e in encoded] * 2
    completions = [e["chosen_ids"] for e in encoded] + [e["rejected_ids"] for e in encoded]
    prompt_ids, prompt_mask = left_pad(prompts, tokenizer.pad_token_id)  # (2P, P_max)
    completion_ids, completion_mask = right_pad(completions, tokenizer.pad_token_id)  # (2P, T)
    logp, _ = completion_logprobs(model, prompt_ids.to(device), prompt_mask.to(device), completion_ids.to(device),
                                  completion_mask.to(device))  # (2P, T), 0 on padding
    return logp.sum(-1)


def train_dpo(cfg: Config, pairs: list[dict], dpo: DPOConfig | None = None, *, progress: bool = True) -> dict:
    """DPO from cfg's model (default: the task's warm start) on preference pairs in TRL's format; writes a run
    directory like GRPO's and returns its summary (greedy accuracy before and after on the task's test split).

    From the Config: task, model_name_or_path (use_peft / dtype), seed, learning_rate and its schedule, AdamW's
    settings, max_grad_norm, eval_steps / eval_num_problems / eval_limit, output_dir, save_model, device,
    chat_template_kwargs. Its own settings (beta, epochs, batch size) are DPOConfig's."""
    dpo = dpo or DPOConfig()
    if processes.launched_processes() > 1 or cfg.load_in_4bit:
        raise ConfigError("train_dpo: one process, full weights or LoRA")
    refuse_unsupported(cfg, "train_dpo")  # what the loop would otherwise silently ignore
    run = load_run(cfg, resolve_device(cfg.device))  # seeded: the task, the policy, the test rows, the output folder
    model, tokenizer = run.model, run.tokenizer
    encoded = encode_pairs(tokenizer, pairs, cfg.chat_template_kwargs)
    num_steps = max(1, round(math.ceil(len(encoded) / dpo.per_device_train_batch_size) * dpo.num_train_epochs))
    optimizer, scheduler = make_optimizer(dataclasses.replace(cfg, max_steps=num_steps),
                                          [p for p in model.parameters() if p.requires_grad])
    write_config(run.out, cfg.to_dict(), algorithm="dpo", dpo=dataclasses.asdict(dpo))
    evaluate_on = evaluator(model, tokenizer, run.task, run.max_completion_length, cfg.temperature,
                            cfg.chat_template_kwargs)
    model.eval()
    with torch.no_grad():  # the reference is the policy before its first update: scored once, never copied
        ref_logp = torch.cat([sequence_logprobs(model, tokenizer, encoded[i:i + 64]).view(2, -1)
                              for i in range(0, len(encoded), 64)], dim=1)  # (2, P): chosen, rejected
    before, wall_seconds = evaluate_on(run.test_rows), 0.0
    batches = epoch_batches(len(encoded), dpo.per_device_train_batch_size, num_steps, cfg.seed)
    with open(run.out / "metrics.jsonl", "w") as metrics_file:
        for step, rows in enumerate(batches, start=1):
            t0 = time.perf_counter()
            model.train()
            logp = sequence_logprobs(model, tokenizer, [encoded[i] for i in rows]).view(2, -1)  # (2, B)
            loss, stats = dpo_loss(logp[0], logp[1], ref_logp[0, rows], ref_logp[1, rows], beta=dpo.beta)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm).item()
            optimizer.step()
            row = {"step": step, "loss": loss.item(), **stats, "grad_norm": grad_norm,
                   "learning_rate": scheduler.get_last_lr()[0], "step_seconds": time.perf_counter() - t0}
            scheduler.step()
            wall_seconds += row["step_seconds"]
            if cfg.eval_steps and (step % cfg.eval_steps == 0 or step == num_steps):
                row["eval/accuracy_greedy"] = evaluate_on(run.test_rows[: cfg.eval_num_problems])["accuracy_greedy"]
                if progress:
                    print(f"dpo step {step:4d}  loss {row['loss']:.4f}  greedy accuracy "
                          f"{row['eval/accuracy_greedy']:6.1%}  {wall_seconds:6.1f} s", flush=True)
            metrics_file.write(json.dumps(row) + "\n")
    return finish_run(cfg, run.task, model, tokenizer, run.out, before=before, after=evaluate_on(run.test_rows),
                      num_test_problems=len(run.test_rows), wall_seconds=wall_seconds, device=run.device,
                      algorithm="dpo", loss_type="dpo", steps=num_steps, pairs=len(encoded))
