"""Ports for servers that a test starts as another process and must name before it starts.

Binding port 0, reading the number and closing the socket (the usual trick) races under
pytest-xdist: the number comes from the kernel's ephemeral range, and until the server binds it
again any other socket of any worker may get the same number (an outgoing connection's source
port, another test's port-0 server). A run of the suite lost a test that way ("address already in
use"). Here a port is taken below the ephemeral range, where the kernel never hands one out by
itself, and from a counter shared by every process of the run (a file under ``run_dir()``, behind
a lock), so no two tests of one run are given the same port. Each is still checked by binding it,
in case another program on the machine holds it.
"""

from __future__ import annotations

import fcntl
import socket
from pathlib import Path

# Below Linux's default ephemeral range (32768-60999), above the ports of common services.
FIRST = 20000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _counter() -> Path:
    # Imported here: tests/llama_server.py and tests/support/synapse.py run as their own processes
    # and find the run's directory in the environment they inherit.
    from tests.support.parallel import run_dir

    return run_dir() / "ports.next"


def free_port() -> int:
    """A loopback port no other test of this run is given and nothing listens on now."""
    last = max(FIRST + 1000, _ephemeral_low()) - 1
    path = _counter()
    with open(path.with_suffix(".lock"), "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            text = path.read_text() if path.exists() else ""
            port = int(text) if text.strip() else FIRST
            for _ in range(last - FIRST + 1):
                if port > last:
                    port = FIRST
                candidate, port = port, port + 1
                if _bindable(candidate):
                    path.write_text(str(port))
                    return candidate
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    raise RuntimeError(f"no free loopback port between {FIRST} and {last}")
