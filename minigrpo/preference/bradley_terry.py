"""The reward model's losses: Bradley–Terry on preference pairs, or a plain classifier on labelled completions.

A reward model r(x, y) is a scalar per (prompt x, completion y). Bradley & Terry (1952) model the probability that
a person prefers y_c (chosen) to y_r (rejected) as a logistic function of the difference of their scores,

    P(y_c > y_r | x) = sigmoid(r(x, y_c) - r(x, y_r))

and fitting it by maximum likelihood is the loss of InstructGPT's reward model (Ouyang et al. 2022, eq. 1), of
TRL's RewardTrainer, and of this file:

    L_BT = - mean_pairs log sigmoid(r_c - r_r - m)  +  c * mean_pairs (r_c + r_r)^2

m, a per-pair margin (Llama 2, Touvron et al. 2023, eq. 2: a clearer preference asks for a larger gap; TRL's
dataset column "margin"), and c, TRL's `center_rewards_coefficient` (Eisenstein et al. 2023): the loss sees only
differences, so r + constant fits as well as r; the second term pulls the scores toward 0 on average, which makes
rewards from different models or runs comparable (a GRPO group subtracts its mean anyway).

Worked example, as the test computes it: r_c = (2.0, 0.5), r_r = (1.0, 1.5), no margin, so r_c - r_r = (1, -1):

    L_BT = (log(1 + e^-1) + log(1 + e^1)) / 2 = (0.31326 + 1.31326) / 2 = 0.81326
    with c = 0.01: + 0.01 * (3^2 + 2^2) / 2 = + 0.065                          -> 0.87826
    with m = (0.5, 0): (log(1 + e^-0.5) + log(1 + e^1)) / 2 = (0.47408 + 1.31326) / 2 = 0.89367
    dL/dr_c = -sigmoid(-(r_c - r_r)) / 2 = (-0.13447, -0.36553) = -dL/dr_r (without c)

When a checker labels each completion right or wrong (no pairs), the same scalar head can be trained pointwise as
a classifier, sigmoid(r) = P(right | x, y), with binary cross-entropy,

    L_BCE = - mean [ l log sigmoid(r) + (1 - l) log(1 - sigmoid(r)) ],     l in {0, 1}

which is what the checker-labelled warm-start samples of notebook 10 give (every completion is used, not only the
prompts where right and wrong both occur). Both losses see a reward model through its scores only: a process
reward model (a score at each step's last token) plugs in with the scores and labels of its steps.

How good is it? `pairwise_accuracy`, the fraction of pairs ranked right (TRL logs it as "accuracy"), and `roc_auc`,
the probability that a random right completion outscores a random wrong one.
"""

import torch
import torch.nn.functional as F

__all__ = ["bradley_terry_loss", "pointwise_bce_loss", "pairwise_accuracy", "roc_auc"]


def bradley_terry_loss(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor, margin: torch.Tensor | None = None,
                       center_rewards_coefficient: float | None = None) -> tuple[torch.Tensor, dict]:
    """L_BT above. chosen_rewards, rejected_rewards: (P,) the model's scores of each pair's two completions;
    margin: (P,) or None. Returns (loss, stats): accuracy (pairs ranked right), margin (mean r_c - r_r), and the mean
    score, as TRL's RewardTrainer logs them."""
    difference = chosen_rewards - rejected_rewards  # (P,)
    loss = -F.logsigmoid(difference if margin is None else difference - margin).mean()
    if center_rewards_coefficient is not None:
        loss = loss + center_rewards_coefficient * ((chosen_rewards + rejected_rewards) ** 2).mean()
    with torch.no_grad():
        stats = {"accuracy": pairwise_accuracy(chosen_rewards, rejected_rewards), "margin": difference.mean().item(),
                 "mean_reward": torch.cat([chosen_rewards, rejected_rewards]).mean().item()}
    return loss, stats


def pointwise_bce_loss(rewards: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """L_BCE above: each score a logit of P(right). rewards: (N,); labels: (N,) 1 right, 0 wrong (floats in [0, 1]
    also work: soft labels). Returns (loss, stats): accuracy (sigmoid(r) > 1/2 agrees with the label) and mean score."""
    labels = labels.to(rewards.dtype)
    loss = F.binary_cross_entropy_with_logits(rewards, labels)
    with torch.no_grad():
        stats = {"accuracy": ((rewards > 0) == (labels > 0.5)).float().mean().item(),
                 "mean_reward": rewards.mean().item()}
    return loss, stats


def pairwise_accuracy(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor) -> float:
    """The fraction of pairs whose chosen completion scores strictly higher (TRL's "accuracy": a tie is wrong)."""
    return (chosen_rewards > rejected_rewards).float().mean().item()


def roc_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve: P(score of a random positive > score of a random negative), a tie counting 1/2
    (the Mann–Whitney U statistic over n_pos x n_neg). scores, labels: (N,), labels 1/0. NaN without both kinds."""
    positive, negative = scores[labels.bool()], scores[~labels.bool()]
    if len(positive) == 0 or len(negative) == 0:
        return float("nan")
    difference = positive[:, None] - negative[None, :]  # (n_pos, n_neg)
    return ((difference > 0).float() + 0.5 * (difference == 0).float()).mean().item()
