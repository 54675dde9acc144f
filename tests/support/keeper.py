"""Stops a server made for a whole test run when the run ends.

Under pytest-xdist a server shared by the workers (tests/support/synapse.py) is started by the
first worker that needs it, but must outlive that worker: it serves the others until the run's
last test. This process waits for the run's controller (the workers' parent) to exit, however it
exits, then stops the server (SIGTERM, then SIGKILL after ``GRACE_S``) and removes its directory.
Both waits are on pidfds (``os.pidfd_open``): no polling.

    python -m tests.support.keeper CONTROLLER_PID SERVER_PID DIRECTORY

It returns at once, leaving a detached process behind to do that.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import sys

GRACE_S = 30.0


def _wait_exit(pid: int, timeout: float | None) -> bool:
    """True once ``pid`` has exited (or never existed), False after ``timeout`` seconds."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def main(controller: int, server: int, directory: str) -> None:
    # Detached: the worker that started us waits only for this first process, and a Ctrl-C at
    # the terminal reaches the run, not the keeper.
    if os.fork():
        os._exit(0)
    os.setsid()
    _wait_exit(controller, None)
    try:
        os.kill(server, signal.SIGTERM)
        if not _wait_exit(server, GRACE_S):
            os.kill(server, signal.SIGKILL)
            _wait_exit(server, GRACE_S)
    except ProcessLookupError:
        pass
    shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
