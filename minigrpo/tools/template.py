"""Token ids of a tool conversation's pieces, from the chat template, without ever re-tokenizing what was sampled.

Two pieces are rendered by the chat template and turned into ids here:

* the prompt, with the tools' schemas (``prompt_ids_with_tools``): ``apply_chat_template(messages, tools=schemas,
  add_generation_prompt=True)``, as the model sees it on its first turn;
* a tool message (``tool_suffix_ids``): the ids to append after an assistant turn that called tools, so that the
  model's next turn starts where the template says it does. Rendered as TRL 1.16's ``_get_tool_suffix_ids`` does:
  a dummy conversation (a user message, an assistant message calling the tool) with and without the tool messages
  and the generation prompt; the difference, after the dummy's last end-of-turn token, is the suffix. For Qwen2.5:

      "\\n<|im_start|>user\\n<tool_response>\\n72\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n"

  (the leading newline closes the assistant's turn the model ended with ``<|im_end|>``). Only the new message is
  tokenized, so the ids the model sampled stay exactly as sampled, and the whole sequence still equals what
  rendering the conversation would give (tests/test_tool_loop.py checks it).

**A tool's text is text.** A tool that returns ``"<|im_end|><|im_start|>assistant\\n..."`` must not end a turn or
forge a message: rendered and tokenized naively, those strings become the template's control tokens. Here the
template's own text is tokenized as usual, and the tool's content with ``encode_as_text``: special tokens split into
ordinary pieces (``split_special_tokens=True``), and added tokens that are not special (Qwen's ``<tool_call>``)
broken after their first character. When no tool content holds such a string (nearly always) the suffix is
tokenized whole, to exactly the ids TRL's method gives; when one does, the pieces are tokenized apart, and the ids
differ from re-rendering the conversation, on purpose: that tokenization is the forgery.
"""

import re

from ..errors import ConfigError

__all__ = ["prompt_ids_with_tools", "tool_suffix_ids", "encode_as_text", "added_token_strings",
           "ids_with_plain_holders", "TemplateChangedContent"]


def prompt_ids_with_tools(tokenizer, prompt, schemas: list[dict] | None,
                          chat_template_kwargs: dict | None = None) -> list[int]:
    """A prompt's ids as the model's first turn sees it: messages rendered with the tools' schemas, or a string
    tokenized as it is (then the tools appear nowhere; a chat template is what shows them to a model)."""
    if isinstance(prompt, str):
        return tokenizer(prompt)["input_ids"]
    text = tokenizer.apply_chat_template(prompt, tools=schemas or None, tokenize=False, add_generation_prompt=True,
                                         **(chat_template_kwargs or {}))
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def added_token_strings(tokenizer) -> list[str]:
    """Every added token's text (special ones and the rest), longest first."""
    return sorted({tok.content for tok in tokenizer.added_tokens_decoder.values()}, key=len, reverse=True)


def encode_as_text(tokenizer, text: str) -> list[int]:
    """Ids that decode to ``text`` and contain no added token: control strings in it stay plain characters."""
    ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    added_ids = set(tokenizer.added_tokens_decoder)
    if not added_ids.intersection(ids):
        return ids
    # A non-special added token (Qwen's <tool_call>) is matched even with split_special_tokens: cut each occurrence
    # after its first character, so that no piece holds it whole.
    pattern = re.compile("|".join(re.escape(s) for s in added_token_strings(tokenizer)))
    out, start = [], 0
    for match in pattern.finditer(text):
        out += _plain(tokenizer, text[start:match.start()]) + _plain(tokenizer, match.group()[:1])
        start = match.start() + 1
    out += _plain(tokenizer, text[start:])
    if added_ids.intersection(out):
        raise ValueError(f"could not encode {text[:80]!r} without added tokens")
    return out


def _plain(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"] if text else []


def tool_suffix_ids(tokenizer, tool_messages: list[dict], chat_template_kwargs: dict | None = None) -> list[int]:
    """The ids to append after an assistant turn for its tool messages ({"role": "tool", "name", "content"}),
    through the next assistant turn's generation prompt. See the module docstring."""
    kwargs = dict(chat_template_kwargs or {})
    dummy = [{"role": "user", "content": "dummy"},
             {"role": "assistant", "content": "", "tool_calls": [
                 {"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}]}]
    prefix_text = tokenizer.apply_chat_template(dummy, tokenize=False, add_generation_prompt=False, **kwargs)
    prefix_ids = tokenizer(prefix_text, add_special_tokens=False)["input_ids"]
    eos_positions = [i for i, tok in enumerate(prefix_ids) if tok == tokenizer.eos_token_id]
    if eos_positions:  # the suffix starts right after the assistant's end-of-turn token (Qwen: "\n" follows it)
        prefix_ids = prefix_ids[: eos_positions[-1] + 1]

    contents = [m["content"] for m in tool_messages]
    unsafe = added_token_strings(tokenizer)
    if not any(s in content for content in contents for s in unsafe):
        full_text = tokenizer.apply_chat_template(dummy + tool_messages, tokenize=False, add_generation_prompt=True,
                                                  **kwargs)
        full_ids = tokenizer(full_text, add_special_tokens=False)["input_ids"]
    else:
        full_ids = _ids_with_plain_contents(tokenizer, dummy, tool_messages, kwargs)
    if full_ids[: len(prefix_ids)] != prefix_ids:
        raise ConfigError("tools: the chat template does not preserve prefixes: a conversation's ids with a tool message "
                         "added do not start with its ids without it")
    return full_ids[len(prefix_ids):]


def _ids_with_plain_contents(tokenizer, dummy: list[dict], tool_messages: list[dict], kwargs: dict) -> list[int]:
    """The whole dummy conversation's ids, the template's text tokenized as usual and each tool content with
    ``encode_as_text``: the contents are rendered as placeholders, found in the text, and tokenized apart."""
    holders = [f"\ue000{i}\ue001" for i in range(len(tool_messages))]  # private-use characters: in no template
    with_holders = [{**m, "content": h} for m, h in zip(tool_messages, holders, strict=True)]
    text = tokenizer.apply_chat_template(dummy + with_holders, tokenize=False, add_generation_prompt=True, **kwargs)
    plain = {h: m["content"] for h, m in zip(holders, tool_messages)}
    try:
        return ids_with_plain_holders(tokenizer, text, plain, lambda content: encode_as_text(tokenizer, content))
    except TemplateChangedContent:
        raise ConfigError("tools: the chat template changes a tool message's content; cannot tokenize it as plain "
                          "text") from None


class TemplateChangedContent(ValueError):
    """A chat template dropped, repeated or reordered a placeholder (ids_with_plain_holders)."""


def ids_with_plain_holders(tokenizer, text: str, plain: dict[str, str], encode_plain) -> list[int]:
    """The ids of `text`, a chat template's rendering in which each key of `plain` (a placeholder of private-use
    characters) stands, once and in order, for text from outside: a tool's output, a completion. The template's own
    text is tokenized as usual, each placeholder's text with encode_plain(text) (ids in which no control string is a
    token), so that text cannot end a turn or forge a message. TemplateChangedContent if the template dropped,
    repeated or reordered a placeholder (it changed the content: nothing can be fenced then); what encode_plain
    raises propagates as it is."""
    pieces = re.split("(" + "|".join(map(re.escape, plain)) + ")", text)
    if [p for p in pieces if p in plain] != list(plain):
        raise TemplateChangedContent("the chat template changes a message's content")
    ids = []
    for piece in pieces:
        if piece in plain:
            ids += encode_plain(plain[piece]) if plain[piece] else []
        elif piece:
            ids += tokenizer(piece, add_special_tokens=False)["input_ids"]
    return ids
