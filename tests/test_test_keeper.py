"""The keeper that stops a server shared by a test run's workers (tests/support/keeper.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.keeper import _wait_exit

ROOT = Path(__file__).resolve().parent.parent


def test_the_server_is_stopped_and_its_directory_removed_when_the_run_ends(tmp_path: Path) -> None:
    run = subprocess.Popen(["sleep", "600"])  # stands for the run's controller
    server = subprocess.Popen(["sleep", "600"], start_new_session=True)
    directory = tmp_path / "server"
    (directory / "data").mkdir(parents=True)
    try:
        subprocess.run([sys.executable, "-m", "tests.support.keeper", str(run.pid), str(server.pid),
                        str(directory)], cwd=ROOT, check=True, timeout=60)  # returns at once
        assert server.poll() is None and directory.is_dir()  # the run goes on: the server serves
        run.kill()
        run.wait()
        assert server.wait(timeout=60) != 0  # stopped by the keeper (SIGTERM)
        os.sync()
        # The keeper removes the directory after the server has gone: wait for the keeper's end.
        keepers = subprocess.run(["pgrep", "-f", f"tests.support.keeper {run.pid} "], capture_output=True,
                                 text=True).stdout.split()
        for pid in keepers:
            assert _wait_exit(int(pid), 60)
        assert not directory.exists()
    finally:
        for proc in (run, server):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
