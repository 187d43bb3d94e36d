"""Steps 1 to 3 of the loop: prompts in, a Batch of scored completions with their advantages out.

    sampler.take(prompts)              which prompts, in a seeded order                 batch.PromptSampler
    sample_round                       G completions per prompt (the engine, or the multi-turn tool loop),
                                       every reward function on each (rewards.py), advantages (advantages.py)
    collect_batch                      one round; with dynamic_sampling (DAPO), more rounds until the batch
                                       holds enough groups whose rewards differ

Like the trainers, these read the run's Config (which estimator, G, the sampler's settings, ...); what they call
takes values.
"""

import warnings

import torch
import torch.nn.functional as F

from . import advantages
from .advantages import gfpo_keep, kl_penalized_rewards
from .batch import Batch, PromptSampler
from .errors import ConfigError
from .generation.engines import sampling_options
from .logprobs import completion_logprobs
from .parallel import processes
from .prompts import completions_for_rewards
from .reward_logs import RewardLogs
from .rewards import combine_rewards, score_completions
from .step_rewards import step_tensors, steps_with_outcome, token_starts
from .tools import ToolSetup

__all__ = ["collect_batch", "sample_round"]


def sample_round(cfg, engine, prompt_rows: list[dict], reward_funcs: list, reward_weights: list[float], max_len: int,
                 policy=None, ref_model=None, tools: ToolSetup | None = None, on_phase=None,
                 reward_logs: RewardLogs | None = None) -> Batch:
    """Sample G completions for each prompt row, score them, and compute their advantages: a Batch.

    policy, ref_model: for kl_in_reward, which subtracts beta * KL(policy || ref) from each reward, and (policy) for
    an estimator that reads the sampling policy's token statistics (the optimal token baseline).
    tools: the multi-turn rollout (tools/loop.py) instead of single-turn sampling.
    With num_remains_in_group (GFPO), only the kept k of each group's G completions are returned. With ReMax, each
    prompt's greedy completion is sampled with its group (one more row), scored, and kept only as the baseline.
    on_phase(text): told what is about to take time ("sampling ...", "scoring ..."), e.g. a progress bar's
    postfix; the place where a slow scorer (a reward model) is announced. reward_logs: the run's trainer_state and
    loggers, handed to every reward function as TRL hands them (reward_logs.py; None: a state at step 0)."""
    G = cfg.num_generations
    reward_logs = reward_logs or RewardLogs()
    say = on_phase or (lambda text: None)
    needs = advantages.ESTIMATOR_NEEDS.get(cfg.advantage_estimator, frozenset())
    greedy = " and a greedy one per prompt" if "greedy_rewards" in needs else ""  # ReMax's baseline
    say(f"sampling {len(prompt_rows) * G} completions{greedy}")
    roll = _sample(cfg, engine, prompt_rows, max_len, tools, with_greedy="greedy_rewards" in needs)
    rows = [r for r in prompt_rows for _ in range(G)]  # one dataset row per completion, grouped like the rollout
    if "greedy_rewards" in needs:  # rows i*(G+1) .. i*(G+1)+G-1 sampled, row i*(G+1)+G greedy: greedy ones last
        sampled = torch.arange(len(roll.completions)) % (G + 1) < G
        roll, rows = roll.select(torch.cat([sampled.nonzero()[:, 0], (~sampled).nonzero()[:, 0]])), rows + prompt_rows

    # Score: every reward function gets TRL's arguments — prompts, completions, and every dataset column but those
    # TRL leaves out (a reference "completion" column is not the sampled one).
    prompts = [r["prompt"] for r in rows]  # strings, or lists of chat messages
    columns = {k: [r[k] for r in rows] for k in rows[0] if k not in ("prompt", "completion", "completion_ids")}
    columns["completion_ids"] = [ids[m.bool()].tolist() for ids, m in zip(roll.completion_ids, roll.completion_mask)]
    if tools and roll.environments is not None:  # TRL's name: reward functions read each completion's environment
        columns["environments"] = roll.environments
    if tools:  # the whole multi-turn text, which step rewards' character offsets index (step_rewards.py)
        columns["completion_text"] = roll.completions
    completions = roll.messages if tools else completions_for_rewards(prompts, roll.completions)
    say(f"scoring {len(completions)} completions with {len(reward_funcs)} reward function(s)")
    graded_steps = {}  # {j: each completion's StepRewards} from the function j that grades steps, if any
    rewards_per_func, unscorable = score_completions(reward_funcs, prompts, completions, columns, steps=graded_steps,
                                                     timeout=cfg.reward_timeout or None, context=reward_logs.kwargs())
    logged_columns = reward_logs.take_columns(len(completions))  # log_extra's: one value per completion
    steps = _step_tensors(engine, roll, columns["completion_ids"], graded_steps)  # (N, K) each, or None
    if steps is not None:  # a step reward beyond float32 (inf) makes its completion unscorable, as a reward does
        unscorable = unscorable | steps[0].isinf().any(1)
    rewards = combine_rewards(rewards_per_func, unscorable, reward_weights)  # (N,), NaN = unscorable
    greedy_rewards = None
    if "greedy_rewards" in needs:
        N = len(prompt_rows) * G
        greedy_rewards, rewards, rewards_per_func = rewards[N:], rewards[:N], rewards_per_func[:N]
        steps = None if steps is None else (steps[0][:N], steps[1][:N])
        roll, rows = roll.select(torch.arange(N)), rows[:N]
        logged_columns = {column: values[:N] for column, values in logged_columns.items()}
    batch = Batch(roll.prompt_ids, roll.prompt_mask, roll.completion_ids, roll.completion_mask, roll.is_truncated,
                  rewards, rewards_per_func, roll.completions, rows, sampling_logp=roll.sampling_logp,
                  logged_columns=logged_columns)
    if steps is not None:
        batch.step_rewards, batch.step_end = steps[0].masked_fill(rewards.isnan().unsqueeze(1), float("nan")), steps[1]
    if tools:
        batch.tool_mask, batch.messages = roll.tool_mask, roll.messages
        batch.tool_counts = {"calls": roll.num_tool_calls, "failed": roll.num_failed_calls,
                             "turns": roll.num_tool_turns}
    if cfg.kl_in_reward and cfg.beta > 0:
        with torch.no_grad():
            ids = (batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
            options = dict(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                           share_prompts=cfg.shared_prefix)
            logp, _ = completion_logprobs(policy, *ids, **options)
            ref_logp, _ = completion_logprobs(ref_model, *ids, **options)
        batch.rewards = kl_penalized_rewards(rewards, logp.cpu(), ref_logp.cpu(), batch.policy_mask.cpu(), cfg.beta)
    if cfg.num_remains_in_group:  # GFPO: train on the k shortest (or most reward per token) of each group
        lengths = batch.policy_mask.sum(-1).cpu()
        batch = batch.select(gfpo_keep(batch.rewards, lengths, G, cfg.num_remains_in_group, cfg.gfpo_filter))
        G = cfg.num_remains_in_group
    token_stats = None
    if "token_stats" in needs:
        say("log pi and sum pi^2 of the sampled tokens (the sampling policy, no gradient)")
        token_stats = _token_stats(cfg, policy, batch)
        batch.old_logp = token_stats[0]  # log pi_old, taken once: the update's ratio reads it too (prepare_update)
    batch.adv, batch.zero_std = _advantages(cfg, batch, G, reward_weights, greedy_rewards, token_stats,
                                            step_func=next(iter(graded_steps), None))
    return batch


def _advantages(cfg, batch: Batch, G: int, reward_weights, greedy_rewards, token_stats, step_func: int | None = None
                ) -> tuple:
    """(adv, zero_std) of this rank's rows. Advantages need the group's rewards (always on this rank) or, for
    scale_rewards="batch", the whole batch's: with several processes, gather every rank's rewards (and what the
    estimator reads besides), then keep this rank's share. adv is (N,), or (N, T) for a per-token estimator.
    step_func: the reward function that graded steps (process supervision), if one did."""
    lengths = batch.policy_mask.sum(-1).cpu()  # (N,) the policy's tokens, for the estimators that weigh by length
    gathered = [torch.cat(processes.gather_objects(x)) for x in (batch.rewards, lengths, batch.rewards_per_func)]
    x = advantages.AdvantageInputs(gathered[0], G, gathered[1], cfg.scale_rewards, cfg.std_type, cfg.pass_k)
    if greedy_rewards is not None:
        x.greedy_rewards = torch.cat(processes.gather_objects(greedy_rewards))  # (P * W,)
    if token_stats is not None:  # (N, T) each, padded to the widest rank's T
        x.old_logp, x.sum_pi_squared, x.mask = (_gather_padded(t) for t in (*token_stats, batch.policy_mask.cpu()))
    if batch.step_rewards is not None:  # process supervision: the graded steps, the outcome one more step
        trained = steps_with_outcome(batch.step_rewards, batch.step_end, batch.rewards_per_func, batch.rewards,
                                     batch.completion_mask, reward_weights, step_func=step_func)
        x.step_rewards, x.step_end, x.num_tokens = _gathered(*trained, batch.completion_ids.shape[1])
        x.prefix_steps = cfg.prefix_step_rewards
    gdpo = cfg.multi_objective_aggregation == "normalize_then_sum"  # GDPO: each reward function normalised alone
    adv, zero_std = advantages.compute_advantages(x, cfg.advantage_estimator, reward_weights=reward_weights,
                                                  rewards_per_func=gathered[2] if gdpo else None)
    share = slice(processes.rank() * len(batch), (processes.rank() + 1) * len(batch))
    adv = adv[share] if adv.dim() == 1 else adv[share, :batch.completion_ids.shape[1]]
    return adv, zero_std[share]


@torch.no_grad()
def _token_stats(cfg, policy, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi_old of each sampled token and sum_v pi_old(v)^2 at its position, (N, T) each on the CPU: the policy
    that sampled, before any update (in eval mode, as the old log-probs of the update are taken)."""
    if policy is None:
        raise ValueError(f"advantage_estimator {cfg.advantage_estimator!r} reads the sampling policy: pass policy")
    was_training = policy.training
    policy.eval()
    ids = (batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
    logp, _, sum_pi_squared = completion_logprobs(policy, *ids, temperature=cfg.temperature, top_k=cfg.top_k,
                                                  top_p=cfg.top_p, share_prompts=cfg.shared_prefix,
                                                  with_sum_pi_squared=True)
    policy.train(was_training)
    return logp.float().cpu(), sum_pi_squared.float().cpu()


def _gather_padded(x: torch.Tensor) -> torch.Tensor:
    """(N, T) tensors of every rank, right-padded with 0 to the widest and stacked in rank order: (N * W, T_max)."""
    parts = processes.gather_objects(x)
    width = max(p.shape[1] for p in parts)
    return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in parts])


def _step_tensors(engine, roll, ids: list[list[int]], graded_steps: dict
                  ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The graded steps as (step_rewards, step_end), (N, K) each, every step's end mapped from characters to the
    completion's tokens (ids) through the offsets of the engine's tokenizer (step_rewards.py); None when no function
    graded steps. Only step rewards read `engine.tokenizer`: an engine needs no more than engines.py's two methods."""
    if not graded_steps:
        return None
    (steps,) = graded_steps.values()
    starts = token_starts(engine.tokenizer, roll.completions, ids)
    return step_tensors(steps, starts, [len(t) for t in roll.completions])


def _gathered(step_rewards: torch.Tensor, step_end: torch.Tensor, num_tokens: int
              ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Every process's step tensors, padded to the most steps (K), and the widest completion tensor (T): what the
    per-token estimator computes on. One process: its own tensors and T."""
    gathered = processes.gather_objects((step_rewards, step_end, num_tokens))
    K = max(r.shape[1] for r, _, _ in gathered)
    pad = lambda x, fill: F.pad(x, (0, K - x.shape[1]), value=fill)  # noqa: E731
    return (torch.cat([pad(r, float("nan")) for r, _, _ in gathered]), torch.cat([pad(e, 0) for _, e, _ in gathered]),
            max(t for _, _, t in gathered))


def _sample(cfg, engine, rows: list[dict], max_len: int, tools: ToolSetup | None, with_greedy: bool = False):
    """G completions per row's prompt: the engine's single-turn sampling, or the multi-turn rollout with tools.
    with_greedy: one more row per prompt, its greedy completion (ReMax's baseline; single-turn engines)."""
    sampling = sampling_options(cfg.temperature, cfg.top_p, cfg.top_k)
    if with_greedy:
        if tools is not None:
            raise ConfigError(f"advantage_estimator: {cfg.advantage_estimator} needs a greedy completion per prompt, "
                              "which the multi-turn rollout with tools does not sample")
        sampling["with_greedy"] = True  # an engine that does not know it fails loudly (TypeError), as top_k does
    if tools is None:
        return engine.generate([row["prompt"] for row in rows], num_generations=cfg.num_generations,
                               max_completion_length=max_len, **sampling)
    return tools.sample(engine, rows, num_generations=cfg.num_generations, max_completion_length=max_len,
                        chat_template_kwargs=cfg.chat_template_kwargs, **sampling)


def collect_batch(cfg, engine, sampler: PromptSampler, reward_funcs: list, reward_weights: list[float], max_len: int,
                  policy=None, ref_model=None, tools: ToolSetup | None = None, on_phase=None,
                  reward_logs: RewardLogs | None = None) -> Batch:
    """Steps 1-3 of the loop: a Batch of this process's generation_batch_size / W completions. on_phase,
    reward_logs: see sample_round.

    With dynamic_sampling (DAPO, Yu et al. 2025, sec. 3.2), groups whose rewards are all equal (advantage 0:
    nothing to learn) are dropped and more prompts are sampled until the batch is full, for at most
    max_dynamic_sampling_rounds rounds; the batch may then hold fewer groups. If no round found a single
    useful group, the last round is kept whole (every advantage 0)."""
    num_prompts = cfg.generation_batch_size // cfg.num_generations // processes.world_size()
    sample = lambda: sample_round(cfg, engine, sampler.take(num_prompts), reward_funcs, reward_weights,  # noqa: E731
                                  max_len, policy, ref_model, tools, on_phase, reward_logs)
    batch = sample()
    zero_std_sampled = [batch.zero_std]
    if cfg.dynamic_sampling:
        batch, zero_std_sampled = _dynamic_sampling(batch, sample, cfg.max_dynamic_sampling_rounds,
                                                    pad_id=getattr(engine.tokenizer, "pad_token_id", None) or 0)
    # The logged zero-std fraction is of what was *sampled*, so that dynamic sampling does not hide it.
    batch.zero_std_sampled = torch.cat(zero_std_sampled)
    batch.sampling_rounds = len(zero_std_sampled)
    _warn_if_nothing_to_learn(batch, max_len, cfg.advantage_estimator)
    return batch


def _dynamic_sampling(first: Batch, sample, max_rounds: int, pad_id: int) -> tuple[Batch, list[torch.Tensor]]:
    """DAPO's loop over rounds: keep the groups of each round whose rewards differ, until there are as many
    completions as one round has. Returns the batch (trimmed to that size) and each round's zero_std."""
    size = len(first)
    kept, zero_std_sampled, part = [first.select(~first.zero_std)], [first.zero_std], first
    while sum(len(p) for p in kept) < size and len(zero_std_sampled) < max_rounds:
        part = sample()
        zero_std_sampled.append(part.zero_std)
        kept.append(part.select(~part.zero_std))
    kept = [p for p in kept if len(p)]
    if not kept:  # no round had a group to learn from: keep the last round as it is
        kept = [part]
    return Batch.concat(kept, pad_id, size), zero_std_sampled


def _warn_if_nothing_to_learn(batch: Batch, max_len: int, estimator: str) -> None:
    """Python's warnings say each of these once per run (same words every time)."""
    if estimator == "process" and batch.step_rewards is None:
        warnings.warn("advantage_estimator 'process': no reward function returned step rewards (StepRewards), so the "
                      "outcome is the only step: GRPO with the population std; add a step checker to reward_funcs "
                      "(steps, arithmetic_steps, or your own: minigrpo/step_rewards.py)", stacklevel=3)
    if batch.is_truncated.float().mean() > 0.5:  # the classic trap: the answer never fits, every reward is 0
        warnings.warn(f"over half of a batch's completions reached max_completion_length={max_len} without an eos; "
                      f"cut-off answers usually score 0 and teach nothing: raise max_completion_length", stacklevel=3)
    if batch.rewards.isnan().all():
        warnings.warn("a step had nothing to learn from: every reward of its batch was None or NaN (do the reward "
                      "functions apply to this task?); its loss is 0 and metrics.jsonl logs its reward as null",
                      stacklevel=3)
