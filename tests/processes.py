"""A process and its descendants, measured: RSS, CPU time, and waiting until they go quiet; and
whether the processes of a command (found by a token in their command line) are still running.
Shared by the tests and benchmarks that start Talon as a process (a process gone meanwhile
counts 0)."""

from __future__ import annotations

import contextlib
import time

import psutil

__all__ = ["running_with", "tree_cpu", "tree_rss", "wait_quiet"]


def running_with(token: str) -> bool:
    """Whether any live process on the machine (not only this one's descendants: an escaped one
    counts too) has ``token`` in its command line. Tests put a unique token in a command to find
    its processes, and wait until none is left instead of sleeping for as long as it could run."""
    for proc in psutil.process_iter(["cmdline", "status"]):
        with contextlib.suppress(psutil.Error):
            if proc.info["status"] != psutil.STATUS_ZOMBIE and token in " ".join(proc.info["cmdline"] or ()):
                return True
    return False


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
