"""Token estimates between provider calls (the provider's reported usage is authoritative), and
of a call's usage when the provider reports none (``talon.agent.hooks.spent``).

Text counts at about four characters per token; an image counts as a fixed 1200 tokens, never by
the length of its base64 (which would overcount a 5 MB photo a thousandfold).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from talon.agent.providers.base import ModelRequest, ToolSpec
from talon.content import AudioBlock, FileBlock, ImageBlock, Message, TextBlock

CHARS_PER_TOKEN = 4
IMAGE_TOKENS = 1200
MESSAGE_OVERHEAD = 4
FILE_BLOCK_TOKENS = 20


def estimate_text(text: str) -> int:
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def estimate_message(message: Message) -> int:
    total = MESSAGE_OVERHEAD
    for block in message.content:
        if isinstance(block, TextBlock):
            total += estimate_text(block.text)
        elif isinstance(block, ImageBlock):
            total += IMAGE_TOKENS
        elif isinstance(block, (AudioBlock, FileBlock)):
            total += FILE_BLOCK_TOKENS + estimate_text(getattr(block, "transcript", None) or "")
    for call in message.tool_calls:
        total += estimate_text(call.name) + estimate_text(call.arguments) + MESSAGE_OVERHEAD
    return total


def estimate_messages(messages: Iterable[Message]) -> int:
    return sum(estimate_message(m) for m in messages)


def estimate_tools(tools: Sequence[ToolSpec]) -> int:
    return sum(
        estimate_text(t.name) + estimate_text(t.description) + estimate_text(json.dumps(t.parameters))
        + MESSAGE_OVERHEAD
        for t in tools
    )


def estimate_overhead(system: str, tools: Sequence[ToolSpec]) -> int:
    """The fixed part of every request: system prompt and tool definitions."""
    return estimate_text(system) + estimate_tools(tools) + MESSAGE_OVERHEAD


def estimate_request(request: ModelRequest) -> int:
    """Input tokens of a whole request, as Talon budgets it (no reply reservation)."""
    return estimate_overhead(request.system, request.tools) + estimate_messages(request.messages)
