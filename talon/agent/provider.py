"""The provider contract: one neutral request in, one neutral assistant message out.

Each provider adapter is a pure mapper to and from its wire format plus a thin client call. What
every mapper shares lives here: how an image is hydrated (a ``data:`` URL made at request time) and
the text a model sees in place of a block it cannot take.
"""

from __future__ import annotations

import abc
import base64
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from talon.content import AudioBlock, FileBlock, ImageBlock, Message, TextBlock
from talon.errors import AttachmentError

log = logging.getLogger(__name__)

Hydrate = Callable[[ImageBlock], str]
"""Turns an image block into a data: URL (reads the attachment store)."""


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


MISSING_BYTES = "its bytes are missing from the attachment store"


def try_hydrate(hydrate: Hydrate, block: ImageBlock) -> str | None:
    """The block's data URL, or None when its bytes cannot be read (a store restored from an
    older backup, a blob deleted by hand). One lost file must not fail every request."""
    try:
        return hydrate(block)
    except (AttachmentError, OSError) as exc:
        log.warning("image %s not sent: %s", block.ref.id[:12], exc)
        return None


def image_placeholder(block: ImageBlock, reason: str) -> str:
    ref = block.ref
    where = ref.path or ref.name or ref.id[:12]
    return f"[image {where} not attached: {reason}]"


def block_text(block: Any) -> str | None:
    """The text a non-image block contributes to a model's input; None for nothing."""
    if isinstance(block, TextBlock):
        return block.text
    if isinstance(block, AudioBlock):
        if block.transcript:
            return None  # the transcript already travels in the text the agent sees
        return f"[audio {block.ref.name or block.ref.id[:12]} not attached: this model takes no audio]"
    if isinstance(block, FileBlock):
        return f"[file {block.ref.path or block.ref.name or block.ref.id[:12]} ({block.ref.mime})]"
    return None


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass
class ModelRequest:
    system: str
    messages: list[Message]
    tools: list[ToolSpec] = field(default_factory=list)
    max_output_tokens: int | None = None
    # Where the stable part of the system prompt ends (for prompt-caching breakpoints).
    system_cache_points: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Usage:
    input_tokens: int
    output_tokens: int


@dataclass
class ModelResponse:
    message: Message
    usage: Usage | None = None
    finish_reason: str | None = None


class Provider(abc.ABC):
    """An LLM behind one ``complete`` call. Raises ``talon.errors.ProviderError`` subclasses."""

    name: str
    model: str

    @abc.abstractmethod
    async def complete(self, request: ModelRequest) -> ModelResponse: ...

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release network resources."""


def mentions_image(message: str) -> bool:
    """Whether a provider's 400 message is about an image in the request."""
    text = message.lower()
    return "image" in text or "vision" in text


def has_images(messages: list[Message]) -> bool:
    return any(isinstance(b, ImageBlock) for m in messages for b in m.content)
