"""The front door: TRL's GRPOConfig / GRPOTrainer on minigrpo's train(), help for every option, no run that
overwrites another, a config.yaml that says what ran, Ctrl-C that stops in one line and resumes exactly, and a
line for every result as soon as it is known.

The runs here are a few steps of the shipped tiny models on a handful of problems: they check the plumbing, not
learning (tests/test_learning.py does that).
"""

import dataclasses
import hashlib
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from peft import LoraConfig
from transformers import BitsAndBytesConfig

from minigrpo import GRPOConfig, GRPOTrainer
from minigrpo.cli import main, options_markdown
from minigrpo.config import Config, ConfigError, field_descriptions
from minigrpo.grpo_config import IGNORED, UNSUPPORTED
from minigrpo.rewards import RewardError
from minigrpo.tasks import DATA_DIR
from minigrpo.trainer import train

ROOT = Path(__file__).resolve().parents[1]
THINK_MODEL, TOOL_MODEL = DATA_DIR / "models" / "think_addition", DATA_DIR / "models" / "tool_addition"
TIMING = {"step_seconds", "generate_seconds", "tokens_per_second"}
SMALL = ["--max-steps", "4", "--num-generations", "4", "--generation-batch-size", "8", "--eval-steps", "0",
         "--eval-num-samples", "0", "--eval-limit", "4", "--save-model", "false"]


def metrics(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def rows(n: int, start: int = 0) -> list[dict]:
    return [json.loads(line) for line in (DATA_DIR / "tasks" / "think_addition" / "test.jsonl").read_text()
            .splitlines()[start:start + n]]


# ---------------------------------------------------------------------------------------------------------
# TRL's quick start, its import changed
# ---------------------------------------------------------------------------------------------------------
# TRL 1.16's GRPO quick start (docs/source/grpo_trainer.md, "Quick start"), as its documentation gives it.
TRL_QUICK_START = '''\
# train_grpo.py
from datasets import load_dataset
from trl import GRPOTrainer
from trl.rewards import accuracy_reward

dataset = load_dataset("trl-lib/DeepMath-103K", split="train")

trainer = GRPOTrainer(
    model="Qwen/Qwen2-0.5B-Instruct",
    reward_funcs=accuracy_reward,
    train_dataset=dataset,
)
trainer.train()
'''


def test_trl_quick_start_runs_with_only_its_import_changed(tmp_path, one_thread):
    pytest.importorskip("trl")
    pytest.importorskip("math_verify")  # TRL's accuracy_reward grades with it
    script = TRL_QUICK_START.replace("from trl import GRPOTrainer", "from minigrpo import GRPOTrainer")
    changed = [line for line in script.splitlines() if line not in TRL_QUICK_START.splitlines()]
    assert changed == ["from minigrpo import GRPOTrainer"]
    # Offline, the hub names resolve to local folders of the same names (transformers and datasets look there
    # first): the model is the shipped chat model (its declared context raised from 256 to 1024 tokens, so that
    # TRL's default max_completion_length of 512 fits); the dataset is two problems in DeepMath's columns, a chat
    # prompt and a "solution".
    model = tmp_path / "Qwen" / "Qwen2-0.5B-Instruct"
    shutil.copytree(TOOL_MODEL, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 1024}))
    data = tmp_path / "trl-lib" / "DeepMath-103K"
    data.mkdir(parents=True)
    problems = [json.loads(line) for line in (DATA_DIR / "tasks" / "tool_addition" / "test.jsonl").read_text()
                .splitlines()[:2]]
    (data / "train.jsonl").write_text("".join(json.dumps({
        "prompt": [{"role": "user", "content": f"{p['a']}+{p['b']}"}], "solution": p["answer"]}) + "\n"
        for p in problems))
    (tmp_path / "train_grpo.py").write_text(script)
    env = {**one_thread, "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "train_grpo.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "Qwen2-0.5B-Instruct-GRPO"  # TRL's folder name for a run given no args
    saved = yaml.safe_load((run / "config.yaml").read_text())
    # TRL's defaults, in minigrpo's counts: 8 completions per step (per_device_train_batch_size 8, G = 8), so one
    # prompt; 3 epochs over the one problem left after holding one out; TRL's loss, learning rate and schedule
    assert (saved["generation_batch_size"], saved["num_generations"], saved["max_steps"]) == (8, 8, 3)
    assert (saved["loss_type"], saved["learning_rate"], saved["lr_scheduler_type"]) == ("dapo", 1e-6, "linear")
    assert saved["reward_funcs"] == ["trl.rewards.accuracy_rewards:accuracy_reward"]
    assert saved["model_name_or_path"] == "Qwen/Qwen2-0.5B-Instruct" and saved["task"] == "answer"
    assert saved["dataset_name"].startswith("<train_dataset: 2 rows, columns prompt, solution; sha256 ")
    assert [m["step"] for m in metrics(run)] == [1, 2, 3] and (run / "summary.json").exists()
    assert "before training: greedy accuracy" in done.stdout and "held out" in done.stdout


# ---------------------------------------------------------------------------------------------------------
# GRPOConfig: TRL's names, meanings and defaults
# ---------------------------------------------------------------------------------------------------------
def test_every_trl_field_is_taken_and_only_log_completions_defaults_otherwise():
    trl = pytest.importorskip("trl")
    ours = {f.name: f for f in dataclasses.fields(GRPOConfig)}

    def default(f):
        return f.default_factory() if f.default is dataclasses.MISSING else f.default

    theirs = {f.name: default(f) for f in dataclasses.fields(trl.GRPOConfig)}
    untaken = [name for name in theirs if name not in ours and name not in UNSUPPORTED and name not in IGNORED]
    assert not untaken, f"TRL fields GRPOConfig neither takes nor refuses: {untaken}"
    assert set(UNSUPPORTED) | IGNORED <= set(theirs)
    differ = {name for name, value in theirs.items() if name in ours and default(ours[name]) != value}
    assert differ == {"log_completions"}  # on purpose: minigrpo writes completions.jsonl (minigrpo show)
    assert all(UNSUPPORTED[name][0] == theirs[name] for name in UNSUPPORTED)  # TRL's default is accepted


def test_trl_counts_become_minigrpos():
    args = GRPOConfig("out", per_device_train_batch_size=4, gradient_accumulation_steps=2, steps_per_generation=4,
                      num_generations=4, max_steps=10, logging_steps=4, save_steps=6, eval_strategy="steps",
                      eval_steps=4, scale_rewards=False, report_to="tensorboard", beta=0.0,
                      model_init_kwargs={"torch_dtype": "bfloat16"}, fsdp="full_shard auto_wrap")
    cfg = args.to_config(num_train_rows=100, world_size=2)
    # a batch is B x processes x S = 4 x 2 x 4 completions, S / A = 2 optimizer steps of A = 2 micro-batches each
    assert (cfg.generation_batch_size, cfg.steps_per_generation, cfg.gradient_accumulation_steps) == (32, 2, 2)
    # TRL counts optimizer steps, minigrpo batches of 2 optimizer steps: 10 -> 5, 4 -> 2, 6 -> 3
    assert (cfg.max_steps, cfg.logging_steps, cfg.eval_steps, cfg.save_steps) == (5, 2, 2, 3)
    assert (cfg.scale_rewards, cfg.report_to) == ("none", ["tensorboard"])
    assert (cfg.dtype, cfg.fsdp) == ("bfloat16", "full_shard")
    assert not cfg.use_bias_correction_kl and not cfg.bf16  # no KL term to correct; bf16 None on the CPU
    # epochs: 8 prompts per batch, 100 // 8 = 12 batches per pass, 2.5 passes
    epochs = GRPOConfig("out", per_device_train_batch_size=32, num_generations=4, num_train_epochs=2.5,
                        save_strategy="epoch", eval_strategy="no").to_config(num_train_rows=100)
    assert (epochs.max_steps, epochs.save_steps, epochs.eval_steps) == (30, 12, 0)


@pytest.mark.parametrize("warmup, steps_per_generation, max_steps", [(4, 4, 8), (0.5, 4, 8), (10, 1, 100),
                                                                     (0.1, 2, 40), (3, 2, 40), (1, 1, 10)])
def test_trl_warmup_peaks_in_the_batch_that_holds_trls_peak(warmup, steps_per_generation, max_steps):
    """TRL steps its schedule once per optimizer step (from 0, at the peak at step W, transformers 5 reading W < 1 as
    a fraction of the run), minigrpo once per batch of steps_per_generation optimizer steps: the same peak batch."""
    from transformers import TrainingArguments, get_linear_schedule_with_warmup

    from minigrpo.run import lr_lambda

    args = GRPOConfig("out", per_device_train_batch_size=4, steps_per_generation=steps_per_generation,
                      num_generations=4, max_steps=max_steps, warmup_steps=warmup)
    cfg = args.to_config(num_train_rows=100)
    trl_warmup = TrainingArguments("out", warmup_steps=warmup).get_warmup_steps(max_steps)
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    schedule = get_linear_schedule_with_warmup(optimizer, trl_warmup, max_steps)
    trl_lr = []
    for _ in range(max_steps):
        trl_lr.append(schedule.get_last_lr()[0])
        optimizer.step()
        schedule.step()
    ours = [lr_lambda(cfg)(step) for step in range(cfg.max_steps)]
    peak_batch = trl_lr.index(max(trl_lr)) // steps_per_generation
    assert ours.index(1.0) == peak_batch
    assert all(0 < a < b for a, b in zip(ours[:peak_batch], ours[1:peak_batch + 1]))  # rising, never 0
    if steps_per_generation == 1:  # one optimizer step a batch: from the peak on, TRL's schedule to the bit
        assert ours[peak_batch:] == trl_lr[peak_batch:]


def test_the_learning_rate_schedule_by_hand():
    from minigrpo.run import lr_lambda

    def factors(**kw):
        cfg = Config(**kw)
        return [lr_lambda(cfg)(step) for step in range(cfg.max_steps)]

    assert factors(max_steps=5, lr_scheduler_type="linear") == [1.0, 0.8, 0.6, 0.4, 0.2]  # (5 - step) / 5
    # warm-up 3: 1/3, 2/3, then the peak at step 2 and (6 - step) / (6 - 2) down to 0 at step 6
    assert factors(max_steps=6, warmup_steps=3, lr_scheduler_type="linear") == pytest.approx(
        [1 / 3, 2 / 3, 1.0, 0.75, 0.5, 0.25])
    assert factors(max_steps=5, warmup_steps=3) == pytest.approx([1 / 3, 2 / 3, 1.0, 1.0, 1.0])  # constant


def test_trl_fractions_of_the_run_below_one_are_read_as_transformers_reads_them():
    cfg = GRPOConfig("out", per_device_train_batch_size=8, num_generations=4, max_steps=20, save_steps=0.5,
                     logging_steps=0.1, eval_strategy="steps", eval_steps=0.25).to_config(num_train_rows=100)
    assert (cfg.max_steps, cfg.save_steps, cfg.logging_steps, cfg.eval_steps) == (20, 10, 2, 5)
    with pytest.raises(ConfigError, match="warmup_steps: must be >= 0, got -1"):
        GRPOConfig("out", warmup_steps=-1)
    with pytest.raises(ConfigError, match="warmup_steps: must be >= 0, got -2"):
        Config(warmup_steps=-2)


def test_hf_argument_parser_reads_grpo_config_as_trl_scripts_do():
    from transformers import HfArgumentParser

    (args,) = HfArgumentParser(GRPOConfig).parse_args_into_dataclasses(
        ["--output_dir", "out", "--per_device_train_batch_size", "16", "--report_to", "tensorboard", "--use_peft",
         "--scale_rewards", "batch"])
    cfg = args.to_config(num_train_rows=40)
    assert (cfg.generation_batch_size, cfg.report_to, cfg.use_peft, cfg.scale_rewards) == (16, ["tensorboard"], True,
                                                                                          "batch")


@pytest.mark.parametrize("make, line", [
    (lambda: GRPOConfig(use_liger_kernel=True), "use_liger_kernel True: TRL's field, not in minigrpo (minigrpo runs "
                                                "plain PyTorch; leave it out)"),
    (lambda: GRPOConfig(per_device_train_batchsize=8), "per_device_train_batchsize: not a GRPOConfig field; did you "
                                                       "mean per_device_train_batch_size?"),
    (lambda: GRPOConfig(push_to_hub=True), "push_to_hub True: TRL's field, not in minigrpo (minigrpo does not upload"),
    (lambda: GRPOConfig(save_strategy="best"), "save_strategy: 'best' is not one of no, steps, epoch"),
    (lambda: GRPOConfig(lr_scheduler_type="cosine"), "lr_scheduler_type: 'cosine' is not one of constant, linear"),
    (lambda: Config(dataset_name=[{"prompt": "1+1="}]), "dataset_name: takes a name or a path, got a list object; "
                                                        "pass the object itself as train(cfg, train_dataset=...)"),
    (lambda: Config(reward_funcs=[len]), "reward_funcs: takes names (module:function, file.py:function), got a "
                                         "builtin_function_or_method; pass functions as train(cfg, reward_funcs="),
    (lambda: GRPOTrainer("m", len, callbacks=[object()]), "callbacks: TRL's argument, not in minigrpo"),
    (lambda: train(GRPOConfig("out")), "GRPOConfig: TRL's field meanings; give it to GRPOTrainer(args=...)"),
    (lambda: GRPOConfig(max_steps=None), "max_steps: must be an integer, got None"),
    (lambda: Config(learning_rate=None), "learning_rate: must be a number, got None"),
    (lambda: GRPOConfig(warmup_steps=-1), "warmup_steps: must be >= 0, got -1"),
    (lambda: GRPOConfig(model_init_kwargs={"trust_remote_code": True}), "model_init_kwargs: minigrpo reads dtype "
                                                                        "only"),
    (lambda: GRPOTrainer("m", len, quantization_config=BitsAndBytesConfig(load_in_8bit=True)),
     "quantization_config: minigrpo quantizes to 4 bits only"),
], ids=["unsupported", "typo", "hub", "strategy", "scheduler", "dataset-object", "function-as-name", "callbacks",
        "grpo-config-to-train", "none", "none-config", "negative-warmup", "init-kwargs", "8-bit"])
def test_what_minigrpo_does_not_take_is_one_line(make, line):
    with pytest.raises(ConfigError) as error:
        make()
    assert str(error.value).startswith(line) and "\n" not in str(error.value)


def test_trl_defaults_and_names_pass_unchanged():
    assert GRPOConfig(push_to_hub=False, dataloader_num_workers=4, optim="adamw_torch").loss_type == "dapo"
    # TRL's grpo.py script: model_init_kwargs at from_pretrained's defaults; top_k None (TRL's default before 1.0)
    init = dict(revision="main", trust_remote_code=False, attn_implementation=None, dtype="bfloat16")
    assert GRPOConfig(model_init_kwargs=init, top_k=None).to_config(num_train_rows=8).dtype == "bfloat16"
    assert GRPOConfig(top_k=None).to_config(num_train_rows=8).top_k == 0
    qlora = GRPOTrainer("m", len, peft_config=LoraConfig(r=4), quantization_config=BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="fp4", bnb_4bit_use_double_quant=True)).args
    assert (qlora.use_peft, qlora.load_in_4bit, qlora.bnb_4bit_quant_type, qlora.use_bnb_nested_quant) == (
        True, True, "fp4", True)
    assert Config(report_to="tensorboard").report_to == ["tensorboard"]  # TRL's string form
    assert Config(lora_target_modules="all-linear").lora_target_modules is None  # peft's name for the default


# ---------------------------------------------------------------------------------------------------------
# GRPOTrainer with objects: a loaded model, datasets, a peft config, functions; config.yaml says what ran
# ---------------------------------------------------------------------------------------------------------
def brevity(prompts, completions, **row):
    return [-len(c) / 100 for c in completions]


STATES_SEEN = []


def curriculum(completions, trainer_state, log_metric, log_extra, **kwargs):
    """A reward function of TRL 1.16's kind: it reads the run's progress and logs a number and a column."""
    STATES_SEEN.append((trainer_state.global_step, trainer_state.max_steps, round(trainer_state.epoch, 4)))
    log_metric("curriculum/progress", trainer_state.global_step / trainer_state.max_steps)
    log_extra("characters", [len(c) for c in completions])
    return [0.0] * len(completions)


def test_reward_functions_get_trls_trainer_state_log_metric_and_log_extra(tmp_path, one_thread):
    """TRL counts optimizer steps: here 2 a batch (steps_per_generation 2), 4 in all, so the two batches are scored
    at global_step 0 and 2 (epoch 0, then 4 of the 15 training prompts: 0.2667); the metric is averaged into its
    step's line, the column written beside its completions."""
    STATES_SEEN.clear()
    args = GRPOConfig(str(tmp_path / "run"), task="think_addition", max_steps=4, per_device_train_batch_size=8,
                      steps_per_generation=2, num_generations=4, gradient_checkpointing=False, eval_num_samples=0,
                      eval_limit=4, save_model=False, disable_tqdm=True, max_completion_length=None)
    GRPOTrainer(model=str(THINK_MODEL), reward_funcs=["correctness", curriculum], args=args,
                train_dataset=rows(16)).train()
    assert STATES_SEEN == [(0, 4, 0.0), (2, 4, 0.2667)]
    assert [m["curriculum/progress"] for m in metrics(tmp_path / "run")] == [0.0, 0.5]
    logged = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert all(c["extra"]["characters"] == len(c["text"]) for record in logged for c in record["completions"])


def test_after_train_the_result_the_model_and_save_model_are_where_trl_scripts_look(tmp_path, one_thread):
    """A TRL script's ending: train()'s TrainOutput fields, trainer.model, save_model(args.output_dir) and
    from_pretrained(args.output_dir)."""
    from peft import AutoPeftModelForCausalLM, LoraConfig

    out = tmp_path / "run"
    args = GRPOConfig(str(out), task="think_addition", max_steps=2, per_device_train_batch_size=8, num_generations=4,
                      gradient_checkpointing=False, eval_num_samples=0, eval_limit=4, disable_tqdm=True,
                      max_completion_length=None)
    trainer = GRPOTrainer(model=str(THINK_MODEL), reward_funcs="correctness", args=args, train_dataset=rows(16),
                          peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    assert trainer.model is None  # given a name: loaded by train()
    result = trainer.train()
    losses = [m["loss"] for m in metrics(out)]
    assert (result.global_step, result["steps"]) == (2, 2) and result.training_loss == pytest.approx(sum(losses) / 2)
    assert result.metrics["train_loss"] == result.training_loss and result.metrics["train_runtime"] > 0
    assert trainer.model.config.model_type == "llama" and hasattr(trainer.model, "merge_and_unload")  # a PeftModel
    assert trainer.save_model(args.output_dir) == out
    reloaded = AutoPeftModelForCausalLM.from_pretrained(out)  # where TRL's save_model puts it
    adapter = {k: v for k, v in reloaded.state_dict().items() if "lora_B" in k}
    trained = trainer.model.state_dict()  # the trained adapter, as it was saved
    assert adapter and all(torch.equal(v, trained[k]) for k, v in adapter.items()) and any(v.any() for v in
                                                                                           adapter.values())
    assert (out / "model" / "adapter_model.safetensors").samefile(out / "adapter_model.safetensors")  # linked


def test_prompt_only_rows_train_on_the_rewards_alone(tmp_path, one_thread):
    """TRL's custom-reward examples (trl-lib/tldr with reward_len): rows with a prompt and no answer. Every row
    trains, nothing is graded or held out, and the reference "completion" column is not handed to the rewards."""
    seen = []

    def reward_len(completions, **kwargs):
        seen.append(sorted(kwargs))
        return [-abs(20 - len(c)) for c in completions]

    rows = [{"prompt": f"{a}+{a}=", "completion": "a reference summary"} for a in range(10, 30)]
    args = GRPOConfig(str(tmp_path / "run"), max_steps=2, per_device_train_batch_size=8, num_generations=4,
                      gradient_checkpointing=False, disable_tqdm=True, max_completion_length=32)
    trainer = GRPOTrainer(model=str(THINK_MODEL), reward_funcs=reward_len, args=args, train_dataset=rows)
    result = trainer.train()
    assert result["task"] == "prompts" and result["accuracy_before"] is None and result["num_test_problems"] == 0
    assert seen[0] == ["completion_ids", "log_extra", "log_metric", "prompts", "trainer_state"]  # TRL's, no more
    logged = metrics(tmp_path / "run")
    assert "accuracy" not in logged[0] and "rewards/reward_len/mean" in logged[0]
    first = json.loads((tmp_path / "run" / "completions.jsonl").read_text().splitlines()[0])
    assert first["completions"][0]["correct"] is None
    with pytest.raises(RewardError, match="'correctness' grades answers, and the prompts task's rows have none"):
        GRPOTrainer(model=str(THINK_MODEL), reward_funcs="correctness", train_dataset=rows,
                    args=dataclasses.replace(args, output_dir=str(tmp_path / "other"))).train()


def test_what_was_handed_over_from_python_is_named_in_the_config():
    from minigrpo.run import record_inputs
    from minigrpo.tasks.tool_addition import add

    cfg, train_rows, eval_rows = record_inputs(Config(), reward_funcs=["format", brevity], tools=[add],
                                               train_dataset=rows(5), eval_dataset=None)
    assert cfg.reward_funcs == ["format", "test_front_door:brevity"]  # load_callable reads the name back
    assert cfg.tools == ["minigrpo.tasks.tool_addition:add"]
    assert cfg.dataset_name.startswith("<train_dataset: 5 rows, columns answer, prompt; sha256 ")
    assert train_rows == rows(5) and eval_rows is None and cfg.eval_dataset_name is None
    same, _, _ = record_inputs(Config(), train_dataset=rows(5))
    other, _, _ = record_inputs(Config(), train_dataset=rows(5, start=1))
    assert same.dataset_name == cfg.dataset_name != other.dataset_name  # the hash is of the rows' content


def test_grpo_trainer_takes_objects_and_config_yaml_names_them(tmp_path, one_thread):
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(THINK_MODEL)
    args = GRPOConfig(str(tmp_path / "run"), task="think_addition", max_steps=2, per_device_train_batch_size=8,
                      num_generations=4, learning_rate=1e-4, gradient_checkpointing=False, eval_num_samples=0,
                      save_model=False, disable_tqdm=True, max_completion_length=None)  # the task's own
    trainer = GRPOTrainer(model=model, reward_funcs=["correctness", brevity], args=args,
                          train_dataset=Dataset.from_list(rows(12)), eval_dataset=rows(3, start=100),
                          processing_class=AutoTokenizer.from_pretrained(THINK_MODEL),
                          peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    summary = trainer.train()
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["reward_funcs"] == ["correctness", "test_front_door:brevity"]
    assert saved["model_name_or_path"] == str(THINK_MODEL)  # where the loaded model came from
    assert saved["dataset_name"].startswith("<train_dataset: 12 rows, columns answer, prompt; sha256 ")
    assert saved["eval_dataset_name"].startswith("<eval_dataset: 3 rows")
    assert (saved["use_peft"], saved["lora_r"], saved["lora_alpha"], saved["lora_target_modules"]) == (
        True, 4, 8, ["q_proj", "v_proj"])
    assert summary["steps"] == 2 and summary["num_test_problems"] == 3
    assert [m["step"] for m in metrics(tmp_path / "run")] == [1, 2]
    assert "rewards/brevity/mean" in metrics(tmp_path / "run")[0]


# ---------------------------------------------------------------------------------------------------------
# Nothing lost: a used folder is refused, resumed or replaced; Ctrl-C stops in one line and resumes exactly
# ---------------------------------------------------------------------------------------------------------
def file_hashes(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


INTERRUPTING_REWARD = '''\
import os
from minigrpo.tasks import get_task

calls = 0


def reward(prompts, completions, **row):
    """The task's correctness; raises KeyboardInterrupt (what Ctrl-C raises) on its third call if asked to."""
    global calls
    calls += 1
    if calls == 3 and os.environ.get("INTERRUPT_AT_STEP_3"):
        raise KeyboardInterrupt
    return get_task("think_addition").correctness_reward(prompts, completions, **row)
'''


def test_ctrl_c_stops_in_one_line_and_the_printed_command_resumes_exactly(tmp_path, capsys, monkeypatch,
                                                                            one_thread):
    (tmp_path / "interrupting.py").write_text(INTERRUPTING_REWARD)
    flags = SMALL + ["--save-steps", "2", "--reward-funcs", f"{tmp_path / 'interrupting.py'}:reward"]
    run, reference = tmp_path / "run", tmp_path / "reference"
    monkeypatch.setenv("INTERRUPT_AT_STEP_3", "1")
    assert main(["train", *flags, "--out", str(run)]) == 130
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"minigrpo train: stopped after step 2; the last checkpoint is "
                          f"{run / 'checkpoints' / 'step-000002.pt'} (step 2). Resume with: minigrpo train ")
    monkeypatch.delenv("INTERRUPT_AT_STEP_3")
    resume = shlex.split(err.split("Resume with: ")[1])
    assert resume[-2:] == ["--resume", str(run)]
    assert main(resume[1:]) == 0  # the printed command, as a user would paste it
    assert main(["train", *flags, "--out", str(reference)]) == 0  # never stopped
    assert metrics(run) == metrics(reference)


def test_an_error_mid_run_says_in_its_line_what_was_kept_and_how_to_resume(tmp_path, capsys, monkeypatch,
                                                                          one_thread):
    (tmp_path / "failing.py").write_text(INTERRUPTING_REWARD.replace("raise KeyboardInterrupt",
                                                                     "raise RuntimeError('judge down')"))
    run = tmp_path / "run"
    monkeypatch.setenv("INTERRUPT_AT_STEP_3", "1")
    assert main(["train", *SMALL, "--save-steps", "2", "--reward-funcs", f"{tmp_path / 'failing.py'}:reward",
                 "--out", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"minigrpo train: error: reward function 'reward' raised on the batch: RuntimeError('judge "
                          f"down'); stopped after step 2; the last checkpoint is "
                          f"{run / 'checkpoints' / 'step-000002.pt'} (step 2). Resume with: minigrpo train ")
    assert err.endswith(f"--resume {run}")


@pytest.mark.run_plots  # plots/ is one of the run's results it names
def test_a_second_run_into_a_used_folder_is_refused_and_changes_nothing(tmp_path, capsys, one_thread):
    run = tmp_path / "run"
    assert main(["train", *SMALL, "--max-steps", "1", "--out", str(run)]) == 0
    before = file_hashes(run)
    assert main(["train", *SMALL, "--max-steps", "1", "--task", "addition", "--out", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (f"minigrpo train: error: output_dir: {run} holds another run's results (config.yaml, metrics.jsonl, "
                   f"completions.jsonl, summary.json, plots); nothing was written. Choose another output_dir (--out), "
                   f"or replace it with overwrite_output_dir (--overwrite-output-dir)")  # no checkpoint there (save_steps 0): no --resume offered
    assert file_hashes(run) == before
    (run / "notes.txt").write_text("mine")  # not a run's file: --overwrite-output-dir leaves it
    assert main(["train", *SMALL, "--max-steps", "1", "--task", "addition", "--out", str(run),
                 "--overwrite-output-dir"]) == 0
    assert yaml.safe_load((run / "config.yaml").read_text())["task"] == "addition"
    assert (run / "notes.txt").read_text() == "mine"


def test_a_folder_of_someone_elses_is_never_deleted_and_a_run_that_logged_nothing_is_replaced(tmp_path):
    from minigrpo.config import Config
    from minigrpo.errors import ConfigError
    from minigrpo.run import claim_output_dir

    mine = tmp_path / "project"  # a user's own folder, with folders named as a run's are
    (mine / "model").mkdir(parents=True)
    (mine / "model" / "weights.bin").write_text("weights")
    (mine / "wandb").mkdir()
    for overwrite in (False, True):
        with pytest.raises(ConfigError, match=r"holds model, wandb but no run of minigrpo's .* nothing was written "
                                              r"or deleted"):
            claim_output_dir(Config(output_dir=str(mine), overwrite_output_dir=overwrite))
    assert (mine / "model" / "weights.bin").read_text() == "weights" and (mine / "wandb").is_dir()

    failed = tmp_path / "failed"  # a run whose first step raised: its config and empty logs, nothing else
    failed.mkdir()
    for name in ("config.yaml", "metrics.jsonl", "completions.jsonl"):
        (failed / name).write_text("task: x\n" if name == "config.yaml" else "")
    (failed / "notes.txt").write_text("mine")
    assert claim_output_dir(Config(output_dir=str(failed))) == failed  # the same command again just runs
    assert sorted(p.name for p in failed.iterdir()) == ["notes.txt"]
    from minigrpo.persistence.checkpoint import stopped_line

    cfg = Config(output_dir=str(failed))  # and a Ctrl-C before the first step says so
    (failed / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    (failed / "metrics.jsonl").write_text("")
    assert stopped_line(failed, "minigrpo train ...", cfg.to_dict()) == ("stopped before the first step; nothing to "
                                                                         "resume: the same command starts it again")

    (tmp_path / "a_file").write_text("x")
    for out, said in ((tmp_path / "a_file", "is a file"), (tmp_path / "a_file" / "run", "lies under a file")):
        with pytest.raises(ConfigError, match=f"output_dir: .* {said}, not a folder; nothing was written"):
            claim_output_dir(Config(output_dir=str(out)))


# ---------------------------------------------------------------------------------------------------------
# Every option explained; unknown commands and keys get "did you mean"; results as soon as they are known
# ---------------------------------------------------------------------------------------------------------
def test_every_config_field_has_a_description_that_help_shows(capsys):
    described = field_descriptions()
    assert set(described) == {f.name for f in dataclasses.fields(Config)}
    assert not [name for name, (_, text) in described.items() if not text.strip()]
    assert main(["train", "--help"]) == 0
    shown = capsys.readouterr().out
    for f in dataclasses.fields(Config):
        assert f"--{f.name.replace('_', '-')}" in shown and described[f.name][1][:60] in " ".join(shown.split())
    for short in ("--out", "--model", "--dataset", "--resume"):
        assert f", {short} " in shown
    assert "one of: 'grpo', 'bnpo', 'dapo'" in shown  # allowed values, from the loss table
    assert main(["train", "--help", "lora_alpha"]) == 0
    assert "lora_alpha / lora_r" in capsys.readouterr().out


def test_the_options_table_in_docs_is_generated_from_config_py():
    assert (ROOT / "docs" / "options.md").read_text() == options_markdown(), (
        "docs/options.md is stale: python -m minigrpo options --markdown > docs/options.md")


def test_an_unknown_command_says_so_and_suggests(capsys):
    assert main(["trian"]) == 2
    assert capsys.readouterr().err.startswith("minigrpo: unknown command 'trian'; did you mean train? (commands: ")


def test_the_accuracy_before_training_is_printed_before_the_first_step(tmp_path, capsys, one_thread):
    assert main(["train", *SMALL, "--max-steps", "1", "--logging-steps", "1", "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    before, step, after = (out.index(text) for text in ("before training: greedy accuracy", "step 1: reward",
                                                        "after training: greedy accuracy"))
    assert before < step < after
