"""Checkpoints and resume: a run killed with SIGKILL and resumed ends exactly where an uninterrupted run ends.

The lesson: a checkpoint is more than the weights. Leave out the optimizer's moments, the RNG states or the
prompt sampler's position, and the resumed run still trains, but it is a different run: its metrics drift
from the uninterrupted one from the first step after the resume. These tests compare every metric (timings
aside) for equality, so any missing piece makes them fail.
"""

import io
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minigrpo.persistence.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint, truncate_metrics
from minigrpo.cli import main
from minigrpo.rewards import shuffled
from minigrpo.trainer import PromptSampler

REPO = Path(__file__).resolve().parents[1]
TIMING = {"step_seconds", "generate_seconds", "tokens_per_second"}


def flags(model_dir, out, **extra) -> list[str]:
    """A short CLI run on the very small random model: 10 steps, a checkpoint every 3."""
    values = dict(model=model_dir, task="addition", max_steps=10, save_steps=3, num_generations=4,
                  generation_batch_size=8, reward_funcs="overlong,correctness", learning_rate=1e-3, eval_steps=5,
                  eval_num_problems=4, eval_limit=4, eval_num_samples=2, save_model="false", out=out)
    values.update(extra)
    return [token for key, value in values.items() for token in (f"--{key.replace('_', '-')}", str(value))]


def metrics(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def steps_on_disk(run: Path) -> tuple[int, int]:
    """(newest checkpoint step, last metrics step) as a crash left them."""
    newest = int(latest_checkpoint(run).stem.split("-")[1])
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.endswith("}")]
    return newest, lines[-1]["step"]


def process_tree(pid: int) -> list[int]:
    """pid and all its descendants (Linux /proc): torchrun starts each worker in a session of its own."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a process that ended meanwhile
        children.setdefault(parent, []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    return tree


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except OSError:
        return False


def start_and_kill(command: list[str], killed: Path, env: dict) -> int:
    """Start `command` (a run writing to `killed`); SIGKILL it and every process it started (no cleanup, no atexit)
    as soon as a checkpoint exists. Returns the step of the newest checkpoint the crash left."""
    log = killed.with_name(killed.name + ".log")
    with open(log, "w") as stderr:
        proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
        hang_guard = time.monotonic() + 600  # not a timing assertion: only stops a broken run from hanging CI
        while proc.poll() is None and not list((killed / "checkpoints").glob("step-*")):  # whole ones only
            assert time.monotonic() < hang_guard, "no checkpoint appeared"
            time.sleep(0.02)
        tree = process_tree(proc.pid)
        for pid in tree:
            os.kill(pid, signal.SIGKILL)
        returncode = proc.wait()
        while any(running(pid) for pid in tree[1:]):  # the workers are gone before anything reads their files
            time.sleep(0.02)
    assert returncode == -signal.SIGKILL, f"the run ended before it could be killed:\n{log.read_text()[-2000:]}"
    assert not (killed / "summary.json").exists()
    checkpoint_step, metrics_step = steps_on_disk(killed)
    assert checkpoint_step < 10 and checkpoint_step <= metrics_step <= checkpoint_step + 3
    return checkpoint_step


def assert_resumed_equals_whole(killed: Path, whole: Path, checkpoint_step: int) -> None:
    resumed, uninterrupted = (json.loads((run / "summary.json").read_text()) for run in (killed, whole))
    assert resumed["resumed_from_step"] == checkpoint_step  # only the steps after the newest checkpoint are redone
    assert [m["step"] for m in metrics(killed)] == list(range(1, 11))  # each step once
    assert metrics(killed) == metrics(whole)
    # completions.jsonl too: cut back to the checkpoint's step on resume, then continued line for line
    assert (killed / "completions.jsonl").read_text() == (whole / "completions.jsonl").read_text()
    assert resumed["eval_before"] == uninterrupted["eval_before"] and resumed["eval_after"] == uninterrupted["eval_after"]


def test_sigkill_then_resume_equals_an_uninterrupted_run(tmp_path, random_model_dir, one_thread):
    # 1. Start a run in its own process; SIGKILL it as soon as a checkpoint exists.
    killed = tmp_path / "killed"
    checkpoint_step = start_and_kill([sys.executable, "-m", "minigrpo", "train", *flags(random_model_dir, killed)],
                                     killed, one_thread)

    # 2. Resume with the same flags plus --resume; 3. the same run, never interrupted.
    assert main(["train", *flags(random_model_dir, killed), "--resume", str(killed)]) == 0
    assert main(["train", *flags(random_model_dir, tmp_path / "whole")]) == 0

    assert_resumed_equals_whole(killed, tmp_path / "whole", checkpoint_step)
    assert [p.name for p in sorted((killed / "checkpoints").iterdir())] == ["step-000006.pt", "step-000009.pt"]


def test_sigkill_then_resume_under_fsdp_equals_an_uninterrupted_run(tmp_path, random_model_dir, one_thread):
    """The same crash with 2 processes sharding the model (FSDP2): each writes its shards of the weights and of the
    optimizer state (torch.distributed.checkpoint), both are killed at once, and both resume exactly."""
    from test_distributed import TORCHRUN, free_port

    def command(out: Path, *extra: str) -> list[str]:
        return [*TORCHRUN, "--nproc-per-node", "2", "--master-port", str(free_port()), "-m", "minigrpo", "train",
                *flags(random_model_dir, out), "--fsdp", "full_shard", *extra]

    killed = tmp_path / "killed"
    checkpoint_step = start_and_kill(command(killed), killed, one_thread)
    for run in (command(killed, "--resume", str(killed)), command(tmp_path / "whole")):
        done = subprocess.run(run, cwd=REPO, env=one_thread, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    assert_resumed_equals_whole(killed, tmp_path / "whole", checkpoint_step)
    checkpoints = sorted((killed / "checkpoints").iterdir())
    assert [p.name for p in checkpoints] == ["step-000006", "step-000009"]  # folders of shards
    assert sorted(p.name for p in checkpoints[-1].iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp",
                                                                 "state.pt"]


def test_resume_with_other_settings_is_refused(tmp_path, random_model_dir, capsys, one_thread):
    run = tmp_path / "run"
    assert main(["train", *flags(random_model_dir, run, max_steps=3)]) == 0
    capsys.readouterr()
    assert main(["train", *flags(random_model_dir, run, max_steps=3, learning_rate=0.5), "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # (above it: transformers' loading bar)
    assert err.startswith("minigrpo train: error: resume_from_checkpoint: ")
    assert "learning_rate (0.001 in the checkpoint, 0.5 now)" in err


def test_a_checkpoint_that_predates_a_config_field_resumes_at_its_default(tmp_path, random_model_dir, capsys,
                                                                           one_thread):
    """A checkpoint written before a field existed has no value for it; left at its default (which keeps what earlier
    runs computed) the run resumes, set to anything else it is another run and is refused."""
    run = tmp_path / "run"
    assert main(["train", *flags(random_model_dir, run, max_steps=3)]) == 0
    checkpoint = latest_checkpoint(run)
    state = torch.load(checkpoint, weights_only=True)
    for key in ("top_k", "shared_prefix"):  # as if written before these fields were added
        del state["config"][key]
    torch.save(state, checkpoint)
    capsys.readouterr()
    assert main(["train", *flags(random_model_dir, run, max_steps=3, top_k=5), "--resume", str(run)]) == 2
    assert "top_k (0 in the checkpoint, 5 now)" in capsys.readouterr().err
    assert main(["train", *flags(random_model_dir, run, max_steps=3), "--resume", str(run)]) == 0  # accepted
    assert [m["step"] for m in metrics(run)] == [1, 2, 3]


def test_a_fresh_run_does_not_overwrite_a_checkpointed_one(tmp_path, random_model_dir, capsys, one_thread):
    run = tmp_path / "run"
    assert main(["train", *flags(random_model_dir, run, max_steps=3)]) == 0
    before = (run / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert main(["train", *flags(random_model_dir, run, max_steps=3)]) == 2
    assert f"--resume {run}" in capsys.readouterr().err
    assert (run / "metrics.jsonl").read_text() == before


def test_resume_without_a_checkpoint_names_the_folder(tmp_path, random_model_dir, capsys):
    assert main(["train", *flags(random_model_dir, tmp_path / "run"), "--resume", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("minigrpo train: error: ") and f"no checkpoint in {tmp_path / 'run' / 'checkpoints'}" in err


# ---------------------------------------------------------------------------------------------------------
# The pieces, without a training run
# ---------------------------------------------------------------------------------------------------------
def tiny_state(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (step + 1))
    sampler = PromptSampler([{"prompt": str(i)} for i in range(7)], seed)
    reward = shuffled(lambda prompts, completions, **row: [float(i) for i in range(len(completions))], seed)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler, sampler=sampler, reward_funcs=[reward])


def one_step(objects):
    """Something that touches every piece of state a checkpoint must carry; returns what it drew."""
    model, optimizer = objects["model"], objects["optimizer"]
    model(torch.randn(4, 3)).square().sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    objects["scheduler"].step()
    return (model.weight.tolist(), objects["scheduler"].get_last_lr(), random.random(),
            [r["prompt"] for r in objects["sampler"].take(3)], objects["reward_funcs"][0](None, ["a"] * 5))


def test_checkpoint_restores_every_random_stream_and_the_optimizer(tmp_path):
    a = tiny_state()
    for _ in range(3):
        one_step(a)
    path = save_checkpoint(tmp_path, 3, **a, config={"seed": 0}, progress={"wall_seconds": 1.5})
    expected = [one_step(a) for _ in range(3)]

    b = tiny_state(seed=1)  # other weights, other RNG streams: everything must come from the file
    step, progress = load_checkpoint(path, **b, config={"seed": 0})
    assert (step, progress) == (3, {"wall_seconds": 1.5})
    assert [one_step(b) for _ in range(3)] == expected


def test_a_crash_while_writing_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    objects = tiny_state()
    save_checkpoint(tmp_path, 2, **objects, config={}, progress={})

    def dies_halfway(obj, f):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt  # what Ctrl-C in the middle of torch.save looks like

    monkeypatch.setattr(torch, "save", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 4, **objects, config={}, progress={}, keep=1)
    assert [p.name for p in tmp_path.iterdir()] == ["step-000002.pt"]  # no half file, no temporary left over
    monkeypatch.undo()
    assert load_checkpoint(tmp_path / "step-000002.pt", **tiny_state(), config={})[0] == 2


def test_an_unreadable_checkpoint_is_one_line(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "step-000005.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=r"cannot read .*step-000005.pt"):
        load_checkpoint(latest_checkpoint(tmp_path), **tiny_state(), config={})


def test_truncate_metrics_keeps_each_step_once(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": s / 10}) + "\n" for s in range(1, 6)) + '{"step": 6, "lo')
    truncate_metrics(path, 3)  # killed during step 6, newest checkpoint at step 3
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2, 3]
    assert not [p for p in tmp_path.iterdir() if p.name != "metrics.jsonl"]


@settings(deadline=None, derandomize=True, max_examples=50)
@given(num_rows=st.integers(1, 20), seed=st.integers(0, 2**32 - 1), takes=st.lists(st.integers(1, 25), max_size=6),
       after=st.integers(1, 25))
def test_prompt_sampler_continues_where_it_stopped(num_rows, seed, takes, after):
    """Any dataset size, any seed, stopped after any sequence of batch sizes: the restored sampler continues
    with the very prompts the original would have drawn next (across pass boundaries too)."""
    rows = [{"prompt": str(i)} for i in range(num_rows)]
    original = PromptSampler(rows, seed)
    for n in takes:
        original.take(n)
    buffer = io.BytesIO()
    torch.save(original.state_dict(), buffer)  # the way a checkpoint stores it
    buffer.seek(0)
    restored = PromptSampler(rows, seed + 1)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert restored.take(after) == original.take(after)
