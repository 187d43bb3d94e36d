"""Every notebook runs top to bottom in fast mode (MINIGRPO_FAST=1), in a fresh kernel, without an error.

The kernel imports minigrpo from this checkout (scripts/run_notebooks.py sets PYTHONPATH), which the first cell's
version printout (the checkout's commit, not its path) lets us check. Fast mode trains for a few steps only; the
whole file takes about 5 minutes on one worker of a 2-core machine. Other tests check that the committed notebooks
carry the outputs of a full run, and that numbers the prose quotes are the numbers those outputs print.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from run_notebooks import execute_notebook  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _head() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def _text_outputs(cell) -> str:
    parts = []
    for output in cell.get("outputs", []):
        if output["output_type"] == "stream":
            parts.append(output["text"])
        elif "text/plain" in output.get("data", {}):
            parts.append(output["data"]["text/plain"])
    return "".join(parts)


def test_there_are_notebooks():
    names = [p.name for p in NOTEBOOKS]
    assert {"01_group_advantages.ipynb", "02_objectives.ipynb", "03_train_grpo.ipynb", "04_variants.ipynb",
            "05_one_gpu.ipynb", "06_grpo_vs_ppo.ipynb", "07_real_model.ipynb", "08_more_variants.ipynb"} <= set(names), names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_in_fast_mode(path, tmp_path):
    # Raises CellExecutionError on a failing cell. Live runs go to tmp_path, not into the checkout, without drawing
    # their plots/ (nothing reads them; the notebook's own figures are drawn).
    notebook = execute_notebook(path, fast=True, timeout=600, threads=1, workdir=tmp_path, run_plots=False)
    code_cells = [c for c in notebook.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code_cells), "a code cell did not run"
    versions = _text_outputs(code_cells[0])
    for name in ("python", "torch", "transformers", "peft", "minigrpo", "device"):
        assert name in versions, f"first cell should print the {name} version:\n{versions}"
    # The first cell names the commit of the checkout it imported (not its path, which is the machine's).
    assert f"git checkout, commit {_head()}" in versions, f"the kernel imported another minigrpo:\n{versions}"
    assert str(ROOT) not in versions, f"the first cell prints this machine's path:\n{versions}"
    assert not any(o["output_type"] == "error" for c in code_cells for o in c.get("outputs", []))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebook_has_full_mode_outputs(path):
    """The committed copy was executed in full mode (scripts/run_notebooks.py), so GitHub shows its plots."""
    notebook = nbformat.read(path, as_version=4)
    code_cells = [c for c in notebook.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code_cells), f"{path.name}: commit it executed (scripts/run_notebooks.py)"
    images = sum("image/png" in o.get("data", {}) for c in code_cells for o in c.get("outputs", []))
    assert images >= 1, f"{path.name}: no plot in the committed outputs"
    text = "".join(_text_outputs(c) for c in code_cells)
    assert "fast mode: True" not in text, f"{path.name}: committed outputs come from fast mode"
    assert "/minigrpo)" not in _text_outputs(code_cells[0]), f"{path.name}: the first cell shows a machine's path"


# Numbers the prose quotes from an output, and where the output prints them: (notebook, the prose's words, the
# outputs' words). Both are compared with runs of whitespace collapsed. A re-execution that moves a number fails
# here until the prose says what the output says. Not every number is listed: the ones a conclusion rests on.
QUOTES = [
    ("01_group_advantages", "(0.188 at $G = 8$ above)", ["frac_reward_zero_std = 0.188"]),
    ("01_group_advantages", "get $\\pm 0.697$, nearly the $\\pm 0.707$ of two scored 0 and 1",
     ["GRPO -0.697 / +0.697", "GRPO -0.707 / +0.707"]),
    ("01_group_advantages", "where Dr. GRPO gives them $\\pm 0.005$",
     ["Dr. GRPO -0.005 / +0.005", "Dr. GRPO -0.500 / +0.500"]),
    ("02_objectives", "push is $-0.500$ under `grpo` and $-0.800$ under `dapo`, the short right answer's $+0.500$ and", ["total per completion [-0.500, +0.500]", "total per completion [-0.800, +0.200]"]),
    ("02_objectives", "(0.0681 against k3's 0.0709)", ["std per sample 0.0681", "std per sample 0.0709"]),
    ("02_objectives", "k3's is the lower one (0.025 against 0.029)", ["+0.0016 ( 0.029) +0.0000 ( 0.025)"]),
    ("03_train_grpo", "(0.69 of 1.84 s per step in the shipped run, steps 2–40, section 5)",
     ["steps 2-40: 1.84 s per step, of which sampling and scoring 0.69 s"]),
    ("03_train_grpo", "thinks in about half its answers", ["thinks in 48% of them"]),
    ("03_train_grpo", "scratchpad in about half its samples (48%), and those are right 42% of the time, against 0% for",
     ["thinks in 48% of them; accuracy when thinking 42%, without thinking 0%"]),
    ("03_train_grpo", "Drawn, it stays between 0.06 and 0.38 (single steps: 0 to 0.56), while the drawn reward stays "
                      "between 0.23 and 0.56 (single steps: 0.16–0.59)",
     ["frac_reward_zero_std logged per step 0.000 .. 0.562 drawn (3-step trailing mean) 0.062 .. 0.375",
      "reward logged per step 0.164 .. 0.594 drawn (3-step trailing mean) 0.230 .. 0.557"]),
    ("03_train_grpo", "a norm of 0.51 on average against 0.91",
     ["(mean 0.91) over steps 1-20", "(mean 0.51) over steps 1-20"]),
    ("03_train_grpo", "Of the warm start's 325 right answers, 15 (4.6%) were reached through a scratchpad step",
     ["325 right answers, of which 15 (4.6%) reached through a step whose arithmetic is wrong; 222 wrong answers"]),
    ("03_train_grpo", "the policy moved 2.378", ["KL in the loss (k3) 29.5% -> 79.5% 2.378 nats 0.0815 0.0760",
                                                 "no KL (section 3) 29.5% -> 79.0% 2.334 nats"]),
    ("03_train_grpo", "1.816 nats, about a fifth less", ["KL in the reward (k1) 29.5% -> 83.0% 1.816 nats"]),
    ("03_train_grpo", "moved by 0.156 on average and by up to 2.404",
     ["moved by the KL in the reward: 0.156 on average, largest 2.404; correlation of the move with the completion's "
      "KL -0.41"]),
    ("03_train_grpo", "(6 of 16 here): their completions get advantages of 0.33 on average",
     ["groups with all-equal rewards: 6 of 16 — with the KL in the reward their completions get advantages of 0.33"]),
    ("04_variants", "GSPO 79.0%, RLOO 78.0%, GRPO 74.5%, DAPO 72.5%, GMPO 71.5%, Dr. GRPO 70.5% — an 8.5-point spread",
     ["GSPO 29.5% -> 79.0%", "RLOO 29.5% -> 78.0%", "GRPO 29.5% -> 74.5%", "DAPO 29.5% -> 72.5%",
      "GMPO 29.5% -> 71.5%", "Dr. GRPO 29.5% -> 70.5%", "span 70.5% .. 79.0% (8.5 points)"]),
    ("04_variants", "GRPO's three seeds end at 74.5%, 73.5% and 75.0%",
     ["GRPO 0 62.5% 76.5% 74.0% 74.5%", "GRPO 1 68.5% 76.0% 78.0% 73.5%", "GRPO 2 72.5% 70.5% 75.5% 75.0%"]),
    ("04_variants", "by +1.04, +0.88 and +0.41 tokens", ["all, steps 2-5 +1.04 +0.88 +0.41"]),
    ("04_variants", "38 to 41 tokens, for 6.6% of the 500 test problems",
     ["correct scratchpads of the 500 test problems: 16 to 41 tokens; longer than 36: 33 (6.6%), 38 to 41 tokens"]),
    ("04_variants", "by less on average (mean +0.68 against +0.86 over steps 1–5), though by more on seed 1",
     ["wrong, steps 1-5 +0.92 +1.36 +0.31 mean +0.86", "wrong, steps 31-40 +0.07 +1.71 +0.25 mean +0.68"]),
    ("04_variants", "GRPO's own three seeds spread 0.69 tokens in the first column (26.00 to 26.69)",
     ["GRPO, seed 0 26.00", "GRPO, seed 1 26.62", "GRPO, seed 2 26.69"]),
    ("04_variants", "against 0.4–0.9% (GRPO 0.68%) over the same 10 steps with two mini-batches",
     ["GRPO greedy accuracy 29.5% -> 62.5% greedy length 16.0 -> 29.5 tokens clipped 0.68%",
      "DAPO greedy accuracy 29.5% -> 73.5% greedy length 16.0 -> 29.2 tokens clipped 0.89%",
      "GSPO greedy accuracy 29.5% -> 63.0% greedy length 16.0 -> 29.2 tokens clipped 22.97%",
      "GMPO greedy accuracy 29.5% -> 64.0% greedy length 16.0 -> 29.3 tokens clipped 0.44%"]),
    ("04_variants", "Wrong answers grow from 22.4–23.3 tokens (mean of steps 1–5) to 30.2–31.7 (last 10 steps)",
     ["GRPO 62.5% 76.5% 74.0% 74.5% 18.7 -> 27.8 27.5 23.3 -> 31.6",
      "Dr. GRPO 60.0% 67.0% 74.0% 70.5% 18.7 -> 27.4 27.3 22.4 -> 31.1",
      "DAPO 73.5% 72.5% 83.5% 72.5% 18.7 -> 27.0 28.5 22.7 -> 30.2",
      "RLOO 66.0% 76.5% 74.0% 78.0% 18.7 -> 27.1 27.7 22.5 -> 31.7"]),
    ("04_variants", "DAPO goes from 83.5% at step 30 to 72.5% at step 40", ["DAPO 73.5% 72.5% 83.5% 72.5%"]),
    ("04_variants", "(`clip_ratio/high_mean` 0.034% of tokens over the last 10 steps, GRPO's 0.063%)",
     ["GRPO 0.302 -> 0.106 1.18% -> 0.20% 0.063%", "DAPO 0.296 -> 0.088 1.34% -> 0.27% 0.034%"]),
    ("04_variants", "from 0.0071–0.0115 nats/token at step 1 to 0.00035–0.00083 over the last 10 steps",
     ["GRPO 0.302 -> 0.106 1.18% -> 0.20% 0.063% 0.0082 -> 0.00035",
      "DAPO 0.296 -> 0.088 1.34% -> 0.27% 0.034% 0.0115 -> 0.00056",
      "GSPO 0.302 -> 0.107 25.62% -> 24.45% 11.250% 0.0082 -> 0.00083",
      "RLOO 0.303 -> 0.104 1.13% -> 0.26% 0.059% 0.0071 -> 0.00048"]),
    ("05_one_gpu", "greedy accuracy went from 29.5% to 26.5% on 200 problems",
     ["float32 model greedy accuracy on 200 test problems: 29.5%", "its nf4 copy greedy accuracy on 200 test problems: 26.5%"]),
    ("05_one_gpu", "9 are right for the float model only and 3 for the nf4 copy only",
     ["right for the float32 model only: 9, for the nf4 copy only: 3"]),
    ("05_one_gpu", "LoRA took greedy accuracy from 29.5% to 75.0%, QLoRA from its 4-bit base's 26.5% to 73.5%",
     ["LoRA greedy accuracy 29.5% -> 75.0%", "QLoRA (nf4) greedy accuracy 26.5% -> 73.5%"]),
    ("06_grpo_vs_ppo", "82.0% (GRPO) and 78.0% (PPO) after 50 steps", ["GRPO 29.5% -> 82.0%", "PPO 29.5% -> 78.0%"]),
    ("06_grpo_vs_ppo", "21 against 13 (McNemar's p = 0.23)", ["GRPO vs PPO 21 13 0.23"]),
    ("06_grpo_vs_ppo", "PPO's 2.45 s is 1.75× GRPO's 1.40 s but 3.4× the other GRPO run's 0.73 s, and the slow-critic "
                       "PPO run, made later, took 1.80 s",
     ["GRPO 1.40s", "PPO 2.45s", "PPO, critic lr 1e-4 1.80s", "GRPO, PPO's loss + whitening 0.73s"]),
    ("06_grpo_vs_ppo", "trails the mean reward by 0.14 in steps 1–5 and 0.04 in steps 6–15",
     ["PPO -0.136 -0.039 -0.016 -0.019"]),
    ("06_grpo_vs_ppo", "was −0.300 over steps 1–5 and −0.376 over steps 6–15", ["PPO, critic lr 1e-4 -0.300 -0.376"]),
    ("06_grpo_vs_ppo", "on the fair leave-one-out scale (dotted): 0.175–0.191, below the critic's 0.25–0.26",
     ["0.260 | 0.191 | 0.146", "0.253 | 0.175 | 0.134"]),
    ("06_grpo_vs_ppo", "0.0632 at $G = 2$, 0.0035 at $G = 32$", ["2 32 0.74 0.0632", "32 2 0.19 0.0035"]),
    ("06_grpo_vs_ppo", "noise over signal is 5.4 at $G = 2$, where 74% of the groups are all right or all wrong",
     ["2 32 0.74 0.0632 0.0610 0.211 0.039 5.4"]),
    ("06_grpo_vs_ppo", "3.6–3.8 from $G = 4$ to $G = 16$; and 7.2 at $G = 32$",
     ["0.133 3.6", "0.268 3.8", "0.425 3.7", "0.478 7.2"]),
    ("05_one_gpu", "by 0.0011 to\n0.0033 nats a token on average (by step), by 0.220 at most, a KL from sampler to trainer of at most 2.1e-03",
     ["per token, by step: 0.0011 .. 0.0033; largest 0.220 nats; KL(sampler || trainer) per completion at most 2.1e-03"]),
    ("05_one_gpu", "the correction's sequence weights run from 0.70 to 1.28",
     ["sequence weights w from 0.70 to 1.28 (masked above C_max = 3)"]),
    ("05_one_gpu", "(every difference 0, every weight 1.00)",
     ["0.0000 .. 0.0000; largest 0.000 nats; KL(sampler || trainer) per completion at most 0.0e+00",
      "sequence weights w from 1.00 to 1.00"]),
    ("05_one_gpu", "the greedy accuracy is 59.0% with the float32 sampler, 58.0% with the bfloat16 one corrected and 56.5% "
                   "uncorrected (mean reward 0.377, 0.373, 0.369), from 29.5%",
     ["float32 sampler (control): greedy accuracy 29.5% -> 59.0%, mean reward 0.377",
      "bfloat16 sampler, corrected: greedy accuracy 29.5% -> 58.0%, mean reward 0.373",
      "bfloat16 sampler, not corrected: greedy accuracy 29.5% -> 56.5%, mean reward 0.369"]),
    ("05_one_gpu", "moves the control, the\nfloat32 sampler that *is* the policy, from 59.0% to 69.5%",
     ["float32 sampler (control) 59.0% 62.0% 69.5% 63.5% 59.0% .. 69.5%"]),
    ("05_one_gpu", "The three samplers' means, 63.5%, 58.3% and 60.7%, are at most 5.2 points apart",
     ["63.5% 59.0% .. 69.5%", "58.3% 55.5% .. 61.5%", "60.7% 56.5% .. 66.5%"]),
    ("05_one_gpu", "is +1.5, +2.5 and −11.0 points: it changes\nsign",
     ["corrected minus not corrected, seed by seed: +1.5%, +2.5%, -11.0%"]),
    ("05_one_gpu", "repeats in seed 1 (62.0%, 61.5%, 59.0%) and not in seed 2 (69.5%, 55.5%, 66.5%)",
     ["bfloat16 sampler, corrected 58.0% 61.5% 55.5%", "bfloat16 sampler, not corrected 56.5% 59.0% 66.5%"]),
    ("05_one_gpu", "2% of the\n> floor at this shape and 6% at the full 24 blocks (GRPO LoRA 2,019 MiB against 2,153)",
     ["GRPO LoRA / PPO + LoRA critic, shared frozen base: 0.98 (2% less)",
      "GRPO LoRA / PPO + LoRA critic, shared frozen base: 0.94 (6% less)",
      "GRPO LoRA 2,019", "PPO + LoRA critic, shared frozen base 2,153"]),
    ("05_one_gpu", "is the full copy's 50% again", ["GRPO LoRA / PPO + LoRA critic, own copy of the base: 0.50 (50% less)"]),
    ("07_real_model", "its peak 6–7% of the way in: keeping the 20\nwarm-up steps would put the peak 40% of the way",
     ["the recipe 300 steps, warm-up 20 (the peak 7% of the way in)",
      "the GPU's first look 50 steps, warm-up 3 (the peak 6% of the way in)",
      "(the recipe's warm-up kept) 50 steps, warm-up 20 (the peak 40% of the way in)"]),
    ("07_real_model", "0.51 for both cuts, 0.50 for the recipe",
     ["the recipe 300 steps, warm-up 20 (the peak 7% of the way in), linear decay: average learning rate 0.50",
      "the GPU's first look 50 steps, warm-up 3 (the peak 6% of the way in), linear decay: average learning rate 0.51",
      "(the recipe's warm-up kept) 50 steps, warm-up 20 (the peak 40% of the way in), linear decay: average learning "
      "rate 0.51"]),
    ("07_real_model", "(GRPO divided by the group's std, 0.524)", ["mean reward 0.437, std 0.524"]),
    ("07_real_model", "so a wrong number still earns 0.01", ["wrong (row 1's answer) 44 0.01 1.00 False"]),
    ("07_real_model", "the samples grow from 23.8 to 29.1 tokens in the healthy run and from 24.0 to 34.3 in the broken one",
     ["healthy: correctness 0.319 -> 0.412 0.319 -> 0.412 23.8 -> 29.1 29.5% -> 65.5% 16.0 -> 29.4",
      "broken: lenient_judge 0.853 -> 0.978 0.284 -> 0.003 24.0 -> 34.3 29.5% -> 0.0% 16.0 -> 38.2"]),
    ("07_real_model", "the greedy answers from 16.0 to 29.4 and to 38.2 tokens", ["16.0 -> 29.4", "16.0 -> 38.2"]),
    ("07_real_model", "0.319 → 0.412 on the samples, and held-out greedy accuracy from 29.5% to 65.5%",
     ["0.319 -> 0.412 0.319 -> 0.412 23.8 -> 29.1 29.5% -> 65.5%"]),
    ("07_real_model", "the reward climbs from 0.853 to 0.978, a run that looks solved, while the grader's accuracy on the "
                      "same samples falls from 0.284 to 0.003 and held-out greedy accuracy from 29.5% to 0.0%",
     ["broken: lenient_judge 0.853 -> 0.978 0.284 -> 0.003 24.0 -> 34.3 29.5% -> 0.0%"]),
    ("07_real_model", "near 1 (0.978 to 0.984 over the last 10 steps) while the grader's accuracy on the same samples ends near 0 (0.002\nto 0.028)",
     ["broken: lenient_judge, reward, last 10 steps 0.978 0.983 0.984 0.981 0.978 .. 0.984",
      "broken: lenient_judge, accuracy of the samples, last 10 0.003 0.028 0.002 0.011 0.002 .. 0.028"]),
    ("07_real_model", "falls from 29.5% to 0.0–2.5% (mean 1.0%), against 65.5–70.0% (mean 68.0%)",
     ["broken: lenient_judge, greedy accuracy, 200 held out 0.0% 2.5% 0.5% 1.0% 0.0% .. 2.5%",
      "healthy: correctness, greedy accuracy, 200 held out 65.5% 68.5% 70.0% 68.0% 65.5% .. 70.0%"]),
    ("07_real_model", "samples of 34.0 to 39.9 tokens over the\nlast 10 steps against 27.9 to 30.4, greedy answers of 37.4 to 43.5 tokens against 29.2 to 29.4",
     ["broken: lenient_judge, length of the samples, last 10 34.3 34.0 39.9 36.0 34.0 .. 39.9",
      "healthy: correctness, length of the samples, last 10 29.1 27.9 30.4 29.1 27.9 .. 30.4",
      "broken: lenient_judge, greedy length 38.2 37.4 43.5 39.7 37.4 .. 43.5",
      "healthy: correctness, greedy length 29.4 29.2 29.2 29.2 29.2 .. 29.4"]),
    ("07_real_model", "cuts off 23% of its samples at the 48-token limit over its last 10 steps (0.230), and the trainer's truncation\nwarning fires on 1 step of its 30; seeds 0 and 1 stay at 2–3% and never warn",
     ["broken: lenient_judge, cut off (clipped_ratio), last 10 0.016 0.031 0.230", "broken seed 1: 0", "broken seed 2: 1"]),
    ("07_real_model", "Digits are split one per token\n(Qwen2's pre-tokenizer), as the last line shows: `63` is `6`, `3`",
     ["[63, 4, 50], as tokens: ['[', '6', '3', ',', 'Ġ', '4', ',', 'Ġ', '5', '0', ']']"]),
    ("07_real_model", "The advantages sum to zero (the last line)", ["sum of the advantages +0.000;"]),
    ("07_real_model", "and here those sum to +7.8", ["the weight DAPO's token-level loss gives each completion: +7.8"]),
    ("07_real_model", "2.94 GiB of weights and 9.42 GiB in all for training",
     ["estimated (minigrpo memory): 2.94 GiB of weights, 9.42 GiB in all"]),
    ("07_real_model", "(entropy between 2.32 and 2.40 nats per token, a mean length of 63.1 tokens at step 7)",
     ["1 0.000 0.000 0.000 0.000 1.000 64.000 1.000 0.000 2.370", "4 0.000 0.000 0.000 0.000 1.000 64.000 1.000 0.000 2.398",
      "7 0.000 0.000 0.000 0.000 1.000 63.125 0.938 0.000 2.369", "10 0.000 0.000 0.000 0.000 1.000 64.000 1.000 0.000 2.321"]),
    ("06_grpo_vs_ppo", "step's memory above the baseline is 0.54 of PPO's for GRPO on this 1.3M-parameter model",
     ["GRPO/PPO memory ratio: 0.54 (full-fine-tune GRPO / PPO with critic"]),
    ("08_more_variants", "span 1.5 points for GRPO, 3.0 for Dr. GRPO and 8.0 for Dr. GRPO's loss alone",
     ["span 1.5 points", "span 3.0 points", "span 8.0 points"]),
    ("08_more_variants", "VESPO's 9 points and Pass@k's 8.5", ["VESPO -9.0", "Pass@k (k=4) -8.5"]),
    ("08_more_variants", "**GFPO** (57.5%, 21 problems right for GFPO only against 55 for GRPO only, p < 0.005)",
     ["GFPO (length) 29.5% -> 57.5% 21/ 55 0.00"]),
    ("08_more_variants", "and up to 10, 15 and 11 points at steps 10–30",
     ["at steps 10, 20, 30: 10.0, 6.0, 4.0", "at steps 10, 20, 30: 15.0, 8.0, 8.0", "at steps 10, 20, 30: 7.5, 6.0, 11.0"]),
    ("08_more_variants", "That leaves 75.0% nonzero", ["pass_at_k +0.000 0.264 -0.166 +1.000 75.0%"]),
    ("08_more_variants", "a lone right answer gets +2.645 where GRPO's sample std gives +2.474 (std 0.939 against 0.878)",
     ["process +0.000 0.939 -2.645 +2.645", "grpo -0.000 0.878 -2.474 +2.474"]),
    ("08_more_variants", "and +0.88 from token 14",
     ["#0 right: A_t +0.50 +0.83 +0.85 +0.90 +0.93 +0.93 +0.33 +0.33 +0.33 +0.33 +0.33 +0.33 +0.33 +0.33 +0.88",
      "#2 wrong: adds to W 0.00 0.13 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 1.81"]),
    ("08_more_variants", "its kept samples' reward was 0.164 at step 1 against GRPO's 0.297, and 0.56 of its kept groups",
     ["GRPO 0.297 0.306 0.12 0.23 62.5% 76.5% 74.0% 74.5%",
      "GFPO (length) 0.164 0.259 0.56 0.35 69.0% 56.0% 56.5% 57.5%"]),
    ("08_more_variants", "**DPPO-Binary-TV** masked 0.41% of the tokens (mean of the steps) where GRPO's ratio clip at the "
                         "same 0.2 stopped 1.68%", ["DPPO-Binary-TV 0.0041 0.0000", "GRPO (section 3) 0.0168"]),
    ("08_more_variants", "a training reward of 0.195 at step 3 against GRPO's 0.320",
     ["DRO 0.297 0.195 18.7 27.6", "GRPO (section 3) 0.297 0.320 18.7 28.5"]),
    ("08_more_variants", "training reward 0.234 against 0.297, length 16.4 against 18.7 at step 1",
     ["ReMax 0.234 0.328 16.4 28.7", "GRPO (section 3) 0.297 0.320 18.7 28.5"]),
    ("08_more_variants", "(0.96 s, GRPO 1.38 s, the others 0.87–0.95 s)",
     ["GRPO (section 3) 0.0168 - - - 0.587 0.266 1.38", "optimal token baseline 0.0161 - - - 0.292 0.302 0.96",
      "MaxRL 0.0163 - - - 1.031 0.234 0.87", "ReMax 0.0100 - - - 0.419 0.258 0.95"]),
    ("09_tools", "within about 10 steps (0.95 calls per completion or\nmore from step 10 on)",
     ["tool calls per completion at 0.95 or more from step 10 on"]),
    ("09_tools", "At its worst step (above) about two\nthirds of its calls came back as errors and about two thirds of its "
                 "completions ran to the budget, against a sixth of\neach in the masked run at the same step",
     ["66% of its tool calls failed", "69% of its completions were cut off", "17% of its calls failed, 17% cut off"]),
    ("09_tools", "−9.31 nats per\ntoken, against −0.06 for the policy's own",
     ["log p per token -0.06 on the policy's tokens, -9.31 on the tool message's"]),
    ("09_tools", "(−9.31 → −1.16 and −1.09 nats per token, seeds 0 and 1",
     ["unmasked_seed0 28.5% / 30.5% / 81.0% 0.123 -1.16", "unmasked_seed1 33.5% / 53.0% / 77.0% 0.160 -1.09"]),
    ("09_tools", "seed 2's, the run that collapsed, got to −3.63", ["unmasked_seed2 5.0% / 0.0% / 0.0% 0.063 -3.63"]),
    ("09_tools", "barely moves (−9.56, −9.32 and −9.58)",
     ["masked_seed0 61.0% / 74.0% / 81.0% 0.408 -9.56", "masked_seed1 64.5% / 69.0% / 68.0% 0.426 -9.32",
      "masked_seed2 67.0% / 65.0% / 74.0% 0.425 -9.58"]),
    ("09_tools", "(28.5%, 33.5% and 5.0%, against 61.0–67.0%)",
     ["unmasked_seed0 28.5%", "unmasked_seed1 33.5%", "unmasked_seed2 5.0%", "masked_seed0 61.0%", "masked_seed1 64.5%",
      "masked_seed2 67.0%"]),
    ("09_tools", "(seed 0: 81.0% against 81.0%; seed 1: 77.0% against 68.0%)",
     ["masked_seed0 61.0% / 74.0% / 81.0%", "unmasked_seed0 28.5% / 30.5% / 81.0%", "masked_seed1 64.5% / 69.0% / 68.0%",
      "unmasked_seed1 33.5% / 53.0% / 77.0%"]),
    ("10_learned_rewards", "(0.43) from a wrong one (0.39): AUC 0.58 there, against 0.85 over all",
     ["with a scratchpad, right 153 0.43", "with a scratchpad, wrong 223 0.39",
      "AUC over all held-out completions: 0.85; among those with a scratchpad only: 0.58"]),
    ("10_learned_rewards", "0.203 at $n = 1$, 0.350 at $n = 4$ — then falls, to 0.120 at $n = 64$",
     ["1 0.000 0.000 0.214 0.203", "4 0.636 0.798 0.419 0.350", "64 3.175 1.782 0.579 0.120"]),
    ("10_learned_rewards", "fits the gold's gain with R² 0.98 (α 0.347, β 0.223)", ["alpha 0.347, beta 0.223, R^2 0.98"]),
    ("10_learned_rewards", "67.5% at step 5", ["reward model: held-out greedy accuracy 29.5% -> best 67.5% (step 5)"]),
    ("10_learned_rewards", "to 11.0% at step 40, far below the warm start", ["-> 11.0% at step 40"]),
    ("10_learned_rewards", "The RL form fits with R² 0.81 and 0.79", ["R^2 0.81", "R^2 0.79"]),
    ("10_learned_rewards", "98% of the logged ones in steps 31–40, against 75% in steps 1–5",
     ["steps 1-5 42% 75% 50%", "steps 31-40 19% 98% 18%"]),
    ("10_learned_rewards", "a scratchpad of the right shape with wrong sums and a wrong answer gets 0.70",
     ["38+85=<think>8+5=5,3+8=11</think>155 P(right) 0.70 checker: False"]),
    ("10_learned_rewards", "its largest is 12.9 nats against 13.6 without the penalty (8.8 against 13.3 at the last step)",
     ["beta 0 drift at the last step 13.26 nats (largest 13.59)",
      "beta 0.1 drift at the last step 8.83 nats (largest 12.86)"]),
    ("10_learned_rewards", "differ by up to 12 points at one step (30% against 18% at step 30)",
     ["held-out greedy accuracy by 5 steps: 68% 62% 58% 48% 39% 18% 15% 11%",
      "held-out greedy accuracy by 5 steps: 73% 66% 60% 50% 40% 30% 22% 16%"]),
    ("10_learned_rewards", "The right worked answer gets P(right) 0.53 (0.52 with its first column's digits swapped)",
     ["38+85=<think>8+5=13,3+8+1=12</think>123 P(right) 0.53 checker: True",
      "38+85=<think>5+8=13,3+8+1=12</think>123 P(right) 0.52 checker: True"]),
    ("10_learned_rewards", "`<think>2+5=7,3+8=11,0+9=9</think>917` four times of eight for `32+985=`",
     ["32+985= 4 of 8 <think>2+5=7,3+8=11,0+9=9</think>917"]),
    ("10_learned_rewards", "`<think>9+7=16,4+5=9,2+8=10,2+0=2</think>2096` five of eight for `2049+857=`",
     ["2049+857= 5 of 8 <think>9+7=16,4+5=9,2+8=10,2+0=2</think>2096"]),
    ("10_learned_rewards", "after 14 s of training against the 67 s the checker run took to its best",
     ["DPO, the same labels as pairs best 80.0% at step 20, after 14 s of training",
      "GRPO, checker best 83.5% at step 40, after 67 s of training"]),
    ("10_learned_rewards", "(0.66 over the first 10 steps, 0.33 over the last)",
     ["DPO's loss: 0.66 over its first 10 steps, 0.33 over its last 10"]),
    ("10_learned_rewards", "29.5% → 80% held-out greedy accuracy at step 20",
     ["DPO, the same labels as pairs 62 steps,", "held-out greedy accuracy 29.5% -> 64% 74% 79% 80%"]),
    ("11_process_supervision", "it pushes down 73% of the tokens of the *right* steps in them and up none",
     ["wrong right 419 0% 73% 27% -0.50 68% 32% 0% +0.97"]),
    ("11_process_supervision", "Process supervision pushes 68% of those right-step tokens up, and 86% of the wrong-step "
                               "tokens down", ["wrong right 419 0% 73% 27% -0.50 68% 32% 0% +0.97",
                                               "wrong wrong 869 0% 82% 18% -0.52 13% 86% 1% -1.22"]),
    ("11_process_supervision", "(mean $|A|$ 1.99 against 0.76; 2.4 times against 0.82",
     ["mean |A| per token: outcome 0.76, process 1.99 (2.6x); outcome with the population std 0.82 (2.4x)"]),
    ("11_process_supervision", "Here most tokens are pushed up (63%), and most tokens sit in right steps (63%), although "
                               "only 39% of the graded steps are right",
     ["2392 policy tokens: 63% in right steps, 63% pushed up by process supervision", "steps graded: 560, right: 39%"]),
    ("11_process_supervision", "(144 of the 560 graded steps hold none, all of them wrong)",
     ["graded steps that hold no token: 144 of 560, 144 of them wrong"]),
    ("11_process_supervision", "(means of the three seeds 85.3% and 82.7%, their ranges overlapping)",
     ["think_addition outcome, 3 seeds: at step 10 72.0% (range 66.0% to 77.5%), after 85.3% (range 82.8% to 87.0%)",
      "think_addition process, 3 seeds: at step 10 71.3% (range 68.5% to 75.0%), after 82.7% (range 80.2% to 87.8%)"]),
    ("11_process_supervision", "means 72.0% and 71.3%", ["at step 10 72.0%", "at step 10 71.3%"]),
    ("11_process_supervision", "the outcome runs end at 86.2%, 82.8% and 87.0%, the process runs at 80.2%, 80.2% and "
                               "87.8%", ["outcome seed 0: 66.0%", "before 26.2% -> after 86.2%",
                                         "before 26.2% -> after 82.8%", "before 26.2% -> after 87.0%",
                                         "process seed 2: 70.5% 75.0% 81.5% 82.0% 80.5% 86.5% 80.5% 80.5% 81.5% 87.0% "
                                         "| before 26.2% -> after 87.8%"]),
    ("11_process_supervision", "Process supervision's advantage is **−1.40 per token on average**",
     ["mean advantage per token: outcome +0.00, process -1.40"]),
    ("11_process_supervision", "and ends at 0.0%, 0.0%, 0.0% against 0.0%, 0.6%, 0.0%",
     ["long_addition process seed 1: 0.5% 1.5% 1.5% 0.5% 1.0% 0.5% | before 13.0% -> after 0.6%"]),
    ("11_process_supervision", "Samples 2 and 3 get their first three columns right and have them pushed down (−1.3, "
                               "−2.1, −2.8)", ["steps 111001010, advantage of each step's tokens -1.3 -2.1 -2.8",
                                              "steps 111001100, advantage of each step's tokens -1.3 -2.1 -2.8"]),
    ("11_process_supervision", "only the first four are pushed up (+2.8 to +0.5); its right fifth to seventh columns are "
                               "pushed down (−0.3, −1.0, −1.8)",
     ["steps 111111100, advantage of each step's tokens +2.8 +2.1 +1.3 +0.5 -0.3 -1.0 -1.8 -2.6 -1.3"]),
    ("11_process_supervision", "Yet its steps get worse, from 0.47–0.50 right at step 1 to 0.12–0.19 over the last 10 steps",
     ["long_addition outcome seed 0: 0.50 at step 1, lowest 0.19 (steps 49-58), last 10 0.19",
      "long_addition outcome seed 1: 0.50 at step 1, lowest 0.12 (steps 31-40), last 10 0.13",
      "long_addition outcome seed 2: 0.47 at step 1, lowest 0.11 (steps 40-49), last 10 0.12"]),
    ("11_process_supervision", "from the same 0.47–0.50 at step 1 to a lowest 10-step mean of 0.37–0.38, then 0.43–0.45 "
                               "over the last 10 steps",
     ["long_addition process seed 0: 0.50 at step 1, lowest 0.38 (steps 6-15), last 10 0.45",
      "long_addition process seed 1: 0.50 at step 1, lowest 0.38 (steps 8-17), last 10 0.44",
      "long_addition process seed 2: 0.47 at step 1, lowest 0.37 (steps 32-41), last 10 0.43"]),
    ("11_process_supervision", "the live run below shows seed 0's first 10 steps: 0.496 to 0.350",
     ["step 1 answers right 0.031 steps right 0.496", "step 10 answers right 0.000 steps right 0.350"]),
    ("11_process_supervision", "4.7 times outcome supervision's on section 2's batch (5.31 against 1.12)",
     ["outcome: gradient norm 1.12 -> clipped to 1.00, process: gradient norm 5.31 -> clipped to 1.00"]),
    ("11_process_supervision", "(from step 9, 3 and 2 on in seeds 0, 1 and 2",
     ["[1, 2, 3, 5, 8] of 60", "seed 1: steps with a non-zero gradient [1, 2] of 60",
      "seed 2: steps with a non-zero gradient [1] of 60"]),
    ("11_process_supervision", "the update is 0.67 of the first at step 2, 0.19 at step 10, 0.07 at step 20 and 0.01 at "
                               "step 40", ["update at steps 1, 2, 10, 20, 40 (the first is 1): 1.00, 0.67, 0.19, 0.07, 0.01"]),
    ("11_process_supervision", "add up to 4.3 times the first update by step 20, 5.0 by step 60",
     ["the zero-gradient steps' updates add up to 4.3 by step 20, 5.0 by step 60"]),
    ("11_process_supervision", "the wrong `7+8=14` gets 0.85, as the right `7+8=15` does; the forgotten carry `4+5=9` "
                               "gets 0.63, the right `4+5+1=10` 0.61; and the right answer `1057` gets 0.39, the wrong "
                               "`1047` 0.38 and `957` 0.47",
     ["<think>1+6=7,7+8=15,4+5+1=10</think>1057 PRM 0.87 0.85 0.61 0.39",
      "<think>1+6=7,7+8=14,4+5+1=10</think>1047 PRM 0.87 0.85 0.61 0.38",
      "<think>1+6=7,7+8=15,4+5=9</think>957 PRM 0.87 0.85 0.63 0.47"]),
    ("11_process_supervision", "the PRM's mean step score climbs from 0.55 to 0.76 in 20 steps",
     ["step 1 PRM's mean step score 0.547", "step 20 PRM's mean step score 0.757"]),
    ("11_process_supervision", "(0.29 to 0.53 by step 3, answers right from 0.20 to 0.38 at step 8) and then collapse: "
                               "0.06 steps right and no right answer at step 20; greedy accuracy on 200 test problems "
                               "went from 29.5% to 0.0%",
     ["checker: steps right 0.287, answers right 0.195", "step 3 PRM's mean step score 0.666 checker: steps right 0.526",
      "step 8 PRM's mean step score 0.710 checker: steps right 0.544, answers right 0.383",
      "step 20 PRM's mean step score 0.757 checker: steps right 0.058, answers right 0.000",
      "greedy accuracy 29.5% -> 0.0%"]),
    ("11_process_supervision", "(`8+0=8,0+2=2,0+5=5,0+5=5` for 538+516)",
     ["538+516= '<think>8+0=8,0+2=2,0+5=5,0+5=5</think>5528'"]),
    ("11_process_supervision", "(0.01 or fewer cut over the first 14 steps, 0.39 at step 20)",
     ["step 14 PRM's mean step score 0.715", "cut at the budget 0.01", "tokens 35.6 cut at the budget 0.39"]),
]


def _squeeze(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("stem, prose, outputs", QUOTES, ids=[f"{q[0][:2]}-{i}" for i, q in enumerate(QUOTES)])
def test_quoted_numbers_match_the_committed_outputs(stem, prose, outputs):
    notebook = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4)
    markdown = _squeeze(" ".join(c.source for c in notebook.cells if c.cell_type == "markdown"))
    printed = _squeeze(" ".join(_text_outputs(c) for c in notebook.cells if c.cell_type == "code"))
    assert _squeeze(prose) in markdown, f"{stem}: the prose no longer says {prose!r}: update QUOTES with it"
    for words in outputs:
        assert _squeeze(words) in printed, f"{stem}: the prose says {prose!r}, the outputs no longer print {words!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_control_characters_in_the_cells(path):
    # "\rho" typed in a plain Python string is a carriage return and "ho": the formula a cell displays is then broken
    notebook = nbformat.read(path, as_version=4)
    found = [(i, hex(ord(m.group()))) for i, c in enumerate(notebook.cells)
             for m in re.finditer(r"[\x00-\x08\x0b\x0c\x0e-\x1f]", c.source)]
    assert not found, f"{path.name}: control characters in cells (cell index, character): {found}"


# What a student should not have to read: the project's history. Commit ids, issue numbers and "round N" belong in
# git; a notebook says what the code does now. (The first cell's "git checkout, commit ..." names the code that made
# the outputs: provenance, allowed.)
HISTORY = re.compile(r"\bround[ -]?(\d+|two|three)\b|\bissue[ #]*\d+|\bbefore the fix\b|\bsince the fix\b|"
                     r"(?<![.\w])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b(?![-+]\d)", re.IGNORECASE)


@pytest.mark.parametrize("path", NOTEBOOKS + [ROOT / "notebooks" / "README.md"], ids=lambda p: p.name)
def test_no_project_history_in_what_a_student_reads(path):
    if path.suffix == ".md":
        texts = [path.read_text()]
    else:
        notebook = nbformat.read(path, as_version=4)
        texts = [c.source for c in notebook.cells]
        texts += [re.sub(r"git checkout, commit [0-9a-f]+", "", _text_outputs(c)) for c in notebook.cells
                  if c.cell_type == "code"]
    found = [m.group(0) for text in texts for m in HISTORY.finditer(text)]
    assert not found, f"{path.name}: project history in what a student reads: {found}"
