"""A process and its descendants, measured: RSS, CPU time, and waiting until they go quiet.
Shared by the tests and benchmarks that start Talon as a process (a process gone meanwhile
counts 0)."""

from __future__ import annotations

import contextlib
import time

import psutil

__all__ = ["tree_cpu", "tree_rss", "wait_quiet"]


def tree_rss(proc: psutil.Process) -> int:
    """RSS of ``proc`` and all its descendants, in bytes."""
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total


def tree_cpu(proc: psutil.Process) -> float:
    """CPU seconds (user and system) of ``proc`` and all its descendants."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def wait_quiet(proc: psutil.Process, *, window_s: float = 1.0, limit_s: float = 120.0) -> None:
    """Until the process tree has used under 10 ms of CPU in ``window_s``: its work is done.
    ``TimeoutError`` when it does not within ``limit_s``."""
    deadline = time.monotonic() + limit_s
    last = tree_cpu(proc)
    while time.monotonic() < deadline:
        time.sleep(window_s)
        now = tree_cpu(proc)
        if now - last < 0.01:
            return
        last = now
    raise TimeoutError(f"the process tree did not go quiet within {limit_s:.0f} s")
