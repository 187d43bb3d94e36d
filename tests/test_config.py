"""Config: TRL's names, YAML + flags, one-line errors naming the key."""

import dataclasses

import pytest

from minigrpo.cli import main
from minigrpo.config import Config, ConfigError, load_config

TRL_NAMES = ["num_generations", "max_completion_length", "beta", "epsilon", "epsilon_high", "delta", "loss_type",
             "scale_rewards", "importance_sampling_level", "num_iterations", "temperature", "learning_rate",
             "reward_weights", "mask_truncated_completions", "top_p", "generation_batch_size", "max_steps", "seed"]


def test_trl_field_names_exist():
    names = {f.name for f in dataclasses.fields(Config)}
    assert set(TRL_NAMES) <= names
    trl = pytest.importorskip("trl")
    trl_names = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    assert set(TRL_NAMES) <= trl_names  # the names really are TRL's


def test_yaml_then_flags(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("loss_type: dr_grpo\nscale_rewards: none\nnum_generations: 4\ngeneration_batch_size: 16\n")
    cfg = load_config(str(path), {"num-generations": "8", "out": "runs/x", "reward_weights": "1,0.5",
                                  "reward_funcs": "correctness,format", "bf16": "false", "epsilon_high": "None"})
    assert (cfg.loss_type, cfg.scale_rewards, cfg.num_generations) == ("dr_grpo", "none", 8)
    assert cfg.output_dir == "runs/x" and cfg.reward_weights == [1.0, 0.5] and cfg.epsilon_high is None


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"num_generation": 8}, "num_generation: unknown config key; did you mean num_generations?"),
        ({"per_device_train_batch_size": 8}, "per_device_train_batch_size: TRL's name; minigrpo's Config has "
                                             "generation_batch_size"),
        ({"loss_type": "gspo"}, "loss_type: 'gspo' is not one of .*; GSPO is a ratio, not a loss type: "
                                "importance_sampling_level sequence"),
        ({"loss_type": "ppo"}, "loss_type: 'ppo' is not one of"),
        ({"num_generations": 1}, "num_generations: must be >= 2"),
        ({"generation_batch_size": 10}, "generation_batch_size: 10 is not a multiple"),
        ({"max_steps": "ten"}, "max_steps: cannot read 'ten' as int"),
        ({"learning_rate": 0}, "learning_rate: must be > 0"),
        ({"reward_weights": [1, 2]}, "reward_weights: 2 weights for 1"),
        ({"bf16": "maybe"}, "bf16: cannot read"),
    ],
)
def test_bad_values_name_the_key(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, overrides)


def test_yaml_must_be_a_mapping(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(str(path))


def test_cli_prints_one_line_errors(capsys, tmp_path):
    assert main(["train", "--num-generatons", "4"]) == 2
    assert capsys.readouterr().err.strip() == ("minigrpo train: error: num_generatons: unknown config key; did you "
                                               "mean num_generations?")
    assert main(["train", "--model", str(tmp_path / "nowhere"), "--max-steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "nowhere" in err and "not a directory" in err
