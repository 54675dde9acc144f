"""Retrying a model call: only what cannot repeat a generation, always logged, always bounded.

A provider's single attempt raises ``SendAgain`` when it changed how it asks (the server said it
takes no images, no tools or no streaming: the next attempt differs, and nothing was generated),
or ``Retryable`` for a failure that produced nothing the person could have seen: a refused
connection, a 429 with its ``Retry-After``, a 5xx or "overloaded" before the stream began. A read
timeout is never retried: the server may have been generating all along, and asking again would
silently double a long wait. The whole call, retries included, is capped by the provider's
``total_timeout_s``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import httpx

from talon.agent.providers.base import ModelRequest, ModelResponse, has_images
from talon.agent.providers.refusals import refusal_error
from talon.errors import ModelTimedOut, ProviderError, ProviderUnavailable, Refusal, Retryable, SendAgain

log = logging.getLogger(__name__)


def _transport_errors() -> tuple[tuple[type[Exception], ...], tuple[type[Exception], ...]]:
    """Network errors raised while a response streams, outside the SDKs' own wrapping: the
    openai and anthropic SDKs use ``httpx2`` (their fork of httpx) where installed."""
    timeouts: list[type[Exception]] = [httpx.TimeoutException]
    transport: list[type[Exception]] = [httpx.TransportError]
    try:
        import httpx2  # type: ignore[import-not-found, unused-ignore]

        timeouts.append(httpx2.TimeoutException)
        transport.append(httpx2.TransportError)
    except ImportError:
        pass
    return tuple(timeouts), tuple(transport)


TIMEOUTS, TRANSPORT_ERRORS = _transport_errors()

BACKOFF_S = (1.0, 4.0, 10.0)
# A server that asks us to wait longer than this gets a failed turn instead (the person is told
# it is rate limited), not a chat frozen for minutes.
MAX_WAIT_S = 60.0
_MAX_SEND_AGAIN = 4


class _Retrying(Protocol):
    model: str
    max_retries: int
    total_timeout_s: float


class _Adapting(Protocol):
    model: str
    vision: bool
    tools: bool
    stream: bool


def broke_off(detail: object) -> ProviderUnavailable:
    """A reply that stopped after some of it was shown: never retried (it would be shown twice)."""
    return ProviderUnavailable(f"the model server broke off its reply: {detail}")


def silent_for(idle_timeout_s: float) -> ModelTimedOut:
    return ModelTimedOut(
        f"the model server sent nothing for {idle_timeout_s:g} s (TALON_MODEL_TIMEOUT); "
        "not asked again, so a long answer is not generated twice")


def unreachable(exc: Exception, *, sent: bool, url: str = "") -> Exception:
    """A connection that failed: retryable while nothing was shown, else a broken-off reply.
    ``url`` is the server's base URL: the SDKs' "Connection error." names no address."""
    if sent:
        return broke_off(exc)
    where = f" at {url.rstrip('/')}" if url else ""
    return Retryable(ProviderUnavailable(f"could not reach the model server{where}: {exc}"))


def response_body(exc: Any) -> Any:
    """An SDK status error's body as the server sent it (the SDKs keep only its ``error``)."""
    try:
        text = exc.response.text
    except Exception:  # a streamed response whose body was not read
        text = ""
    return text or exc.body


def adapt_or_fail(provider: _Adapting, refusal: Refusal, request: ModelRequest) -> Exception:
    """What a provider does about a refusal: ``SendAgain`` after switching off what the server
    said it cannot take (images, tools, streaming: from now on), ``Retryable`` for a transient
    one, else the typed error to give up with. Adapter-specific switches come before this."""
    images = has_images(request.messages)
    if refusal.kind == "images_unsupported" and provider.vision and images:
        log.warning("model %s takes no images (%s); sending text notices instead from now on",
                    provider.model, refusal.short())
        provider.vision = False
        return SendAgain()
    if refusal.kind == "tools_unsupported" and provider.tools and request.tools:
        log.warning("model %s cannot call tools (%s); running without tools from now on",
                    provider.model, refusal.short())
        provider.tools = False
        return SendAgain()
    if refusal.kind == "stream_unsupported" and provider.stream:
        log.warning("model server refused streaming (%s); asking without it from now on", refusal.short())
        provider.stream = False
        return SendAgain()
    error = refusal_error(refusal, has_images=images and provider.vision)
    return Retryable(error, refusal.retry_after) if refusal.transient else error


async def complete_with_retries(
    provider: _Retrying, request: ModelRequest, once: Callable[[ModelRequest], Awaitable[ModelResponse]]
) -> ModelResponse:
    attempts = 0
    adjustments = 0

    async def run() -> ModelResponse:
        nonlocal attempts, adjustments
        while True:
            try:
                return await once(request)
            except SendAgain:
                adjustments += 1
                if adjustments > _MAX_SEND_AGAIN:
                    raise ProviderError("the model server kept refusing the request in new ways") from None
            except Retryable as retry:
                attempts += 1
                delay = retry.delay if retry.delay is not None else BACKOFF_S[min(attempts, len(BACKOFF_S)) - 1]
                if attempts > provider.max_retries:
                    raise retry.error from None
                if delay > MAX_WAIT_S:
                    log.warning("model %s: %s; the server asks to wait %.0f s, which is too long to hold "
                                "the chat", provider.model, retry.error, delay)
                    raise retry.error from None
                log.warning("model %s: %s; retrying in %.1f s (retry %d of %d)", provider.model,
                            retry.error, delay, attempts, provider.max_retries)
                await asyncio.sleep(delay)

    try:
        async with asyncio.timeout(provider.total_timeout_s):
            return await run()
    except TimeoutError:
        raise ModelTimedOut(
            f"the model did not finish within {provider.total_timeout_s:.0f} s in all "
            "(TALON_MODEL_TOTAL_TIMEOUT); not asked again") from None
