"""Checkpoints: everything a run needs to continue exactly where it stopped, one file per checkpoint.

    RUN/checkpoints/step-000040.pt     written every `save_steps` steps, the newest `save_total_limit` kept

    start_or_resume(...)               a run's start: step 0, or the newest checkpoint restored (--resume)
    save_step_checkpoint(...)          the loop's step 7, when checkpoint_due(step, save_steps)

A checkpoint holds the trainable weights (the whole model in full fine-tuning, only the adapter with LoRA:
frozen weights are reloaded from `model_name_or_path`), the optimizer and LR-scheduler states, fp16's loss scale
(mixed_precision.py: the scale and its count of steps since the last overflow), the torch and
Python RNG states and the prompt sampler's position (one set per process in a multi-process run, written by
rank 0), the step counter, and the run's config. Restoring all of
them makes a resumed run draw the same samples and take the same steps as a run that was never stopped, so
its metrics are equal, not just close (on CPU, where torch is deterministic).

Why the write goes to a temporary file and is then renamed: a process killed mid-write (SIGKILL, power loss,
an out-of-memory kill) leaves a half-written temporary file, never a half-written checkpoint. `os.replace`
is atomic on POSIX and Windows: readers see the old file list or the new one, nothing in between. So the
newest `step-*.pt` is always whole, and older ones are deleted only after a newer one is in place.

metrics.jsonl is written before the checkpoint of the same step. After a crash it may hold lines past the
newest checkpoint; `truncate_metrics` drops them on resume, so the file holds each step exactly once.

Sharded training (FSDP2, parallel/ddp_fsdp.py) writes a folder instead, every process its own shards:

    RUN/checkpoints/step-000040/       torch.distributed.checkpoint (DCP): the trainable weights and the optimizer
                                       state, each process writing the pieces it holds (.metadata, *.distcp)
                                       + state.pt: the rest, as above (written by rank 0)

No process ever holds the whole model to save or load it. The folder is written as `.step-000040.partial` and
renamed when every process has finished, so a killed run leaves the previous checkpoint whole here too. Resuming
needs the same number of processes (each resumes its own RNGs). Several machines: checkpoints must go to a
folder every machine sees.
"""

import json
import os
import random
import re
import shutil
import tempfile
from pathlib import Path

import torch
import yaml

from ..errors import MinigrpoError
from ..parallel import processes

__all__ = ["save_checkpoint", "load_checkpoint", "process_state", "latest_checkpoint", "list_checkpoints",
           "truncate_metrics", "CheckpointError", "RESUMABLE_CHANGES", "start_or_resume", "checkpoint_due",
           "save_step_checkpoint"]

CHECKPOINT_NAME = re.compile(r"step-(\d+)(\.pt)?")  # a file, or a folder of shards
# Config keys that may differ between the interrupted run and its resumption: they do not change what is
# computed. Everything else must match, or the "resumed" run would be a different run.
RESUMABLE_CHANGES = frozenset({"output_dir", "resume_from_checkpoint", "save_steps", "save_total_limit",
                               "save_model", "device", "reward_timeout"})


class CheckpointError(MinigrpoError, ValueError):
    """No checkpoint to resume from, or one that does not belong to this run; the message names the file."""


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights the optimizer changes: all of them in full fine-tuning, the adapter's with LoRA."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def rng_states() -> dict:
    states = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def _atomic_torch_save(obj, path: Path) -> None:
    """torch.save to a temporary file in the same directory, flushed to disk, then renamed over `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def list_checkpoints(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of the whole checkpoints in ckpt_dir, oldest first; temporary files and folders are not listed."""
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := CHECKPOINT_NAME.fullmatch(p.name))]
    return sorted(found)


def process_state(sampler, reward_funcs) -> dict:
    """What one process carries that another may not: its RNGs (each process samples its own completions),
    the prompt sampler's position, and the RNGs of reward functions that have one (the `random` control)."""
    return {
        "rng": rng_states(),
        "sampler": sampler.state_dict(),
        "reward_rngs": [f.rng.getstate() if hasattr(f, "rng") else None for f in reward_funcs],
    }


def save_checkpoint(ckpt_dir: str | os.PathLike, step: int, *, model, optimizer, scheduler, sampler, reward_funcs,
                    config: dict, progress: dict, keep: int | None = None,
                    process_states: list[dict] | None = None, ref_model=None, sharded: bool = False,
                    scaler=None) -> Path:
    """Write ckpt_dir/step-{step}.pt (sharded: the folder step-{step}/) atomically, then delete all but the newest
    `keep` checkpoints (None: keep all).

    progress: what the loop carries from step to step besides the RNGs (e.g. accumulated wall time, the
    evaluation made before training), restored verbatim by `load_checkpoint`.
    process_states: with several processes, `process_state(...)` of every rank, gathered by rank 0 (which
    alone writes); None = this process's only.
    ref_model: a reference that moves during training (sync_ref_model): its weights are saved too.
    sharded: the model is sharded (FSDP2): every process calls this, and the checkpoint is a folder of shards.
    scaler: fp16's GradScaler (the same on every process), or None.
    """
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    state = {
        "step": step,
        "scheduler": scheduler.state_dict(),
        "scaler": None if scaler is None else scaler.state_dict(),
        "processes": process_states or [process_state(sampler, reward_funcs)],
        "config": config,
        "progress": progress,
    }
    if sharded:
        path = _save_shards(ckpt_dir, step, state, model, optimizer, ref_model)
    else:
        state.update(model=trainable_state(model),  # the same on every rank: gradients are averaged before each step
                     optimizer=optimizer.state_dict())
        if ref_model is not None:
            state["ref_model"] = {name: p.detach().clone() for name, p in ref_model.named_parameters()}
        path = ckpt_dir / f"step-{step:06d}.pt"
        _atomic_torch_save(state, path)
    if keep is not None and processes.is_main():
        for _, old in list_checkpoints(ckpt_dir)[:-keep]:
            if old.is_dir():
                shutil.rmtree(old)
            else:
                old.unlink()
    return path


def _sharded_state(model, optimizer, ref_model) -> dict:
    """What DCP writes and reads in place: {"model": the trainable weights, "optimizer": its state[, "ref_model"]},
    each tensor this process's shard (DTensors), keyed by parameter name."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    weights = {k: v for k, v in get_model_state_dict(model).items() if k in trainable}
    state = {"model": weights, "optimizer": get_optimizer_state_dict(model, optimizer)}
    if ref_model is not None:
        state["ref_model"] = get_model_state_dict(ref_model)
    return state


def _save_shards(ckpt_dir: Path, step: int, state: dict, model, optimizer, ref_model) -> Path:
    """Every process writes its shards into .step-N.partial/, rank 0 adds state.pt, then renames it step-N/."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    path, partial = ckpt_dir / f"step-{step:06d}", ckpt_dir / f".step-{step:06d}.partial"
    if processes.is_main():
        shutil.rmtree(partial, ignore_errors=True)  # left by a run killed while writing
    dist.barrier()
    shards = _sharded_state(model, optimizer, ref_model)
    dcp.save(shards, checkpoint_id=partial)
    if processes.is_main():
        _atomic_torch_save({**state, "model_keys": sorted(shards["model"])}, partial / "state.pt")
    dist.barrier()  # every process's shards are on disk
    if processes.is_main():
        os.replace(partial, path)
    dist.barrier()
    return path


def latest_checkpoint(run_or_checkpoint: str | os.PathLike) -> Path:
    """The newest checkpoint of a run directory, or the checkpoint (file or folder of shards) itself if given one."""
    path = Path(run_or_checkpoint)
    if path.is_file() or (path / "state.pt").is_file():
        return path
    found = list_checkpoints(path / "checkpoints")
    if not found:
        raise CheckpointError(f"resume_from_checkpoint: no checkpoint in {path / 'checkpoints'} "
                              "(checkpoints are written every save_steps steps; was it 0?)")
    return found[-1][1]


def _defaults_of_newer_keys(saved: dict, config: dict, defaults: dict) -> dict:
    """Config keys a checkpoint predates (written before the field existed), at their defaults: a field is added
    with the default that keeps what earlier runs computed, so resuming with it left at the default is the same run."""
    return {k: defaults[k] for k in config if k not in saved and k in defaults}


def load_checkpoint(path: str | os.PathLike, *, model, optimizer, scheduler, sampler, reward_funcs,
                    config: dict, rank: int = 0, world_size: int = 1, ref_model=None,
                    config_defaults: dict | None = None, scaler=None) -> tuple[int, dict]:
    """Restore everything `save_checkpoint` wrote into the given objects; returns (step, progress).
    rank, world_size: this process's place in a multi-process run (it takes its own RNGs and sampler).
    config_defaults: each config key's default, taken for keys the checkpoint predates.

    Raises CheckpointError if the checkpoint was written with a config that differs in a key outside
    RESUMABLE_CHANGES, by another number of processes, or for weights this model does not have.
    """
    path = Path(path)
    try:
        state = torch.load(path / "state.pt" if path.is_dir() else path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same one-line error
        raise CheckpointError(f"resume_from_checkpoint: cannot read {path}: {exc}") from exc
    saved_config = {**_defaults_of_newer_keys(state["config"], config, config_defaults or {}), **state["config"]}
    changed = sorted(k for k in config.keys() | saved_config.keys()
                     if k not in RESUMABLE_CHANGES and config.get(k) != saved_config.get(k))
    if changed:
        diffs = ", ".join(f"{k} ({saved_config.get(k)!r} in the checkpoint, {config.get(k)!r} now)" for k in changed)
        raise CheckpointError(f"resume_from_checkpoint: {path} was written by a run with other settings: {diffs}")
    expected = sorted(name for name, p in model.named_parameters() if p.requires_grad)
    saved = state["model_keys"] if path.is_dir() else sorted(state["model"])
    if saved != expected:
        raise CheckpointError(f"resume_from_checkpoint: {path} holds weights for another model "
                              f"({len(saved)} trainable tensors, this model has {len(expected)})")
    if len(state["processes"]) != world_size:
        raise CheckpointError(f"resume_from_checkpoint: {path} was written by a run of {len(state['processes'])} "
                              f"process(es); resume it with as many (this run has {world_size})")
    if path.is_dir():
        _load_shards(path, model, optimizer, ref_model)
    else:
        model.load_state_dict(state["model"], strict=False)  # strict=False: frozen weights are not in the file
        if ref_model is not None and "ref_model" in state:
            ref_model.load_state_dict(state["ref_model"], strict=False)
        optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if scaler is not None and state.get("scaler"):  # fp16 (config checked above: the checkpoint's run was fp16 too)
        scaler.load_state_dict(state["scaler"])
    mine = state["processes"][rank]
    sampler.load_state_dict(mine["sampler"])
    for func, rng_state in zip(reward_funcs, mine["reward_rngs"]):
        if rng_state is not None and hasattr(func, "rng"):
            func.rng.setstate(rng_state)
    set_rng_states(mine["rng"])
    return state["step"], state["progress"]


def _load_shards(path: Path, model, optimizer, ref_model) -> None:
    """Each process reads its own shards of a folder checkpoint (DCP reshards if they were cut otherwise)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)

    shards = _sharded_state(model, optimizer, ref_model)
    dcp.load(shards, checkpoint_id=path)
    set_model_state_dict(model, shards["model"], options=StateDictOptions(strict=False))  # frozen: not in it
    set_optimizer_state_dict(model, optimizer, shards["optimizer"])
    if ref_model is not None:
        set_model_state_dict(ref_model, shards["ref_model"])


def truncate_metrics(metrics_path: str | os.PathLike, last_step: int, copy_to: str | os.PathLike | None = None) -> None:
    """Keep the lines of metrics.jsonl up to `last_step` (and drop a line half-written by a killed process).

    copy_to: write the kept lines there instead (a run resumed into another directory starts with its history).
    Rewritten through a temporary file and a rename, like a checkpoint, so a crash here loses nothing.
    """
    metrics_path = Path(metrics_path)
    target = Path(copy_to) if copy_to is not None else metrics_path
    if not metrics_path.exists():
        return
    kept = []
    for line in metrics_path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # the last line of a killed run may be cut short
        if row.get("step", 0) <= last_step:
            kept.append(line)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write("".join(line + "\n" for line in kept))
    os.replace(tmp, target)


def stopped_line(out: Path, resume: str, config: dict | None = None) -> str:
    """The one line a run stopped by Ctrl-C ends with: the last step logged, the newest checkpoint and how to
    resume from it (resume: the command or call that does), or that there is none to resume from. config: the
    stopped run's settings; a config.yaml in `out` that differs from them is another run's (this one stopped before
    it wrote anything)."""
    written = out / "config.yaml"
    if config is not None and (not written.exists() or not same_run(yaml.safe_load(written.read_text()), config)):
        return "stopped before the run started; nothing was written"
    metrics = out / "metrics.jsonl"
    steps = [json.loads(line).get("step", 0) for line in metrics.read_text().splitlines()
             if line.strip().startswith("{") and line.strip().endswith("}")] if metrics.exists() else []
    if not steps:  # nothing logged: run.claim_output_dir lets the same command start it again
        return "stopped before the first step; nothing to resume: the same command starts it again"
    done = f"after step {steps[-1]}"
    found = list_checkpoints(out / "checkpoints")
    if not found:
        return (f"stopped {done}: no checkpoint in {out} to resume from (save_steps writes them); the run's "
                f"files stay there, and a new run into it needs --overwrite-output-dir")
    step, path = found[-1]
    return f"stopped {done}; the last checkpoint is {path} (step {step}). Resume with: {resume}"


def same_run(written: dict, config: dict) -> bool:
    """Whether a config.yaml (written) is this config's, ignoring what may change between a run and its resumption."""
    return all(written.get(k) == v for k, v in config.items() if k not in RESUMABLE_CHANGES)


def start_or_resume(resume_from_checkpoint: str | os.PathLike | None, out: Path, config: dict,
                    config_defaults: dict | None = None, **training_objects) -> tuple[int, dict]:
    """(step to start after, what the loop carries between steps): (0, fresh), or with resume_from_checkpoint (a run
    directory or one checkpoint) its newest checkpoint restored into the training objects (model, optimizer,
    scheduler, fp16's loss scaler, sampler, reward functions, ref_model) and this process's RNGs, and the run's
    metrics.jsonl and completions.jsonl cut back to its step (copied into `out` when the run resumes elsewhere).
    config: this run's settings, checked against the checkpoint's (RESUMABLE_CHANGES may differ); config_defaults:
    the defaults of keys the checkpoint's run did not have yet."""
    if not resume_from_checkpoint:
        return 0, {"wall_seconds": 0.0, "before": None}  # "before": the evaluation before step 1
    ckpt = latest_checkpoint(resume_from_checkpoint)
    start_step, run_state = load_checkpoint(ckpt, **training_objects, config=config, rank=processes.rank(),
                                            world_size=processes.world_size(), config_defaults=config_defaults)
    if processes.is_main():
        for name in ("metrics.jsonl", "completions.jsonl"):
            truncate_metrics(ckpt.parent.parent / name, start_step, copy_to=out / name)
    return start_step, run_state


def checkpoint_due(step: int, save_steps: int) -> bool:
    """Whether this step ends with a checkpoint: every save_steps steps (0 = never)."""
    return bool(save_steps) and step % save_steps == 0


def save_step_checkpoint(out: Path, step: int, *, config: dict, keep: int | None, model, policy, sampler,
                         reward_funcs, run_state: dict, bar=None, **training_objects) -> None:
    """A checkpoint of everything the run needs to continue exactly, in out/checkpoints (the newest `keep`
    kept), each process's RNGs gathered to rank 0; with FSDP2 (policy sharded) every process writes its own
    shards. bar: the loop's progress bar, which says a checkpoint is being written and how large it is.
    training_objects: optimizer, scheduler, scaler, ref_model (a reference that moves, or None)."""
    states = processes.gather_objects(process_state(sampler, reward_funcs))  # each rank's RNGs
    sharded = processes.is_sharded(policy)  # FSDP2: every process writes its own shards
    if not (processes.is_main() or sharded):
        return
    if bar is not None:
        weights = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        bar.set_postfix_str(f"writing checkpoint {step} (~{3 * weights / 2**20:,.0f} MiB: weights + AdamW)")
    save_checkpoint(out / "checkpoints", step, model=model, sampler=sampler, reward_funcs=reward_funcs, config=config,
                    progress=run_state, keep=keep, process_states=states, sharded=sharded, **training_objects)
    if bar is not None:
        bar.set_postfix_str(f"checkpoint {step} written")
