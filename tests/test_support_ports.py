"""The suite's port allocator (tests/support/ports.py): ports outside the kernel's ephemeral
range, never the same twice in a run, never one that something listens on."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support import ports


def test_ports_are_below_the_ephemeral_range_distinct_and_skip_a_taken_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    given = [ports.free_port() for _ in range(5)]
    assert all(ports.FIRST <= port < ports._ephemeral_low() for port in given)
    assert len(set(given)) == 5
    # Something listens on a port this test was given (so no other test is handed it); a counter
    # of the test's own that reaches that port next passes over it.
    held = given[-1]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", held))
        sock.listen()
        counter = tmp_path / "ports.next"
        counter.write_text(str(held))
        monkeypatch.setattr(ports, "_counter", lambda: counter)
        assert ports.free_port() > held
