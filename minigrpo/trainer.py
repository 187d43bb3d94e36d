"""The GRPO training loop, top to bottom.

    for each step:
        sample    G completions for each of (generation_batch_size / G) prompts      collect.py, rollout.py
                  (with tools: sample, run the calls, append their answers, sample ...) tools/
        score     every completion with every reward function                          rewards.py, tasks/
        advantage group-relative (or another estimator), per completion                advantages.py
        prepare   the loss mask (the policy's tokens), old and reference log-probs     prepare_update
        optimise  num_iterations x steps_per_generation mini-batches of the loss       grpo_update, objectives/
        log       one JSON line of metrics, a few groups of completions                metrics.py, run_log.py
        save      every save_steps steps, a checkpoint to resume from exactly          checkpoint.py

What this loop simplifies, on purpose:
  * One device per process. Every log-prob goes through one object, `policy`: with one process that is
    logprobs.LogprobForward(model), the model's forward, called as it is. Several processes (`accelerate launch` /
    `torchrun`) split each batch by whole groups and average their gradients with DistributedDataParallel, or
    shard the model with FSDP2 (`fsdp`): `policy` is then their wrapping of it (parallel/, imported only then).
  * Generation with the policy itself (rollout.py's decode loop, via engines.py), or with a colocated vLLM
    engine (`use_vllm`, rollout_vllm.py, tested on the CPU) whose weights are synced after each batch's updates;
    its log-probs differ a little from the trainer's: logged, and corrected as TRL does (engine_mismatch.py).
  * The "old" policy is never a copy of the model: its log-probs are computed once per batch, and only
    when they can differ from the current policy's (num_iterations > 1 or several mini-batches). Otherwise
    old_logp = logp.detach() and the ratio is exactly 1 in value (its gradient is still the policy gradient).
  * The reference policy (beta > 0) is a frozen copy of the starting weights, made once; with LoRA it is the
    same model with its adapter switched off (models.py), so it costs no memory.
  * With a learned reward (reward_models/) the drift from the start, KL(pi || pi_init) per completion
    and d = sqrt(KL), is logged each step (drift/kl, drift/d) from the same reference: with LoRA it is free but for
    one no-grad forward per batch; training all weights it costs a frozen copy of the model, as beta > 0 does (with
    sync_ref_model the reference moves, and the drift is measured from where it has moved to).
  * Each mini-batch is one optimizer step; gradient_accumulation_steps splits it into micro-batches for memory
    only (the same step: each micro-batch's loss is its share of the mini-batch's, objectives/aggregation.py).
  * 16 bits for the forward passes only (bf16, or fp16 with loss scaling on GPUs without bfloat16): the trained
    weights, the log-probs and the loss stay float32, and fp16 skips (and counts) a step whose gradients overflow
    (mixed_precision.py).
  * With tools, a completion is every turn after the prompt, the tools' answers included; the loss, KL, entropy
    and lengths count only the tokens the policy sampled (Batch.policy_mask), while every log-prob is taken with
    the tools' tokens in context. Tools run in a worker process; each call has a time limit.
"""

import contextlib
import os
import time

import torch
from tqdm.auto import tqdm

from .batch import Batch, PromptSampler
from .collect import collect_batch
from .config import Config, ConfigError
from .evaluate import eval_due, evaluate_on_main, evaluator
from .generation.engine_mismatch import sampler_correction
from .kl import sequence_kl
from .loading.models import reference_policy, refresh_reference, resolve_device
from .metrics import gather_batch, gather_stats, step_metrics
from .mixed_precision import optimizer_step, scaled_backward
from .objectives import policy_loss
from .parallel import processes
from .persistence.checkpoint import checkpoint_due, save_step_checkpoint, start_or_resume
from .persistence.run_log import RunLog, write_config
from .reward_logs import RewardLogs
from .rewards import reward_names
from .run import finish_run, load_run, make_engine, make_optimizer, record_inputs
from .sandbox.isolation import take_failed_count
from .tools import tool_setup

__all__ = ["train", "prepare_update", "grpo_update"]


def train(cfg: Config, *, reward_funcs: list | None = None, tools: list | None = None, environment_factory=None,
          progress: bool = True, model=None, processing_class=None, train_dataset=None, eval_dataset=None,
          engine_factory=None) -> dict:
    """Train, evaluate before and after, write output_dir/{config.yaml, metrics.jsonl, completions.jsonl,
    summary.json, plots/}. A folder holding another run is refused (run.claim_output_dir).

    reward_funcs: your own reward functions (TRL's signature, see rewards.py), names (as in cfg.reward_funcs) among
    them if you like; they replace cfg.reward_funcs.
    tools: plain typed Python functions the model may call (TRL's `tools=`, tools/); they replace cfg.tools and the
    task's own. With tools, each completion is a multi-turn rollout and the loss learns only the policy's tokens.
    environment_factory: TRL's: a class (or function) whose instances are stateful tools, one per completion, reset
    from its dataset row (tools/environment.py); its get_reward(), if any, is one more reward function (weight 1).
    model, processing_class: a loaded model and its tokenizer (TRL's names), instead of cfg.model_name_or_path.
    train_dataset, eval_dataset: a datasets.Dataset or a list of row dicts, instead of cfg.dataset_name's rows;
    without eval_dataset the last tenth of train_dataset is held out for evaluation (as for a single file).
    What was handed over is named in the config.yaml the run writes (run.record_inputs).
    engine_factory: a function (model, tokenizer) -> an engine that samples (generation/engines.py's interface),
    used instead of the one the Config asks for: e.g. lab/cast_engine.py's CastEngine, a sampler in bfloat16.
    progress: a progress bar for every long wait, and a line for each result as soon as it is known.
    Under `accelerate launch` / `torchrun` with W processes, each one trains on 1/W of every batch
    (parallel/); rank 0 alone evaluates and writes, and every rank returns the summary.
    """
    cfg, train_rows, eval_rows = record_inputs(cfg, reward_funcs, tools, model, train_dataset, eval_dataset)
    device = processes.setup(resolve_device(cfg.device))  # joins the process group when launched W > 1 times
    check_processes(cfg)
    run = load_run(cfg, device, reward_funcs, model=model, processing_class=processing_class, train_rows=train_rows,
                   eval_rows=eval_rows, updates_per_step=cfg.steps_per_generation * cfg.num_iterations)  # seeded
    model, tokenizer, task, out, max_len = run.model, run.tokenizer, run.task, run.out, run.max_completion_length
    ref_model = reference_policy(model) if cfg.beta > 0 or run.logs_drift else None  # also the drift's start
    # Every log-prob of the loss goes through policy: LogprobForward(model) alone, DDP's / FSDP2's when W > 1.
    policy, ref_policy = processes.wrap(model, ref_model, fsdp=cfg.fsdp, fsdp_config=cfg.fsdp_config,
                                        compute_dtype=run.compute_dtype)
    tools = tool_setup(cfg.tools if tools is None else tools, task, model, tokenizer, environment_factory,
                       **cfg.tool_options())  # train's tools, else cfg.tools, else the task's; None: single-turn
    reward_funcs, weights = with_environment_reward(run.reward_funcs, run.reward_weights, tools)
    optimizer, scheduler = make_optimizer(cfg, model.parameters())
    sampler = PromptSampler(run.train_rows, cfg.seed, processes.rank(), processes.world_size())
    saved = dict(model=model, optimizer=optimizer, scheduler=scheduler, sampler=sampler, scaler=run.scaler,  # what a
                 reward_funcs=reward_funcs, ref_model=ref_model if cfg.sync_ref_model else None)  # checkpoint holds
    start_step, run_state = start_or_resume(cfg.resume_from_checkpoint, out, cfg.to_dict(), cfg.defaults(), **saved)
    # The policy's own decode loop, vLLM (use_vllm) or engine_factory's, made after the resume: it copies the weights.
    engine = make_engine(cfg, model, tokenizer, [r["prompt"] for r in run.train_rows], max_len, factory=engine_factory)
    if processes.is_main():  # one process writes the run directory
        write_config(out, cfg.to_dict(), resume_from_checkpoint=None)  # resuming is an action, not a setting
    log = RunLog(out, reward_names(reward_funcs), resume_step=start_step, enabled=processes.is_main(),
                 **cfg.log_options())  # metrics.jsonl, completions.jsonl (rank 0)
    evaluate_on = evaluator(model, tokenizer, task, max_len, cfg.temperature, cfg.chat_template_kwargs, tools)
    take_failed_count()  # verifier failures are counted from this run's first step
    if run_state["before"] is None:  # printed as soon as it is known; a resumed run carries it in its checkpoint
        run_state["before"] = evaluate_on_main(policy, evaluate_on, run.test_rows, cfg.eval_num_samples,
                                               label=progress and "before training")

    bar = tqdm(range(start_step + 1, cfg.max_steps + 1), initial=start_step, total=cfg.max_steps, desc="grpo",
               disable=not (progress and processes.is_main()), dynamic_ncols=True)
    for step in bar:
        t0 = time.perf_counter()
        # 1-3. Sample G completions per prompt, score them, group-relative advantages (collect.py).
        # FSDP2: sampling needs the whole weights (and kl_in_reward the reference's)
        with run.autocast(), processes.full_weights(policy, ref_policy if cfg.kl_in_reward else None):
            batch = collect_batch(cfg, engine, sampler, reward_funcs, weights, max_len, model, ref_model, tools,
                                  on_phase=bar.set_postfix_str, reward_logs=run.reward_logs.at(step))
        t_generate = time.perf_counter() - t0
        # 4. What the update needs beyond the batch: which tokens learn, old and reference log-probs (below).
        bar.set_postfix_str("updating")
        inputs, sampling_stats = prepare_update(cfg, batch.to(device), policy, ref_policy, run.autocast, run.logs_drift)

        # 5. Optimise: num_iterations passes over the batch, each in steps_per_generation mini-batches.
        policy.train()
        step_stats = grpo_update(policy, optimizer, inputs, cfg, max_completion_length=max_len, autocast=run.autocast,
                                 step=step, scaler=run.scaler, drift=run.logs_drift)
        engine.sync_weights()  # an engine with its own copy of the weights (vLLM) catches up; generate: no-op
        learning_rate = scheduler.get_last_lr()[0]
        scheduler.step()
        if cfg.sync_ref_model and step % cfg.ref_model_sync_steps == 0:  # TR-DPO: the reference follows, slowly
            refresh_reference(ref_model, model, cfg.ref_model_mixup_alpha)
        step_seconds = time.perf_counter() - t0
        run_state["wall_seconds"] += step_seconds

        # 6. Log one line (rank 0, from every rank's share of the batch) and the first groups' completions.
        row, correct = step_row(step, batch, task, step_stats, log, sampling_stats, learning_rate=learning_rate,
                                step_seconds=step_seconds, generate_seconds=t_generate, reward_logs=run.reward_logs)
        if task.graded and eval_due(step, cfg.eval_steps, cfg.max_steps):
            bar.set_postfix_str(f"evaluating on {min(cfg.eval_num_problems, len(run.test_rows))} problems")
            result = evaluate_on_main(policy, evaluate_on, run.test_rows[: cfg.eval_num_problems])
            row.update({"eval/accuracy_greedy": result["accuracy_greedy"]} if result else {})
        if processes.is_main():
            log.log(step, row, batch, correct)  # rank 0's rows come first in the gathered batch
            bar.set_postfix(reward=f"{row['reward']:.2f}", len=f"{row['completions/mean_length']:.1f}")
        # 7. Checkpoint, after the metrics line of the same step (so a resumed run never lacks a line).
        if checkpoint_due(step, cfg.save_steps):
            save_step_checkpoint(out, step, config=cfg.to_dict(), keep=cfg.save_total_limit, policy=policy,
                                 run_state=run_state, bar=bar, **saved)
    summary = wrap_up(cfg, run, policy, log, tools, evaluate_on, run_state, device=device, start_step=start_step,
                      progress=progress)
    del policy, ref_policy  # DDP's reducer must go before its process group does
    processes.cleanup()
    return summary


def wrap_up(cfg: Config, run, policy, log, tools, evaluate_on, run_state: dict, *, device, start_step: int,
            progress: bool) -> dict:
    """After the last step: close the log and the tools' worker, evaluate, and on rank 0 save the policy and write
    summary.json and the plots (run.finish_run); every rank returns the summary."""
    log.close()
    if tools is not None:
        tools.worker.close()
    after = evaluate_on_main(policy, evaluate_on, run.test_rows, cfg.eval_num_samples,
                             label=progress and "after training")
    # FSDP2: the whole model gathered to rank 0, which saves it as one ordinary folder (else None: saved as it is)
    full_state = processes.full_state_dict(run.model, policy) if cfg.save_model else None
    summary = None
    if processes.is_main():  # rank 0 evaluates, saves and writes
        summary = finish_run(cfg, run.task, run.model, run.tokenizer, run.out, before=run_state["before"], after=after,
                             num_test_problems=len(run.test_rows), wall_seconds=run_state["wall_seconds"],
                             device=device, state_dict=full_state,
                             resumed_from_step=start_step if cfg.resume_from_checkpoint else None)
    return processes.broadcast_object(summary)


def with_environment_reward(reward_funcs: list, weights: list, tools) -> tuple[list, list]:
    """The run's reward functions, and an environment's own get_reward() as one more (weight 1) if it has one."""
    if tools is not None and tools.environments is not None and tools.environments.has_reward:
        return reward_funcs + [tools.environments.reward_func()], weights + [1.0]
    return reward_funcs, weights


def step_row(step: int, batch: Batch, task, step_stats: list[dict], log, sampling_stats: dict, *,
             learning_rate: float, step_seconds: float, generate_seconds: float, reward_logs: RewardLogs
             ) -> tuple[dict, list]:
    """Step 6's metrics line, from every process's share of the batch (metrics.py; TRL's names) and what reward
    functions logged (log_metric), and which of the gathered completions were correct (for the completions log; None
    where nothing is graded)."""
    gathered = gather_batch(batch, task)
    row = {"step": step, **step_metrics(gathered, gather_stats(step_stats), log.reward_names)}
    failed = processes.gather_objects(take_failed_count())  # third-party verifiers' failed calls (isolation.py)
    if any(n is not None for n in failed):  # every rank gathers, whether its rewards called a verifier or not
        row["rewards/verifier_failed"] = sum(n or 0 for n in failed)
    row.update(learning_rate=learning_rate, step_seconds=step_seconds, generate_seconds=generate_seconds,
               tokens_per_second=gathered["lengths"].sum().item() / step_seconds, **sampling_stats)
    row.update(reward_logs.take_metrics(row))
    return row, gathered["correct"].tolist() if task.graded else [None] * len(gathered["correct"])


def prepare_update(cfg: Config, inputs: Batch, policy, ref_policy, autocast, drift: bool = False
                   ) -> tuple[Batch, dict]:
    """Step 4 of the loop: the batch's loss mask, old and reference log-probs, and the sampler correction.

    The loss acts on the policy's own tokens: tool output is context, not an action (train_on_tool_output: the
    bug, for teaching), less truncated completions with mask_truncated_completions (DAPO). Old log-probs are
    computed once per batch and only when they can differ from the current policy's (with vLLM always: its
    log-probs are compared with ours before any update, as TRL does); the policy that sampled has no dropout.
    A batch that arrives with them (the optimal token baseline's estimator read them in collect_batch) keeps them.
    Reference log-probs: for the KL term (beta > 0), and for the drift from the start (drift: a learned reward).
    policy, ref_policy: LogprobForward(model) (and of the reference, or None), or their engines' (parallel/)."""
    inputs.loss_mask = inputs.completion_mask if cfg.train_on_tool_output else inputs.policy_mask
    if cfg.mask_truncated_completions:  # a cut-off completion teaches nothing about its ending
        inputs.loss_mask = inputs.loss_mask * (~inputs.is_truncated).unsqueeze(1)
    ids = (inputs.prompt_ids, inputs.prompt_mask, inputs.completion_ids, inputs.completion_mask)
    needs_old = cfg.num_iterations > 1 or cfg.steps_per_generation > 1 or inputs.sampling_logp is not None
    policy.eval()
    with torch.no_grad(), autocast():
        options = dict(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, share_prompts=cfg.shared_prefix)
        if not needs_old:
            inputs.old_logp = None
        elif inputs.old_logp is None:  # else collect_batch took them already (an estimator that reads pi_old)
            inputs.old_logp = policy(*ids, **options)[0]
        use_ref = (cfg.beta > 0 and not cfg.kl_in_reward) or drift
        inputs.ref_logp = ref_policy(*ids, **options)[0] if use_ref else None
    # vLLM sampled: its log-probs against ours, and TRL's importance weight on each token (engine_mismatch.py).
    inputs.is_weight, sampling_stats = sampler_correction(inputs.old_logp, inputs.sampling_logp, inputs.loss_mask,
                                                          **cfg.sampler_correction_options())
    return inputs, sampling_stats


def grpo_update(policy, optimizer, inputs: Batch, cfg: Config, *, max_completion_length: int,
                autocast=contextlib.nullcontext, step: int = 0, scaler=None, drift: bool = False) -> list[dict]:
    """Step 5 of the loop: num_iterations passes over the batch, each in steps_per_generation mini-batches, one
    optimizer step per mini-batch. Returns each mini-batch's statistics (policy_loss's, plus loss, grad_norm,
    tokens and entropy; with fp16's scaler, skipped (1.0 where an overflow skipped the step) and loss_scale).

    policy: LogprobForward(model), or its engine's (parallel/). inputs: a Batch on the model's device, N
    completions, with loss_mask set (the policy's tokens, less what mask_truncated_completions drops) and old_logp,
    ref_logp, is_weight, sampling_logp each None when not used (old_logp None: on-policy, the ratio is 1).

    gradient_accumulation_steps > 1 runs each mini-batch in that many micro-batches (less memory), each loss its
    share of the mini-batch's (objectives/aggregation.py, which also knows the W processes), gradients summed: the
    same optimizer step.
    scaler: fp16's GradScaler (mixed_precision.py): every micro-batch's backward is of S * loss, the gradients are
    unscaled before clipping, and a step whose gradients overflowed is skipped instead of stopping the run.
    drift: also report drift/kl, KL(pi_old || pi_ref) per completion (kl.sequence_kl), from inputs.ref_logp.
    """
    N, W = inputs.adv.shape[0], processes.world_size()
    loss_mask = inputs.loss_mask
    # dapo/cispo divide each mini-batch's summed loss by the batch's tokens per mini-batch, over all W processes
    # (TRL's num_items_in_batch); the aggregation takes each process's share of it.
    num_tokens = processes.all_reduce_sum(loss_mask.sum())
    step_stats = []
    for _ in range(cfg.num_iterations):
        for mb in torch.randperm(N).split(N // cfg.steps_per_generation):  # the same on every rank
            optimizer.zero_grad(set_to_none=True)
            micro_stats = []
            # Micro-batches of whole groups where they can be (rows i*G .. i*G+G-1 share a prompt, so sorted rows
            # keep groups together): each holds few distinct prompts, which the shared prefix runs once each.
            micro_batches = mb.sort().values if cfg.gradient_accumulation_steps > 1 else mb
            mini_batch_tokens = processes.all_reduce_sum(loss_mask[mb].sum())  # over all W processes
            mini_batch = dict(mini_batch_rows=len(mb), mini_batch_tokens=mini_batch_tokens, dp_size=W,
                              num_items_in_batch=num_tokens / cfg.steps_per_generation)
            for i, micro in enumerate(micro_batches.split(len(mb) // cfg.gradient_accumulation_steps)):
                with processes.no_sync(policy, last_micro_batch=i == cfg.gradient_accumulation_steps - 1):  # DDP
                    # the loss is this micro-batch's share of the mini-batch's (mini_batch: objectives/aggregation.py)
                    loss, stats = micro_batch_loss(policy, inputs, micro, cfg, max_completion_length, autocast,
                                                   drift=drift, **mini_batch)
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"step {step}: the loss is {loss.item()} — stopping before the weights "
                                             "are changed")
                scaled_backward(loss, scaler)  # fp16: of S * loss
                micro_stats.append({**stats, "loss": loss.item()})
            # W > 1: DDP / FSDP2 averaged the gradients in backward: the global batch's gradient, on every rank.
            # Clip and step; a non-finite gradient stops the run, or with fp16's scaler skips the step (an overflow)
            grad_norm, skipped = optimizer_step(optimizer, policy.parameters(), cfg.max_grad_norm, scaler,
                                                where=f"step {step}: ")
            stats = {**merge_micro_stats(micro_stats), "grad_norm": grad_norm}
            if scaler is not None:
                stats.update(skipped=float(skipped), loss_scale=scaler.get_scale())
            step_stats.append(stats)
    return step_stats


def micro_batch_loss(policy, inputs: Batch, rows: torch.Tensor, cfg: Config, max_completion_length: int, autocast,
                     drift: bool = False, **mini_batch) -> tuple[torch.Tensor, dict]:
    """policy_loss on the given rows of the batch: a forward pass of the policy, then the objective. mini_batch:
    num_items_in_batch and what makes the loss this micro-batch's share of the mini-batch's (policy_loss's).
    drift: also drift/kl, the mean over the rows of KL(pi_old || pi_ref) (pi_old: the policy that sampled them; no
    extra pass)."""
    mb = inputs.select(rows)
    with autocast():
        logp, entropy = policy(mb.prompt_ids, mb.prompt_mask, mb.completion_ids, mb.completion_mask,
                               temperature=cfg.temperature, with_entropy=True, entropy_grad=cfg.entropy_coef > 0,
                               share_prompts=cfg.shared_prefix, top_k=cfg.top_k, top_p=cfg.top_p)
    kl_in_loss = mb.ref_logp is not None and not cfg.kl_in_reward  # ref_logp may be there for the drift alone
    loss, stats = policy_loss(
        logp, logp.detach() if mb.old_logp is None else mb.old_logp, mb.adv, mb.loss_mask, loss_type=cfg.loss_type,
        importance_sampling_level=cfg.importance_sampling_level, epsilon=cfg.epsilon, epsilon_high=cfg.epsilon_high,
        delta=cfg.delta, beta=cfg.beta if kl_in_loss else 0.0, ref_logp=mb.ref_logp,
        kl_estimator=cfg.kl_estimator, max_completion_length=max_completion_length,
        token_weights=mb.is_weight, sampling_logp=mb.sampling_logp,
        entropies=entropy, use_bias_correction_kl=cfg.use_bias_correction_kl,
        off_policy_mask_threshold=cfg.off_policy_mask_threshold, top_entropy_quantile=cfg.top_entropy_quantile,
        entropy_coef=cfg.entropy_coef, **mini_batch, **cfg.policy_loss_options(),  # the loss type's own options
    )
    policy_mask = mb.policy_mask  # entropy and token counts over the policy's own tokens
    stats.update(tokens=policy_mask.sum().item(),
                 entropy=((entropy * policy_mask).sum() / policy_mask.sum().clamp(min=1)).item())
    if drift:  # the policy that sampled: old_logp, or (on-policy) this very forward's
        sampler_logp = logp.detach() if mb.old_logp is None else mb.old_logp
        stats["drift/kl"] = sequence_kl(sampler_logp, mb.ref_logp, policy_mask).mean().item()
    return loss, stats


def merge_micro_stats(micro_stats: list[dict]) -> dict:
    """One mini-batch's statistics from its micro-batches': loss summed (the mini-batch's loss), tokens summed, the
    rest weighted by tokens (exact for token means; sequence means, e.g. GSPO's clip ratios, approximately)."""
    if len(micro_stats) == 1:
        return micro_stats[0]
    tokens = [s["tokens"] for s in micro_stats]
    merged = {key: sum(s[key] * n for s, n in zip(micro_stats, tokens)) / max(sum(tokens), 1) for key in micro_stats[0]}
    merged.update(loss=sum(s["loss"] for s in micro_stats), tokens=sum(tokens))
    return merged


def check_processes(cfg: Config) -> None:
    """One-line errors for what cannot be split over this run's W processes."""
    W = processes.world_size()
    if (cfg.generation_batch_size // cfg.num_generations) % W:
        raise ConfigError(f"generation_batch_size: {cfg.generation_batch_size // cfg.num_generations} prompts per "
                          f"step cannot be split into whole groups over {W} processes")
    completions = cfg.generation_batch_size // cfg.num_generations * cfg.group_size // W  # what each process trains on
    if W > 1 and completions % cfg.steps_per_generation:
        raise ConfigError(f"steps_per_generation: {cfg.steps_per_generation} does not divide the {completions} "
                          f"completions of each of {W} processes")
    if W > 1 and completions // cfg.steps_per_generation % cfg.gradient_accumulation_steps:
        raise ConfigError(f"gradient_accumulation_steps: {cfg.gradient_accumulation_steps} does not divide the "
                          f"{completions // cfg.steps_per_generation} completions of each process's mini-batch over "
                          f"{W} processes")
    accelerate_engine = [name for name in ("FSDP", "DEEPSPEED") if os.environ.get(f"ACCELERATE_USE_{name}") == "true"]
    if accelerate_engine and not (accelerate_engine == ["FSDP"] and cfg.fsdp):  # accelerate's own: not read here
        raise ConfigError(f"fsdp: accelerate launch's --use_{accelerate_engine[0].lower()} configures accelerate's "
                          "engine, which minigrpo does not use; drop it and pass --fsdp full_shard to minigrpo train")
    if cfg.dynamic_sampling and W > 1:
        raise ConfigError("dynamic_sampling: not supported with several processes (each would refill its share "
                          "to a different size); run it in one process")
