"""entropy_coef in the loop: the bonus has a gradient, and a step on it raises the policy's entropy."""

import copy

import torch

from minigrpo.config import Config
from minigrpo.logprobs import completion_logprobs
from minigrpo.loading.models import load_model
from minigrpo.batch import Batch
from minigrpo.logprobs import LogprobForward
from minigrpo.trainer import grpo_update


def test_an_entropy_bonus_alone_moves_the_policy_toward_more_entropy(random_model_dir):
    model = load_model(random_model_dir)
    g = torch.Generator().manual_seed(0)
    V = model.config.vocab_size
    inputs = Batch.of_completions(torch.randint(3, V, (4, 3), generator=g), torch.ones(4, 3, dtype=torch.long),
                                  torch.randint(3, V, (4, 5), generator=g), torch.ones(4, 5),
                                  adv=torch.zeros(4))  # advantage 0: no policy gradient at all
    ids = [inputs.prompt_ids, inputs.prompt_mask, inputs.completion_ids, inputs.completion_mask]
    mean_entropy = lambda m: completion_logprobs(m, *ids, with_entropy=True)[1].mean().item()  # noqa: E731
    stats = {}
    for coef in (0.0, 0.5):
        m = copy.deepcopy(model)
        cfg = Config(num_generations=4, generation_batch_size=4, entropy_coef=coef, max_grad_norm=1e9)
        optimizer = torch.optim.SGD(m.parameters(), lr=0.5)
        stats[coef] = grpo_update(LogprobForward(m), optimizer, inputs, cfg, max_completion_length=5)[0]
        if coef:
            assert mean_entropy(m) > mean_entropy(model)
    assert stats[0.0]["grad_norm"] == 0.0  # A = 0: nothing to learn without the bonus
    assert stats[0.5]["grad_norm"] > 0.0 and "policy_loss" in stats[0.5]
    assert stats[0.5]["loss"] < stats[0.5]["policy_loss"]  # loss = policy loss - coef * entropy
