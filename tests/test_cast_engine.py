"""The lab's bfloat16 sampler (minigrpo/lab/cast_engine.py): the train/inference mismatch made without vLLM. In
float32 it is the policy (every sampling/* difference exactly 0); in bfloat16 the trainer sees a mismatch, logs it
and corrects it as it does vLLM's."""

import pytest
import torch

from minigrpo.config import Config
from minigrpo.lab.cast_engine import CastEngine
from minigrpo.lab.plots import load_metrics
from minigrpo.trainer import train

pytestmark = pytest.mark.usefixtures("one_thread")


def run(tmp_path, dtype):
    cfg = Config(task="think_addition", max_steps=2, generation_batch_size=8, num_generations=4, eval_steps=0,
                 eval_limit=2, eval_num_samples=0, save_model=False, output_dir=str(tmp_path / str(dtype)))
    train(cfg, progress=False, engine_factory=lambda model, tokenizer: CastEngine(model, tokenizer, dtype))
    return load_metrics(cfg.output_dir)


def test_a_float32_copy_is_the_policy_and_a_bfloat16_one_is_not(tmp_path):
    control, bf16 = run(tmp_path, torch.float32), run(tmp_path, torch.bfloat16)
    for m in control:  # the same weights in the same precision: not a rounding apart
        assert m["sampling/sampling_logp_difference/max"] == 0.0
        assert m["sampling/importance_sampling_ratio/min"] == m["sampling/importance_sampling_ratio/max"] == 1.0
    for m in bf16:  # bfloat16 keeps 8 bits of mantissa: the log-probs differ, by a little
        assert 0 < m["sampling/sampling_logp_difference/mean"] < 0.05
        assert m["sampling/importance_sampling_ratio/min"] < 1 < m["sampling/importance_sampling_ratio/max"]
