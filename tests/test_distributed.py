"""Multi-process training (parallel/): 2 CPU processes over gloo, started by `accelerate launch`, must
reproduce a one-process run with the same global batch — its metrics and its final weights. Here the replicated
engine (DistributedDataParallel); sharded training (FSDP2) in test_fsdp.py."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
ACCELERATE = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or shutil.which("accelerate")
needs_accelerate = pytest.mark.skipif(ACCELERATE is None, reason="accelerate is not installed")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]  # `torchrun`, from this interpreter


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args: list[str], env: dict, processes: int, launcher: str = "accelerate") -> None:
    """Run `python ARGS` with `processes` CPU processes under `accelerate launch` or `torchrun` (launcher)."""
    if launcher == "torchrun":
        command = [*TORCHRUN, "--nproc-per-node", str(processes), "--master-port", str(free_port()), *args]
    else:
        command = [ACCELERATE, "launch", "--multi_gpu", "--num_processes", str(processes), "--num_machines", "1",
                   "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()), *args]
    done = subprocess.run(command, cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def run_one_process(out: Path, loss_type: str, *settings: str) -> None:
    """distributed_run.py's run with W = 1, in this process (with the caller's one torch thread): the function the
    W processes run, without starting an interpreter and importing torch and transformers (about 6 CPU seconds)."""
    import distributed_run

    distributed_run.run(str(out), loss_type, *settings)


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def weights(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(run / "model" / "model.safetensors")


@needs_accelerate
@pytest.mark.parametrize("loss_type, extra", [("bnpo", []), ("dapo", []),  # the two that need the global token count
                                              ("grpo", ["advantage_estimator=process"])])  # (N, T) advantages
def test_two_processes_match_one(tmp_path, one_thread, loss_type, extra):
    script = str(ROOT / "tests" / "distributed_run.py")
    run_one_process(tmp_path / "one", loss_type, *extra)
    launch([script, str(tmp_path / "two"), loss_type, *extra], one_thread, processes=2)

    one, two = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert [r["step"] for r in two] == [1, 2, 3], "rank 0 alone writes one line per step"
    for a, b in zip(one, two):
        assert a["advantages"] == pytest.approx(b["advantages"], abs=1e-4)  # same completions, same order
        for key in ("reward", "reward_std", "completions/mean_length", "accuracy", "frac_reward_zero_std"):
            assert a[key] == pytest.approx(b[key], abs=1e-6), key
        for key in ("loss", "grad_norm", "entropy"):  # the global loss, the averaged gradient, a token mean
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
        for key in [k for k in a if k.startswith("process/")]:  # step metrics, summed over the ranks
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
        assert a["grad_norm"] > 0
    w1, w2 = weights(tmp_path / "one"), weights(tmp_path / "two")
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], rtol=1e-4, atol=1e-5, msg=name)
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["accuracy_after"] == json.loads((tmp_path / "one" / "summary.json").read_text())["accuracy_after"]


@needs_accelerate
def test_cli_runs_under_accelerate_launch(tmp_path, one_thread):
    """The README's command, 2 processes: one run directory, written once, with checkpoints of both ranks' RNGs."""
    out = tmp_path / "run"
    launch(["-m", "minigrpo", "train", "--out", str(out), "--max-steps", "2", "--num-generations", "4",
            "--generation-batch-size", "16", "--eval-steps", "0", "--eval-limit", "8", "--eval-num-samples", "1",
            "--save-steps", "2", "--save-model", "false"], one_thread, processes=2)
    assert [r["step"] for r in metrics(out)] == [1, 2]
    ckpt = torch.load(out / "checkpoints" / "step-000002.pt", weights_only=True)
    assert len(ckpt["processes"]) == 2
    # Each rank sampled with its own generator: their RNG states differ.
    assert not torch.equal(ckpt["processes"][0]["rng"]["torch"], ckpt["processes"][1]["rng"]["torch"])
    assert json.loads((out / "summary.json").read_text())["steps"] == 2


def test_uneven_split_is_a_config_error(tmp_path, monkeypatch):
    """3 prompts cannot be split into whole groups over 2 processes: said before any process group is made."""
    from minigrpo.config import Config, ConfigError
    from minigrpo.trainer import train

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr("minigrpo.parallel.processes.setup", lambda device: device)
    monkeypatch.setattr("minigrpo.parallel.processes.world_size", lambda: 2)
    with pytest.raises(ConfigError, match="generation_batch_size: 3 prompts"):
        train(Config(output_dir=str(tmp_path), num_generations=4, generation_batch_size=12), progress=False)
    with pytest.raises(ConfigError, match="gradient_accumulation_steps: 16 does not divide the 8 completions"):
        train(Config(output_dir=str(tmp_path), num_generations=4, generation_batch_size=16,
                     gradient_accumulation_steps=16), progress=False)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # accelerate launch --use_fsdp: accelerate's FSDP, not ours
    with pytest.raises(ConfigError, match="fsdp: accelerate launch's --use_fsdp"):
        train(Config(output_dir=str(tmp_path), num_generations=4, generation_batch_size=16), progress=False)
    monkeypatch.delenv("ACCELERATE_USE_FSDP")
    with pytest.raises(ConfigError, match="dynamic_sampling"):
        train(Config(output_dir=str(tmp_path), num_generations=4, generation_batch_size=16, dynamic_sampling=True),
              progress=False)


def test_world_size_one_is_a_no_op():
    """Without a launcher nothing is initialised and the collectives return their input."""
    from minigrpo.parallel import processes as distributed

    assert os.environ.get("WORLD_SIZE", "1") == "1" or distributed.world_size() == 1
    x = torch.tensor([1.0, 2.0])
    assert distributed.all_reduce_sum(x) is x
    assert distributed.gather_objects({"a": 1}) == [{"a": 1}]
    assert distributed.broadcast_object(3) == 3
    assert distributed.setup(torch.device("cpu")) == torch.device("cpu")


def test_ranks_share_the_one_process_prompt_stream():
    """Rank r of W keeps its contiguous share of each draw: together, the prompts of a one-process run, in order."""
    from minigrpo.trainer import PromptSampler

    rows = [{"prompt": str(i)} for i in range(10)]
    one = PromptSampler(rows, seed=3)
    ranks = [PromptSampler(rows, seed=3, rank=r, world_size=2) for r in range(2)]
    for _ in range(7):  # crosses several shuffled passes
        assert one.take(4) == ranks[0].take(2) + ranks[1].take(2)


def test_checkpoint_keeps_every_ranks_state(tmp_path):
    """Each rank resumes with its own RNG and sampler; a checkpoint of 2 processes refuses to resume in 1."""
    from minigrpo.persistence.checkpoint import CheckpointError, load_checkpoint, process_state, save_checkpoint
    from minigrpo.trainer import PromptSampler

    rows = [{"prompt": str(i)} for i in range(10)]
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    objects = lambda sampler: dict(model=model, optimizer=optimizer, scheduler=scheduler, sampler=sampler,  # noqa: E731
                                   reward_funcs=[])
    states = []
    for r in range(2):
        torch.manual_seed(100 + r)
        sampler = PromptSampler(rows, seed=0, rank=r, world_size=2)
        sampler.take(1 + r)  # the ranks are at different places (possible with their own RNG streams)
        states.append(process_state(sampler, []))
    path = save_checkpoint(tmp_path, 1, **objects(sampler), config={}, progress={}, process_states=states)
    torch.manual_seed(0)
    restored = PromptSampler(rows, seed=0, rank=1, world_size=2)
    load_checkpoint(path, **objects(restored), config={}, rank=1, world_size=2)
    assert restored.state_dict() == states[1]["sampler"]
    assert torch.equal(torch.get_rng_state(), states[1]["rng"]["torch"])
    with pytest.raises(CheckpointError, match="2 process"):
        load_checkpoint(path, **objects(restored), config={})


@needs_accelerate
def test_two_process_run_resumes_exactly(tmp_path, one_thread):
    """Kill-free version of the crash test, with 2 processes: resuming from the step-2 checkpoint into another
    directory redoes step 3 exactly — each rank gets back its own sampling RNG, so it draws the same completions."""
    flags = ["--max-steps", "3", "--num-generations", "4", "--generation-batch-size", "16", "--eval-steps", "0",
             "--eval-limit", "8", "--eval-num-samples", "1", "--save-steps", "2", "--save-model", "false"]
    launch(["-m", "minigrpo", "train", "--out", str(tmp_path / "a"), *flags], one_thread, processes=2)
    launch(["-m", "minigrpo", "train", "--out", str(tmp_path / "b"), *flags,
            "--resume", str(tmp_path / "a" / "checkpoints" / "step-000002.pt")], one_thread, processes=2)
    a, b = metrics(tmp_path / "a"), metrics(tmp_path / "b")
    assert [r["step"] for r in b] == [1, 2, 3]  # steps 1-2 copied from a's history, step 3 trained again
    for key in ("reward", "advantages", "completions/mean_length", "loss", "grad_norm", "entropy"):
        assert b[2][key] == a[2][key], key
