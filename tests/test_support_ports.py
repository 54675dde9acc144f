"""The suite's port allocator (tests/support/ports.py): ports outside the kernel's ephemeral
range, never the same twice in a run, never one that something listens on."""

from __future__ import annotations

import socket

from tests.support import ports


def test_ports_are_below_the_ephemeral_range_distinct_and_skip_a_taken_one() -> None:
    first = ports.free_port()
    assert ports.FIRST <= first < ports._ephemeral_low()
    # Hold the next port in the counter, as another program might: it is skipped.
    held = int(ports._counter().read_text())
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", held))
        except OSError:  # taken already (another worker's server): skipped all the same
            pass
        sock.listen()
        given = [ports.free_port() for _ in range(5)]
    assert held not in given and first not in given and len(set(given)) == 5
