"""GRPO on the shipped tiny model really learns: a short run must lift held-out greedy accuracy.

Not a timing test: a fixed number of steps, on CPU, deterministic in the seed. It can fail — a sign error in
the loss, a wrong mask, a broken reward or tokenizer decoder would leave accuracy flat or make it fall.
"""

from minigrpo.config import Config
from minigrpo.trainer import train


def test_grpo_lifts_greedy_accuracy_on_addition(tmp_path):
    cfg = Config(task="addition", output_dir=str(tmp_path / "run"), max_steps=50, eval_steps=0, eval_limit=200,
                 eval_num_samples=1, save_model=False, seed=0)
    summary = train(cfg, progress=False)
    assert summary["accuracy_after"] >= summary["accuracy_before"] + 0.05, summary
