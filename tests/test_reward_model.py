"""A reward model given as TRL users give one: scored as TRL 1.16's GRPOTrainer scores it, trained on with a weight
(or only logged, weight 0), with the drift from the start logged, and every bad input a one-line error."""

import json
import types

import pytest
import torch

from minigrpo.cli import main
from minigrpo.reward_models.outcome import RewardModel, is_reward_model, load_reward_model
from minigrpo.rewards import RewardError, score_completions

pytestmark = pytest.mark.usefixtures("single_torch_thread")  # conftest.py: one torch thread for this module

PROMPTS = ["12+34=", "5+6=", "987+654=", "38+85="]
COMPLETIONS = ["<think></think>46", "<think>5+6=11</think>11", "<think>7+4=11,8+5+1=14,9+6+1=16</think>1641",
               "<think>8+5=5,3+8=11</think>155"]  # of different lengths: padding is where scorers go wrong


def trl_scores(model, tokenizer, prompts, completions, chat_template_kwargs=None) -> torch.Tensor:
    """TRL 1.16's own `GRPOTrainer._calculate_rewards` on this batch, with the reward model as its only reward
    function: the method itself, on a trainer object holding just the attributes that path reads."""
    grpo_trainer = pytest.importorskip("trl.trainer.grpo_trainer")
    trainer = grpo_trainer.GRPOTrainer.__new__(grpo_trainer.GRPOTrainer)  # no __init__: no training set-up
    accelerator = types.SimpleNamespace(device=torch.device("cpu"), is_main_process=True)
    trainer.__dict__.update(
        accelerator=accelerator, args=types.SimpleNamespace(device=torch.device("cpu"), report_to=[]),
        is_deepspeed_enabled=False, reward_funcs=[model], reward_processing_classes=[tokenizer],
        reward_func_names=["rm"], chat_template_kwargs=chat_template_kwargs or {}, environments=None,
        state=types.SimpleNamespace(global_step=0), _log_completion_extra=None, _log_metric=None)
    rows = [{"prompt": p} for p in prompts]
    return trainer._calculate_rewards(rows, prompts, completions, [[0]] * len(prompts))[:, 0]


def test_scores_equal_trls_on_the_same_batch(reward_model_dir):
    rm = load_reward_model(reward_model_dir)
    ours = torch.tensor(rm(PROMPTS, COMPLETIONS))
    theirs = trl_scores(rm.model, rm.tokenizer, PROMPTS, COMPLETIONS)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    assert ours.unique().numel() == len(PROMPTS)  # four different texts, four different scores
    # Batched is the same as one by one: right padding, the last real token found by the model.
    one_by_one = torch.tensor([rm([p], [c])[0] for p, c in zip(PROMPTS, COMPLETIONS)])
    torch.testing.assert_close(ours, one_by_one, rtol=1e-5, atol=1e-5)
    assert rm.__name__ == "rm" and rm.learned  # TRL's name: the model id's last part


def test_completions_of_one_prompt_share_its_tokens_with_the_same_scores(reward_model_dir):
    """The G completions of a prompt begin with the same tokens: each distinct prefix runs once, the rest on its keys
    and values, and the scores are the padded forward's (the model's own logits at the last non-pad token) and TRL's.
    A text that ends in pad-token text (<pad> is token 0 here) is scored where the model scores it: at its last token
    that is not the pad token, as TRL's right-padded batch is."""
    from minigrpo.reward_models.outcome import sequence_scores, shared_prefix_lengths, shared_prefix_scores

    rm = load_reward_model(reward_model_dir)
    prompts = ["12+34="] * 3 + ["987+654="] * 2 + ["5+6="]  # groups of 3, 2 and 1
    completions = ["<think></think>46", "<think>2+4=6</think>46", "<think>4+3=7,2+1=3</think>37<pad><pad>",
                   "<think></think>1641", "<think>7+4=11</think>1", "<think>5+6=11</think>11"]
    ids = rm.tokenizer(rm.texts(prompts, completions), add_special_tokens=False)["input_ids"]
    # "12+34=<think>" is 7 tokens, "987+654=<think>" 9; a prompt of its own shares all but its last token.
    assert shared_prefix_lengths(ids, prompts) == [7, 7, 7, 9, 9, len(ids[5]) - 1]
    padded = rm.tokenizer.pad({"input_ids": ids}, padding_side="right", return_tensors="pt")
    with torch.inference_mode():
        shared = shared_prefix_scores(rm.model, rm.tokenizer.pad_token_id, ids, shared_prefix_lengths(ids, prompts))
        torch.testing.assert_close(shared, rm.model(**padded).logits[:, 0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(shared, sequence_scores(rm.model, rm.tokenizer, ids), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(torch.tensor(rm(prompts, completions)), trl_scores(rm.model, rm.tokenizer, prompts,
                                                                                 completions), rtol=1e-6, atol=1e-6)
    # A one-token text has no prefix to share: the padded path scores that batch.
    assert shared_prefix_scores(rm.model, rm.tokenizer.pad_token_id, [[6], [6, 7]], [0, 1]) is None


def test_conversational_rows_go_through_the_chat_template_as_trl_does(chat_model_dir, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(chat_model_dir, num_labels=1)
    tokenizer = AutoTokenizer.from_pretrained(chat_model_dir)
    prompts = [[{"role": "user", "content": f"What is {p}"}] for p in PROMPTS]
    completions = [[{"role": "assistant", "content": c}] for c in COMPLETIONS]
    rm = RewardModel(model, tokenizer)
    assert rm.texts(prompts[:1], completions[:1])[0].endswith("<|im_start|>assistant\n<think></think>46<|im_end|>\n")
    torch.testing.assert_close(torch.tensor(rm(prompts, completions)),
                               trl_scores(model, tokenizer, prompts, completions), rtol=1e-6, atol=1e-6)


def test_reward_model_entries_are_told_from_reward_names(reward_model_dir):
    assert is_reward_model(str(reward_model_dir)) and is_reward_model("OpenAssistant/reward-model-deberta-v3-large")
    for name in ("correctness", "r1_format", "my_rewards:score", "path/to/file.py:score", "path/to/file.py"):
        assert not is_reward_model(name), name


def test_training_on_a_reward_model_logs_both_rewards_and_the_drift(reward_model_dir, tmp_path, one_thread):
    """The issue's command: the reward model trains (weight 1), the checker is only watched (weight 0)."""
    out = tmp_path / "run"
    code = main(["train", "--reward-funcs", f"{reward_model_dir},correctness", "--reward-weights", "1,0",
                 "--max-steps", "2", "--num-generations", "4", "--generation-batch-size", "8", "--eval-steps", "0",
                 "--eval-limit", "4", "--eval-num-samples", "0", "--save-model", "false", "--out", str(out)])
    assert code == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        assert row["reward"] == pytest.approx(row["rewards/rm/mean"], abs=1e-6)  # weight 0: the checker adds nothing
        assert 0 <= row["rewards/correctness_reward/mean"] <= 1
        assert row["drift/d"] == pytest.approx(row["drift/kl"] ** 0.5)
    assert rows[0]["drift/kl"] == 0.0  # the first batch is sampled by the starting policy itself
    assert rows[1]["drift/kl"] > 0.0  # after one update it has moved


def test_trls_front_door_takes_reward_models_with_their_tokenizers_and_weights(reward_model_dir, tmp_path,
                                                                               one_thread):
    """GRPOTrainer(reward_funcs=[a loaded reward model, "correctness"], reward_processing_classes=[its tokenizer,
    None], args=GRPOConfig(reward_weights=[1, 0])), as a TRL script gives them."""
    import yaml
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from minigrpo import GRPOConfig, GRPOTrainer
    from minigrpo.config import ConfigError

    model = AutoModelForSequenceClassification.from_pretrained(reward_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(reward_model_dir)
    args = GRPOConfig(str(tmp_path / "run"), task="think_addition", max_steps=1, per_device_train_batch_size=8,
                      num_generations=4, reward_weights=[1.0, 0.0], eval_limit=4, eval_num_samples=0,
                      save_model=False, disable_tqdm=True, max_completion_length=None)
    trainer = GRPOTrainer(model=get_task_model_dir(), reward_funcs=[model, "correctness"], args=args,
                          reward_processing_classes=[tokenizer, None])
    assert isinstance(trainer.reward_funcs[0], RewardModel) and trainer.reward_funcs[0].tokenizer is tokenizer
    trainer.train()
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["reward"] == pytest.approx(row["rewards/rm/mean"], abs=1e-6) and "drift/kl" in row
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["reward_funcs"] == [
        str(reward_model_dir), "correctness"]  # the reward model named by where it came from
    with pytest.raises(ConfigError, match=r"^reward_processing_classes: 1 for 2 reward functions \(one per"):
        GRPOTrainer(model=get_task_model_dir(), reward_funcs=[str(reward_model_dir), "correctness"],
                    reward_processing_classes=[tokenizer])
    with pytest.raises(ConfigError, match=r"^reward_weights: 2 weights for 1 reward_funcs$"):  # checked once known
        GRPOTrainer(model=get_task_model_dir(), reward_funcs=["correctness"], args=args).config()


def get_task_model_dir() -> str:
    from minigrpo.tasks import get_task

    return str(get_task("think_addition").model_dir)


def bad_input(tmp_path, reward_model_dir, what: str):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = tmp_path / what
    model = AutoModelForSequenceClassification.from_pretrained(reward_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(reward_model_dir)
    if what == "two_labels":
        model = AutoModelForSequenceClassification.from_pretrained(reward_model_dir, num_labels=2,
                                                                   ignore_mismatched_sizes=True)
    if what == "no_pad_token":
        tokenizer.pad_token = None
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.parametrize("what, message", [
    ("causal_lm", "is a LlamaForCausalLM, not a sequence-classification model"),
    ("two_labels", "has num_labels=2; a reward model outputs one score"),
    ("no_pad_token", "has no pad token"),
    ("missing", "is neither a built-in reward, a directory nor a hub id"),
])
def test_bad_reward_models_are_one_line_errors(what, message, reward_model_dir, tmp_path, capsys):
    from minigrpo.tasks import get_task

    path = {"causal_lm": get_task("think_addition").model_dir, "missing": "./no/such/rm"}.get(what)
    path = path or bad_input(tmp_path, reward_model_dir, what)
    with pytest.raises(RewardError, match=message):
        load_reward_model(path)
    assert main(["train", "--reward-funcs", str(path), "--max-steps", "1", "--out", str(tmp_path / "run")]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]  # the policy's load may draw a progress bar above it
    assert line.startswith("minigrpo train: error: reward_funcs: ") and message in line


def test_a_nan_score_is_an_unscorable_completion_said_once(reward_model_dir):
    rm = load_reward_model(reward_model_dir)
    with torch.no_grad():
        rm.model.score.weight[:, :7] = float("nan")  # (the hidden state's first features): every score NaN
    with pytest.warns(UserWarning, match=r"scored 4 of 4 completions NaN: each is unscorable"):
        rewards, unscorable = score_completions([rm], PROMPTS, COMPLETIONS, {})
    assert unscorable.all()  # rewards.py's policy: kept out of the baseline, advantage 0, counted in frac_reward_nan


def test_memory_counts_the_reward_model(reward_model_dir):
    """`minigrpo memory`: a recipe's floor holds the reward model's weights and the start kept for the drift; a
    measured step scores its batch with one and counts its parameters as held."""
    from minigrpo.config import load_config
    from minigrpo.lab.memory import measure_setup, recipe_floor, shape_dir

    rm_params = sum(p.numel() for p in load_reward_model(reward_model_dir).model.parameters())
    floor = recipe_floor(load_config(None, {"reward_funcs": [str(reward_model_dir), "correctness"]}))
    checker_only = recipe_floor(load_config(None, {"reward_funcs": ["correctness"]}))
    assert floor["reward_models"] == 4 * rm_params and checker_only["reward_models"] == 0  # float32
    assert floor["reference"] == floor["weights"] and checker_only["reference"] == 0  # the start, for the drift
    assert floor["floor"] == checker_only["floor"] + floor["reward_models"] + floor["reference"]
    step = dict(batch_size=2, num_generations=2, prompt_length=4, completion_length=4, steps=1)
    model_dir = str(shape_dir("tiny", "unused"))
    with_rm, without = (measure_setup("grpo-lora", model_dir, reward_model=rm, **step) for rm in (True, False))
    assert with_rm["total_params"] == without["total_params"] + rm_params  # the same shape's body, a scalar head


def test_an_ensemble_scores_each_completion_by_its_members_minimum(reward_model_dir):
    from minigrpo.reward_models.outcome import RewardEnsemble

    first, second = load_reward_model(reward_model_dir), load_reward_model(reward_model_dir)
    with torch.no_grad():
        second.model.score.weight.neg_()  # a member that disagrees
    a, b = torch.tensor(first(PROMPTS, COMPLETIONS)), torch.tensor(second(PROMPTS, COMPLETIONS))
    ensemble = RewardEnsemble([first, second], name="rm")
    assert ensemble(PROMPTS, COMPLETIONS) == pytest.approx(torch.minimum(a, b).tolist())
    assert RewardEnsemble([first, second], reduce="mean")(PROMPTS, COMPLETIONS) == pytest.approx(((a + b) / 2).tolist())
    assert ensemble.learned and ensemble.__name__ == "rm"
    with pytest.raises(RewardError, match="reduce must be 'min' or 'mean'"):
        RewardEnsemble([first], reduce="max")
