"""Advantages against the worked examples and hand-computed cases."""

import math

import pytest
import torch

from minigrpo.advantages import group_advantages, kl_penalized_rewards, process_advantages, rloo_advantages


def test_worked_example_four_answers_population_std():
    adv, zero_std = group_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0]), 4, std="population", eps=0.0)
    assert adv.tolist() == [1.0, 1.0, -1.0, -1.0]
    assert not zero_std.any()


def test_worked_example_six_of_ten_population_std():
    adv, _ = group_advantages(torch.tensor([1.0] * 6 + [0.0] * 4), 10, std="population", eps=0.0)
    # mean 0.6, population std sqrt(0.24): (1 - 0.6)/0.4899 = 0.8165, (0 - 0.6)/0.4899 = -1.2247
    assert adv[:6] == pytest.approx([0.4 / math.sqrt(0.24)] * 6, abs=1e-6)
    assert adv[6:] == pytest.approx([-0.6 / math.sqrt(0.24)] * 4, abs=1e-6)
    assert round(adv[0].item(), 4) == 0.8165 and round(adv[-1].item(), 4) == -1.2247


def test_sample_std_is_trl_convention():
    adv, _ = group_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0]), 4)  # sample std, eps 1e-4
    sample_std = math.sqrt(4 * 0.25 / 3)
    assert adv.tolist() == pytest.approx([0.5 / (sample_std + 1e-4)] * 2 + [-0.5 / (sample_std + 1e-4)] * 2)


def test_huge_finite_rewards_keep_their_advantages():
    # (1e20 - mean)^2 overflows float32; the std is then taken in units of the group's largest deviation. A group
    # of ordinary rewards beside them is computed as before, to the bit.
    rewards = torch.tensor([0.0, 1e20, 0.0, 1e20, 3.0, 1.0, 2.0, 2.0])
    adv, _ = group_advantages(rewards, 4, std="population", eps=0.0)
    assert adv[:4].tolist() == pytest.approx([-1.0, 1.0, -1.0, 1.0])
    assert torch.equal(adv[4:], group_advantages(rewards[4:], 4, std="population", eps=0.0)[0])


def test_dr_grpo_is_mean_centred_only():
    adv, _ = group_advantages(torch.tensor([3.0, 1.0, 2.0, 2.0]), 4, scale="none")
    assert adv.tolist() == [1.0, -1.0, 0.0, 0.0]


def test_batch_scale_uses_group_mean_and_batch_std():
    rewards = torch.tensor([1.0, 0.0, 3.0, 1.0])
    adv, _ = group_advantages(rewards, 2, scale="batch", eps=0.0)
    batch_std = rewards.std().item()  # Bessel-corrected, over all four
    assert adv.tolist() == pytest.approx([0.5 / batch_std, -0.5 / batch_std, 1 / batch_std, -1 / batch_std])


def test_zero_std_groups_give_exact_zero_and_are_flagged():
    rewards = torch.tensor([0.1, 0.1, 0.1, 1.0, 0.0, 1.0, 5.0, 5.0, 5.0])
    adv, zero_std = group_advantages(rewards, 3)
    assert adv[:3].tolist() == [0.0, 0.0, 0.0]  # exactly, not a rounding residue / eps
    assert adv[6:].tolist() == [0.0, 0.0, 0.0]
    assert zero_std.tolist() == [True] * 3 + [False] * 3 + [True] * 3
    assert zero_std.float().mean().item() == pytest.approx(2 / 3)


def test_nan_rewards_are_left_out_of_the_baseline():
    adv, zero_std = group_advantages(torch.tensor([1.0, float("nan"), 0.0, 0.0]), 4, std="population", eps=0.0)
    # scored rewards [1, 0, 0]: mean 1/3, population std sqrt(2)/3
    s = math.sqrt(2) / 3
    assert adv.tolist() == pytest.approx([(2 / 3) / s, 0.0, (-1 / 3) / s, (-1 / 3) / s])
    assert not zero_std.any()
    adv, zero_std = group_advantages(torch.full((4,), float("nan")), 4)
    assert adv.tolist() == [0.0] * 4 and zero_std.all()


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="scale"):
        group_advantages(torch.zeros(4), 2, scale="groups")
    with pytest.raises(ValueError, match="groups of 3"):
        group_advantages(torch.zeros(4), 3)


def test_rloo_leave_one_out():
    adv = rloo_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0, 2.0, 0.0]), 3)
    # group 1 [1, 1, 0]: 1 - (1+0)/2 = 0.5, 0.5, 0 - 1 = -1 ; group 2 [0, 2, 0]: -1, 2, -1
    assert adv.tolist() == [0.5, 0.5, -1.0, -1.0, 2.0, -1.0]
    # = G/(G-1) (r - mean)
    r = torch.tensor([3.0, 1.0, 2.0, 6.0])
    assert rloo_advantages(r, 4).tolist() == pytest.approx((4 / 3 * (r - r.mean())).tolist())


def test_rloo_with_nan():
    adv = rloo_advantages(torch.tensor([1.0, float("nan"), 0.0]), 3)
    assert adv.tolist() == [1.0, 0.0, -1.0]


def test_process_supervision_hand_case():
    # One group of 2 completions, T = 4 tokens. Completion 0: steps ending at t=1 (reward 1) and t=3 (reward 0).
    # Completion 1: one step ending at t=2 (reward 0.5). R = {1, 0, 0.5}: mean 0.5, population std sqrt(1/6).
    step_rewards = torch.tensor([[1.0, 0.0], [0.5, 0.0]])
    step_end = torch.tensor([[1, 3], [2, 0]])
    step_mask = torch.tensor([[1, 1], [1, 0]])
    adv = process_advantages(step_rewards, step_end, step_mask, group_size=2, num_tokens=4, eps=0.0)
    s = math.sqrt(1 / 6)
    n1, n0, nh = 0.5 / s, -0.5 / s, 0.0
    expected = [[n1 + n0, n1 + n0, n0, n0], [nh, nh, nh, 0.0]]
    assert adv.tolist() == [pytest.approx(row) for row in expected]


def test_process_supervision_equal_steps_give_zero():
    adv = process_advantages(torch.ones(2, 2), torch.tensor([[0, 1], [1, 2]]), torch.ones(2, 2), 2, 3)
    assert adv.abs().max().item() == 0.0


def test_kl_in_reward():
    rewards = torch.tensor([1.0, 0.0])
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -9.0]])
    ref_logp = torch.tensor([[-1.5, -2.0], [-1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    # sequence k1: row 0 = 0.5 + 0, row 1 = 0.5 (second token masked)
    assert kl_penalized_rewards(rewards, logp, ref_logp, mask, beta=0.1).tolist() == pytest.approx([0.95, -0.05])
