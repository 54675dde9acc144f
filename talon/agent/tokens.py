"""Token estimates between provider calls (the provider's reported usage is authoritative).

Text counts at about four characters per token; an image counts as a fixed 1200 tokens, never by
the length of its base64 (which would overcount a 5 MB photo a thousandfold).
"""

from __future__ import annotations

from talon.content import AudioBlock, FileBlock, ImageBlock, Message, TextBlock

CHARS_PER_TOKEN = 4
IMAGE_TOKENS = 1200
MESSAGE_OVERHEAD = 4


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
            total += 20 + estimate_text(getattr(block, "transcript", None) or "")
    for call in message.tool_calls:
        total += estimate_text(call.name) + estimate_text(call.arguments) + MESSAGE_OVERHEAD
    return total


def estimate_messages(messages: list[Message]) -> int:
    return sum(estimate_message(m) for m in messages)
