"""A process reward model's loss: a right/wrong label at the end of every step (Math-Shepherd, Wang et al. 2024;
Lightman et al. 2023's PRM800K).

A PRM reads the prompt and the steps, a separator token after each, and has two logits at every token (a
token-classification head, num_labels=2); only the separators carry a label, l_k = 1 if step k is right, else 0.
The loss is the cross-entropy of the labelled tokens, every other token's label -100 (ignored):

    L = - (1 / |S|) sum_{(i,t) in S} log softmax(z_{i,t})[l_{i,t}],    S = the tokens whose label is not -100

which is what TRL's former PRMTrainer trained (its `tokenize_row` put each step's label on the last token of the
separator it appended, -100 elsewhere, and left the loss to AutoModelForTokenClassification's cross-entropy), and
what ProcessRewardModel reads back: P(step k right) = softmax(z at the k-th separator)[1].

Worked example, as the test computes it: one text with three labelled separators, logits (0, 2), (1, 0), (0, 0) and
labels 1, 1, 0:

    -log softmax(0, 2)[1] = log(1 + e^-2) = 0.126928
    -log softmax(1, 0)[1] = log(1 + e^1)  = 1.313262
    -log softmax(0, 0)[0] = log 2         = 0.693147          L = 2.133337 / 3 = 0.711112
    dL/dz = (softmax(z) - onehot(l)) / 3 at each of them, 0 at every unlabelled token
"""

import torch
import torch.nn.functional as F

__all__ = ["step_label_loss", "IGNORE_INDEX"]

IGNORE_INDEX = -100  # a token with no label (transformers' and TRL's convention)


def step_label_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """L above. logits: (B, L, 2) the PRM's two logits per token; labels: (B, L) long, 1 right / 0 wrong at each
    step's separator, IGNORE_INDEX elsewhere (padding too). Returns (loss, stats): step_accuracy (the labelled tokens
    whose argmax is their label), p_right (the mean P(right) there), steps (how many were labelled)."""
    labelled = labels != IGNORE_INDEX  # (B, L)
    step_logits, step_labels = logits[labelled], labels[labelled]  # (S, 2), (S,)
    loss = F.cross_entropy(step_logits.float(), step_labels)
    with torch.no_grad():
        stats = {"step_accuracy": (step_logits.argmax(-1) == step_labels).float().mean().item(),
                 "p_right": step_logits.float().softmax(-1)[:, 1].mean().item(), "steps": int(labelled.sum())}
    return loss, stats
