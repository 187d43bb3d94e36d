"""`minigrpo show RUN [--step N]`: a step's groups from RUN/completions.jsonl, as readable tables.

    step 40, group 0: 769+175=        answer 944
      #  reward  correctness_reward  advantage  len  cut  completion
      0   1.000               1.000     +0.935   29       <think>5+9=14,7+7+1=15,...</think>944
      1   0.000               0.000     -0.935    6       <think></think>755
      ...

What TRL users see as the completions table: a prompt's G completions side by side, with what each earned
from every reward function and the advantage it was trained with.
"""

import argparse
import json
from pathlib import Path

from .errors import UsageError

__all__ = ["read_completions", "format_group", "main"]


def read_completions(run_dir: str | Path) -> list[dict]:
    """The records of RUN/completions.jsonl (run_log.completion_records), in the order they were written."""
    path = Path(run_dir) / "completions.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file (runs write it unless log_completions is false)")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _one_line(text, width: int) -> str:
    text = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False)
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 3] + "..."


def _number(x) -> str:
    return "   n/a" if x is None else f"{x:6.3f}"


def format_group(record: dict, width: int = 100) -> str:
    """One group as a small table: reward, each reward function, advantage, length, cut off, completion."""
    prompt = record["prompt"]
    if isinstance(prompt, list):  # chat messages: the last user turn says what was asked
        prompt = next((m["content"] for m in reversed(prompt) if m.get("role") == "user"), prompt)
    head = f"step {record['step']}, group {record['group']}: {_one_line(prompt, width)}"
    if "answer" in record:
        head += f"    answer {_one_line(record['answer'], 40)}"
    names = list(record["completions"][0]["rewards"]) if record["completions"] else []
    columns = ["#", " reward", *names, "advantage", " len", "cut", "ok", "completion"]
    lines = [head, "  " + "  ".join(columns)]
    for i, c in enumerate(record["completions"]):
        cells = [f"{i:>1}", f"{_number(c['reward']):>7}"]
        cells += [f"{_number(c['rewards'][n]):>{len(n)}}" for n in names]
        cells += [f"{c['advantage']:>+9.3f}", f"{c['length']:>4}", "cut" if c["truncated"] else "   ",
                  "ok" if c["correct"] else "  ", _one_line(c["text"], width)]
        lines.append("  " + "  ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="minigrpo show", description="A step's groups of completions, as tables.")
    p.add_argument("run", help="a run directory (with completions.jsonl)")
    p.add_argument("--step", type=int, default=None, help="which step (default: the last one logged)")
    p.add_argument("--width", type=int, default=100, help="cut prompts and completions to this many characters")
    args = p.parse_args(argv)
    records = read_completions(args.run)
    if not records:
        print(f"{args.run}/completions.jsonl is empty")
        return 1
    steps = sorted({r["step"] for r in records})
    step = steps[-1] if args.step is None else args.step
    chosen = [r for r in records if r["step"] == step]
    if not chosen:
        raise UsageError(f"--step {step}: not logged (steps {steps[0]}..{steps[-1]})")
    print("\n\n".join(format_group(r, args.width) for r in chosen))
    return 0
