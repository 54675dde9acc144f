"""Talon's runtime with the given channels, started for a block and stopped after it: what each
channel's ``running`` helper wraps."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from talon.config import Settings
from talon.runtime import Runtime, build_runtime


@contextlib.asynccontextmanager
async def started(settings: Settings, channels: Sequence[Any]) -> AsyncIterator[Runtime]:
    runtime = build_runtime(settings, list(channels))
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.stop()
