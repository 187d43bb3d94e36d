"""`python -m minigrpo train | eval | plot | show | bench | bench-length | bench-logprobs | memory | ppo | reward-model |
options` (also installed as `minigrpo`).

    minigrpo train                                  # the embedded demo: tiny model, think_addition, GRPO, on CPU
    minigrpo train --loss-type dr_grpo --max-steps 100 --out runs/drgrpo
    minigrpo train --config run.yaml --seed 1       # YAML first, flags override
    minigrpo train --out runs/a --save-steps 20     # checkpoint every 20 steps into runs/a/checkpoints
    minigrpo train --out runs/a --save-steps 20 --resume runs/a   # after a crash: same flags, plus --resume
    minigrpo eval --model runs/grpo/model --split test
    minigrpo eval --task gsm8k --model Qwen/Qwen2.5-0.5B-Instruct --limit 200 --num-samples 0
    minigrpo train --config recipes/qwen2.5-0.5b-instruct_gsm8k_qlora.yaml   # a real model on one GPU (README)
    minigrpo train --task answer --dataset rows.jsonl --model DIR --reward-funcs my.py:score,r1_format_soft
    minigrpo plot runs/grpo runs/drgrpo --out plots/compare
    minigrpo show runs/grpo --step 40               # one step's groups: completions, rewards, advantages
    minigrpo bench --against trl                    # one GRPO step, minigrpo vs TRL, side by side (needs trl)
    minigrpo memory --shape tiny                    # peak memory: GRPO full / LoRA / QLoRA vs PPO with a critic
    minigrpo bench-length                           # peak memory and step time vs completion length, vs TRL
    minigrpo bench-logprobs                         # the log-prob pass alone: time and memory, side by side
    minigrpo ppo --max-steps 50 --lam 1 --out runs/ppo   # PPO with a critic (ppo_trainer.py): Config + PPOConfig flags
    minigrpo reward-model --loss bce --learning-rate 1e-3 --out runs/rm   # a reward model from the checker's labels
    minigrpo train --reward-funcs runs/rm,correctness --reward-weights 1,0   # GRPO on it, the checker only watched

Every Config field is a flag, with dashes or underscores: --num-generations 8 == --num_generations 8.
`minigrpo train --help` lists them with what each does; `minigrpo train --help lora` only those about LoRA.
Ctrl-C stops a run with one line: its last checkpoint and the command that resumes it.

Input minigrpo cannot use (a bad flag, a data file's bad line, a reward function that raises, a missing model
directory or config file, a loss that turned NaN) is one line and exit status 2. Anything else is a bug, here or
in a module you edited, and shows its traceback (errors.py).
"""

import argparse
import dataclasses
import json
import os
import shlex
import sys
import textwrap
import time
from pathlib import Path

from .config import ALIASES, Config, ConfigError, did_you_mean, field_choices, field_descriptions, load_config
from .errors import MinigrpoError

# One line, exit 2: minigrpo's own errors; FloatingPointError, the trainers' stop before a NaN loss or gradient
# reaches the weights; FileNotFoundError, a path the user gave (--config, --model, a run directory) that is not there.
USER_ERRORS = (MinigrpoError, ConfigError, FloatingPointError, FileNotFoundError)


def _parse_overrides(tokens: list[str]) -> dict:
    """['--max-steps', '10', '--bf16'] -> {'max_steps': '10', 'bf16': 'true'}; values are coerced by load_config."""
    overrides, i = {}, 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--"):
            raise ConfigError(f"{token}: expected a --flag")
        key, _, value = token[2:].partition("=")
        if not value:
            has_value = i + 1 < len(tokens) and not tokens[i + 1].startswith("--")
            value = tokens[i + 1] if has_value else "true"
            i += has_value
        overrides[key.replace("-", "_")] = value
        i += 1
    return overrides


def option_help(cls=Config, search: str | None = None, width: int = 110) -> str:
    """Every field of a config dataclass as a flag, grouped by section: its short flag, value, default, allowed
    values and description (config.field_descriptions: the comments in config.py). search: only the fields whose
    name or description contains it."""
    aliases = {field: short for short, field in ALIASES.items()} if cls is Config else {}
    choices, lines, section_shown = field_choices(), [], None
    for f in dataclasses.fields(cls):
        section, text = field_descriptions(cls).get(f.name, ("", ""))
        if search and search.lower() not in f"{f.name} {text}".lower():
            continue
        if section != section_shown:
            lines += ["", f"{section or 'options'}:"]
            section_shown = section
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        flags = f"--{f.name.replace('_', '-')}" + (f", --{aliases[f.name]}" if f.name in aliases else "")
        facts = [f"default {default!r}"] + ([f"one of: {', '.join(map(repr, choices[f.name]))}"]
                                            if f.name in choices else [])
        lines.append(f"  {flags} {_metavar(f.type)}   ({'; '.join(facts)})")
        lines += textwrap.wrap(text or "(no description)", width, initial_indent=" " * 6, subsequent_indent=" " * 6,
                               break_on_hyphens=False)
    return "\n".join(lines) if lines else f"no option mentions {search!r}"


def _metavar(annotation) -> str:
    """What a flag's value looks like, from the field's type."""
    text = str(annotation)
    for needle, shown in (("bool", "[true|false]"), ("list", "A,B,..."), ("dict", "JSON"), ("int", "N"),
                          ("float", "X")):
        if needle in text:
            return shown
    return "TEXT"


def options_markdown() -> str:
    """docs/options.md: every Config field in one table (flag, default, allowed values, description), generated
    from config.py's comments by `python -m minigrpo options --markdown`."""
    choices, described = field_choices(), field_descriptions()
    rows = ["# `minigrpo train` options", "",
            "Every field of `minigrpo.config.Config`, a flag of `minigrpo train` and a key of a `--config` YAML file,",
            "in config.py's order. Generated from config.py's comments: `python -m minigrpo options --markdown >",
            "docs/options.md` (a test checks it is current). TRL's names for these: `minigrpo.GRPOConfig`.", "",
            "| option | default | description |", "|---|---|---|"]
    short = {field: name for name, field in ALIASES.items()}
    for f in dataclasses.fields(Config):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        flag = f"`--{f.name.replace('_', '-')}`" + (f" (`--{short[f.name]}`)" if f.name in short else "")
        text = described[f.name][1].rstrip(".") + "."
        text += f" One of: {', '.join(map(repr, choices[f.name]))}." if f.name in choices else ""
        text = text.replace("|", "/").replace("<", "&lt;").replace(">", "&gt;")  # a table cell, not HTML
        rows.append(f"| {flag} | `{default!r}` | {text} |")
    return "\n".join(rows) + "\n"


def cmd_options(argv: list[str]) -> int:
    """`minigrpo options [WORD]`: the options mentioning WORD (all without); --markdown: docs/options.md's table."""
    if argv == ["--markdown"]:
        print(options_markdown(), end="")
        return 0
    print(option_help(search=argv[0] if argv else None))
    return 0


def resume_command(command: str, argv: list[str], out: str) -> str:
    """The command line that resumes an interrupted run: the same flags, without --overwrite-output-dir (and any
    --resume), plus --resume OUT."""
    kept, skip = [], False
    for token in argv:
        name = token[2:].partition("=")[0].replace("-", "_") if token.startswith("--") else None
        if skip and name is None:
            skip = False
            continue
        skip = name in ("resume", "resume_from_checkpoint", "overwrite_output_dir") and "=" not in token
        if name not in ("resume", "resume_from_checkpoint", "overwrite_output_dir"):
            kept.append(token)
    return f"minigrpo {command} " + " ".join(shlex.quote(t) for t in kept + ["--resume", out])


def _close_progress_bars() -> None:
    """End the progress bars' lines before a line of ours."""
    from tqdm import tqdm

    for bar in list(getattr(tqdm, "_instances", [])):
        bar.close()


def run_stoppable(command: str, argv: list[str], cfg: Config, run):
    """run() (a trainer), or, on Ctrl-C, one line on stderr: the last checkpoint and the command that resumes it.
    An error once the run has logged a step (a reward function that raised at step 40, say) gets the same words
    after its own, in its one line: what was kept, and how to go on from it."""
    started = time.time()
    try:
        return run()
    except USER_ERRORS as error:
        metrics = Path(cfg.output_dir) / "metrics.jsonl"
        written = metrics.stat() if metrics.is_file() else None
        if not (written and written.st_size and written.st_mtime >= started):
            raise  # stopped before this run logged anything: the error alone says it
        from .persistence.checkpoint import stopped_line

        _close_progress_bars()
        line = stopped_line(Path(cfg.output_dir), resume_command(command, argv, cfg.output_dir), cfg.to_dict())
        raise MinigrpoError(f"{error}; {line}") from error
    except KeyboardInterrupt:
        from .persistence.checkpoint import stopped_line

        _close_progress_bars()
        line = stopped_line(Path(cfg.output_dir), resume_command(command, argv, cfg.output_dir), cfg.to_dict())
        print(f"minigrpo {command}: {line}", file=sys.stderr)
        return None


def cmd_train(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__ if len(argv) == 1 else "")
        print("Options (every Config field; YAML keys take the same names):" if len(argv) == 1 else "", end="")
        print(option_help(search=argv[1] if len(argv) > 1 else None))
        return 0
    overrides = _parse_overrides(argv)
    cfg = load_config(overrides.pop("config", None), overrides)
    from .trainer import train

    s = run_stoppable("train", argv, cfg, lambda: train(cfg))
    if s is None:
        return 130
    if os.environ.get("RANK", "0") != "0":  # several processes: rank 0 reports for all
        return 0
    print(summary_line(s, cfg.output_dir))
    return 0


def summary_line(s: dict, output_dir: str) -> str:
    """ "think_addition grpo seed 0: greedy accuracy 26.2% -> 83.8%, ..., 100 steps in 67 s of training. Run: ..." """
    return (f"{s['task']} {s['loss_type']} seed {s['seed']}: {accuracy_change(s)}, {s['steps']} step"
            f"{'s' * (s['steps'] != 1)} in {s['wall_seconds']:.0f} s of training. Run: {output_dir}")


def accuracy_change(s: dict) -> str:
    """ "greedy accuracy 26.2% -> 83.8%, sampled 19.6% -> 61.8%" from a summary; "no accuracy (nothing to grade)"."""
    if s["accuracy_before"] is None:
        return "no accuracy (nothing to grade)"
    sampled = ""
    if s["accuracy_before_sampled"] is not None:
        sampled = f", sampled {s['accuracy_before_sampled']:.1%} -> {s['accuracy_after_sampled']:.1%}"
    return f"greedy accuracy {s['accuracy_before']:.1%} -> {s['accuracy_after']:.1%}{sampled}"


def refuse_unread(overrides: dict, reads: frozenset, command: str) -> None:
    """A `minigrpo train` flag that this command's trainer never reads is a one-line error, not silently ignored
    (a YAML file's keys are let through: one file may serve several commands)."""
    config_fields = {f.name for f in dataclasses.fields(Config)}
    for key in overrides:
        name = ALIASES.get(key, key)
        if name in config_fields and name not in reads:
            raise ConfigError(f"{name}: a `minigrpo train` setting that `minigrpo {command}` does not read "
                              f"(`minigrpo {command} --help` says which it reads)")


def cmd_ppo(argv: list[str]) -> int:
    from .ppo_trainer import CONFIG_KEYS as PPO_KEYS, PPOConfig, train_ppo

    ppo_fields = [f.name for f in dataclasses.fields(PPOConfig)]
    if argv and argv[0] in ("-h", "--help"):
        unread = sorted({f.name for f in dataclasses.fields(Config)} - PPO_KEYS)
        print(textwrap.fill("minigrpo ppo: the `minigrpo train` flags (see `minigrpo train --help`) but these, which "
                            "belong to the GRPO family's losses, updates, reference model and tools, and are refused:",
                            116))
        print(textwrap.fill(", ".join("--" + key.replace("_", "-") for key in unread), 116, initial_indent="  ",
                            subsequent_indent="  ", break_on_hyphens=False))
        print("plus PPOConfig's:")
        print(option_help(PPOConfig, search=argv[1] if len(argv) > 1 else None))
        return 0
    overrides = _parse_overrides(argv)
    refuse_unread(overrides, PPO_KEYS, "ppo")
    ppo = PPOConfig.from_flags({key: overrides.pop(key) for key in ppo_fields if key in overrides})
    cfg = load_config(overrides.pop("config", None), {"output_dir": "runs/ppo", **overrides},
                      command_keys=tuple(ppo_fields))
    s = run_stoppable("ppo", argv, cfg, lambda: train_ppo(cfg, ppo))
    if s is None:
        return 130
    print(summary_line(s, cfg.output_dir))
    return 0


def cmd_reward_model(argv: list[str]) -> int:
    from .reward_trainer import CONFIG_KEYS as REWARD_MODEL_KEYS, RewardConfig, train_reward_model

    reward_fields = [f.name for f in dataclasses.fields(RewardConfig)]
    if argv and argv[0] in ("-h", "--help"):
        print(textwrap.fill("minigrpo reward-model: train a reward model (reward_trainer.py) on --dataset rows in TRL's "
                            "format, or on the policy's samples labelled by the task's checker. The `minigrpo train` "
                            "flags it reads (--out, --model and --dataset are short for output_dir, "
                            "model_name_or_path and dataset_name; any other is refused):", 116))
        print(textwrap.fill(", ".join("--" + key.replace("_", "-") for key in sorted(REWARD_MODEL_KEYS)), 116,
                            initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False))
        print("and RewardConfig's:")
        print(option_help(RewardConfig, search=argv[1] if len(argv) > 1 else None))
        return 0
    overrides = _parse_overrides(argv)
    reward_cfg = RewardConfig.from_flags({key: overrides.pop(key) for key in reward_fields if key in overrides})
    if "max_steps" in overrides:  # TRL's RewardConfig has it; this trainer runs whole epochs over its rows
        raise ConfigError("max_steps: the reward-model trainer runs --num-train-epochs over its rows (a fraction such "
                          "as 0.5 for a shorter run); it has no step budget")
    refuse_unread(overrides, REWARD_MODEL_KEYS, "reward-model")
    cfg = load_config(overrides.pop("config", None), {"output_dir": "runs/rm", **overrides},
                      command_keys=tuple(reward_fields))
    s = train_reward_model(cfg, reward_cfg)
    if reward_cfg.loss == "step_labels":  # a token classifier: scored in Python by ProcessRewardModel
        held_out = "" if s["eval"] is None else (f": held-out AUC {s['eval']['auc']:.3f}, step accuracy "
                                                 f"{s['eval']['step_accuracy']:.3f}")
        print(f"process reward model ({s['loss']}, {s['train_rows']} rows, {s['steps']} steps){held_out}. Saved to "
              f"{s['output_dir']}: --reward-funcs {s['output_dir']} --advantage-estimator process")
        return 0
    held_out = "" if s["eval"] is None else (f": held-out AUC {s['eval']['auc']:.3f}, pairwise accuracy "
                                             f"{s['eval']['pairwise_accuracy']:.3f}")
    print(f"reward model ({s['loss']}, {s['train_rows']} rows, {s['steps']} steps){held_out}. Saved to "
          f"{s['output_dir']}: --reward-funcs {s['output_dir']}")
    return 0


def cmd_eval(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="minigrpo eval", description="Greedy accuracy, sampled accuracy and pass@k.")
    p.add_argument("--model", default=None, help="model directory or hub name (default: the task's shipped model)")
    p.add_argument("--task", default=Config.task)
    p.add_argument("--split", default="test")
    p.add_argument("--num-samples", type=int, default=8, help="k samples per problem for pass@1..k")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--limit", type=int, default=None, help="evaluate on the first N problems only")
    p.add_argument("--device", default="auto")
    p.add_argument("--dataset", default=None, help="a .jsonl/.parquet file, a folder or a hub name (see train)")
    p.add_argument("--dataset-config", default=None)
    p.add_argument("--chat-template-kwargs", default=None, help='JSON, e.g. \'{"enable_thinking": false}\'')
    p.add_argument("--answer-grader", default=Config.answer_grader,
                   help="numeric, or math_verify for LaTeX answers (MATH-500, AIME): the answer and gsm8k tasks")
    args = p.parse_args(argv)
    from .evaluate import evaluate
    from .loading.models import load_model_and_tokenizer, resolve_device
    from .tasks import get_task
    from .run import policy_path

    cfg = load_config(None, {"task": args.task, "model_name_or_path": args.model, "dataset_name": args.dataset,
                             "dataset_config": args.dataset_config, "chat_template_kwargs": args.chat_template_kwargs,
                             "answer_grader": args.answer_grader})
    task = get_task(cfg.task, answer_grader=cfg.answer_grader)
    model, tokenizer = load_model_and_tokenizer(policy_path(cfg, task), resolve_device(args.device))
    rows = task.load(args.split, cfg.dataset_name, cfg.dataset_config)[: args.limit]
    result = evaluate(model, tokenizer, task, rows, num_samples=args.num_samples, temperature=args.temperature,
                      chat_template_kwargs=cfg.chat_template_kwargs)
    print(json.dumps(result, indent=2))
    return 0


def cmd_plot(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="minigrpo plot", description="Plot one or several runs on shared axes.")
    p.add_argument("runs", nargs="+", help="run directories (each with a metrics.jsonl)")
    p.add_argument("--out", default=None, help="where to write PNGs (default: RUN/plots for one run)")
    p.add_argument("--window", type=int, default=10, help="moving-average window in steps")
    args = p.parse_args(argv)
    from .lab.plots import plot_runs

    out = args.out or (f"{args.runs[0]}/plots" if len(args.runs) == 1 else "plots")
    for path in plot_runs(args.runs, out, window=args.window):
        print(path)
    return 0


def cmd_show(argv: list[str]) -> int:
    from .lab.show import main as show_main

    return show_main(argv)


def cmd_bench(argv: list[str]) -> int:
    from .lab.bench import main as bench, parse_args

    args = parse_args(argv)
    if args.reward_model:
        from .lab.bench_reward_model import main as against_trl_scoring

        return against_trl_scoring(args)
    if args.against == "vllm":
        from .lab.bench_vllm import main as against_vllm

        return against_vllm(args)
    return bench(argv)


def cmd_bench_length(argv: list[str]) -> int:
    from .lab.bench_length import main as bench_length

    return bench_length(argv)


def cmd_bench_logprobs(argv: list[str]) -> int:
    from .lab.bench_logprobs import main as bench_logprobs

    return bench_logprobs(argv)


def cmd_memory(argv: list[str]) -> int:
    from .lab.memory_cli import main as memory_main

    return memory_main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = {"train": cmd_train, "eval": cmd_eval, "plot": cmd_plot, "show": cmd_show, "bench": cmd_bench,
                "bench-length": cmd_bench_length, "bench-logprobs": cmd_bench_logprobs, "memory": cmd_memory,
                "ppo": cmd_ppo, "reward-model": cmd_reward_model, "options": cmd_options}
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    if argv[0] not in commands:
        hint = did_you_mean(argv[0], commands)
        print(f"minigrpo: unknown command {argv[0]!r}{'; ' + hint if hint else ''} (commands: {', '.join(commands)}; "
              f"minigrpo --help shows what each does)", file=sys.stderr)
        return 2
    try:
        return commands[argv[0]](argv[1:])
    except USER_ERRORS as exc:
        print(f"minigrpo {argv[0]}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
