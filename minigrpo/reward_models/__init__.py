"""Rewards read from a model rather than a checker: each one a reward function the trainer calls like any other.

    outcome.py   RewardModel: a trained sequence classifier's score of prompt + completion, as TRL's GRPOTrainer
                 scores it (reward_funcs=["path/to/rm"]); RewardEnsemble, the minimum or mean of several
    process.py   ProcessRewardModel: a process reward model's P(step right) at each step's separator (the hub PRMs'
                 convention, Qwen2.5-Math-PRM), returned as StepRewards for advantage_estimator="process"
    judge.py     LLMJudge: a chat model asked through its chat template, P("Yes") read from its next token

Their math (Bradley-Terry, the step labels' loss, DPO, best-of-n) is in preference/; reward_trainer.py trains them.
"""

from .judge import LLMJudge
from .outcome import RewardEnsemble, RewardModel, is_reward_model, load_reward_model
from .process import ProcessRewardModel, split_steps

__all__ = ["RewardModel", "RewardEnsemble", "load_reward_model", "is_reward_model", "ProcessRewardModel", "split_steps",
           "LLMJudge"]
