"""Train `tool_addition` with the tool's tokens masked out of the loss (the default) and left in it
(`train_on_tool_output=True`), on the same seeds and budget, and report what each run learned.

    OMP_NUM_THREADS=1 python scripts/compare_tool_masking.py                      # seeds 0 1 2, both settings
    OMP_NUM_THREADS=1 python scripts/compare_tool_masking.py --seeds 0 --out /tmp/masking
    python scripts/compare_tool_masking.py --report                                # the table of the shipped runs

Every run is docs/tools.md's tool_addition command (`minigrpo train --task tool_addition --learning-rate 3e-4
--max-steps 60 --eval-limit 300 --eval-num-samples 0`: greedy accuracy on the first 300 test problems before and
after, on the first 200 every 10 steps) with one field changed, `train_on_tool_output`. The two runs of a seed draw
the same prompts and start from the same weights; their first batches are the same, and they part after the first
update.

Besides the run's own summary, each trained model is scored on the *right* tool conversation of the same 300
problems, teacher-forced (the call to `add`, the tool's answer, the answer copied): the mean log-probability the
model gives to the tool's tokens, and to the digits of the tool's answer alone. A policy trained with the tool's
tokens in its loss is trained to predict what the tool writes; the masked policy never is.

The table (``--report``): greedy accuracy at steps 10 and 20 (first 200 test problems) and after the last step
(first 300); the mean training reward (sampled accuracy) over steps 1-20; the largest `tools/failure_frequency` of
any step (the share of calls that came back as an error: malformed, unknown tool, ...); the mean log-probability per
token of the tool's tokens, warm start -> trained model.

The small files of each run (metrics.jsonl, summary.json, config.yaml) are copied to
data/reference_runs/tool_masking/<masked|unmasked>_seed<N>/ (notebook 09 plots them), with results.json (this
script's table, as numbers). Models and completion logs are not kept.
"""

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a clone without installing

from minigrpo.config import load_config  # noqa: E402
from minigrpo.logprobs import completion_logprobs  # noqa: E402
from minigrpo.loading.models import load_model_and_tokenizer  # noqa: E402
from minigrpo.prompts import left_pad  # noqa: E402
from minigrpo.tasks import DATA_DIR, get_task  # noqa: E402
from minigrpo.tasks.tool_addition import tool_call_text  # noqa: E402
from minigrpo.tools import prompt_ids_with_tools, tool_schemas, tool_suffix_ids  # noqa: E402
from minigrpo.trainer import train  # noqa: E402

TARGET_DIR = DATA_DIR / "reference_runs" / "tool_masking"
KEEP = ("metrics.jsonl", "summary.json", "config.yaml")
# The README's command, as Config fields (everything else is a default).
BASE = dict(task="tool_addition", learning_rate=3e-4, max_steps=60, eval_limit=300, eval_num_samples=0)


def right_conversation_ids(tokenizer, task, row) -> tuple[list[int], list[int], list[int], list[int]]:
    """One problem's right tool conversation as the rollout builds it: (prompt ids, completion ids, tool mask, answer
    mask), the tool mask 0 on the tool message's tokens, the answer mask 1 on the digits of the tool's answer."""
    a, b = int(row["a"]), int(row["b"])
    eos = tokenizer.eos_token_id
    prompt = prompt_ids_with_tools(tokenizer, row["prompt"], tool_schemas(task.tools))
    call = tokenizer(tool_call_text("add", {"a": a, "b": b}), add_special_tokens=False)["input_ids"] + [eos]
    suffix = tool_suffix_ids(tokenizer, [{"role": "tool", "name": "add", "content": str(a + b)}])
    answer = tokenizer(str(a + b), add_special_tokens=False)["input_ids"] + [eos]
    digits = tokenizer(str(a + b), add_special_tokens=False)["input_ids"]
    start = next(i for i in range(len(suffix)) if suffix[i:i + len(digits)] == digits)  # the tool's answer in it
    tool_mask = [1] * len(call) + [0] * len(suffix) + [1] * len(answer)
    answer_mask = [0] * (len(call) + start) + [1] * len(digits) + [0] * (len(suffix) - start - len(digits) + len(answer))
    return prompt, call + suffix + answer, tool_mask, answer_mask


@torch.no_grad()
def tool_token_logprobs(model_dir, rows) -> dict:
    """Mean log-probability per token of the tool's tokens, of the digits of its answer, and of the policy's own
    tokens, over the right tool conversations of `rows`, teacher-forced."""
    task = get_task("tool_addition")
    model, tokenizer = load_model_and_tokenizer(model_dir)
    model.eval()
    pieces = [right_conversation_ids(tokenizer, task, row) for row in rows]
    pad = tokenizer.pad_token_id
    prompt_ids, prompt_mask = left_pad([p[0] for p in pieces], pad)  # (N, P)
    T = max(len(p[1]) for p in pieces)
    padded = lambda values, fill: torch.tensor([v + [fill] * (T - len(v)) for v in values])  # noqa: E731 (N, T)
    completion_ids = padded([p[1] for p in pieces], pad)
    completion_mask = padded([[1.0] * len(p[1]) for p in pieces], 0.0)
    tool_mask = padded([[float(m) for m in p[2]] for p in pieces], 1.0)
    answer_mask = padded([[float(m) for m in p[3]] for p in pieces], 0.0)
    logp, _ = completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask)  # (N, T)
    tool_tokens = completion_mask * (1 - tool_mask)
    policy_tokens = completion_mask * tool_mask
    mean = lambda mask: ((logp * mask).sum() / mask.sum()).item()  # noqa: E731
    return {"logp_tool_tokens": mean(tool_tokens), "logp_tool_answer_digits": mean(answer_mask),
            "logp_policy_tokens": mean(policy_tokens)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=TARGET_DIR, help="where the runs' small files go")
    parser.add_argument("--max-steps", type=int, default=BASE["max_steps"], help="a shorter run, to try the script")
    parser.add_argument("--report", action="store_true", help="only print the table of the runs already in --out")
    args = parser.parse_args()
    if args.report:
        print(report(args.out))
        return 0
    task = get_task("tool_addition")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        rows = task.load("test")[: BASE["eval_limit"]]
        warm = tool_token_logprobs(task.model_dir, rows)
        print("warm start:", json.dumps({k: round(v, 3) for k, v in warm.items()}), flush=True)
        for seed in args.seeds:
            for masked in (True, False):
                name = f"{'masked' if masked else 'unmasked'}_seed{seed}"
                cfg = load_config(None, {**BASE, "max_steps": args.max_steps, "seed": seed, "train_on_tool_output": not masked,
                                         "output_dir": str(Path(tmp) / name)})
                s = train(cfg, progress=False)
                result = {"name": name, "seed": seed, "train_on_tool_output": not masked,
                          "accuracy_before": s["accuracy_before"], "accuracy_after": s["accuracy_after"],
                          "tool_calls_greedy_before": s["eval_before"]["tool_calls_greedy"],
                          "tool_calls_greedy_after": s["eval_after"]["tool_calls_greedy"],
                          "wall_seconds": s["wall_seconds"], **tool_token_logprobs(Path(cfg.output_dir) / "model", rows)}
                results.append(result)
                print(json.dumps(result), flush=True)
                target = args.out / name
                shutil.rmtree(target, ignore_errors=True)
                target.mkdir(parents=True)
                for filename in KEEP:
                    shutil.copy(Path(cfg.output_dir) / filename, target / filename)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"warm_start": warm, "runs": results}, indent=2) + "\n")
    print(report(args.out))


def report(out: Path) -> str:
    """The comparison as a markdown table, from results.json and each run's metrics.jsonl in `out`."""
    results = json.loads((out / "results.json").read_text())
    lines = ["| seed | tool tokens in the loss | greedy accuracy at step 10 / 20 / last | training reward, steps 1-20 | "
             "peak tools/failure_frequency | log p of the tool's tokens |", "|---|---|---|---|---|---|"]
    warm = results["warm_start"]["logp_tool_tokens"]
    for r in results["runs"]:
        metrics = [json.loads(line) for line in (out / r["name"] / "metrics.jsonl").read_text().splitlines()]
        at = {m["step"]: m["eval/accuracy_greedy"] for m in metrics if "eval/accuracy_greedy" in m}
        early = [m["reward"] for m in metrics if m["step"] <= 20]
        failures = max(m["tools/failure_frequency"] for m in metrics)
        lines.append(f"| {r['seed']} | {'**yes**' if r['train_on_tool_output'] else 'no (masked)'} | "
                     f"{at.get(10, float('nan')):.1%} / {at.get(20, float('nan')):.1%} / {r['accuracy_after']:.1%} | "
                     f"{sum(early) / len(early):.3f} | {failures:.0%} | {warm:.2f} → {r['logp_tool_tokens']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
