"""The provider contract: one neutral request in, one neutral assistant message out.

Each provider adapter is a pure mapper to and from its wire format plus a thin client call. What
every mapper shares lives here: how an image is hydrated (a ``data:`` URL made at request time) and
the text a model sees in place of a block it cannot take.
"""

from __future__ import annotations

import abc
import base64
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from talon.content import AudioBlock, FileBlock, ImageBlock, Message, TextBlock
from talon.errors import AttachmentError

log = logging.getLogger(__name__)

Hydrate = Callable[[ImageBlock], "str | Awaitable[str]"]
"""Turns an image block into a data: URL (reads the attachment store; async, or plain in tests)."""

TextSink = Callable[[str], Awaitable[None]]
"""Receives the text of a reply as it streams in, delta by delta."""


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


MISSING_BYTES = "its bytes are missing from the attachment store"


def try_hydrate(hydrate: Hydrate, block: ImageBlock) -> str | None:
    """The block's data URL, or None when its bytes cannot be read (a store restored from an
    older backup, a blob deleted by hand). One lost file must not fail every request."""
    try:
        url = hydrate(block)
    except (AttachmentError, OSError) as exc:
        log.warning("image %s not sent: %s", block.ref.id[:12], exc)
        return None
    # Mappers are plain functions: an async store is read first (``prefetch_images``).
    assert isinstance(url, str), "an async hydrate is used through prefetch_images"
    return url


async def prefetch_images(messages: list[Message], hydrate: Hydrate) -> Callable[[ImageBlock], str]:
    """Read every image of a request before it is mapped: the store is async, the mappers are
    plain functions. The result hydrates from what was read (an image that could not be read
    raises its error again, for ``try_hydrate``)."""
    urls: dict[str, str | Exception] = {}
    for message in messages:
        for block in message.content:
            if isinstance(block, ImageBlock) and block.ref.id not in urls:
                try:
                    url = hydrate(block)
                    urls[block.ref.id] = await url if inspect.isawaitable(url) else url
                except (AttachmentError, OSError) as exc:
                    urls[block.ref.id] = exc

    def read(block: ImageBlock) -> str:
        found = urls.get(block.ref.id)
        if found is None:
            raise AttachmentError(f"image {block.ref.id[:12]} was not read before the request")
        if isinstance(found, Exception):
            raise found
        return found

    return read


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
    # Text deltas of the reply, as they arrive, for a channel that shows the answer growing.
    # Providers stream whether or not it is set: a slow server is then judged by the gap between
    # chunks, not by how long the whole answer takes.
    on_text: TextSink | None = None
    # What the call has cost so far, filled in by the provider as the answer streams (set by
    # ``talon.agent.hooks.model_call`` for a guarded call): a call stopped or broken off midway
    # is still counted against the caps.
    meter: "CallMeter | None" = None


@dataclass(frozen=True)
class Usage:
    input_tokens: int  # every input token, cached ones included
    output_tokens: int
    cached_tokens: int = 0  # of the input, read from the provider's prompt cache (cheaper)


@dataclass
class CallMeter:
    """One model call as far as it got: whether the server began answering, how many characters
    of text and tool-call arguments came back, and the usage the server reported (if it did)."""

    started: bool = False  # the server accepted the request and began its answer
    received_chars: int = 0
    reported: Usage | None = None

    def answer_began(self) -> None:
        self.started = True

    def received(self, text: str) -> None:
        self.started = True
        self.received_chars += len(text)


@dataclass
class ModelResponse:
    message: Message
    usage: Usage | None = None
    finish_reason: str | None = None


class Provider(abc.ABC):
    """An LLM behind one ``complete`` call. Raises ``talon.errors.ProviderError`` subclasses.

    ``vision`` and ``tools`` say what the model takes right now; a provider turns them off itself
    when the server says it cannot (and the agent reads them back for /status and its requests).
    """

    name: str
    model: str
    vision: bool = True
    tools: bool = True

    @abc.abstractmethod
    async def complete(self, request: ModelRequest) -> ModelResponse: ...

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release network resources."""


class StreamRelay:
    """Hands text deltas to a sink, and never lets a failing sink break the model call."""

    def __init__(self, sink: TextSink | None) -> None:
        self._sink = sink
        self.sent = 0  # characters handed on

    async def __call__(self, delta: str) -> None:
        if self._sink is None or not delta:
            return
        try:
            await self._sink(delta)
            self.sent += len(delta)
        except Exception:
            log.exception("the live-text receiver failed; the reply continues without it")
            self._sink = None


def has_images(messages: list[Message]) -> bool:
    return any(isinstance(b, ImageBlock) for m in messages for b in m.content)
