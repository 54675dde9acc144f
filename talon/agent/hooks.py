"""What the bridge lends the agent for one turn: a guard around every model call (caps, usage,
metrics) and a gate before every tool call (approvals). The agent core stays platform-free: it
calls these without knowing what stands behind them.

The call guard travels in a context variable set for the turn, so a model call made deep inside
the context pipeline (a summary of older turns) is guarded like the turn's own calls.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol

from talon.agent.provider import ModelRequest, ModelResponse, Provider
from talon.content import ToolCall


class CallGuard(Protocol):
    async def before_call(self, model: str, purpose: str) -> None:
        """Raise ``talon.errors.CapReached`` to keep the call from being made."""
        ...

    async def after_call(self, model: str, purpose: str, response: ModelResponse | None,
                         error: BaseException | None) -> None:
        """The call's response (its usage), or the error it ended with."""
        ...


ApproveCall = Callable[[ToolCall], Awaitable[str | None]]
"""Asked before a tool call runs: None lets it run; a text is given to the model as the call's
result instead (denied, no answer in time). It may wait for a person."""

ToolDone = Callable[[str, str], None]
"""Told after each tool call: the tool's name and how it ended (ok, error, denied)."""


@dataclass(frozen=True)
class TurnHooks:
    guard: CallGuard | None = None
    approve: ApproveCall | None = None
    tool_done: ToolDone | None = None


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
    """``provider.complete(request)`` under the current turn's guard, if any."""
    guard = _guard.get()
    if guard is None:
        return await provider.complete(request)
    await guard.before_call(provider.model, purpose)
    try:
        response = await provider.complete(request)
    except Exception as exc:
        await guard.after_call(provider.model, purpose, None, exc)
        raise
    await guard.after_call(provider.model, purpose, response, None)
    return response
