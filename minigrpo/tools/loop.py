"""The multi-turn rollout: the model samples, calls tools, reads their answers, and samples again.

    rollout = sample_with_tools(engine, tokenizer, prompts, tools=[calculator], num_generations=8,
                                max_completion_length=256, max_tool_calling_iterations=4, eos_ids=eos_ids)

For each of the N = B*G rows:

    1. sample a turn from prompt + everything so far (``engine.continue_from_ids``; the first turn from the prompt,
       rendered with the tools' schemas);
    2. if the turn ended with eos and holds tool calls (calls.py), run them (execute.py) and append the tool
       message's own ids, rendered by the chat template (template.py);
    3. repeat with the rows that called a tool, and only those, until a turn calls none, the row has had
       ``max_tool_calling_iterations`` tool turns (TRL's name; the last turn's calls are then not run), or its
       ``max_completion_length`` tokens are spent. A tool message that would not leave room for one more token ends
       the completion there, flagged truncated (``is_truncated``), its message not appended; so does a turn cut by
       the budget.

A row's completion is one sequence: its turns and the tool messages between them, in order. Earlier turns are
never re-tokenized: the ids the model sampled are kept as sampled, and the next turn is sampled from exactly those ids
plus the tool message's. The sequence equals the chat template's rendering of the whole conversation (tested on the
stand-in), so the loss is computed on what the model will see at inference.

**The masking rule.** ``completion_mask`` is 1 on every completion token: the model's turns, their intermediate
end-of-turn tokens, and the tool messages (all of them context for the tokens after). ``tool_mask`` is 1 where the
policy sampled the token and 0 where a tool (or the template around its answer) wrote it (TRL's convention; 1 on
padding, as TRL pads it). Everything that treats completion tokens as the policy's actions (the loss, the KL term,
entropy, clip fractions, lengths) uses ``completion_mask * tool_mask``; the log-probs themselves are computed over
the whole sequence, tool tokens in context. Without the product, the policy is trained to predict what the tool said.

What this loop simplifies: the first turn is sampled from the N rows as they are (the G samples of a prompt are not
prefilled once, as ``sample_completions`` does); tools run one call at a time, in row order; calls in a turn that
did not end with eos (cut by the budget) are not run; the model's text is parsed in the Qwen2.5 / Qwen3 (Hermes)
format only.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..generation.engines import sampling_options
from ..prompts import left_pad
from ..rollout import Rollout
from .calls import ToolCall, parse_assistant_turn, tool_schemas
from .environment import environment_tools
from .execute import ToolWorker, execute_tool_call
from .template import prompt_ids_with_tools, tool_suffix_ids

__all__ = ["Turn", "ToolRollout", "sample_with_tools", "tool_call_loop"]

# Why a row's completion ended (ToolRollout.stop_reasons).
NO_TOOL_CALL, MAX_ITERATIONS, MAX_LENGTH = "no_tool_call", "max_tool_calling_iterations", "max_completion_length"


@dataclass
class Turn:
    role: str  # "assistant": sampled by the policy (tool_mask 1); "tool": written by the tools (tool_mask 0)
    start: int  # the turn's span in the completion's ids: [start, end)
    end: int
    text: str  # its ids decoded, special tokens kept; for a tool turn, the tool answers joined by newlines


@dataclass
class ToolRollout(Rollout):
    """A Rollout (rollout.py) of multi-turn completions, with what the tools did. Shapes as Rollout's, N = B*G."""
    tool_mask: torch.Tensor = None  # (N, T) 1 = sampled by the policy, 0 = written by a tool; 1 on padding
    num_tool_calls: torch.Tensor = None  # (N,) calls run, failed ones included
    num_failed_calls: torch.Tensor = None  # (N,) calls that came back as an error (malformed, unknown, raised, ...)
    num_tool_turns: torch.Tensor = None  # (N,) tool messages appended
    stop_reasons: list[str] = field(default_factory=list)  # no_tool_call | max_tool_calling_iterations | ...length
    turns: list[list[Turn]] = field(default_factory=list)  # per row, in order
    messages: list[list[dict]] = field(default_factory=list)  # per row, the completion as TRL's messages (calls.py)
    environments: list | None = None  # per row, its environment (environment_factory), for the reward functions

    @property
    def policy_mask(self) -> torch.Tensor:
        """(N, T) 1 on the tokens the policy sampled: completion_mask * tool_mask, the loss's mask."""
        return self.completion_mask * self.tool_mask


@dataclass
class _Row:
    """One completion while it is being built."""
    ids: list[int] = field(default_factory=list)
    tool_mask: list[int] = field(default_factory=list)
    logp: list[float] | None = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)
    pending: list[ToolCall] = field(default_factory=list)  # the latest turn's calls, not run yet
    calls: int = 0
    failed: int = 0
    tool_turns: int = 0
    stop: str | None = None  # set when the row is done

    def add(self, role: str, ids: list[int], logp: list[float] | None, text: str) -> None:
        self.turns.append(Turn(role, len(self.ids), len(self.ids) + len(ids), text))
        self.ids += ids
        self.tool_mask += [1 if role == "assistant" else 0] * len(ids)
        if self.logp is not None:  # the engine's sampling log-probs; 0 at the tools' tokens
            if role == "tool":
                self.logp += [0.0] * len(ids)
            elif logp is None:
                self.logp = None
            else:
                self.logp += logp


def _add_assistant_turn(row: _Row, ids: list[int], logp, tokenizer, eos_ids) -> None:
    """Append a sampled turn, parse its calls, and decide whether the row goes on.

    The turn is also recorded as TRL's assistant message: the text before the first call as ``content``, each call
    as a ``tool_calls`` entry (``ToolCall.as_message_call``), a malformed one with its ``error`` and its ``text`` as
    the model wrote it, so the messages say what was sampled even where no call could be read."""
    ended = bool(ids) and ids[-1] in eos_ids
    text = tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=False)
    row.add("assistant", ids, logp, text)
    content, calls = parse_assistant_turn(text)
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [call.as_message_call() for call in calls]
    row.messages.append(message)
    row.pending = calls if ended else []
    if not ended:
        row.stop = MAX_LENGTH  # cut by the budget: its calls, if any, are not run
    elif not calls:
        row.stop = NO_TOOL_CALL


def _add_tool_turn(row: _Row, tools: dict[str, Callable], tokenizer, *, max_completion_length: int, timeout: float,
                   max_output_chars: int, worker, chat_template_kwargs) -> None:
    """Run the row's pending calls and append the tool message's ids (or end the row if they would not fit)."""
    tool_messages = []
    for call in row.pending:
        text, failed = execute_tool_call(call, tools, timeout=timeout, max_output_chars=max_output_chars,
                                         worker=worker)
        row.calls, row.failed = row.calls + 1, row.failed + failed
        tool_messages.append({"role": "tool", "name": call.name or "unknown", "content": text})
    row.pending = []
    suffix = tool_suffix_ids(tokenizer, tool_messages, chat_template_kwargs)
    if len(row.ids) + len(suffix) >= max_completion_length:  # no room left for the model to answer
        row.stop = MAX_LENGTH
        return
    row.add("tool", suffix, None, "\n".join(m["content"] for m in tool_messages))
    row.messages += tool_messages
    row.tool_turns += 1


def tool_call_loop(engine, tokenizer, prompt_ids: list[list[int]], first_turn_ids: list[list[int]],
                   first_turn_logp: list[list[float]] | None, *, tools: list[dict[str, Callable]],
                   max_completion_length: int, max_tool_calling_iterations: int | None, eos_ids: list[int],
                   tool_timeout: float = 10.0, max_tool_output_chars: int = 4000, worker: ToolWorker | None = None,
                   temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, do_sample: bool = True,
                   chat_template_kwargs: dict | None = None) -> ToolRollout:
    """Steps 2-3 of the module docstring for N rows whose first turn is sampled.

    prompt_ids: N lists (the prompt as the first turn saw it); first_turn_ids: N lists, each ending with eos unless
    cut by the budget; first_turn_logp: the engine's log-probs of those ids, or None; tools: N tables {name: fn}.
    """
    rows = [_Row(logp=[] if first_turn_logp is not None else None) for _ in prompt_ids]
    for i, row in enumerate(rows):
        _add_assistant_turn(row, list(first_turn_ids[i]), None if first_turn_logp is None else list(first_turn_logp[i]),
                            tokenizer, eos_ids)
    iteration = 0
    while True:
        calling = [i for i, row in enumerate(rows) if row.stop is None]
        if max_tool_calling_iterations is not None and iteration >= max_tool_calling_iterations:
            for i in calling:
                rows[i].stop = MAX_ITERATIONS  # its last turn's calls are not run
            break
        for i in calling:
            _add_tool_turn(rows[i], tools[i], tokenizer, max_completion_length=max_completion_length,
                           timeout=tool_timeout, max_output_chars=max_tool_output_chars, worker=worker,
                           chat_template_kwargs=chat_template_kwargs)
        going_on = [i for i in calling if rows[i].stop is None]
        if not going_on:
            break
        new_ids, new_logp = engine.continue_from_ids(
            [prompt_ids[i] + rows[i].ids for i in going_on],
            max_new_tokens=[max_completion_length - len(rows[i].ids) for i in going_on],
            **sampling_options(temperature, top_p, top_k), do_sample=do_sample)
        for k, i in enumerate(going_on):
            _add_assistant_turn(rows[i], new_ids[k], None if new_logp is None else new_logp[k], tokenizer, eos_ids)
        iteration += 1
    return _tool_rollout(tokenizer, prompt_ids, rows, eos_ids)


def _tool_rollout(tokenizer, prompt_ids: list[list[int]], rows: list[_Row], eos_ids: list[int]) -> ToolRollout:
    """Pad the rows into tensors: prompts left-padded, completions right-padded."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    prompt, prompt_mask = left_pad([list(ids) for ids in prompt_ids], pad)  # (N, P) each
    T = max(1, max(len(row.ids) for row in rows))

    def padded(values, fill, dtype):
        return torch.tensor([v + [fill] * (T - len(v)) for v in values], dtype=dtype)  # (N, T)

    completion_ids = padded([row.ids for row in rows], pad, torch.long)
    completion_mask = padded([[1.0] * len(row.ids) for row in rows], 0.0, torch.float)
    tool_mask = padded([[float(m) for m in row.tool_mask] for row in rows], 1.0, torch.float)
    has_logp = all(row.logp is not None for row in rows)
    sampling_logp = padded([row.logp for row in rows], 0.0, torch.float) if has_logp else None
    return ToolRollout(
        prompt_ids=prompt, prompt_mask=prompt_mask, completion_ids=completion_ids, completion_mask=completion_mask,
        completions=tokenizer.batch_decode(completion_ids.masked_fill(completion_mask == 0, pad).tolist(),
                                           skip_special_tokens=True),
        is_truncated=torch.tensor([row.stop == MAX_LENGTH for row in rows]), sampling_logp=sampling_logp,
        tool_mask=tool_mask, num_tool_calls=torch.tensor([row.calls for row in rows]),
        num_failed_calls=torch.tensor([row.failed for row in rows]),
        num_tool_turns=torch.tensor([row.tool_turns for row in rows]), stop_reasons=[row.stop for row in rows],
        turns=[row.turns for row in rows], messages=[row.messages for row in rows])


def sample_with_tools(engine, tokenizer, prompts: list, *, tools: list[Callable] = (), environments: list | None = None,
                      num_generations: int = 1, max_completion_length: int, max_tool_calling_iterations: int | None,
                      eos_ids: list[int], tool_timeout: float = 10.0, max_tool_output_chars: int = 4000,
                      temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, do_sample: bool = True,
                      chat_template_kwargs: dict | None = None, worker: ToolWorker | None = None) -> ToolRollout:
    """The multi-turn rollout of B prompts, G completions each (rows grouped: prompt i owns rows i*G .. i*G+G-1).

    tools: plain typed functions, run in ``worker`` (one is started for this call and closed after, when None).
    environments: None, or one reset environment per row (N = B*G; environment.py), whose methods join the tools
    of its row. The prompts are rendered with every tool's schema; the rest is ``tool_call_loop``.
    """
    G, N = num_generations, len(prompts) * num_generations
    plain = {tool.__name__: tool for tool in tools}
    if environments is None:  # every row has the same tools: each prompt is rendered once, for its G rows
        tables, schemas = [plain] * N, tool_schemas(plain.values())
        encoded = [prompt_ids_with_tools(tokenizer, p, schemas, chat_template_kwargs) for p in prompts]
        prompt_ids = [ids for ids in encoded for _ in range(G)]
    elif len(environments) != N:
        raise ValueError(f"environments: {len(environments)} for {N} completions; give one per completion")
    else:
        tables = [{**plain, **environment_tools(env)} for env in environments]
        prompt_ids = [prompt_ids_with_tools(tokenizer, prompts[i // G], tool_schemas(table.values()),
                                            chat_template_kwargs) for i, table in enumerate(tables)]
    first_ids, first_logp = engine.continue_from_ids(prompt_ids, max_new_tokens=[max_completion_length] * N,
                                                     **sampling_options(temperature, top_p, top_k),
                                                     do_sample=do_sample)
    own_worker = worker is None and bool(plain)
    worker = ToolWorker(plain, max_output_chars=max_tool_output_chars) if own_worker else worker
    try:
        roll = tool_call_loop(engine, tokenizer, prompt_ids, first_ids, first_logp, tools=tables,
                              max_completion_length=max_completion_length,
                              max_tool_calling_iterations=max_tool_calling_iterations, eos_ids=eos_ids,
                              tool_timeout=tool_timeout, max_tool_output_chars=max_tool_output_chars, worker=worker,
                              temperature=temperature, top_p=top_p, top_k=top_k, do_sample=do_sample,
                              chat_template_kwargs=chat_template_kwargs)
    finally:
        if own_worker:
            worker.close()
    roll.environments = environments
    return roll
