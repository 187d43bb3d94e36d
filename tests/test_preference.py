"""The preference losses by hand (the docstrings' worked numbers), then equal to TRL 1.16's own on the same inputs:
RewardTrainer.compute_loss (Bradley–Terry, margin, centering) and DPOTrainer._compute_loss (sigmoid DPO), value and
gradient; then TRL's data formats and the pairing of right with wrong."""

import math
import random
import types
from collections import defaultdict

import pytest
import torch

from minigrpo.preference import (bradley_terry_loss, dpo_loss, pair_right_with_wrong, pairwise_accuracy,
                                 pointwise_bce_loss, preference_pair, roc_auc)
from minigrpo.tasks.sources import DataError


# ---- Bradley–Terry and BCE by hand ----------------------------------------------------------------------------
def test_bradley_terry_loss_by_hand():
    chosen = torch.tensor([2.0, 0.5], requires_grad=True)
    rejected = torch.tensor([1.0, 1.5], requires_grad=True)
    loss, stats = bradley_terry_loss(chosen, rejected)
    # r_c - r_r = (1, -1): (log(1 + e^-1) + log(1 + e^1)) / 2 = (0.31326 + 1.31326) / 2
    assert loss.item() == pytest.approx(0.81326, abs=1e-5)
    loss.backward()
    # dL/dr_c = -sigmoid(-(r_c - r_r)) / 2 = (-0.13447, -0.36553); dL/dr_r the opposite
    torch.testing.assert_close(chosen.grad, torch.tensor([-0.13447, -0.36553]), atol=1e-5, rtol=0)
    torch.testing.assert_close(rejected.grad, -chosen.grad)
    assert stats == pytest.approx({"accuracy": 0.5, "margin": 0.0, "mean_reward": 1.25})
    # + 0.01 * ((2 + 1)^2 + (0.5 + 1.5)^2) / 2 = + 0.065
    centred, _ = bradley_terry_loss(chosen, rejected, center_rewards_coefficient=0.01)
    assert centred.item() == pytest.approx(0.87826, abs=1e-5)
    # margin (0.5, 0): (log(1 + e^-0.5) + log(1 + e^1)) / 2 = (0.47408 + 1.31326) / 2
    with_margin, _ = bradley_terry_loss(chosen, rejected, margin=torch.tensor([0.5, 0.0]))
    assert with_margin.item() == pytest.approx(0.89367, abs=1e-5)


def test_the_bradley_terry_loss_sees_only_differences_until_it_is_centred():
    chosen, rejected = torch.randn(5), torch.randn(5)
    shifted = bradley_terry_loss(chosen + 7, rejected + 7)[0]
    assert shifted.item() == pytest.approx(bradley_terry_loss(chosen, rejected)[0].item(), abs=1e-6)
    assert bradley_terry_loss(chosen + 7, rejected + 7, center_rewards_coefficient=0.01)[0] > shifted


def test_pointwise_bce_loss_by_hand():
    rewards = torch.tensor([0.0, 2.0, -1.0])
    loss, stats = pointwise_bce_loss(rewards, torch.tensor([1, 1, 0]))
    # -(log sigmoid(0) + log sigmoid(2) + log(1 - sigmoid(-1))) / 3 = (0.69315 + 0.12693 + 0.31326) / 3
    assert loss.item() == pytest.approx((math.log(2) + math.log(1 + math.exp(-2)) + math.log(1 + math.exp(-1))) / 3)
    assert stats["accuracy"] == pytest.approx(2 / 3)  # r = 0 says "wrong" (sigmoid 1/2 is not above 1/2)


def test_pairwise_accuracy_and_auc_by_hand():
    assert pairwise_accuracy(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.0, 2.0, 4.0])) == pytest.approx(1 / 3)
    # positives 0.9, 0.4; negatives 0.4, 0.1: pairs (0.9 > 0.4, 0.9 > 0.1, 0.4 = 0.4 counts 1/2, 0.4 > 0.1) = 3.5 / 4
    scores, labels = torch.tensor([0.9, 0.4, 0.4, 0.1]), torch.tensor([1, 1, 0, 0])
    assert roc_auc(scores, labels) == pytest.approx(0.875)
    assert roc_auc(-scores, labels) == pytest.approx(0.125)
    assert math.isnan(roc_auc(scores, torch.ones(4)))


# ---- DPO by hand ---------------------------------------------------------------------------------------------
def test_dpo_loss_by_hand():
    logp_chosen, logp_rejected = torch.tensor([-5.0], requires_grad=True), torch.tensor([-6.0], requires_grad=True)
    loss, stats = dpo_loss(logp_chosen, logp_rejected, torch.tensor([-5.5]), torch.tensor([-5.5]), beta=0.1)
    # implicit rewards 0.1 * 0.5 and 0.1 * -0.5: L = log(1 + e^-0.1) = 0.64440
    assert loss.item() == pytest.approx(0.64440, abs=1e-5)
    loss.backward()
    assert logp_chosen.grad.item() == pytest.approx(-0.1 / (1 + math.exp(0.1)), abs=1e-6)  # -beta sigmoid(-0.1)
    assert logp_rejected.grad.item() == pytest.approx(-logp_chosen.grad.item())
    assert stats == pytest.approx({"rewards/chosen": 0.05, "rewards/rejected": -0.05, "rewards/accuracies": 1.0,
                                   "rewards/margins": 0.1})


def test_dpo_is_bradley_terry_on_the_implicit_reward():
    g = torch.Generator().manual_seed(0)
    logp, ref = -torch.rand(2, 6, generator=g) * 10, -torch.rand(2, 6, generator=g) * 10
    beta = 0.3
    ours = dpo_loss(logp[0], logp[1], ref[0], ref[1], beta=beta)[0]
    implicit = beta * (logp - ref)
    assert ours.item() == pytest.approx(bradley_terry_loss(implicit[0], implicit[1])[0].item(), abs=1e-6)


# ---- parity with TRL 1.16 -------------------------------------------------------------------------------------
class _Accelerator:
    device = torch.device("cpu")

    def gather(self, x):
        return x

    def gather_for_metrics(self, x):
        return x


def _fake_trainer(trainer_class, **attributes):
    """A TRL trainer object without its __init__, holding only what the loss method reads."""
    trainer = trainer_class.__new__(trainer_class)
    metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    trainer.__dict__.update(accelerator=_Accelerator(), _metrics=metrics, _total_train_tokens=0, _tp_size=1,
                            **attributes)
    return trainer


@pytest.mark.parametrize("margin, center", [(False, None), (True, None), (False, 0.01), (True, 0.05)])
def test_bradley_terry_loss_equals_trls_reward_trainer(margin, center):
    reward_trainer = pytest.importorskip("trl.trainer.reward_trainer")
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(16, 1, generator=g, dtype=torch.float64).requires_grad_()  # 8 chosen, then 8 rejected
    inputs = {"input_ids": torch.ones(16, 3, dtype=torch.long), "attention_mask": torch.ones(16, 3, dtype=torch.long)}
    if margin:
        inputs["margin"] = torch.rand(8, generator=g, dtype=torch.float64)
    model = lambda **kw: types.SimpleNamespace(logits=logits)  # noqa: E731 - the model's scores, as given
    trainer = _fake_trainer(reward_trainer.RewardTrainer, model=types.SimpleNamespace(training=True),
                            args=types.SimpleNamespace(center_rewards_coefficient=center))
    theirs = trainer.compute_loss(model, dict(inputs))
    (their_grad,) = torch.autograd.grad(theirs, logits)
    ours, stats = bradley_terry_loss(logits[:8, 0], logits[8:, 0], inputs.get("margin"), center)
    (our_grad,) = torch.autograd.grad(ours, logits)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(our_grad, their_grad, rtol=1e-12, atol=1e-12)
    assert stats["accuracy"] == pytest.approx(trainer._metrics["train"]["accuracy"][0])
    assert stats["margin"] == pytest.approx(trainer._metrics["train"]["margin"][0])


def test_dpo_loss_equals_trls_dpo_trainer():
    """TRL's `_compute_loss` with its default loss (sigmoid, reverse KL), on per-token log-probs we hand it through
    fake policy and reference models, against dpo_loss on the same log-probs summed over each completion."""
    dpo_trainer = pytest.importorskip("trl.trainer.dpo_trainer")
    g = torch.Generator().manual_seed(2)
    P, L = 4, 7  # pairs, sequence length
    completion_mask = torch.zeros(2 * P, L, dtype=torch.long)  # rows 0..P-1 chosen, P..2P-1 rejected
    for row, start in enumerate(torch.randint(1, 4, (2 * P,), generator=g).tolist()):
        completion_mask[row, start:start + int(torch.randint(2, L - start + 1, (1,), generator=g))] = 1
    shift_mask = completion_mask[:, 1:].double()  # (2P, L - 1): log-prob t predicts token t + 1
    policy_logp = (-torch.rand(2 * P, L - 1, generator=g, dtype=torch.float64) * 3 * shift_mask).requires_grad_()
    ref_logp = -torch.rand(2 * P, L - 1, generator=g, dtype=torch.float64) * 3 * shift_mask

    def fake_model(per_token_logp):
        def forward(**kw):
            zeros = torch.zeros(2 * P, L - 1, dtype=torch.float64)
            return types.SimpleNamespace(log_probs=per_token_logp, entropy=zeros, mean_logits=zeros,
                                         is_top1=zeros.bool())
        return forward

    model = fake_model(policy_logp)
    trained = torch.nn.Module()  # what TRL asks `self.model` (training mode, gradient checkpointing, peft or not)
    trained.is_gradient_checkpointing = False
    trainer = _fake_trainer(
        dpo_trainer.DPOTrainer, model=trained,
        ref_model=fake_model(ref_logp), args=types.SimpleNamespace(gradient_checkpointing_kwargs=None),
        aux_loss_enabled=False, ld_alpha=None, precompute_ref_logps=False, f_divergence_type="reverse_kl",
        loss_types=["sigmoid"], loss_weights=[1.0], beta=0.1, use_weighting=False)
    inputs = {"input_ids": torch.ones(2 * P, L, dtype=torch.long), "attention_mask": torch.ones(2 * P, L),
              "completion_mask": completion_mask}
    theirs = trainer._compute_loss(model, inputs, return_outputs=False)
    (their_grad,) = torch.autograd.grad(theirs, policy_logp)
    logp, ref = policy_logp.sum(-1), ref_logp.sum(-1)  # (2P,) each completion's log-probability
    ours, stats = dpo_loss(logp[:P], logp[P:], ref[:P], ref[P:], beta=0.1)
    (our_grad,) = torch.autograd.grad(ours, policy_logp)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(our_grad, their_grad, rtol=1e-12, atol=1e-12)
    assert stats["rewards/margins"] == pytest.approx(trainer._metrics["train"]["rewards/margins"][0])


# ---- data formats ---------------------------------------------------------------------------------------------
def test_preference_rows_explicit_and_implicit():
    explicit = {"prompt": "38+85=", "chosen": "<think></think>123", "rejected": "<think></think>113", "margin": 1.0}
    assert preference_pair(explicit) == explicit
    # implicit: the longest common prefix is the prompt (TRL's extract_prompt), a trailing space left to the answers
    implicit = preference_pair({"chosen": "The sky is blue.", "rejected": "The sky is green."})
    assert implicit == {"prompt": "The sky is", "chosen": " blue.", "rejected": " green.", "margin": None}
    user = {"role": "user", "content": "What color is the sky?"}
    messages = preference_pair({"chosen": [user, {"role": "assistant", "content": "Blue."}],
                                "rejected": [user, {"role": "assistant", "content": "Green."}]})
    assert messages["prompt"] == [user] and messages["chosen"] == [{"role": "assistant", "content": "Blue."}]
    with pytest.raises(DataError, match="needs 'chosen' and 'rejected'"):
        preference_pair({"prompt": "1+1=", "completion": "2"})


def test_trl_extracts_the_same_implicit_prompt():
    data_utils = pytest.importorskip("trl.data_utils")
    for row in ({"chosen": "The sky is blue.", "rejected": "The sky is green."},
                {"chosen": "12+34=<think></think>46", "rejected": "12+34=<think>2+4=6</think>46"}):
        ours = preference_pair(row)
        del ours["margin"]
        assert ours == data_utils.extract_prompt(row)


def test_right_is_paired_with_wrong_and_every_sample_used():
    completions = ["a", "b", "c", "d", "e"]
    pairs = pair_right_with_wrong("p", completions, [True, False, False, False, True], random.Random(0))
    assert len(pairs) == 3  # max(2 right, 3 wrong)
    assert {p["chosen"] for p in pairs} == {"a", "e"} and {p["rejected"] for p in pairs} == {"b", "c", "d"}
    assert all(p["prompt"] == "p" for p in pairs)
    assert pair_right_with_wrong("p", completions, [True] * 5, random.Random(0)) == []


# ---- over-optimization ----------------------------------------------------------------------------------------
def test_best_of_n_by_hand_and_against_brute_force():
    from itertools import combinations

    from minigrpo.preference import best_of_n, kl_best_of_n

    proxy = torch.tensor([[0.1, 0.9, 0.5, 0.3]])
    gold = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    assert best_of_n(proxy, gold, 1) == pytest.approx(0.5)  # n = 1: the plain mean
    assert best_of_n(proxy, gold, 4) == pytest.approx(0.0)  # n = m: the proxy's favourite, which is wrong
    # n = 2: of the 6 pairs, the proxy's pick is right in (0.1, 0.5), (0.5, 0.3), and wrong in the other 4
    assert best_of_n(proxy, gold, 2) == pytest.approx(2 / 6)
    g = torch.Generator().manual_seed(0)
    proxy, gold = torch.rand(3, 7, generator=g), torch.rand(3, 7, generator=g)
    for n in (2, 3, 5):
        brute = torch.tensor([[gold[p, max(s, key=lambda j: proxy[p, j])].item() for s in combinations(range(7), n)]
                              for p in range(3)]).mean().item()
        assert best_of_n(proxy, gold, n) == pytest.approx(brute)
    assert kl_best_of_n(1) == 0 and kl_best_of_n(64) == pytest.approx(math.log(64) - 63 / 64)



def test_the_best_of_n_kl_bounds_a_policy_that_repeats_itself():
    # The closed form is exact only when no completion has a sizeable probability. A policy with two completions,
    # y1 (the proxy's favourite) and y2, each with probability 1/2: best-of-2 writes y1 unless both draws are y2,
    # so pi_bon = (3/4, 1/4) and KL(pi_bon || pi) = 3/4 log(3/2) + 1/4 log(1/2) = 0.1308 nats, under
    # log 2 - 1/2 = 0.1931. With m equally likely completions the exact KL climbs to the closed form as m grows.
    from minigrpo.preference import kl_best_of_n

    def exact_kl(m, n):  # m equally likely completions, ranked; pi_bon(i-th lowest) = (i/m)^n - ((i-1)/m)^n
        i = torch.arange(1, m + 1, dtype=torch.float64)
        p_bon = (i / m) ** n - ((i - 1) / m) ** n
        return (p_bon * (p_bon * m).log()).sum().item()

    assert exact_kl(2, 2) == pytest.approx(0.75 * math.log(1.5) + 0.25 * math.log(0.5))
    assert exact_kl(2, 2) == pytest.approx(0.1308, abs=1e-4) and kl_best_of_n(2) == pytest.approx(0.1931, abs=1e-4)
    gaps = [kl_best_of_n(4) - exact_kl(m, 4) for m in (2, 8, 64, 4096)]
    assert all(g > 0 for g in gaps) and gaps == sorted(gaps, reverse=True) and gaps[-1] < 1e-3

def test_gao_forms_are_recovered_from_their_own_curves():
    from minigrpo.preference import fit_gao

    d = torch.linspace(0.2, 3.0, 12)
    assert fit_gao(d, d * (0.42 - 0.27 * d), "bon") == pytest.approx({"alpha": 0.42, "beta": 0.27, "r2": 1.0})
    assert fit_gao(d, d * (0.3 - 0.2 * d.log()), "rl") == pytest.approx({"alpha": 0.3, "beta": 0.2, "r2": 1.0})
    assert fit_gao(d, torch.rand(12, generator=torch.Generator().manual_seed(0)), "bon")["r2"] < 0.9
