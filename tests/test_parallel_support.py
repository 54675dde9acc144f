"""The suite's own scheduling under pytest-xdist (tests/support/parallel.py): an ``alone`` test
waits for the tests in flight and keeps new ones out while it runs, and the run directory is
shared by the processes of one run."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support.parallel import RUN_DIR_ENV, _Turns, run_dir
from tests.support.waiting import until_sync


def gate_taken(directory: Path) -> bool:
    """Whether someone holds the turnstile exclusively (an alone test waiting or running)."""
    with open(directory / "alone.turnstile", "a+b") as probe:
        try:
            fcntl.flock(probe.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False


def test_an_alone_test_waits_for_the_test_in_flight_and_keeps_new_ones_out(tmp_path: Path) -> None:
    other, alone, later = _Turns(tmp_path), _Turns(tmp_path), _Turns(tmp_path)
    events: list[str] = []
    entered, leave = threading.Event(), threading.Event()

    def run_alone() -> None:
        with alone.turn(True):
            events.append("alone in")
            entered.set()
            leave.wait(10)
            events.append("alone out")

    with other.turn(False):
        events.append("other in")
        thread = threading.Thread(target=run_alone)
        thread.start()
        until_sync(lambda: gate_taken(tmp_path), 10, "the alone test to queue at the turnstile")
        assert not entered.is_set()  # it waits for the test in flight
        events.append("other out")
    until_sync(entered.is_set, 10, "the alone test to start")
    assert gate_taken(tmp_path)  # a new test would wait now
    leave.set()
    thread.join(10)
    with later.turn(False):
        events.append("later in")
    assert events == ["other in", "other out", "alone in", "alone out", "later in"]


@pytest.mark.e2e  # starts a Python process
def test_workers_inherit_the_run_directory() -> None:
    here = run_dir()
    assert os.environ[RUN_DIR_ENV] == str(here) and here.is_dir()
    assert os.environ["XDG_CACHE_HOME"] == str(here / "cache")  # the model cache is the run's
    code = "from tests.support.parallel import run_dir; print(run_dir())"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                           cwd=Path(__file__).resolve().parent.parent, env={**os.environ, "PYTHONPATH": str(
                               Path(__file__).resolve().parent.parent)})
    assert child.stdout.strip() == str(here), child.stderr
