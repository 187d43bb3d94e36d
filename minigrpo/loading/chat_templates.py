"""Pieces of chat templates shared by the models minigrpo builds (the CPU stand-in, the tool_addition world).

QWEN25_MESSAGES is Qwen2.5-Instruct's loop over the messages, word for word (TRL ships the whole template as
trl/chat_templates/qwen2_5.jinja): ChatML turns; an assistant's `tool_calls` as
`\n<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` blocks after its content; consecutive `tool`
messages as <tool_response> blocks inside one user turn. The templates around it differ only in their system
header (the tools section) and generation prompt.
"""

__all__ = ["QWEN25_MESSAGES"]

QWEN25_MESSAGES = r"""{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
"""
