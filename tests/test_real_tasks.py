"""The pieces a real model's run is made of, without a model: the R1 answer format, GSM8K rows, datasets from
files, folders and the hub, reward functions named on the command line, and the truncation warning."""

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minigrpo.cli import main
from minigrpo.config import ConfigError, load_config
from minigrpo.lab.memory import HUB_SHAPES, distinct_prompts, format_recipe_table, qwen_config, recipe_floor
from minigrpo.prompts import completions_for_rewards, is_conversational
from minigrpo.rewards import RewardError, load_reward_func, r1_format, r1_format_soft
from minigrpo.tasks import DataError, get_task
from minigrpo.tasks.answers import R1_SYSTEM_PROMPT, boxed, final_answer, normalize_number, same_answer
from minigrpo.tasks.gsm8k import gsm8k_reference
from minigrpo.tasks.sources import held_out_size, read_dataset

GSM8K, ANSWER = get_task("gsm8k"), get_task("answer")


# ---- reading the final answer ------------------------------------------------------------------------------
@pytest.mark.parametrize("text, number", [
    ("72", "72"), ("1,234", "1234"), ("$1,234.00", "1234"), ("72.0", "72"), ("0.50", "0.5"), ("-0", "0"),
    (" 7. ", "7"), ("007", "7"), ("-3.25", "-3.25"), ("seventy-two", None), ("1.2.3", None), ("", None),
    ("1e5", None), ("9" * 1001, None),
])
def test_normalize_number(text, number):
    assert normalize_number(text) == number


@pytest.mark.parametrize("completion, answer", [
    ("<think>48/2 = 24, 48 + 24 = 72</think>\n<answer>72</answer>", "72"),  # the tag wins
    ("<answer>71</answer> no wait <answer> 72 </answer>", "72"),  # the last tag
    ("so the total is \\boxed{72}.", "72"),  # no tag: \boxed{}
    ("\\boxed{\\frac{1}{2}} then \\boxed{3}", "3"),
    ("She sold 48 + 24 = 72 clips.", "72"),  # neither: the last number
    ("The answer is $1,000.", "$1,000"),
    ("no number here", None),
    ("", None),
])
def test_final_answer_reads_tag_then_boxed_then_last_number(completion, answer):
    assert final_answer(completion) == answer


def test_boxed_matches_nested_braces_and_refuses_unclosed():
    assert boxed("\\boxed{\\frac{3}{4}}") == "\\frac{3}{4}"
    assert boxed("\\boxed{12") is None


@pytest.mark.parametrize("predicted, reference, same", [
    ("72", "72", True), ("72.00", "72", True), ("$72", "72", True), ("1,234", "1234", True),
    ("The answer is 72", "72", True), ("71", "72", False), (None, "72", False),
    ("Paris", "paris", True), ("Paris ", "Lyon", False),
])
def test_same_answer(predicted, reference, same):
    assert same_answer(predicted, reference) is same


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_grading_any_text_never_raises(text):
    assert GSM8K.grade(text, {"answer": "72"}) in (True, False)
    assert ANSWER.is_well_formed(text) in (True, False)


def test_hostile_completions_are_just_wrong():
    hostile = ["<answer>__import__('os').system('echo pwned')</answer>", "<answer>" + "9" * 100_000 + "</answer>",
               "\\boxed{" * 10_000, "<answer>" * 5_000, "<answer>1e999999</answer>", "\x00\x01<answer></answer>"]
    assert [GSM8K.grade(text, {"answer": "72"}) for text in hostile] == [False] * len(hostile)


# ---- GSM8K rows --------------------------------------------------------------------------------------------
HUB_ROW = {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in "
                       "May. How many clips did Natalia sell altogether in April and May?",
           "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
                     "altogether in April and May.\n#### 72"}


def test_a_gsm8k_hub_row_becomes_a_chat_prompt_with_the_number_after_the_hashes():
    row = GSM8K.prepare_row(HUB_ROW)
    assert row["prompt"] == [{"role": "system", "content": R1_SYSTEM_PROMPT},
                             {"role": "user", "content": HUB_ROW["question"]}]
    assert row["answer"] == "72" and row["solution"] == HUB_ROW["answer"]
    assert gsm8k_reference("... #### 1,234") == "1234"
    with pytest.raises(DataError, match="without '####'"):
        gsm8k_reference("no final answer")


def test_the_gsm8k_reward_takes_trl_conversational_completions():
    prompts = [GSM8K.prepare_row(HUB_ROW)["prompt"]] * 3
    texts = ["<think>48/2=24</think><answer>72</answer>", "<answer>70</answer>", "It is 72."]
    completions = completions_for_rewards(prompts, texts)
    assert completions[0] == [{"role": "assistant", "content": texts[0]}]
    assert GSM8K.correctness_reward(prompts, completions, answer=["72"] * 3, solution=["s"] * 3) == [1.0, 0.0, 1.0]
    assert GSM8K.format_reward(prompts, completions) == [1.0, 0.0, 0.0]
    assert completions_for_rewards(["3+4="], ["7"]) == ["7"] and not is_conversational("3+4=")


# ---- the R1 format rewards -----------------------------------------------------------------------------------
def test_r1_format_strict_and_soft():
    completions = ["<think>\n24 + 48\n</think>\n<answer>\n72\n</answer>",  # both
                   "<think>24 + 48</think> <answer>72</answer>",  # soft only: tags not on their own lines
                   "Sure! <think>x</think>\n<answer>72</answer> Hope that helps.",  # soft only: text around
                   "<answer>72</answer><think>x</think>",  # neither: wrong order
                   "<think>\nx\n</think>\n", ""]
    assert r1_format(None, completions) == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert r1_format_soft(None, completions) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]


# ---- datasets: files, folders, the hub ------------------------------------------------------------------------
def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_single_file_holds_out_its_last_tenth_for_evaluation(tmp_path):
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(30)]
    path = write_jsonl(tmp_path / "mine.jsonl", rows)
    train, test = read_dataset(str(path), "train"), read_dataset(str(path), "test")
    assert train == rows[:27] and test == rows[27:]  # 30 // 10 = 3 held out, never trained on
    assert [held_out_size(n) for n in (0, 1, 2, 19, 100, 10_000)] == [0, 0, 1, 1, 10, 500]


def test_a_file_of_prompts_alone_trains_every_row_on_the_rewards_alone(tmp_path, capsys, one_thread):
    """--task prompts: a file's rows all train (no tenth held out: nothing to grade); 'correctness' is refused."""
    from minigrpo.tasks import DATA_DIR, get_task

    path = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": f"{a}+{a}="} for a in range(30)])
    assert len(get_task("prompts").load("train", str(path))) == 30 and get_task("prompts").load("test", str(path)) == []
    (tmp_path / "rewards.py").write_text("def brevity(completions, **kw):\n    return [-len(c) for c in completions]\n")
    argv = ["train", "--task", "prompts", "--dataset", str(path), "--model", str(DATA_DIR / "models" / "think_addition"),
            "--max-completion-length", "32", "--max-steps", "1", "--generation-batch-size", "8", "--num-generations",
            "4", "--save-model", "false", "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    assert "'correctness' grades answers, and the prompts task's rows have none" in capsys.readouterr().err
    assert main([*argv, "--reward-funcs", f"{tmp_path / 'rewards.py'}:brevity"]) == 0
    out = capsys.readouterr().out
    assert "before training: no answers to grade" in out and "no accuracy (nothing to grade), 1 step in" in out


def test_a_folder_in_the_hub_layout_reads_parquet_and_jsonl_splits(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "main").mkdir()
    pq.write_table(pa.Table.from_pylist([HUB_ROW] * 3), tmp_path / "main" / "test-00000-of-00001.parquet")
    write_jsonl(tmp_path / "main" / "train.jsonl", [HUB_ROW] * 5)
    test = GSM8K.load("test", str(tmp_path), "main")
    assert len(test) == 3 and test[0]["answer"] == "72" and test[0]["prompt"][0]["role"] == "system"
    assert len(GSM8K.load("train", str(tmp_path), "main")) == 5
    with pytest.raises(DataError, match="no 'validation' split"):
        GSM8K.load("validation", str(tmp_path), "main")


def test_rows_without_a_prompt_or_the_graded_column_are_named(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "q", "answer": "1"}] * 20 + [{"question": "q"}])
    with pytest.raises(DataError, match=r"\(test split\), row 2: no \"prompt\" column \(columns: 'question'\)"):
        ANSWER.load("test", str(path))
    path = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "q"}] * 20)
    with pytest.raises(DataError, match=r"row 1: missing column 'answer' \(or TRL's 'solution'\), the final answer "
                                        r"that the accuracy .* is graded against; rows with no answer, scored by "
                                        r"reward functions alone, are the prompts task's \(task: prompts\)"):
        ANSWER.load("train", str(path))
    path = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": [{"role": "user"}], "answer": "1"}] * 20)
    with pytest.raises(DataError, match="a string or a list of"):
        ANSWER.load("train", str(path))


def test_a_hub_dataset_while_offline_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataError) as info:
        read_dataset("someone/no-such-dataset", "train")
    message = str(info.value)
    assert message.startswith("dataset_name: cannot load 'someone/no-such-dataset'") and "local copy" in message
    assert "\n" not in message
    with pytest.raises(DataError, match="does not exist"):
        read_dataset("./missing.jsonl", "train")


# ---- reward functions named on the command line ----------------------------------------------------------------
def test_a_reward_function_from_a_file_or_module(tmp_path):
    (tmp_path / "my_rewards.py").write_text("def shorter(prompts, completions, **row):\n"
                                            "    return [-len(c) / 100 for c in completions]\nNOT_A_FUNCTION = 3\n")
    shorter = load_reward_func(f"{tmp_path}/my_rewards.py:shorter")
    assert shorter(["p"], ["abcd"]) == [-0.04]
    assert load_reward_func("minigrpo.rewards:r1_format") is r1_format
    for spec, match in [("no_such_module_xyz:f", "ModuleNotFoundError"), ("minigrpo.rewards:nope", "AttributeError"),
                        (f"{tmp_path}/missing.py:f", "no file"), (f"{tmp_path}/my_rewards.py:NOT_A_FUNCTION", "not a function")]:
        with pytest.raises(RewardError, match=f"reward_funcs: .*{match}"):
            load_reward_func(spec)


def test_cli_names_a_reward_that_does_not_import_and_a_task_without_a_model(capsys, tmp_path):
    assert main(["train", "--reward-funcs", "no_such_module_xyz:f", "--max-steps", "1", "--out", str(tmp_path / "a"),
                 "--eval-limit", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("minigrpo train: error: reward_funcs: cannot load 'no_such_module_xyz:f'")
    assert main(["train", "--task", "gsm8k", "--out", str(tmp_path / "b")]) == 2
    assert "model_name_or_path: the task 'gsm8k' ships no model" in capsys.readouterr().err


def test_chat_template_kwargs_and_dataset_flags():
    cfg = load_config(None, {"dataset": "rows.jsonl", "chat_template_kwargs": '{"enable_thinking": false}'})
    assert cfg.dataset_name == "rows.jsonl" and cfg.chat_template_kwargs == {"enable_thinking": False}
    with pytest.raises(ConfigError, match="chat_template_kwargs: cannot read"):
        load_config(None, {"chat_template_kwargs": "[1, 2]"})


# ---- recipes ------------------------------------------------------------------------------------------------
RECIPES = sorted((Path(__file__).resolve().parents[1] / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_every_recipe_loads_and_its_memory_is_computed(recipe):
    cfg = load_config(str(recipe))
    assert cfg.model_name_or_path and get_task(cfg.task)
    floor = recipe_floor(cfg)
    # activations (16-bit under bf16): each distinct prompt of a mini-batch once (200 tokens), every completion, 34 h
    # bytes per token and layer, plus each row's copy of its prompt's keys and values (2 x kv heads x head size)
    shape = qwen_config(HUB_SHAPES[cfg.model_name_or_path])
    mini_batch = cfg.generation_batch_size // cfg.steps_per_generation // cfg.gradient_accumulation_steps
    # one mini-batch per generation, micro-batches of 8 sorted rows (within one group of G = 8 or 16) or of 16 (two
    # whole groups of 8)
    assert cfg.steps_per_generation == 1 and (cfg.num_generations % mini_batch == 0 or mini_batch % cfg.num_generations == 0)
    prompts = max(1, mini_batch // cfg.num_generations)
    tokens = prompts * 200 + mini_batch * cfg.max_completion_length
    kv_size = shape.num_key_value_heads * (getattr(shape, "head_dim", None) or shape.hidden_size // shape.num_attention_heads)
    kv_copies = mini_batch * 200 * 2 * kv_size * 2
    assert floor["activations"] == (tokens * 34 * shape.hidden_size + kv_copies) * shape.num_hidden_layers
    # every row running its own prompt (shared_prefix false): mini-batch x (200 + completion) tokens
    unshared = recipe_floor(load_config(None, {**cfg.to_dict(), "shared_prefix": False}))
    assert unshared["activations"] == (mini_batch * (200 + cfg.max_completion_length) * shape.num_hidden_layers
                                       * 34 * shape.hidden_size) > floor["activations"]
    # logits: one block of the head (2^25 logits: 220 tokens x 151,936), 3 float32 copies (logprobs.py)
    assert floor["logits"] == 3 * 220 * 151936 * 4
    # gradient_checkpointing: every layer's input (h values per token, 2 bytes) and one layer's 34 h
    checkpointed = recipe_floor(load_config(None, {**cfg.to_dict(), "gradient_checkpointing": True}))
    assert checkpointed["activations"] == (tokens * (shape.num_hidden_layers * 2 + 34) * shape.hidden_size
                                           + kv_copies)
    # float32 weights trained under bf16 / fp16: autocast's 16-bit copy of every weight a product uses (the blocks'
    # linear layers and the head), kept for backward
    copies = 2 * floor["matmul_weights"] if cfg.bf16 and cfg.dtype == "float32" and not cfg.use_peft else 0
    assert floor["autocast_copies"] == copies
    assert floor["floor"] == floor["total"] + floor["reference"] + floor["logits"] + floor["activations"] + copies


def test_distinct_prompts_in_a_micro_batch_by_hand():
    # G = 8, 64 rows sorted into micro-batches: of 8 rows (one group each), 16 (two), 4 (half a group), 12 (rows
    # 0-11, 12-23, ...: some span two groups, others three: at most ceil(12 / 8) + 1 = 3)
    assert [distinct_prompts(m, 8, 64, 1) for m in (8, 16, 4, 12)] == [1, 2, 1, 3]
    # random mini-batches (steps_per_generation 2) hold rows of any group: up to every prompt, or one per row
    assert distinct_prompts(8, 8, 64, 2) == 8 and distinct_prompts(32, 8, 64, 2) == 8


def test_quantizing_the_base_shrinks_the_recipe_floor():
    cfg = load_config(str(RECIPES[0].parent / "qwen2.5-0.5b-instruct_gsm8k_qlora.yaml"))
    qlora = recipe_floor(cfg)
    lora = recipe_floor(load_config(None, {**cfg.to_dict(), "load_in_4bit": False}))
    assert qlora["trainable_params"] == lora["trainable_params"] and qlora["weights"] < 0.8 * lora["weights"]
    # Not 4x: the block linears go from 16 bits to 4.127, but peft's prepare_model_for_kbit_training puts every weight
    # it does not quantize in float32, at Qwen2.5-0.5B mostly the tied 151,936 x 896 embedding: 0.51 of 0.71 GiB
    assert 4 * 151936 * 896 > 0.7 * qlora["weights"]


def test_a_task_reward_ignores_what_trl_passes_besides_the_columns():
    # TRL 1.16 calls reward functions with trainer_state=... (and log helpers) beside the dataset's columns
    completions = ["<answer>72</answer>", "<answer>7</answer>"]
    assert GSM8K.correctness_reward(None, completions, answer=["72", "72"], trainer_state=object(),
                                    log_metric=print) == [1.0, 0.0]


def test_a_vllm_recipe_counts_vllms_share_of_the_gpu():
    cfg = load_config(str(RECIPES[0].parent / "qwen2.5-0.5b-instruct_gsm8k_qlora_vllm.yaml"))
    assert cfg.use_vllm and cfg.load_in_4bit and cfg.vllm_gpu_memory_utilization == 0.3
    floor = recipe_floor(cfg, gpu_bytes=8 * 2**30)
    shape = qwen_config(HUB_SHAPES[cfg.model_name_or_path])
    # vLLM's copy of the base: the 4-bit weights dequantized to bfloat16, every parameter but the adapter's
    assert floor["vllm"]["weights"] == (floor["total_params"] - floor["trainable_params"]) * 2
    # KV cache: 64 sequences x (200 + 512) tokens x keys and values x 24 layers x 2 kv heads x 64 x 2 bytes
    assert floor["vllm"]["kv_cache"] == 64 * 712 * 2 * 24 * 2 * 64 * 2 == floor["vllm"]["total"] - floor["vllm"]["weights"]
    assert floor["vllm_share"] == 0.3 * 8 * 2**30
    table = format_recipe_table("recipe.yaml", floor)
    assert "| **vLLM needs** | 1.44 |" in table and "leaving the trainer 5.60 GiB: both fit." in table
    assert "does not fit" in format_recipe_table("recipe.yaml", recipe_floor(cfg, gpu_bytes=4 * 2**30))
    assert "vllm" not in recipe_floor(load_config(str(RECIPES[0].parent / "qwen2.5-0.5b-instruct_gsm8k_qlora.yaml")))
