"""The shared prefix (Config.shared_prefix, logprobs.py): each group's prompt runs through the model once and its G
completions attend to its keys and values. It must give the numbers of the reference path, where every row runs
its own prompt — log-probs, entropies, the loss and every gradient — for each way the trainer computes them."""

import contextlib
import copy

import pytest
import torch

from minigrpo.batch import Batch
from minigrpo.config import Config
from minigrpo.logprobs import can_share_prompts, completion_logprobs, trimmed_chunks
from minigrpo.loading.models import reference_policy
from minigrpo.run import load_policy
from minigrpo.objectives import LOSSES
from minigrpo.logprobs import LogprobForward
from minigrpo.trainer import grpo_update, prepare_update

from test_logprobs import perturb_adapter, relative_difference, sampled_batch, trainable_grads

ADAPTERS = {"full": {}, "lora": dict(use_peft=True), "qlora": dict(use_peft=True, load_in_4bit=True)}


def load(chat_model_dir, adapter="full", **overrides):
    if ADAPTERS[adapter].get("load_in_4bit"):
        pytest.importorskip("bitsandbytes")
    cfg = Config(model_name_or_path=str(chat_model_dir), lora_r=4, lora_alpha=8, lora_dropout=0.0,
                 **ADAPTERS[adapter], **overrides)
    torch.manual_seed(0)  # the same LoRA initialisation every time
    model, _ = load_policy(cfg, chat_model_dir, torch.device("cpu"))
    if ADAPTERS[adapter]:
        perturb_adapter(model)
    return model


def tokens_through_the_first_block(model, run) -> int:
    """How many token positions the first decoder block's MLP computes in forward while run() executes."""
    mlp = [m for name, m in model.named_modules() if name.endswith("layers.0.mlp")][0]
    counted, forward = [], mlp.forward  # wrapped, not hooked: hooks do not fire in checkpoint's recomputation
    mlp.forward = lambda x: counted.append(x.shape[0] * x.shape[1]) or forward(x)
    try:
        run()
    finally:
        del mlp.forward
    return sum(counted)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["", "checkpointing"])
@pytest.mark.parametrize("adapter", list(ADAPTERS))
def test_shared_prefix_equals_every_row_running_its_prompt(adapter, checkpointing, chat_model_dir):
    model = load(chat_model_dir, adapter, gradient_checkpointing=checkpointing)
    model.train()
    ids = sampled_batch(model.config.vocab_size, G=4, prompts=3, P=7, T=9, seed=5)
    grad_logp = torch.randn(ids[3].shape, generator=torch.Generator().manual_seed(1)) * ids[3]  # any dL/dlogp
    results = {}
    for share in (False, True):
        model.zero_grad(set_to_none=True)
        out = {}

        def forward():
            out["logp"], out["entropy"] = completion_logprobs(model, *ids, temperature=0.8, with_entropy=True,
                                                              share_prompts=share)
        tokens = tokens_through_the_first_block(model, forward)
        (out["logp"] * grad_logp).sum().backward()
        results[share] = (out["logp"].detach(), out["entropy"], trainable_grads(model), tokens)
    (logp, entropy, grads, tokens), (logp_s, entropy_s, grads_s, tokens_s) = results[False], results[True]
    torch.testing.assert_close(logp_s, logp, rtol=0, atol=2e-5)
    # H = log Z - sum_v p_v logit_v cancels: with this model's peaked logits float32 rounding reaches ~4e-5.
    torch.testing.assert_close(entropy_s, entropy, rtol=0, atol=1e-4)
    assert relative_difference(grads_s, grads) < 1e-5
    # The work: each of the 3 distinct prompts once (all 7 columns), then every completion on its own; the
    # reference runs each row's prompt with its completion.
    prompt_ids, prompt_mask, completion_ids, completion_mask = ids
    chunks, _ = trimmed_chunks(prompt_mask, completion_mask)
    assert tokens_s == 3 * 7 + sum(len(rows) * t for rows, p, t in chunks)
    assert tokens == sum(len(rows) * (p + t) for rows, p, t in chunks)


def test_a_sliding_window_model_takes_the_reference_path(chat_model_dir):
    model = load(chat_model_dir)
    assert can_share_prompts(model.get_decoder(), model.config)
    config = copy.deepcopy(model.config)
    config.layer_types = ["sliding_attention"] * config.num_hidden_layers
    config.use_sliding_window, config.sliding_window = True, 4
    assert not can_share_prompts(model.get_decoder(), config)  # its cache would keep only the window


def grouped_batch(vocab_size, *, tools: bool) -> Batch:
    """Four groups of G = 4 (rows of a group share a prompt, groups interleaved as a mini-batch draws them),
    ragged completions, advantages, and with tools a tool mask: tokens 3-5 of some rows are a tool's answer."""
    prompt_ids, prompt_mask, completion_ids, completion_mask = sampled_batch(vocab_size, G=4, prompts=4, P=6, T=10,
                                                                             seed=7)
    g = torch.Generator().manual_seed(8)
    fields = {}
    if tools:
        tool_mask = torch.ones_like(completion_mask)
        tool_mask[::3, 3:6] = 0
        fields["tool_mask"] = tool_mask
    return Batch.of_completions(prompt_ids, prompt_mask, completion_ids, completion_mask,
                                adv=torch.randn(len(prompt_ids), generator=g), **fields)


CASES = {  # (adapter, config, tools): the ways a training step computes log-probs
    # every registered loss type, off-policy (two mini-batches: old log-probs, ratios away from 1, clipping can fire)
    **{f"loss-{loss}": ("full", dict(loss_type=loss, steps_per_generation=2), False) for loss in LOSSES},
    "gspo-kl": ("full", dict(loss_type="grpo", importance_sampling_level="sequence", beta=0.1), False),  # reference
    "dr_grpo-accumulation": ("full", dict(loss_type="dr_grpo", gradient_accumulation_steps=2), False),
    "cispo-checkpointing": ("full", dict(loss_type="cispo", gradient_checkpointing=True, num_iterations=2), False),
    "lora-kl": ("lora", dict(loss_type="dapo", beta=0.1, steps_per_generation=2), False),
    "qlora": ("qlora", dict(loss_type="grpo", gradient_accumulation_steps=2), False),
    "tools": ("full", dict(loss_type="dapo", steps_per_generation=2), True),
    "tools-lora-checkpointing": ("lora", dict(loss_type="grpo", gradient_checkpointing=True, beta=0.1), True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_training_step_is_the_same_with_and_without_the_shared_prefix(case, chat_model_dir):
    """prepare_update (old and reference log-probs) and grpo_update (the mini-batches' losses, gradients and
    optimizer steps) with shared_prefix on and off: the same statistics and the same weights after."""
    adapter, overrides, tools = CASES[case]
    after = {}
    for share in (False, True):
        cfg = Config(num_generations=4, generation_batch_size=16, max_grad_norm=1e9,
                     shared_prefix=share, **overrides)
        model = load(chat_model_dir, adapter, gradient_checkpointing=cfg.gradient_checkpointing)
        ref_model = reference_policy(model) if cfg.beta > 0 else None
        trained = [p for p in model.parameters() if p.requires_grad]
        before = torch.cat([p.detach().flatten() for p in trained])
        optimizer = torch.optim.SGD(trained, lr=1e-4)  # SGD: the step is the gradient; small, so the next mini-batch
        # sees weights near these (a random adapter far from its reference makes the KL term large and steep)
        policy, ref_policy = LogprobForward(model), ref_model and LogprobForward(ref_model)
        inputs, _ = prepare_update(cfg, grouped_batch(model.config.vocab_size, tools=tools), policy, ref_policy,
                                   autocast=contextlib.nullcontext)
        model.train()
        torch.manual_seed(1)  # the same mini-batch order
        stats = grpo_update(policy, optimizer, inputs, cfg, max_completion_length=10)
        step = torch.cat([p.detach().flatten() for p in trained]) - before  # the update the steps made
        after[share] = (step, stats, inputs)
    (step, stats, inputs), (step_s, stats_s, inputs_s) = after[False], after[True]
    for name in ("old_logp", "ref_logp"):
        if getattr(inputs, name) is not None:
            torch.testing.assert_close(getattr(inputs_s, name), getattr(inputs, name), rtol=0, atol=2e-5)
    assert relative_difference(step_s, step) < 1e-4
    assert len(stats_s) == len(stats) == cfg.num_iterations * cfg.steps_per_generation
    for one, other in zip(stats_s, stats):
        assert one.keys() == other.keys()
        for key in one:
            assert one[key] == pytest.approx(other[key], rel=1e-4, abs=1e-6), key


def test_micro_batches_take_whole_groups(monkeypatch):
    """With gradient accumulation a mini-batch's rows are cut in sorted order, so a micro-batch holds whole groups
    (one prompt for the shared prefix to run per G rows), whatever order the mini-batch was drawn in."""
    import minigrpo.trainer as trainer

    seen = []
    monkeypatch.setattr(trainer, "micro_batch_loss", lambda model, inputs, rows, *args, **kw: (
        seen.append(rows.tolist()) or (torch.zeros((), requires_grad=True), {})))
    monkeypatch.setattr(trainer, "merge_micro_stats", lambda stats: {})
    model = torch.nn.Linear(1, 1)
    cfg = Config(num_generations=4, generation_batch_size=16, gradient_accumulation_steps=2)
    inputs = Batch.of_completions(torch.ones(16, 2, dtype=torch.long), torch.ones(16, 2, dtype=torch.long),
                                  torch.ones(16, 3, dtype=torch.long), torch.ones(16, 3), adv=torch.zeros(16))
    grpo_update(model, torch.optim.SGD(model.parameters(), lr=0.0), inputs, cfg, max_completion_length=3)
    assert [sorted({row // 4 for row in rows}) for rows in seen] == [[0, 1], [2, 3]]  # groups of rows 4i .. 4i+3
