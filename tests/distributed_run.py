"""A short training run for tests/test_distributed.py, the same under `accelerate launch` or `torchrun` with W
processes and under plain `python` (W = 1): `python tests/distributed_run.py OUT_DIR LOSS_TYPE [KEY=VALUE ...]` (more
Config settings, e.g. fsdp=full_shard use_peft=true). The tests make their one-process runs by calling `run` in their
own process.

Sampling would make the runs differ (W processes draw from W random generators), so the completions here are
scripted: fixed by the prompt and the place in its group, of different lengths (so the token-count
normalisers matter), the same under any number of processes. Everything after sampling — rewards,
advantages, log-probs, loss, gradients, the optimizer — is the real trainer, and W processes must reproduce
the one-process run's metrics and weights.

`plant_overflow_step=K` (not a Config key): at the K-th optimizer step, rank 0 alone writes inf into one element of
its gradient (its shard, when sharded), an fp16 overflow that only one process sees.

Each process also writes OUT_DIR/shard-RANK.json: how many parameter and optimizer-state elements it holds
(a sharded tensor counts its local shard only) and how many optimizer steps it took, measured on the optimizer the
run trained with, and how many
times the output head ran in blocks (logprobs.head_logprobs) rather than as full logits.
"""

import contextlib
import json
import os
import sys
from pathlib import Path
from unittest import mock

import minigrpo.lab.plots
import minigrpo.logprobs
import minigrpo.trainer
from minigrpo.config import load_config
from minigrpo.parallel import ddp_fsdp, processes
from minigrpo.rollout import rollout_from_ids


class ScriptedEngine:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, prompts, *, num_generations, max_completion_length, **sampling):
        tok, completions = self.tokenizer, []
        for prompt in prompts:
            digits = "".join(c for c in prompt if c.isdigit())
            for j in range(num_generations):  # 1 to len(digits) digits, depending on j and the prompt
                text = digits[: 1 + (5 * j + len(prompt)) % len(digits)]
                completions.append(tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
        prompt_ids = [tok(p)["input_ids"] for p in prompts]
        return rollout_from_ids(prompt_ids, completions, tok, [tok.eos_token_id], num_generations, max_completion_length)

    def sync_weights(self):
        pass


def place_and_length(prompts, completions, completion_ids, **row):
    """Depends on the place in the group (G = 4) and the length: groups always have non-zero std."""
    return [(i % 4) / 3 + 0.05 * len(ids) for i, ids in enumerate(completion_ids)]


def plant_overflow(step: int):
    """A replacement for trainer.optimizer_step: at the step-th optimizer step, rank 0 writes inf into the first element
    of its gradient of the first trained parameter: under FSDP2 a part of the gradient no other process holds."""
    import math

    optimizer_step, calls = minigrpo.trainer.optimizer_step, []

    def planted(optimizer, parameters, *args, **kwargs):
        parameters = list(parameters)
        calls.append(1)
        if len(calls) == step and processes.is_main():
            grad = next(p for p in parameters if p.grad is not None).grad
            (grad.to_local() if hasattr(grad, "to_local") else grad).view(-1)[0] = math.inf
        return optimizer_step(optimizer, parameters, *args, **kwargs)

    return planted


def digit_steps(prompts, completions, **row):
    """Process supervision: one step per digit, its reward set by the place in the group and in the completion."""
    from minigrpo.step_rewards import StepRewards

    return [StepRewards([float((i % 4 + k) % 3 == 0) for k in range(len(c))], list(range(1, len(c) + 1)))
            for i, c in enumerate(completions)]


def held_elements(optimizer) -> dict:
    """Elements of the trained parameters and of AdamW's moments this process holds (its shards, when sharded)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    moments = [state[key] for state in optimizer.state.values() for key in ("exp_avg", "exp_avg_sq")]
    steps = max(int(state["step"]) for state in optimizer.state.values())  # the optimizer steps this process took
    return {"params": ddp_fsdp.local_numel(params), "optimizer_state": ddp_fsdp.local_numel(moments),
            "optimizer_steps": steps}


def run(out: str, loss_type: str, *settings: str) -> None:
    """Train the run into `out` (settings: KEY=VALUE, as on the command line). The tests call it in their own process
    for W = 1 (no interpreter to start); the patches below are undone when it returns."""
    extra = dict(arg.split("=", 1) for arg in settings)
    made = []  # the run's (optimizer, scheduler), kept to count what this process holds at the end
    head_calls = []
    head_logprobs, make_optimizer = minigrpo.logprobs.head_logprobs, minigrpo.trainer.make_optimizer
    with contextlib.ExitStack() as patches:
        patch = lambda module, name, new: patches.enter_context(mock.patch.object(module, name, new))  # noqa: E731
        if "plant_overflow_step" in extra:
            patch(minigrpo.trainer, "optimizer_step", plant_overflow(int(extra.pop("plant_overflow_step"))))
        patch(minigrpo.logprobs, "head_logprobs",
              lambda *args, **kwargs: head_calls.append(1) or head_logprobs(*args, **kwargs))
        patch(minigrpo.lab.plots, "plot_runs", lambda *args, **kwargs: [])  # the run's plots/: nothing reads them
        patch(minigrpo.trainer, "make_optimizer", lambda *args: made.append(make_optimizer(*args)) or made[-1])
        cfg = load_config(None, dict(output_dir=out, loss_type=loss_type, max_steps=3, num_generations=4,
                                     generation_batch_size=16, learning_rate=1e-3, eval_steps=0, eval_limit=8,
                                     eval_num_samples=1, save_model=True, **extra))
        reward = digit_steps if cfg.advantage_estimator == "process" else place_and_length
        minigrpo.trainer.train(cfg, reward_funcs=[reward], progress=False,
                               engine_factory=lambda model, tokenizer: ScriptedEngine(tokenizer))
    held = {**held_elements(made[0][0]), "head_calls": len(head_calls)}
    (Path(out) / f"shard-{os.environ.get('RANK', '0')}.json").write_text(json.dumps(held))


if __name__ == "__main__":
    run(*sys.argv[1:])
