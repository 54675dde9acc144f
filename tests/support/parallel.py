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
  If pytest-xdist cannot mark the groups (pytest 9.2 with xdist 3.8), the run fails at its end,
  saying so (``check_groups``), rather than quietly making those fixtures once per worker.
- **Heavy files first**: files with end-to-end tests go to the workers first and the unit tier last,
  so the small tests fill the end of the run instead of one long test making the other worker wait.
- **Three workers per core** (``-n auto``, ``pytest_xdist_auto_num_workers``): most of the suite's
  time is waiting (for a process to start, a server to answer, a lease to pass), not computing:
  with one worker per core, the workers were busy 940 s of a 500 s run on two cores while
  the tests' processes used 535 s of CPU. More workers per core fill those waits; once `talon
  run` processes were forked from a helper that imported Talon once (tests/support/zygote.py),
  the CPU they used dropped and a third worker per core made the run shorter again (343 s
  against 359-371 s with two; four per core, 352 s).
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


def check_groups(session: pytest.Session) -> None:
    """In a worker: note it if pytest-xdist's ``loadgroup`` did not take effect. It marks a grouped
    test by adding ``@group`` to its node id, which pytest 9.2 no longer lets it change
    (pytest-dev/pytest-xdist#1386); every worker then silently made every heavy module fixture
    again (two llama.cpp servers, three Whisper models). pyproject.toml keeps pytest below 9.2
    until xdist follows. The controller fails the run at its end (``groups_lost``)."""
    if worker() is None or not session.config.getvalue("loadgroup"):
        return
    lost = [item.nodeid for item in session.items
            if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid]
    if lost:
        (run_dir() / "groups-lost.txt").write_text(f"{len(lost)} tests, the first {lost[0]}")


def groups_lost(session: pytest.Session) -> None:
    """In the controller, at the end: a run whose groups were lost fails, saying why."""
    note = run_dir() / "groups-lost.txt"
    if worker() is None and note.is_file():
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"pytest-xdist's --dist loadgroup grouped nothing ({note.read_text()}): "
                                "see tests/support/parallel.py check_groups", red=True)
        session.exitstatus = pytest.ExitCode.INTERNAL_ERROR


def heavy_first(items: list[pytest.Item]) -> None:
    """Tests marked ``alone`` first of all, then the groups of tests that share a heavy fixture
    (each runs on one worker, one test after the other: the longest units of work), then files
    with e2e tests, then files with slow ones, then the rest; each file's tests in their own order
    (a module's fixtures are made once). pyproject.toml turns off xdist's own reordering
    (``--no-loadscope-reorder``, which put the biggest groups first, before the ``alone`` tests).

    ``alone`` tests first: an exclusive turn waits for every test already running to end, and
    meanwhile no other test starts, so an ``alone`` test that arrived while a 30-second test ran
    kept every other worker idle for up to 30 s. At the start every worker takes its first test at
    once, and those are the ``alone`` ones: they run one after the other and then leave the run
    to the rest."""
    rank: dict[Path, int] = {}
    for item in items:
        tier = 0 if item.get_closest_marker("e2e") else 1 if item.get_closest_marker("slow") else 2
        rank[item.path] = min(rank.get(item.path, 2), tier)

    def key(item: pytest.Item) -> int:
        if item.get_closest_marker("alone") is not None:
            return -2
        return -1 if item.get_closest_marker("xdist_group") is not None else rank[item.path]

    items.sort(key=key)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: three workers per core (see above), one for the unit tier alone (``-m unit``:
    its tests do not wait, so another worker per core only collects the suite once more);
    ``--maxprocesses`` still caps it."""
    cores = os.cpu_count() or 1
    return cores if str(config.getoption("markexpr", "")).strip() == "unit" else 3 * cores


def compile_ahead(config: pytest.Config) -> None:
    """In the controller of a parallel run, before its workers start: compile Talon and the tests
    (the test modules as pytest rewrites them) on every core, once. On a clean clone each worker
    otherwise compiled all of them itself at the same moment (7 s of CPU each, four times over).
    Uses pytest's own rewriting (``_pytest.assertion.rewrite``, not public): if that changes,
    nothing is compiled ahead and the workers compile as before."""
    if worker() is not None or not config.getoption("numprocesses", None) or sys.dont_write_bytecode:
        return
    import compileall

    try:
        from _pytest.assertion import rewrite

        state = config.stash[rewrite.assertstate_key]
    except (ImportError, AttributeError, KeyError):
        return
    root = config.rootpath
    sources = sorted(path for package in ("talon", "channels", "tests") for path in (root / package).rglob("*.py"))
    rewritten = {"conftest.py"}

    def one(path: Path) -> None:
        try:
            if path.name.startswith("test_") or path.name in rewritten:
                pyc = rewrite.get_cache_dir(path) / (path.name[:-3] + rewrite.PYC_TAIL)
                if pyc.exists():  # the workers check that it is still that source's
                    return
                rewrite.try_makedirs(pyc.parent)
                source_stat, code = rewrite._rewrite_test(path, config)
                rewrite._write_pyc(state, code, source_stat, pyc)
            else:
                compileall.compile_file(path, quiet=2)  # only if out of date
        except Exception:  # noqa: BLE001  (a broken file: its worker reports it, as usual)
            pass

    cores = max(1, min(len(os.sched_getaffinity(0)), 8))
    children = []
    for index in range(1, cores):  # forked: the rewriting needs this process's config
        pid = os.fork()
        if pid == 0:
            try:
                for path in sources[index::cores]:
                    one(path)
            finally:
                os._exit(0)
        children.append(pid)
    try:
        for path in sources[0::cores]:
            one(path)
    finally:
        for pid in children:
            os.waitpid(pid, 0)


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
