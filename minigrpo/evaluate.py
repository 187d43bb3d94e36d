"""Held-out evaluation: greedy accuracy, sampled accuracy and pass@k.

Greedy accuracy is deterministic and is the number to compare runs by. Sampled accuracy
(temperature 1 by default) is what GRPO actually optimizes: the mean reward of the policy's
own samples. pass@j asks whether at least one of j samples is right.

pass@j uses the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models
Trained on Code", Sec. 2.1): draw n >= j samples per problem, count c correct, then

    pass@j = E_problems[ 1 - C(n - c, j) / C(n, j) ]

All j = 1..k come from the same n = k samples (as nanochat does), so one batch of
sampling gives the whole curve; pass@1 equals the sampled accuracy.

Two models graded on the same problems are compared with a paired test, `mcnemar`, on the problems where
they disagree (`evaluate(..., per_problem=True)` gives each problem's greedy result).
"""

import functools
import math

import torch
from tqdm.auto import tqdm

from .generation.engines import GenerateEngine
from .parallel.processes import full_weights, is_main, say
from .rollout import sample_completions


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with ``c`` correct out of ``n`` samples: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every draw of k samples contains a correct one
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _generate_all(model, tokenizer, rows, *, num_generations, batch_size, tools=None, bar=None, **sampling):
    """Completions (grouped by prompt), their lengths (the policy's tokens) and tool calls per completion, generated
    ``batch_size`` sequences at a time; with ``tools`` (tools.ToolSetup) through the multi-turn tool loop. bar: a
    progress bar (tqdm) that counts the completions."""
    prompts_per_batch = max(1, batch_size // num_generations)
    completions, lengths, calls = [], [], []
    for start in range(0, len(rows), prompts_per_batch):
        chunk = rows[start:start + prompts_per_batch]
        if tools is None:
            rollout = sample_completions(model, tokenizer, [row["prompt"] for row in chunk],
                                         num_generations=num_generations, **sampling)
            calls += [0] * len(rollout.completions)
            lengths += rollout.completion_lengths.tolist()
        else:
            rollout = tools.sample(GenerateEngine(model, tokenizer), chunk, num_generations=num_generations, **sampling)
            calls += rollout.num_tool_calls.tolist()
            lengths += rollout.policy_mask.sum(1).tolist()
        completions += rollout.completions
        if bar is not None:
            bar.update(len(rollout.completions))
    return completions, lengths, calls


@torch.no_grad()
def evaluate(model, tokenizer, task, rows, *, num_samples: int = 0, temperature: float = 1.0, batch_size: int = 256,
             max_completion_length: int | None = None, chat_template_kwargs: dict | None = None,
             per_problem: bool = False, tools=None, progress: str | None = None) -> dict:
    """Score ``model`` on ``rows`` (dicts with a "prompt" and what ``task.grade`` reads, e.g. "answer").

    Always: ``accuracy_greedy``, ``format_greedy`` and ``mean_length_greedy`` (completion
    tokens, eos included). With ``num_samples = k > 0`` also ``accuracy_sampled``,
    ``format_sampled``, ``mean_length_sampled`` and ``pass@1`` .. ``pass@k`` from k samples
    per problem. ``batch_size`` is the number of sequences generated at once; each completion gets up to
    ``max_completion_length`` tokens (None: the task's own). Conversational prompts go through the chat template
    with ``chat_template_kwargs`` (prompts.py). ``per_problem``: also ``correct_greedy``, one bool per row, for a
    paired comparison of two models on the same rows (``mcnemar``). ``tools`` (tools.ToolSetup): completions come
    from the multi-turn tool loop, and ``tool_calls_greedy`` (tool calls per greedy completion) is reported too.
    ``progress``: a label ("before training"); a progress bar with an estimate of the time left is shown while the
    completions are generated (greedy, then num_samples per problem), and removed when they are done.
    """
    if not task.graded:  # the prompts task: no answers, so no accuracy (and nothing generated for it)
        return {"num_problems": 0, "accuracy_greedy": None, "format_greedy": None, "mean_length_greedy": None}
    results = {"num_problems": len(rows)}
    bar = tqdm(total=len(rows) * (1 + num_samples), desc=f"{progress}: evaluating", unit="completion", leave=False,
               disable=not progress, dynamic_ncols=True)
    generate = lambda k, **sampling: _generate_all(  # noqa: E731
        model, tokenizer, rows, num_generations=k, batch_size=batch_size,
        max_completion_length=max_completion_length or task.max_completion_length,
        chat_template_kwargs=chat_template_kwargs, tools=tools, bar=bar, **sampling)

    completions, lengths, calls = generate(1, do_sample=False)
    correct = [bool(task.grade(c, row)) for c, row in zip(completions, rows)]
    results["accuracy_greedy"] = sum(correct) / len(rows)
    if per_problem:
        results["correct_greedy"] = correct
    results["format_greedy"] = sum(task.is_well_formed(c) for c in completions) / len(rows)
    results["mean_length_greedy"] = sum(lengths) / len(lengths)
    if tools is not None:
        results["tool_calls_greedy"] = sum(calls) / len(calls)

    if num_samples > 0:
        k = num_samples
        completions, lengths, _ = generate(k, do_sample=True, temperature=temperature)
        correct = [task.grade(c, rows[i // k]) for i, c in enumerate(completions)]  # grouped: row i*k.. is prompt i
        num_correct = [sum(correct[i * k:(i + 1) * k]) for i in range(len(rows))]
        results["accuracy_sampled"] = sum(correct) / len(correct)
        results["format_sampled"] = sum(task.is_well_formed(c) for c in completions) / len(completions)
        results["mean_length_sampled"] = sum(lengths) / len(lengths)
        for j in range(1, k + 1):
            results[f"pass@{j}"] = sum(pass_at_k(k, c, j) for c in num_correct) / len(rows)
    bar.close()
    return results


def mcnemar(correct_a: list[bool], correct_b: list[bool]) -> dict:
    """McNemar's exact test: do models A and B, graded on the *same* problems, differ in accuracy?

    Only the discordant problems carry information: b = right for A only, c = right for B only. If the two are
    equally good, each discordant problem is a fair coin, so b ~ Binomial(b + c, 1/2), and the two-sided p-value is

        p = min(1, 2 * sum_{i <= min(b, c)} C(b + c, i) / 2^(b + c))

    (McNemar 1947; the exact binomial form for small counts). This is the right yardstick when both accuracies
    come from the same problems: the problems both get right or both get wrong cancel, which an unpaired
    standard error of the difference ignores (it treats the two accuracies as independent and overstates the noise
    when the models agree on most problems). Returns {"n", "accuracy_a", "accuracy_b", "only_a", "only_b",
    "p_value"}.
    """
    if len(correct_a) != len(correct_b) or not correct_a:
        raise ValueError(f"need two equally long, non-empty lists, got {len(correct_a)} and {len(correct_b)}")
    only_a = sum(bool(a) and not bool(b) for a, b in zip(correct_a, correct_b))
    only_b = sum(bool(b) and not bool(a) for a, b in zip(correct_a, correct_b))
    discordant = only_a + only_b
    tail = sum(math.comb(discordant, i) for i in range(min(only_a, only_b) + 1)) / 2 ** discordant
    return {"n": len(correct_a), "accuracy_a": sum(map(bool, correct_a)) / len(correct_a),
            "accuracy_b": sum(map(bool, correct_b)) / len(correct_b), "only_a": only_a, "only_b": only_b,
            "p_value": min(1.0, 2 * tail)}


def evaluator(model, tokenizer, task, max_completion_length: int | None = None, temperature: float = 1.0,
              chat_template_kwargs: dict | None = None, tools=None):
    """evaluate() with one run's settings fixed: evaluate_on(rows, num_samples=0, ...) -> evaluate()'s accuracies."""
    return functools.partial(evaluate, model, tokenizer, task, temperature=temperature,
                             max_completion_length=max_completion_length, chat_template_kwargs=chat_template_kwargs,
                             tools=tools)


def eval_due(step: int, eval_steps: int, max_steps: int) -> bool:
    """Whether this step ends with a greedy evaluation: every eval_steps steps, and the last step (0 = never)."""
    return bool(eval_steps) and (step % eval_steps == 0 or step == max_steps)


def evaluate_on_main(policy, evaluate_on, rows: list[dict], num_samples: int = 0, label: str | None = None):
    """evaluate_on(rows) on the main process, the whole weights gathered first (FSDP2); None on the others.
    label ("before training"): a progress bar while it runs, and one line with the result as soon as it is known."""
    with full_weights(policy):
        if not is_main():
            return None
        result = evaluate_on(rows, num_samples=num_samples, progress=label or None)
    if label:
        say(accuracy_line(label, result))
    return result


def accuracy_line(label: str, result: dict) -> str:
    """ "before training: greedy accuracy 26.2% on 500 problems, sampled 19.6%, pass@8 67.4% (length 15.2)"."""
    n = result["num_problems"]
    if result["accuracy_greedy"] is None:
        return f"{label}: no answers to grade (rows scored by the reward functions alone): no evaluation"
    line = f"{label}: greedy accuracy {result['accuracy_greedy']:.1%} on {n} problem{'s' * (n != 1)}"
    if "accuracy_sampled" in result:
        k = max(int(key.split("@")[1]) for key in result if key.startswith("pass@"))
        line += f", sampled {result['accuracy_sampled']:.1%}, pass@{k} {result[f'pass@{k}']:.1%}"
    return line + f" (greedy length {result['mean_length_greedy']:.1f} tokens)"
