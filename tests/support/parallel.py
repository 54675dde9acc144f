"""The suite on several processes (pytest-xdist, ``-n auto --dist loadgroup`` in pyproject.toml).

- **One directory for the run** (``run_dir()``): made by the first pytest process (the xdist
  controller, or the only process with ``-n 0``), inherited by the workers through the environment,
  and removed by the process that made it when it exits. The model cache (``$XDG_CACHE_HOME``) is
  in it, so the Whisper model is joined once per run, not once per worker: the join takes a file
  lock (talon.speech.transcribe.join_bundled_base), so two workers that need it at the same moment
  write it once.
- **Heavy module fixtures stay on one worker**: a test that uses a module- or session-scoped
  fixture defined in its own test file (a speech model, a llama.cpp server) is put in the xdist
  group of its file, so the fixture is made once, not once per worker.
- **Heavy files first**: files with end-to-end tests go to the workers first and the unit tier last,
  so the small tests fill the end of the run instead of one long test making the other worker wait.
- **Two workers per core** (``-n auto``, ``pytest_xdist_auto_num_workers``): most of the suite's
  time is waiting (for a process to start, a server to answer, a lease to pass), not computing:
  with one worker per core, the workers were busy 940 s of a 500 s run on two cores while
  the tests' processes used 535 s of CPU. A second worker per core fills those waits.
- **Bytecode is kept** (``keep_bytecode``): where ``PYTHONDONTWRITEBYTECODE`` is set (as on the
  machines CI runs on), every worker compiled Talon and rewrote every test module's asserts
  again (11 s of CPU per worker, 4 s with the cache), and every ``talon`` process the tests start
  compiled Talon again. The suite lets Python write ``__pycache__`` (in the clone), for itself
  and the processes it starts.
- **Tests that must run alone** (``@pytest.mark.alone``: they measure a process tree's memory or CPU,
  or a latency, that another worker's load would disturb): every test holds a shared lock on
  ``run_dir()/alone.lock`` while it runs and an ``alone`` test an exclusive one, so while it runs no
  other test does. A turnstile lock in front keeps the exclusive request from waiting forever
  behind tests that keep arriving.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import shutil
import sys
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import IO, Any

import pytest

RUN_DIR_ENV = "TALON_TESTS_RUN_DIR"


def run_dir() -> Path:
    """This run's directory, shared by all its pytest processes (made on first use)."""
    given = os.environ.get(RUN_DIR_ENV)
    if given and Path(given).is_dir():
        return Path(given)
    made = tempfile.mkdtemp(prefix="talon-test-run-")
    os.environ[RUN_DIR_ENV] = made
    atexit.register(shutil.rmtree, made, True)
    return Path(made)


def worker() -> str | None:
    """The xdist worker's id (``gw0``...), or None in the controller or a run without workers."""
    return os.environ.get("PYTEST_XDIST_WORKER")


def group_heavy_modules(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        module = item.nodeid.split("::", 1)[0]
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.values() if info is not None else ()
        if any(d.scope != "function" and d.baseid == module for seq in defs for d in seq):
            item.add_marker(pytest.mark.xdist_group(module))


def heavy_first(items: list[pytest.Item]) -> None:
    """Tests marked ``alone`` first of all, then files with e2e tests, then files with slow ones,
    then the rest; each file's tests in their own order (a module's fixtures are made once).

    ``alone`` tests first: an exclusive turn waits for every test already running to end, and
    meanwhile no other test starts, so an ``alone`` test that arrived while a 30-second test ran
    kept every other worker idle for up to 30 s. At the start every worker takes its first test at
    once, and those are the ``alone`` ones: they run one after the other and then leave the run
    to the rest."""
    rank: dict[Path, int] = {}
    for item in items:
        tier = 0 if item.get_closest_marker("e2e") else 1 if item.get_closest_marker("slow") else 2
        rank[item.path] = min(rank.get(item.path, 2), tier)
    items.sort(key=lambda item: -1 if item.get_closest_marker("alone") is not None else rank[item.path])


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers per core (see above), one for the unit tier alone (``-m unit``:
    its tests do not wait, so a second worker per core only collects the suite once more);
    ``--maxprocesses`` still caps it."""
    cores = os.cpu_count() or 1
    return cores if str(config.getoption("markexpr", "")).strip() == "unit" else 2 * cores


def keep_bytecode() -> None:
    """Let this process and the processes it starts write bytecode (see above). Called by the
    first lines of tests/conftest.py, before the modules it imports are compiled."""
    sys.dont_write_bytecode = False
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


class _Turns:
    """The run-wide readers/writer lock: tests take it shared, ``alone`` tests exclusive."""

    def __init__(self, directory: Path) -> None:
        self.gate: IO[bytes] = open(directory / "alone.turnstile", "a+b")  # noqa: SIM115
        self.lock: IO[bytes] = open(directory / "alone.lock", "a+b")  # noqa: SIM115

    @contextlib.contextmanager
    def turn(self, alone: bool) -> Iterator[None]:
        if alone:
            fcntl.flock(self.gate.fileno(), fcntl.LOCK_EX)
            fcntl.flock(self.lock.fileno(), fcntl.LOCK_EX)
        else:
            fcntl.flock(self.gate.fileno(), fcntl.LOCK_SH)
            fcntl.flock(self.lock.fileno(), fcntl.LOCK_SH)
            fcntl.flock(self.gate.fileno(), fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self.lock.fileno(), fcntl.LOCK_UN)
            if alone:
                fcntl.flock(self.gate.fileno(), fcntl.LOCK_UN)


_turns: _Turns | None = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
    global _turns
    if worker() is None:  # one process: every test is alone already
        return (yield)
    if _turns is None:
        _turns = _Turns(run_dir())
    with _turns.turn(item.get_closest_marker("alone") is not None):
        return (yield)
