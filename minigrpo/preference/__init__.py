"""Learning from preferences, the math (torch only): the Bradley–Terry loss a reward model is trained with, the
pointwise loss on checker-labelled completions, how a reward model is judged (pairwise accuracy, AUC), DPO's loss
that folds the reward model into the policy, and TRL's preference data formats.

    bradley_terry.py   -log sigmoid(r_chosen - r_rejected - margin) (+ centering); BCE on labels; accuracy, AUC
    dpo.py             the same Bradley–Terry loss on DPO's implicit reward beta log pi / pi_ref
    pairs.py           TRL's preference rows (explicit or implicit prompt) and the pairing of right with wrong
    step_labels.py     a process reward model's loss: cross-entropy of a right/wrong label at each step's separator
    overoptimization.py  best-of-n against a proxy, its KL, and Gao et al.'s forms of the gold reward's rise and fall

The models these train, and the loops, are one floor up: reward_models/, reward_trainer.py, dpo_trainer.py.
"""

from .bradley_terry import bradley_terry_loss, pairwise_accuracy, pointwise_bce_loss, roc_auc
from .dpo import dpo_loss
from .overoptimization import best_of_n, fit_gao, kl_best_of_n
from .pairs import pair_right_with_wrong, preference_pair
from .step_labels import step_label_loss

__all__ = ["bradley_terry_loss", "pointwise_bce_loss", "pairwise_accuracy", "roc_auc", "dpo_loss",
           "preference_pair", "pair_right_with_wrong", "best_of_n", "kl_best_of_n", "fit_gao",
           "step_label_loss"]
