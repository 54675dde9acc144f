"""The unit tier's own check: a test in the ``unit`` tier that costs more than
``UNIT_CPU_LIMIT_S`` of CPU (its setup and call together) fails, naming the rule, so a slow test
cannot join the tier that is meant to run in seconds; it has to be given the ``slow`` or ``e2e``
tier (tests/conftest.py) or made cheaper.

What is measured, and why (docs/development.md):

- CPU time, not wall time: the CPU seconds of the test process (every thread, ``time.process_time``)
  plus those of the child processes it started and waited for (``os.times``). Wall time on a
  loaded machine (two cores shared with other work, or the other pytest-xdist worker) stretches a
  0.05 s test to 0.5 s; CPU time does not, so the check cannot flake under load.
- A test that only waits (a sleep, a subprocess it does not reap, a server) costs little CPU, so
  wall time is checked too, against a bound ten times as generous (``UNIT_WALL_LIMIT_S``, 3 s): no
  unit test needs that long even on a loaded machine, and a test that waits that long is not a
  unit test.
- Full collections (generation 2) are not counted: their cost grows with the heap the whole
  process has built up (a worker that has run a thousand tests collects far more than a fresh
  one), not with the test's own work, and made the same test cost 0.16 s or 0.33 s depending on
  where it ran. Collections of the younger generations, which follow the test's own
  allocations, are counted.
- The first import of a library (Pillow, PyAV, a channel) is paid by whichever test imports it first,
  which is a matter of order and of how pytest-xdist shares the tests out. The conftest imports
  those libraries once per process before the first test (``WARM_IMPORTS``), so that each test
  is measured for its own work.

- Once the tests are collected, each test process imports those libraries, collects, and freezes
  what is alive then (``gc.freeze``: the modules, the collected tests, the libraries' own tables):
  a full collection then walks only what tests made since, not the 400,000 objects every worker
  holds from the start. Talon collects at every runtime start (``give_memory_back``, after the
  speech files are prepared), and in a worker that collection cost 0.3 to 0.5 s of CPU each
  time, some hundreds of times a run. Only objects alive at that moment are frozen, once: the
  garbage of later tests is collected as before.

The hooks are imported by tests/conftest.py; tests/test_tier_check.py runs them in a pytester.
"""

from __future__ import annotations

import gc
import importlib
import os
import time
from collections.abc import Generator
from typing import Any

import pytest

UNIT_CPU_LIMIT_S = 0.3
UNIT_WALL_LIMIT_S = 3.0

# Imported once per test process before the first test (see above). Modules that are not
# installed are skipped: their tests are skipped too.
WARM_IMPORTS = (
    "PIL.Image", "numpy", "av", "pypdf", "psycopg", "httpx", "aiohttp", "openai", "anthropic", "telegram",
    "telegram.ext", "twilio.rest", "talon.runtime", "talon.cli", "channels.telegram", "channels.whatsapp",
)

_COST_KEY = pytest.StashKey[list[float]]()  # [cpu, wall] of setup and call so far
_warmed = False


def warm_imports() -> None:
    global _warmed
    _warmed = True
    for name in WARM_IMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:
            pass


class _FullCollections:
    """The CPU time spent in generation-2 collections so far (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.spent = 0.0
        self._started: float | None = None

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.process_time()
        elif self._started is not None:
            self.spent += time.process_time() - self._started
            self._started = None


_full = _FullCollections()
gc.callbacks.append(_full)


def _cpu() -> float:
    t = os.times()
    return time.process_time() + t.children_user + t.children_system - _full.spent


def _measured(item: pytest.Item) -> Generator[None, Any, Any]:
    cost = item.stash.setdefault(_COST_KEY, [0.0, 0.0])
    cpu, wall = _cpu(), time.perf_counter()
    try:
        return (yield)
    finally:
        cost[0] += _cpu() - cpu
        cost[1] += time.perf_counter() - wall


def freeze_after_collection() -> None:
    """Warm the imports and freeze what is alive after collection (see above)."""
    if not _warmed:
        warm_imports()
    gc.collect()
    gc.freeze()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, Any]:
    if item.get_closest_marker("unit") is None:
        return (yield)
    if not _warmed:
        warm_imports()
    return (yield from _measured(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    if item.get_closest_marker("unit") is None:
        return (yield)
    return (yield from _measured(item))


def tier_violation(item: pytest.Item) -> str | None:
    """Why ``item`` breaks the unit tier's bound, or None."""
    if item.get_closest_marker("unit") is None or _COST_KEY not in item.stash:
        return None
    cpu, wall = item.stash[_COST_KEY]
    if cpu > UNIT_CPU_LIMIT_S:
        return (f"unit tier check: {item.nodeid} took {cpu:.2f} s of CPU (setup and call), over the unit "
                f"tier's {UNIT_CPU_LIMIT_S} s; make it cheaper, or give it the slow or e2e tier "
                "(tests/conftest.py, docs/development.md)")
    if wall > UNIT_WALL_LIMIT_S:
        return (f"unit tier check: {item.nodeid} took {wall:.1f} s (setup and call; {cpu:.2f} s of CPU), over "
                f"the unit tier's {UNIT_WALL_LIMIT_S:g} s wall-time guard for tests that wait; wait for an event "
                "instead, or give it the slow or e2e tier (tests/conftest.py, docs/development.md)")
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    if report.when == "call" and report.passed:
        why = tier_violation(item)
        if why is not None:
            report.outcome = "failed"
            report.longrepr = why
    return report
