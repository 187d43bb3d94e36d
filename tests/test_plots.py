"""The plotting functions draw what they are given, labelled: hand-made metrics and tensors in, artists checked."""

import math

import pytest

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from minigrpo.advantages import group_advantages  # noqa: E402
from minigrpo.objectives.grpo import clipped_surrogate  # noqa: E402
from minigrpo.lab.plots import (  # noqa: E402
    _series, plot_advantage_heatmap, plot_advantage_vs_num_correct, plot_completion_lengths, plot_curve, plot_histograms, plot_kl_samples,
    plot_memory, plot_run_overview, plot_surrogate, plot_token_heatmap, plot_token_ratios,
)

pytestmark = pytest.mark.run_plots  # plot_runs itself, not skipped here (tests/conftest.py)

METRICS = [  # three logged steps; eval at steps 2 and 3
    {"step": 1, "step_seconds": 1.5, "reward": 0.2, "frac_reward_zero_std": 0.5, "entropy": 1.0, "advantages": [1.0, -1.0, 0.0],
     "completions/mean_length": 10.0, "completions/mean_length_correct": 20.0, "completions/mean_length_incorrect": 5.0},
    {"step": 2, "step_seconds": 2.0, "reward": 0.4, "frac_reward_zero_std": 0.4, "entropy": 0.9, "advantages": [0.5, -0.5, 0.0],
     "completions/mean_length": 12.0, "completions/mean_length_correct": 20.0, "completions/mean_length_incorrect": None,
     "eval/accuracy_greedy": 0.5},
    {"step": 3, "step_seconds": 1.0, "reward": 0.6, "frac_reward_zero_std": 0.3, "entropy": 0.8, "advantages": [0.2, -0.2, 0.0],
     "completions/mean_length": 15.0, "completions/mean_length_correct": 19.0, "completions/mean_length_incorrect": 6.0,
     "eval/accuracy_greedy": 0.7},
]


def teardown_function():
    plt.close("all")


def test_series_against_steps_and_training_time():
    assert _series(METRICS, "eval/accuracy_greedy") == ([2, 3], [0.5, 0.7])
    assert _series(METRICS, "eval/accuracy_greedy", x="seconds") == ([3.5, 4.5], [0.5, 0.7])  # 1.5 + 2.0, then + 1.0


def test_plot_curve_starts_at_the_given_value_and_labels_axes():
    ax = plot_curve({"run": METRICS}, "eval/accuracy_greedy", window=1, x="seconds", start={"run": 0.3})
    (line,) = ax.get_lines()
    assert list(line.get_xdata()) == [0, 3.5, 4.5] and list(line.get_ydata()) == [0.3, 0.5, 0.7]
    assert "time" in ax.get_xlabel() and ax.get_legend() is not None


def test_completion_lengths_draw_three_lines_per_run_skipping_missing_values():
    ax = plot_completion_lengths({"a": METRICS, "b": METRICS}, window=1)
    lines = ax.get_lines()
    assert len(lines) == 6
    wrong = [ln for ln in lines if ln.get_label() == "a: wrong"][0]
    assert list(wrong.get_xdata()) == [1, 3]


def test_run_overview_has_six_titled_panels():
    summary = {"accuracy_before": 0.3, "accuracy_after": 0.8, "steps": 3, "num_test_problems": 200}
    fig = plot_run_overview(METRICS, summary, title="toy")
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]  # the heat map adds its colour bar
    assert len(panels) == 6 and all(ax.get_title() for ax in panels)


def test_advantage_vs_num_correct_calls_the_scheme_for_every_k():
    ax = plot_advantage_vs_num_correct({"pop": lambda r: group_advantages(r, 4, std="population", eps=0.0)[0]}, 4)
    right, wrong = ax.get_lines()[:2]
    assert math.isnan(right.get_ydata()[0]) and right.get_ydata()[2] == 1.0  # k = 2 of 4: +1
    assert wrong.get_ydata()[2] == -1.0 and math.isnan(wrong.get_ydata()[4])


def test_histograms_share_bins_and_drop_nans():
    ax = plot_histograms({"a": torch.tensor([0.0, 1.0, float("nan")]), "b": torch.tensor([0.5])}, bins=4)
    assert len(ax.patches) == 2 and ax.get_xlabel() == "advantage"


def test_heatmap_blanks_padding():
    values = torch.tensor([[1.0, -1.0], [0.5, 9.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    ax = plot_token_heatmap(values, mask, tokens=[["a", "b"], ["c", "d"]])
    shown = ax.images[0].get_array()
    assert shown.mask[1, 1] or math.isnan(shown[1, 1])  # padding is not drawn
    assert ax.images[0].norm.vmax == 1.0  # the padded 9.0 does not set the colour scale
    assert len(ax.texts) == 3


def test_surrogate_marks_exactly_the_clipped_stretch():
    ax = plot_surrogate({"clip": lambda r, a: clipped_surrogate(r, a, 0.2, 0.2)}, adv=1.0, ratio_range=(0.5, 1.5))
    curve, flat = ax.get_lines()[:2]
    assert max(curve.get_ydata()) == 1.2  # the objective stops at 1 + eps
    assert min(flat.get_xdata()) >= 1.2 - 1e-9 and len(flat.get_xdata()) > 0


def test_kl_and_ratio_plots_draw_one_line_per_estimator():
    axes = plot_kl_samples({"k1": torch.randn(50), "k3": torch.rand(50)}, exact_kl=0.1)
    assert len(axes[1].get_lines()) == 3  # two running means and the exact value
    ax = plot_token_ratios(torch.tensor([1.0, 1.5]), {"mean": 1.25}, clip_range=(0.8, 1.2))
    assert len(ax.patches) == 3  # two bars and the clip band


def test_run_comparison_draws_every_run_on_nine_shared_panels_with_one_legend():
    from minigrpo.lab.plots import plot_run_comparison

    fig = plot_run_comparison({"a": METRICS, "b": METRICS}, start={"a": 0.3, "b": 0.3}, title="toy", window=1)
    assert len(fig.axes) == 9 and all(ax.get_title() for ax in fig.axes)
    assert all(ax.get_legend() is None for ax in fig.axes) and len(fig.legends) == 1
    accuracy = fig.axes[0].get_lines()
    assert [list(line.get_xdata()) for line in accuracy] == [[0, 2, 3]] * 2  # starts at step 0
    assert len({ax.get_ylim() for ax in fig.axes[3:6]}) == 1  # the three length panels share their y range


def test_length_drift_is_last_minus_first_for_all_right_and_wrong():
    from minigrpo.lab.plots import plot_length_drift

    ax = plot_length_drift({"run": METRICS}, first=1, last=1)
    heights = [patch.get_height() for patch in ax.patches]
    assert heights == [15.0 - 10.0, 19.0 - 20.0, 6.0 - 5.0]  # all, right answers, wrong answers (None skipped)


def test_plot_memory_draws_measured_bars_above_the_baseline_and_stacks_the_estimate():
    mib = 2**20
    results = [{"setup": "grpo-full", "peak_bytes": 500 * mib, "baseline_bytes": 400 * mib},
               {"setup": "ppo-critic", "peak_bytes": 600 * mib, "baseline_bytes": 400 * mib}]
    estimates = {s: {"weights": 10 * mib * k, "gradients": 10 * mib * k, "optimizer": 20 * mib * k}
                 for s, k in (("grpo-full", 1), ("ppo-critic", 2))}
    ax = plot_memory(results, "cpu", estimates=estimates, labels={"grpo-full": "GRPO", "ppo-critic": "PPO"})
    measured, *parts = ax.containers
    assert [b.get_height() for b in measured] == [100, 200]  # peak minus baseline, in MiB
    assert [b.get_y() for b in parts[2]] == [20, 40] and [b.get_height() for b in parts[2]] == [20, 40]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["GRPO", "PPO"]
    assert "50% of PPO" in ax.texts[0].get_text() and "RSS" in ax.get_ylabel() and ax.get_legend() is not None
    cuda = plot_memory(results, "cuda")  # on a GPU the peak allocated is the figure, no baseline subtracted
    assert [b.get_height() for b in cuda.containers[0]] == [500, 600] and "CUDA" in cuda.get_ylabel()


PPO_METRICS = [  # two logged steps of ppo_trainer.train_ppo, the keys the critic plots read
    {"step": s, "reward": r, "value/v0_mean": v, "value/v0_mse": e, "adv_var/reward": 0.25,
     "adv_var/grpo_unscaled": 0.12, "adv_var/gae_t0": 0.02, "adv_var/gae_tokens": 0.08, "adv_var/grpo": 0.6}
    for s, r, v, e in ((1, 0.4, 0.0, 0.4), (2, 0.6, 0.3, 0.3))
]


def test_critic_plot_draws_reward_and_prediction_left_and_two_errors_right():
    from minigrpo.lab.plots import plot_critic

    lag_ax, err_ax = plot_critic({"a": PPO_METRICS, "b": PPO_METRICS}, window=1)
    assert [line.get_ydata().tolist() for line in lag_ax.lines[:2]] == [[0.4, 0.6], [0.0, 0.3]]
    assert len(lag_ax.lines) == len(err_ax.lines) == 4  # two per run
    assert err_ax.lines[0].get_ydata().tolist() == [0.4, 0.3] and err_ax.lines[1].get_linestyle() == ":"
    assert all(ax.get_xlabel() == "step" and ax.get_ylabel() and ax.get_title() for ax in (lag_ax, err_ax))
    assert "a: critic V(s_0)" in [t.get_text() for t in lag_ax.get_legend().get_texts()]



def test_critic_plot_with_the_group_size_draws_the_leave_one_out_error():
    # r_i - mean of the others = G/(G-1) (r_i - group mean): the fair baseline's squared error is (G/(G-1))^2 times.
    from minigrpo.lab.plots import plot_critic

    _, err_ax = plot_critic({"a": PPO_METRICS}, window=1, group_size=8)
    assert all(math.isclose(y, 0.12 * (8 / 7) ** 2) for y in err_ax.lines[1].get_ydata())
    assert "leave-one-out" in err_ax.lines[1].get_label()

def test_advantage_variance_draws_one_line_per_estimator_from_zero(tmp_path):
    import json

    from minigrpo.lab.plots import plot_advantage_variance, plot_critic_runs

    ax = plot_advantage_variance(PPO_METRICS, window=1)
    assert len(ax.lines) == 5 and ax.get_ylim()[0] == 0 and ax.get_ylabel().startswith("variance")
    assert ax.lines[2].get_ydata().tolist() == [0.02, 0.02]
    (tmp_path / "ppo").mkdir()
    (tmp_path / "ppo" / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in PPO_METRICS))
    assert plot_critic_runs([tmp_path / "ppo"], tmp_path / "plots").exists()


def test_sampling_mismatch_draws_the_difference_and_the_weight_and_plot_runs_adds_it_only_with_vllm(tmp_path):
    import json

    from minigrpo.lab.plots import plot_runs, plot_sampling_mismatch

    vllm = [dict(m, **{"sampling/sampling_logp_difference/mean": 1e-6 * m["step"],
                       "sampling/sampling_logp_difference/max": 1e-5 * m["step"],
                       "sampling/importance_sampling_ratio/min": 0.99, "sampling/importance_sampling_ratio/mean": 1.0,
                       "sampling/importance_sampling_ratio/max": 1.01}) for m in METRICS]
    diff_ax, ratio_ax = plot_sampling_mismatch({"vllm": vllm, "decode loop": METRICS})
    assert [line.get_label() for line in diff_ax.lines if line.get_xdata().size] == ["vllm mean", "vllm max"]
    assert diff_ax.lines[1].get_ydata().tolist() == [1e-5 * s for s in (1, 2, 3)] and diff_ax.get_yscale() == "log"
    assert [line.get_linestyle() for line in ratio_ax.lines[:3]] == [":", "-", "--"]
    for name, metrics in (("vllm", vllm), ("plain", METRICS)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    assert "sampling_mismatch.png" in [p.name for p in plot_runs([tmp_path / "vllm"], tmp_path / "a")]
    assert "sampling_mismatch.png" not in [p.name for p in plot_runs([tmp_path / "plain"], tmp_path / "b")]


def test_advantage_heatmap_columns_are_steps_and_shares_sum_to_one():
    # Step 1: advantages [1, -1, 0]; 3 bins over [-1, 1]: each bin holds a third. Step 3: [0.2, -0.2, 0.0] all
    # fall in the middle bin [-1/3, 1/3].
    ax = plot_advantage_heatmap(METRICS, bins=3, limit=1.0)
    (image,) = ax.get_images()
    share = image.get_array()  # (bins, steps): rows = advantage bins, columns = steps
    assert share.shape == (3, 3)
    assert [round(float(x), 6) for x in share[:, 0]] == [round(1 / 3, 6)] * 3
    assert [float(x) for x in share[:, 2]] == [0.0, 1.0, 0.0]
    assert all(abs(float(share[:, j].sum()) - 1) < 1e-9 for j in range(3))
    assert image.get_extent() == [0.5, 3.5, -1.0, 1.0] and "step" in ax.get_xlabel()


def test_advantage_heatmap_puts_zero_in_the_middle_bin():
    ax = plot_advantage_heatmap([{"step": 1, "advantages": [0.0, 0.0, 0.9]}], bins=4, limit=1.0)  # 4 -> 5 bins
    share = ax.get_images()[0].get_array()
    assert share.shape == (5, 1) and float(share[2, 0]) == 2 / 3 and float(share[4, 0]) == 1 / 3


def test_surrogate_curves_differ_in_width_so_none_hides_another():
    same = lambda ratio, adv: clipped_surrogate(ratio, adv, 0.2, 0.2)  # noqa: E731
    ax = plot_surrogate({"a": same, "b": same}, adv=1.0)
    labelled = [ln for ln in ax.get_lines() if ln.get_label() in ("a", "b")]
    assert labelled[0].get_linewidth() > labelled[1].get_linewidth()
    assert labelled[0].get_linestyle() != labelled[1].get_linestyle()


def test_a_run_with_tools_gets_calls_beside_accuracy_and_length(tmp_path):
    import json

    from minigrpo.lab.plots import plot_runs

    tools = [dict(m, **{"tools/call_frequency": 0.2 * m["step"]}) for m in METRICS]
    for name, metrics in (("tools", tools), ("plain", METRICS)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    assert "tools.png" in [p.name for p in plot_runs([tmp_path / "tools"], tmp_path / "a")]
    assert "tools.png" not in [p.name for p in plot_runs([tmp_path / "plain"], tmp_path / "b")]


def test_plot_runs_names_each_accuracy_sample_and_knows_an_on_policy_run(tmp_path):
    import json

    import yaml

    from minigrpo.lab.plots import eval_label, on_policy, plot_runs

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({**m, "clip_ratio/region_mean": 0.0}) + "\n" for m in METRICS))
    (run / "config.yaml").write_text(yaml.safe_dump({"eval_num_problems": 200, "eval_steps": 5, "num_iterations": 1,
                                                     "steps_per_generation": 1}))
    (run / "summary.json").write_text(json.dumps({"num_test_problems": 50, "steps": 3, "accuracy_before": 0.3,
                                                  "accuracy_after": 0.7}))
    assert eval_label(run) == "greedy, first 50 held-out problems, every 5 steps"  # 200 asked, 50 there
    assert on_policy(yaml.safe_load((run / "config.yaml").read_text()))
    assert not on_policy({"num_iterations": 2}) and not on_policy({"steps_per_generation": 4})
    assert {p.name for p in plot_runs([run], tmp_path / "plots")} >= {"accuracy.png", "length.png", "clip_entropy.png"}


def test_plot_seeds_draws_each_seed_and_their_mean():
    from minigrpo.lab.plots import plot_seeds

    other = [{**m, "eval/accuracy_greedy": m.get("eval/accuracy_greedy") and m["eval/accuracy_greedy"] - 0.2}
             for m in METRICS]
    ax = plot_seeds({"process": [METRICS, other]}, "eval/accuracy_greedy", start={"process": [0.1, 0.3]})
    thin, mean = ax.lines[:2], ax.lines[2]
    assert [list(line.get_ydata()) for line in thin] == [[0.1, 0.5, 0.7], pytest.approx([0.3, 0.3, 0.5])]
    assert list(mean.get_xdata()) == [0, 2, 3] and list(mean.get_ydata()) == pytest.approx([0.2, 0.4, 0.6])
    assert mean.get_label() == "process (mean of 2)"


def test_first_steps_puts_the_reward_beside_the_graders_accuracy_for_every_run():
    from minigrpo.lab.plots import plot_first_steps

    paid_for_length = [dict(m, reward=0.9, accuracy=0.1) for m in METRICS]  # the reward rises, the accuracy does not
    healthy = [dict(m, accuracy=m["reward"]) for m in METRICS]
    fig = plot_first_steps({"healthy": healthy, "paid for length": paid_for_length}, start={"healthy": 0.3})
    reward_ax, accuracy_ax = fig.axes[:2]
    assert [line.get_ydata().tolist() for line in reward_ax.lines] == [[0.2, 0.4, 0.6], [0.9, 0.9, 0.9]]
    samples, held_out = accuracy_ax.lines[:2]  # the healthy run's: the grader on its samples, then held out
    assert samples.get_ydata().tolist() == [0.2, 0.4, 0.6] and held_out.get_xdata().tolist() == [0, 2, 3]
    assert held_out.get_ydata().tolist() == [0.3, 0.5, 0.7]
    assert accuracy_ax.lines[2].get_ydata().tolist() == [0.1, 0.1, 0.1]
    assert len(fig.axes) == 6
