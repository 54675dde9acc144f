"""Waiting for a condition instead of sleeping a guessed time.

``until`` (in a coroutine) and ``until_sync`` (in plain code) call ``check`` until it returns
something true and return that value; ``check`` may be a plain function or, for ``until``, a
coroutine function. Past ``timeout`` seconds they raise ``AssertionError`` naming ``what``. The
poll interval is short (20 ms) so that a test waits no longer than the condition takes; the
timeout is only the bound for a failure, never a time that a passing test waits out.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

__all__ = ["until", "until_sync"]

POLL_S = 0.02


async def until(check: Callable[[], T | Awaitable[T]], timeout: float = 30.0, what: str = "the condition") -> T:
    """Await until ``check()`` is true; return its value. ``AssertionError`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(POLL_S)


def until_sync(check: Callable[[], T], timeout: float = 30.0, what: str = "the condition") -> T:
    """``until`` for code outside an event loop (a test driving a process)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(POLL_S)

