"""What the bridge lends the agent for one turn: a guard around every model call (caps, usage,
metrics) and a gate before every tool call (approvals). The agent core stays platform-free: it
calls these without knowing what stands behind them.

The call guard travels in a context variable set for the turn, so a model call made deep inside
the context pipeline (a summary of older turns) is guarded like the turn's own calls. Every call
that reached the server is reported to the guard with what it cost (``Spent``), however it ended:
answered, failed midway, or stopped; when the server reported no usage, an estimate stands in.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol

from talon.agent.providers.base import CallMeter, ModelRequest, ModelResponse, Provider, Usage
from talon.agent.context.tokens import CHARS_PER_TOKEN, MESSAGE_OVERHEAD, estimate_message, estimate_request
from talon.content import ToolCall
from talon.errors import ModelTimedOut


@dataclass(frozen=True)
class Spent:
    """What a model call cost: the usage the server reported, or an estimate (``estimated``) from
    the request sent and what came back, when it reported none (a server that never does, a
    call stopped or broken off before the end of its stream)."""

    usage: Usage
    estimated: bool = False


class CallGuard(Protocol):
    async def before_call(self, model: str, purpose: str, request: ModelRequest) -> object:
        """Raise ``talon.errors.CapReached`` to keep the call from being made. What it returns
        (a reservation against the caps) is handed back to ``after_call``."""
        ...

    def after_call(self, model: str, purpose: str, ticket: object, response: ModelResponse | None,
                   error: BaseException | None, spent: Spent | None) -> None:
        """The call's response, or the error it ended with (a stop: ``CancelledError``), and what
        it cost (None: nothing, it was refused before the server answered). Called on every way
        out of a call, also in a task being cancelled, so it must not wait for anything."""
        ...


ApproveCall = Callable[[ToolCall], Awaitable[str | None]]
"""Asked before a tool call runs: None lets it run; a text is given to the model as the call's
result instead (denied, no answer in time). It may wait for a person."""

ToolDone = Callable[[str, str], None]
"""Told after each tool call: the tool's name and how it ended (ok, error, denied)."""

Notice = Callable[[str], Awaitable[None]]
"""Shows the chat one line about the turn's work (a delegation); best effort, never raises."""


@dataclass(frozen=True)
class TurnHooks:
    guard: CallGuard | None = None
    approve: ApproveCall | None = None
    tool_done: ToolDone | None = None
    notice: Notice | None = None


_guard: ContextVar[CallGuard | None] = ContextVar("talon_call_guard", default=None)


@contextlib.contextmanager
def guarding(guard: CallGuard | None) -> Iterator[None]:
    """Guard every model call made in this context (the turn's task) with ``guard``."""
    token = _guard.set(guard)
    try:
        yield
    finally:
        _guard.reset(token)


async def model_call(provider: Provider, request: ModelRequest, purpose: str = "turn") -> ModelResponse:
    """``provider.complete(request)`` under the current turn's guard, if any: every call that
    reached the server is reported to the guard with what it cost, however it ended."""
    guard = _guard.get()
    if guard is None:
        return await provider.complete(request)
    meter = CallMeter()
    request = dataclasses.replace(request, meter=meter)
    ticket = await guard.before_call(provider.model, purpose, request)
    response: ModelResponse | None = None
    error: BaseException | None = None
    try:
        response = await provider.complete(request)
        return response
    except BaseException as exc:  # a stop (/stop, a timeout, shutdown) is counted like an error
        error = exc
        raise
    finally:
        guard.after_call(provider.model, purpose, ticket, response, error, spent(request, response, error, meter))


def spent(request: ModelRequest, response: ModelResponse | None, error: BaseException | None,
          meter: CallMeter) -> Spent | None:
    """What a call cost: the reported usage, else an estimate (about four characters a token)
    from the request and what came back. A call refused before its answer began (a 4xx, a server
    not reached) cost nothing; one stopped, timed out or broken off is counted, since the
    server may have read the whole request and generated what was streamed, and more."""
    if response is not None and response.usage is not None and _counted(response.usage):
        return Spent(response.usage)
    if response is None and not (meter.started or isinstance(error, (asyncio.CancelledError, ModelTimedOut))):
        return None
    reported = meter.reported
    received = -(-meter.received_chars // CHARS_PER_TOKEN)
    if response is not None:
        received = max(received, estimate_message(response.message) - MESSAGE_OVERHEAD)
    if reported is not None and _counted(reported) and reported.input_tokens > 0:
        input_tokens, cached = reported.input_tokens, reported.cached_tokens
    else:
        input_tokens, cached = estimate_request(request), 0
    output = max(reported.output_tokens if reported is not None else 0, received)
    return Spent(Usage(input_tokens, output, cached), estimated=True)


def _counted(usage: Usage) -> bool:
    """Whether a reported usage says anything: some servers send zeros for every call, which
    would make every call free under the caps."""
    return usage.input_tokens > 0 or usage.output_tokens > 0
