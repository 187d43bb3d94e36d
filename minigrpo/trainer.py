"""The GRPO training loop, top to bottom.

    for each step:
        sample    G completions for each of (generation_batch_size / G) prompts      rollout.py
        score     every completion with every reward function                          rewards.py, tasks/
        advantage group-relative (or RLOO), per completion                             advantages.py
        optimise  num_iterations x steps_per_generation mini-batches of the loss       objectives/
        log       one JSON line of metrics                                             metrics.jsonl
        save      every save_steps steps, a checkpoint to resume from exactly          checkpoint.py

What this loop simplifies, on purpose:
  * One device per process; several processes (`accelerate launch` / `torchrun`) split each batch by whole
    groups and average their gradients (distributed.py).
  * Generation with the policy itself (rollout.py's decode loop, via engines.py), or with a colocated vLLM
    engine (`use_vllm`, rollout_vllm.py, tested on the CPU) whose weights are synced after each batch's updates;
    its log-probs differ a little from the trainer's: logged, and corrected as TRL does (engine_mismatch.py).
  * The "old" policy is never a copy of the model: its log-probs are computed once per batch, and only
    when they can differ from the current policy's (num_iterations > 1 or several mini-batches). Otherwise
    old_logp = logp.detach() and the ratio is exactly 1 in value (its gradient is still the policy gradient).
  * The reference policy (beta > 0) is a frozen copy of the starting weights, made once; with LoRA it is the
    same model with its adapter switched off (models.py), so it costs no memory.
  * No gradient accumulation: each mini-batch is one optimizer step.
"""

import functools
import json
import math
import random
import time
import warnings
from statistics import fmean
from pathlib import Path

import torch
import yaml
from tqdm.auto import tqdm

from . import distributed
from .advantages import group_advantages, kl_penalized_rewards, rloo_advantages
from .checkpoint import (CheckpointError, latest_checkpoint, load_checkpoint, process_state, save_checkpoint,
                         truncate_metrics)
from .config import Config, ConfigError
from .engine_mismatch import importance_weights, mismatch_stats
from .engines import make_engine
from .evaluate import evaluate
from .logprobs import completion_logprobs
from .models import (is_quantized, load_policy, parameter_counts, peak_memory_bytes, reference_policy, resolve_device,
                     save_policy)
from .objectives import policy_loss
from .prompts import completions_for_rewards, encode_prompts
from .rewards import (RewardError, combine_rewards, load_reward_func, overlong_penalty, r1_format, r1_format_soft,
                      score_completions, shuffled)
from .tasks import Task, get_task

__all__ = ["train", "build_reward_funcs", "policy_path", "evaluator"]


def build_reward_funcs(names: list[str], task: Task, max_completion_length: int, cfg: Config):
    """Reward names -> functions: correctness, format (the task's), r1_format / r1_format_soft (the R1 tags, any
    task), overlong (DAPO), random (control), or your own as "module:function" / "path/file.py:function"."""
    funcs = []
    for name in names:
        if ":" in name:
            funcs.append(load_reward_func(name))
        elif name in ("r1_format", "r1_format_soft"):
            funcs.append(r1_format if name == "r1_format" else r1_format_soft)
        elif name == "correctness":
            funcs.append(task.correctness_reward)
        elif name == "format":
            funcs.append(task.format_reward)
        elif name == "overlong":
            funcs.append(overlong_penalty(max_completion_length, cfg.overlong_buffer_len or max(1, max_completion_length // 4)))
        elif name == "random":
            funcs.append(shuffled(task.correctness_reward, seed=cfg.seed))
        else:
            raise RewardError(f"reward_funcs: unknown reward {name!r} (known: correctness, format, r1_format, "
                              f"r1_format_soft, overlong, random, or module:function / path/file.py:function)")
    return funcs


class PromptSampler:
    """Endless shuffled passes over the training rows, deterministic in the seed.

    With several processes, every rank draws the same global stream (same seed) and keeps its own contiguous
    share: take(n) on rank r of W draws n * W rows and returns rows [r n, (r+1) n). So a W-process run trains
    on the prompts a one-process run would, in the same order.
    """

    def __init__(self, rows: list[dict], seed: int, rank: int = 0, world_size: int = 1):
        self.rows, self.rng, self.order = rows, random.Random(seed), []
        self.rank, self.world_size = rank, world_size

    def take(self, n: int) -> list[dict]:
        batch = []
        while len(batch) < n * self.world_size:
            if not self.order:
                self.order = list(range(len(self.rows)))
                self.rng.shuffle(self.order)
            batch.append(self.rows[self.order.pop()])
        return batch[self.rank * n:(self.rank + 1) * n]

    def state_dict(self) -> dict:
        """Where the sampler is: its RNG and what is left of the current pass (saved in checkpoints)."""
        return {"rng": self.rng.getstate(), "order": list(self.order)}

    def load_state_dict(self, state: dict) -> None:
        self.rng.setstate(state["rng"])
        self.order = list(state["order"])


def _pad_cat(tensors: list[torch.Tensor], value, left: bool = False) -> torch.Tensor:
    """Concatenate (b_i, T_i) tensors along dim 0, padding T to the longest (on the left for prompts)."""
    width = max(t.shape[1] for t in tensors)
    pad = lambda t: torch.nn.functional.pad(t, (width - t.shape[1], 0) if left else (0, width - t.shape[1]), value=value)  # noqa: E731
    return torch.cat([pad(t) for t in tensors])


def collect_batch(model, tokenizer, task, cfg, sampler, reward_funcs, weights, max_len, ref_model, pad_id, engine) -> dict:
    """Sample, score and compute advantages for one batch. With dynamic_sampling (DAPO), groups whose rewards
    are all equal are dropped and more prompts are sampled until the batch is full (or rounds run out)."""
    G = cfg.num_generations
    num_prompts = cfg.generation_batch_size // G // distributed.world_size()  # this process's share of the prompts
    kept, seen_zero_std, rounds = [], [], 0
    while sum(len(part["rows"]) for part in kept) < num_prompts * G and rounds < cfg.max_dynamic_sampling_rounds:
        rounds += 1
        rows = sampler.take(num_prompts)
        roll = engine.generate(
            [r["prompt"] for r in rows], num_generations=G, max_completion_length=max_len,
            temperature=cfg.temperature, top_p=cfg.top_p,
        )
        rows = [r for r in rows for _ in range(G)]  # one row per completion, grouped like the rollout
        columns = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"}
        columns["completion_ids"] = [ids[m.bool()].tolist() for ids, m in zip(roll.completion_ids, roll.completion_mask)]
        prompts = [r["prompt"] for r in rows]  # as TRL passes them: strings, or lists of messages
        rewards_per_func, unscorable = score_completions(reward_funcs, prompts,
                                                         completions_for_rewards(prompts, roll.completions), columns)
        rewards = combine_rewards(rewards_per_func, unscorable, weights)  # (N,), NaN = unscorable
        if cfg.kl_in_reward and cfg.beta > 0:
            with torch.no_grad():
                args = (roll.prompt_ids, roll.prompt_mask, roll.completion_ids, roll.completion_mask)
                logp, _ = completion_logprobs(model, *args, temperature=cfg.temperature)
                ref_logp, _ = completion_logprobs(ref_model, *args, temperature=cfg.temperature)
            rewards = kl_penalized_rewards(rewards, logp.cpu(), ref_logp.cpu(), roll.completion_mask.cpu(), cfg.beta)
        # Advantages need the rewards of the group (always on this rank) or, for scale_rewards="batch", of the
        # whole batch: with several processes, gather every rank's rewards, then keep this rank's share.
        batch_rewards = torch.cat(distributed.gather_objects(rewards))  # (N * W,) in rank order
        if cfg.advantage_estimator == "rloo":
            adv = rloo_advantages(batch_rewards, G)
            _, zero_std = group_advantages(batch_rewards, G)
        else:
            adv, zero_std = group_advantages(batch_rewards, G, scale=cfg.scale_rewards, std=cfg.std_type)
        share = slice(distributed.rank() * len(rewards), (distributed.rank() + 1) * len(rewards))
        adv, zero_std = adv[share], zero_std[share]
        seen_zero_std.append(zero_std)
        keep = ~zero_std if cfg.dynamic_sampling else torch.ones_like(zero_std)
        last_round = rounds == cfg.max_dynamic_sampling_rounds
        if cfg.dynamic_sampling and last_round and not kept and not keep.any():
            keep = torch.ones_like(zero_std)  # nothing to learn from in any round: keep one batch (all A = 0)
        idx = keep.nonzero().squeeze(1)
        kept.append({
            "roll": roll, "idx": idx, "rows": [rows[i] for i in idx], "adv": adv[idx], "rewards": rewards[idx],
            "rewards_per_func": rewards_per_func[idx], "zero_std": zero_std[idx],
        })
        if not cfg.dynamic_sampling:
            break
        kept = [part for part in kept if len(part["rows"])]
    take = lambda f: [f(p) for p in kept]  # noqa: E731
    n = num_prompts * G  # dynamic sampling may overfill by whole groups: trim to the batch size
    batch = {
        "prompt_ids": _pad_cat(take(lambda p: p["roll"].prompt_ids[p["idx"]]), pad_id, left=True)[:n],
        "prompt_mask": _pad_cat(take(lambda p: p["roll"].prompt_mask[p["idx"]]), 0, left=True)[:n],
        "completion_ids": _pad_cat(take(lambda p: p["roll"].completion_ids[p["idx"]]), pad_id)[:n],
        "completion_mask": _pad_cat(take(lambda p: p["roll"].completion_mask[p["idx"]]), 0.0)[:n],
        "is_truncated": torch.cat(take(lambda p: p["roll"].is_truncated[p["idx"]]))[:n],
        "completions": sum(take(lambda p: [p["roll"].completions[i] for i in p["idx"]]), [])[:n],
        "rows": sum(take(lambda p: p["rows"]), [])[:n],
        # the log-probs the engine sampled with (vLLM); None when the policy itself sampled
        "sampling_logp": (_pad_cat(take(lambda p: p["roll"].sampling_logp[p["idx"]]), 0.0)[:n]
                          if all(p["roll"].sampling_logp is not None for p in kept) else None),
    }
    for key in ("adv", "rewards", "rewards_per_func", "zero_std"):
        batch[key] = torch.cat(take(lambda p: p[key]))[:n]
    # Logged zero-std fraction is of what was *sampled*, so dynamic sampling does not hide it.
    batch["zero_std_sampled"] = torch.cat(seen_zero_std)  # (completions sampled,) True where the group's std is 0
    batch["frac_reward_zero_std"] = batch["zero_std_sampled"].float().mean().item()
    batch["sampling_rounds"] = rounds
    if batch["is_truncated"].float().mean() > 0.5:  # the classic trap: the answer never fits, every reward is 0
        warnings.warn(f"over half of a batch's completions reached max_completion_length={max_len} without an eos; "
                      f"cut-off answers usually score 0 and teach nothing: raise max_completion_length", stacklevel=2)
    if batch["rewards"].isnan().all():  # the same words every time, so Python's warnings say it once per run
        warnings.warn("a step had nothing to learn from: every reward of its batch was None or NaN (do the reward "
                      "functions apply to this task?); its loss is 0 and metrics.jsonl logs its reward as null",
                      stacklevel=2)
    return batch


def lr_lambda(cfg: Config):
    def factor(step: int) -> float:
        warm = min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else 1.0
        decay = max(0.0, 1 - step / cfg.max_steps) if cfg.lr_scheduler_type == "linear" else 1.0
        return warm * decay

    return factor


def start_or_resume(cfg: Config, out: Path, **training_objects) -> tuple[int, dict]:
    """(step to start after, what the loop carries between steps): (0, fresh) or, with --resume, the newest
    checkpoint restored into model, optimizer, scheduler, RNGs, sampler (checkpoint.py) and metrics.jsonl cut
    back to its step. A fresh run refuses a directory that holds another run's checkpoints."""
    if cfg.resume_from_checkpoint:
        ckpt = latest_checkpoint(cfg.resume_from_checkpoint)
        start_step, run_state = load_checkpoint(ckpt, **training_objects, config=cfg.to_dict(),
                                                rank=distributed.rank(), world_size=distributed.world_size())
        if distributed.is_main():
            truncate_metrics(ckpt.parent.parent / "metrics.jsonl", start_step, copy_to=out / "metrics.jsonl")
        return start_step, run_state
    if any((out / "checkpoints").glob("step-*.pt")):
        raise CheckpointError(f"output_dir: {out} holds checkpoints of an earlier run; continue it with "
                              f"--resume {out}, or choose another --out")
    return 0, {"wall_seconds": 0.0, "before": None}  # "before": the evaluation before step 1


def policy_path(cfg: Config, task: Task):
    """The model to train: cfg.model_name_or_path, else the task's shipped tiny model (addition tasks only)."""
    if cfg.model_name_or_path is None and not task.model_dir.exists():
        raise ConfigError(f"model_name_or_path: the task {task.name!r} ships no model; pass one with --model "
                          f"(a local directory or a hub name such as Qwen/Qwen2.5-0.5B-Instruct)")
    return cfg.model_name_or_path or task.model_dir


def evaluator(cfg: Config, model, tokenizer, task: Task, max_completion_length: int):
    """evaluate() with this run's settings: its sampling temperature, completion budget and chat template."""
    return functools.partial(evaluate, model, tokenizer, task, temperature=cfg.temperature,
                             max_completion_length=max_completion_length, chat_template_kwargs=cfg.chat_template_kwargs)


def prepare_task(cfg: Config, task: Task, tokenizer, model_config, reward_funcs: list | None = None):
    """The run's rows and reward functions, checked before any step: (train_rows, test_rows, reward_funcs,
    reward_weights, max_completion_length). One-line ConfigError for an empty split, a weight count that does
    not match, or prompts that leave no room for the completion in the model's context."""
    max_len = cfg.max_completion_length or task.max_completion_length
    if reward_funcs is None:
        reward_funcs = build_reward_funcs(cfg.reward_funcs, task, max_len, cfg)
    weights = cfg.reward_weights or [1.0] * len(reward_funcs)
    if len(weights) != len(reward_funcs):
        raise ConfigError(f"reward_weights: {len(weights)} weights for {len(reward_funcs)} reward functions")
    load = lambda split: task.load(split, cfg.dataset_name, cfg.dataset_config)  # noqa: E731
    train_rows, test_rows = load(cfg.dataset_train_split), load(cfg.dataset_test_split)[: cfg.eval_limit]
    for split, rows in (("train", train_rows), ("test", test_rows)):
        if not rows:
            raise ConfigError(f"task: the {split} split of {cfg.dataset_name or task.name!r} is empty")
    context = getattr(model_config, "max_position_embeddings", None)
    for rows in (train_rows, test_rows):  # training and evaluation both sample up to max_len tokens
        prompt_ids = encode_prompts(tokenizer, [r["prompt"] for r in rows], cfg.chat_template_kwargs)
        longest_prompt = max(len(ids) for ids in prompt_ids)
        if context is not None and longest_prompt + max_len > context:
            raise ConfigError(
                f"max_completion_length: prompt ({longest_prompt} tokens) + completion ({max_len}) exceeds "
                f"the model's context of {context} tokens"
            )
    return train_rows, test_rows, reward_funcs, weights, max_len


def train(cfg: Config, *, reward_funcs: list | None = None, progress: bool = True) -> dict:
    """Train, evaluate before and after, write output_dir/{config.yaml, metrics.jsonl, summary.json, plots/}.

    reward_funcs: your own reward functions (TRL's signature, see rewards.py); they replace cfg.reward_funcs.
    Under `accelerate launch` / `torchrun` with W processes, each one trains on 1/W of every batch
    (distributed.py); rank 0 alone evaluates and writes, and every rank returns the summary.
    """
    device = distributed.setup(resolve_device(cfg.device))  # joins the process group when launched W > 1 times
    W, rank, main = distributed.world_size(), distributed.rank(), distributed.is_main()
    if (cfg.generation_batch_size // cfg.num_generations) % W:
        raise ConfigError(f"generation_batch_size: {cfg.generation_batch_size // cfg.num_generations} prompts per "
                          f"step cannot be split into whole groups over {W} processes")
    if cfg.dynamic_sampling and W > 1:
        raise ConfigError("dynamic_sampling: not supported with several processes (each would refill its share "
                          "to a different size); run it in one process")
    torch.manual_seed(cfg.seed)  # the same on every rank: identical starting weights (and LoRA initialisation)
    random.seed(cfg.seed)
    task = get_task(cfg.task)
    model, tokenizer = load_policy(cfg, policy_path(cfg, task), device)  # full, LoRA or QLoRA
    if W > 1:
        torch.manual_seed(cfg.seed + rank)  # ... but each rank samples its own completions
    train_rows, test_rows, reward_funcs, weights, max_len = prepare_task(cfg, task, tokenizer, model.config,
                                                                         reward_funcs)
    reward_names = [getattr(f, "__name__", f"reward_{j}") for j, f in enumerate(reward_funcs)]
    ref_model = reference_policy(model) if cfg.beta > 0 else None
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2), weight_decay=cfg.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    sampler = PromptSampler(train_rows, cfg.seed, rank, W)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    start_step, run_state = start_or_resume(cfg, out, model=model, optimizer=optimizer, scheduler=scheduler,
                                            sampler=sampler, reward_funcs=reward_funcs)
    # The policy's own decode loop, or vLLM (use_vllm), made after the resume so that it copies the restored weights.
    engine = make_engine(cfg, model, tokenizer, [r["prompt"] for r in train_rows], max_len)
    if main:  # one process writes the run directory
        run_config = {**cfg.to_dict(), "resume_from_checkpoint": None}  # resuming is an action, not a setting
        (out / "config.yaml").write_text(yaml.safe_dump(run_config, sort_keys=False))
        metrics_file = open(out / "metrics.jsonl", "a" if start_step else "w")
    eval_rows = test_rows[: cfg.eval_num_problems]
    evaluate_on = evaluator(cfg, model, tokenizer, task, max_len)  # evaluate_on(rows, num_samples=0) -> accuracies
    autocast = lambda: torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.bf16)  # noqa: E731

    if main and run_state["before"] is None:
        run_state["before"] = evaluate_on(test_rows, num_samples=cfg.eval_num_samples)
    bar = tqdm(range(start_step + 1, cfg.max_steps + 1), initial=start_step, total=cfg.max_steps, desc="grpo",
               disable=not (progress and main), dynamic_ncols=True)
    for step in bar:
        t0 = time.perf_counter()
        # 1-3. Sample, score, advantages.
        with autocast():
            batch = collect_batch(model, tokenizer, task, cfg, sampler, reward_funcs, weights, max_len, ref_model,
                                  tokenizer.pad_token_id, engine)
        t_generate = time.perf_counter() - t0
        ids = [batch[k].to(device) for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")]
        adv = batch["adv"].to(device)
        loss_mask = ids[3] * (~batch["is_truncated"].to(device)).unsqueeze(1) if cfg.mask_truncated_completions else ids[3]
        N = adv.shape[0]  # this process's completions: generation_batch_size / W
        num_tokens = distributed.all_reduce_sum(loss_mask.sum())  # the global batch's completion tokens

        # 4. Old and reference log-probs, once per batch, only when needed.
        # (With vLLM always: its log-probs are compared with ours before any update, as TRL does.)
        needs_old = cfg.num_iterations > 1 or cfg.steps_per_generation > 1 or batch["sampling_logp"] is not None
        model.eval()  # the policy that sampled has no dropout (a LoRA adapter has some): nor have its log-probs
        with torch.no_grad(), autocast():
            old_logp = completion_logprobs(model, *ids, temperature=cfg.temperature)[0] if needs_old else None
            use_ref = cfg.beta > 0 and not cfg.kl_in_reward
            ref_logp = completion_logprobs(ref_model, *ids, temperature=cfg.temperature)[0] if use_ref else None
        # vLLM sampled: its log-probs against ours, and TRL's importance weight on each token (engine_mismatch.py).
        is_weight, sampling_stats = None, {}
        if batch["sampling_logp"] is not None:
            sampling_logp = batch["sampling_logp"].to(device)
            if cfg.vllm_importance_sampling_correction:
                is_weight = importance_weights(old_logp, sampling_logp, loss_mask, mode=cfg.vllm_importance_sampling_mode,
                                               clip_min=cfg.vllm_importance_sampling_clip_min,
                                               clip_max=cfg.vllm_importance_sampling_clip_max)
            sampling_stats = mismatch_stats(old_logp, sampling_logp, loss_mask, is_weight, cfg.vllm_importance_sampling_mode)

        # 5. Optimise: num_iterations passes over the batch, each in steps_per_generation mini-batches.
        model.train()
        step_stats, mb_size = [], N // cfg.steps_per_generation
        for _ in range(cfg.num_iterations):
            for mb in torch.randperm(N).split(mb_size):  # steps_per_generation mini-batches, on every rank
                mb_ids = [t[mb] for t in ids]
                with autocast():
                    logp, entropy = completion_logprobs(model, *mb_ids, temperature=cfg.temperature, with_entropy=True)
                loss, stats = policy_loss(
                    logp, logp.detach() if old_logp is None else old_logp[mb], adv[mb], loss_mask[mb],
                    loss_type=cfg.loss_type, importance_sampling_level=cfg.importance_sampling_level,
                    epsilon=cfg.epsilon, epsilon_high=cfg.epsilon_high, delta=cfg.delta,
                    beta=0.0 if ref_logp is None else cfg.beta, ref_logp=None if ref_logp is None else ref_logp[mb],
                    kl_estimator=cfg.kl_estimator, max_completion_length=max_len,
                    # dapo/cispo: sum / tokens. W processes: / (global tokens / W), as the gradients are averaged
                    num_items_in_batch=num_tokens / cfg.steps_per_generation / W, gmpo_epsilon=cfg.gmpo_epsilon,
                    token_weights=None if is_weight is None else is_weight[mb],
                )
                if cfg.loss_type == "bnpo" and W > 1:  # bnpo divides by this rank's tokens: make it the global count
                    mb_tokens = loss_mask[mb].sum()
                    loss = loss * mb_tokens * W / distributed.all_reduce_sum(mb_tokens).clamp(min=1)
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"step {step}: the loss is {loss.item()} — stopping before the weights are")
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                distributed.average_gradients(model.parameters())  # W > 1: the global batch's gradient, on every rank
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm).item()
                if not math.isfinite(grad_norm):  # a finite loss can still have an inf/nan gradient
                    raise FloatingPointError(f"step {step}: the gradient norm is {grad_norm} — stopping before the weights are")
                optimizer.step()
                stats.update(loss=loss.item(), grad_norm=grad_norm, tokens=mb_ids[3].sum().item(),
                             entropy=((entropy * mb_ids[3]).sum() / mb_ids[3].sum().clamp(min=1)).item())
                step_stats.append(stats)
        engine.sync_weights()  # an engine with its own copy of the weights (vLLM) catches up; generate: no-op
        learning_rate = scheduler.get_last_lr()[0]
        scheduler.step()
        step_seconds = time.perf_counter() - t0
        run_state["wall_seconds"] += step_seconds

        # 6. Log one line (rank 0, from every rank's share of the batch).
        gathered = gather_batch(batch, task)
        row = {"step": step, **step_metrics(gathered, gather_stats(step_stats), reward_names)}
        row.update(learning_rate=learning_rate, step_seconds=step_seconds, generate_seconds=t_generate,
                   tokens_per_second=gathered["lengths"].sum().item() / step_seconds)  # all sampled tokens
        row.update(sampling_stats)  # sampling/*: vLLM's log-probs against the trainer's (empty without vLLM)
        if main:
            if cfg.eval_steps and (step % cfg.eval_steps == 0 or step == cfg.max_steps):
                row["eval/accuracy_greedy"] = evaluate_on(eval_rows)["accuracy_greedy"]
            metrics_file.write(json_line(row))
            metrics_file.flush()
            bar.set_postfix(reward=f"{row['reward']:.2f}", len=f"{row['completion_length_mean']:.1f}")
        # 7. Checkpoint, after the metrics line of the same step (so a resumed run never lacks a line).
        if cfg.save_steps and step % cfg.save_steps == 0:
            states = distributed.gather_objects(process_state(sampler, reward_funcs))  # each rank's RNGs
            if main:
                save_checkpoint(out / "checkpoints", step, model=model, optimizer=optimizer, scheduler=scheduler,
                                sampler=sampler, reward_funcs=reward_funcs, config=cfg.to_dict(), progress=run_state,
                                keep=cfg.save_total_limit, process_states=states)
    if not main:  # the other ranks are done: rank 0 evaluates, saves and returns the summary to them
        summary = distributed.broadcast_object(None)
        distributed.cleanup()
        return summary
    metrics_file.close()

    before = run_state["before"]
    after = evaluate_on(test_rows, num_samples=cfg.eval_num_samples)
    trainable_params, total_params = parameter_counts(model)
    peak_memory = peak_memory_bytes(device)  # before saving: merging a LoRA adapter reloads the base model
    if cfg.save_model:  # LoRA: the adapter in model/, the merged model in model_merged/
        save_policy(model, tokenizer, out / "model", base_name_or_path=policy_path(cfg, task), dtype=cfg.dtype)
    summary = {
        "task": task.name, "model": str(policy_path(cfg, task)), "dataset": cfg.dataset_name, "loss_type": cfg.loss_type,
        "seed": cfg.seed, "steps": cfg.max_steps, "wall_seconds": round(run_state["wall_seconds"], 2),
        "resumed_from_step": start_step if cfg.resume_from_checkpoint else None,
        "accuracy_before": before["accuracy_greedy"], "accuracy_after": after["accuracy_greedy"],
        "accuracy_before_sampled": before.get("accuracy_sampled"), "accuracy_after_sampled": after.get("accuracy_sampled"),
        "completion_length_before": before["mean_length_greedy"], "completion_length_after": after["mean_length_greedy"],
        "eval_before": before, "eval_after": after, "num_test_problems": len(test_rows),
        "device": str(device), "torch": torch.__version__,
        "quantized": is_quantized(model), "trainable_params": trainable_params, "total_params": total_params,
        "peak_memory_bytes": peak_memory,  # CUDA peak allocated, or the process's peak RSS on CPU (models.py)
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    from .plots import plot_runs

    plot_runs([out], out / "plots")
    distributed.broadcast_object(summary)
    distributed.cleanup()
    return summary


def gather_batch(batch: dict, task: Task) -> dict:
    """What step_metrics reads of a batch, as CPU tensors, concatenated over the processes in rank order (so
    in the order a one-process run holds the same prompts). With one process: this batch's."""
    correct = [task.grade(c, r) for c, r in zip(batch["completions"], batch["rows"])]
    mine = {
        "rewards": batch["rewards"].cpu(), "adv": batch["adv"].cpu(), "correct": torch.tensor(correct),
        "lengths": batch["completion_mask"].sum(1).cpu(), "is_truncated": batch["is_truncated"].cpu(),
        "rewards_per_func": batch["rewards_per_func"].cpu(), "zero_std_sampled": batch["zero_std_sampled"].cpu(),
        "sampling_rounds": torch.tensor([batch["sampling_rounds"]]),
    }
    ranks = distributed.gather_objects(mine)
    return {key: torch.cat([r[key] for r in ranks]) for key in mine}


def gather_stats(step_stats: list[dict]) -> list[dict]:
    """Each mini-batch's loss statistics over all processes (every rank ran as many mini-batches).

    loss and grad_norm are the same quantity on every rank's scale (the loss is normalised so that the ranks'
    average is the global batch's; the gradient is averaged before its norm is taken): a plain mean. The
    rest are token means (entropy, clip ratios, ratio, KL): weighted by each rank's tokens, which makes them
    the global batch's token mean. (GSPO's sequence-level clip ratios are sequence means: token-weighting them
    is then an approximation.)"""
    ranks = distributed.gather_objects(step_stats)
    if len(ranks) == 1:
        return step_stats
    gathered = []
    for i, stats in enumerate(step_stats):
        tokens = [r[i]["tokens"] for r in ranks]
        weighted = lambda key: sum(r[i][key] * n for r, n in zip(ranks, tokens)) / max(sum(tokens), 1)  # noqa: E731
        gathered.append({key: fmean(r[i][key] for r in ranks) if key in ("loss", "grad_norm") else weighted(key)
                         for key in stats})
    return gathered


def json_line(row: dict) -> str:
    """One line of metrics.jsonl. A number that is missing (NaN: no reward scored; or infinite) is written null:
    Python's json would write NaN, which jq, JavaScript and pandas' strict readers refuse."""

    def finite_or_none(x):
        if isinstance(x, float):
            return x if math.isfinite(x) else None
        if isinstance(x, dict):
            return {k: finite_or_none(v) for k, v in x.items()}
        if isinstance(x, list):
            return [finite_or_none(v) for v in x]
        return x

    return json.dumps(finite_or_none(row), allow_nan=False) + "\n"


def step_metrics(batch: dict, step_stats: list[dict], reward_names: list[str]) -> dict:
    """The per-step numbers of metrics.jsonl, named as TRL logs them where TRL has the same quantity.
    batch: as `gather_batch` returns it."""
    rewards, adv, lengths, correct = batch["rewards"], batch["adv"], batch["lengths"], batch["correct"]
    scored = ~rewards.isnan()
    row = {
        "loss": fmean(s["loss"] for s in step_stats),
        "reward": rewards[scored].mean().item() if scored.any() else math.nan,
        "reward_std": rewards[scored].std().item() if scored.sum() > 1 else 0.0,
        "frac_reward_zero_std": batch["zero_std_sampled"].float().mean().item(),
        "frac_reward_nan": (~scored).float().mean().item(),
        "accuracy": correct.float().mean().item(),
        "advantages/mean": adv.mean().item(), "advantages/std": adv.std().item(),
        "advantages/min": adv.min().item(), "advantages/max": adv.max().item(),
        "advantages": [round(a, 4) for a in adv.tolist()],
        "completion_length_mean": lengths.mean().item(),
        "completion_length_min": lengths.min().item(), "completion_length_max": lengths.max().item(),
        "completion_length_correct_mean": lengths[correct].mean().item() if correct.any() else None,
        "completion_length_incorrect_mean": lengths[~correct].mean().item() if (~correct).any() else None,
        "clipped_ratio": batch["is_truncated"].float().mean().item(),
        "sampling_rounds": batch["sampling_rounds"].max().item(),
    }
    for j, name in enumerate(reward_names):
        col = batch["rewards_per_func"][:, j]
        row[f"rewards/{name}/mean"] = col.nanmean().item()
        row[f"rewards/{name}/std"] = col[~col.isnan()].std().item() if (~col.isnan()).sum() > 1 else 0.0
    for key in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "ratio_mean", "approx_kl",
                "entropy", "grad_norm"):
        row[key] = fmean(s[key] for s in step_stats)
    row["kl"] = fmean(s["kl"] for s in step_stats) if "kl" in step_stats[0] else None
    return row

