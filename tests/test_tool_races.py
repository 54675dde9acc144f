"""The file tools against another local writer flipping paths between real files/directories and
symbolic links to the outside, 100,000 flips per tool: not one byte read from outside, not one
byte written there. Also: one read is bounded by bytes, not by the lines it finds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from talon.agent.tools.registry import ToolContext, ToolRegistry
from talon.agent.tools.workspace import Workspace
from talon.agent.tools.workspace_tools import workspace_tools
from talon.config import Limits
from talon.content import ToolCall

FLIPS = 100_000
# Another process (a real second writer, not a thread under our GIL) flips, as fast as it can,
# with renameat2(RENAME_EXCHANGE): ws/victim.txt swaps between a regular file and a symlink to
# outside/secret.txt, and ws/d between a directory and a symlink to outside/, each swap atomic,
# so at every instant the path is one or the other.
FLIPPER = r"""
import ctypes, os, sys
ws, outside, flips = sys.argv[1], sys.argv[2], int(sys.argv[3])
libc = ctypes.CDLL(None, use_errno=True)
renameat2 = libc.renameat2
renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
AT_FDCWD, RENAME_EXCHANGE = -100, 2
os.symlink(os.path.join(outside, "secret.txt"), os.path.join(ws, ".victim-link"))
os.symlink(outside, os.path.join(ws, ".d-link"))
pairs = [(os.path.join(ws, "victim.txt").encode(), os.path.join(ws, ".victim-link").encode()),
         (os.path.join(ws, "d").encode(), os.path.join(ws, ".d-link").encode())]
print("ready", flush=True)
for i in range(flips):
    for a, b in pairs:
        if renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) != 0:
            sys.exit("renameat2: " + os.strerror(ctypes.get_errno()))
"""
SECRET = b"SECRET inside\n"


def _layout(tmp_path: Path) -> tuple[Path, Path]:
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    (ws / "d").mkdir(parents=True)
    outside.mkdir()
    (ws / "victim.txt").write_bytes(b"inside\n")
    (ws / "d" / "f.txt").write_bytes(b"inside\n")
    (outside / "secret.txt").write_bytes(SECRET)
    (outside / "f.txt").write_bytes(SECRET)
    (outside / "only-outside.txt").write_bytes(SECRET)
    return ws, outside


def _outside_state(outside: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(outside.iterdir())}


async def _race(tools: ToolRegistry, ws: Path, outside: Path, calls: list[tuple[str, dict[str, object]]],
                leaked: str) -> tuple[int, int, int]:
    """Call the tools round-robin while the flipper runs; (calls, escapes, successes)."""
    before = _outside_state(outside)
    flipper = subprocess.Popen([sys.executable, "-c", FLIPPER, str(ws), str(outside), str(FLIPS)],
                               stdout=subprocess.PIPE, text=True)
    assert flipper.stdout is not None and flipper.stdout.readline().strip() == "ready"
    made = escapes = successes = 0
    started = time.monotonic()
    try:
        while flipper.poll() is None:
            name, args = calls[made % len(calls)]
            result = await tools.call(ToolCall(id=str(made), name=name, arguments=json.dumps(args)),
                                      ToolContext())
            made += 1
            text = "".join(getattr(b, "text", "") for b in result.content)
            successes += not result.is_error
            if leaked in text:
                escapes += 1
            assert time.monotonic() - started < 60, "the flipper should be done long before this"
    finally:
        flipper.kill()
        flipper.wait()
    assert flipper.returncode == 0
    after = _outside_state(outside)
    escapes += sum(1 for k in set(before) | set(after) if before.get(k) != after.get(k))
    return made, escapes, successes


@pytest.mark.parametrize("tool,calls", [
    ("read_file", [("read_file", {"path": "victim.txt"}), ("read_file", {"path": "d/f.txt"})]),
    ("grep", [("grep", {"pattern": "SEC.ET", "path": "."}), ("grep", {"pattern": "SEC.ET", "path": "d"}),
              ("grep", {"pattern": "SEC.ET", "path": "victim.txt"})]),
    ("edit_file", [("edit_file", {"path": "victim.txt", "old_string": "inside", "new_string": "inside!"}),
                   ("edit_file", {"path": "d/f.txt", "old_string": "inside", "new_string": "inside!"})]),
    ("write_file", [("write_file", {"path": "victim.txt", "content": "written\n"}),
                    ("write_file", {"path": "d/f.txt", "content": "written\n"}),
                    ("write_file", {"path": "d/new/deeper.txt", "content": "written\n"})]),
    ("ls+glob", [("ls", {"path": "d"}), ("glob", {"pattern": "d/*"}), ("glob", {"pattern": "**/*.txt"})]),
])
async def test_no_tool_escapes_a_100000_flip_race(tmp_path: Path, tool: str,
                                                  calls: list[tuple[str, dict[str, object]]]) -> None:
    ws, outside = _layout(tmp_path)
    tools = workspace_tools(Workspace(ws), store=None, limits=Limits())
    leaked = "only-outside" if tool == "ls+glob" else "SECRET"
    made, escapes, successes = await _race(tools, ws, outside, calls, leaked)
    assert made > 50, f"only {made} calls during the race"
    assert successes > 0, "the race never let a call through: it shows nothing"
    assert escapes == 0, f"{escapes} escapes in {made} calls during {FLIPS:,} flips"
    assert not list(outside.rglob("deeper.txt")) and not (outside / "new").exists()


async def test_one_read_is_bounded_by_bytes_not_lines(tmp_path: Path) -> None:
    # A 20 GB sparse file: some text, then a hole of NUL bytes and no newline: one endless line.
    ws = tmp_path / "ws"
    ws.mkdir()
    with open(ws / "sparse.log", "wb") as fh:
        fh.write(b"first line\n" + b"x" * 9000)
        fh.truncate(20 * 1024**3)
    tools = workspace_tools(Workspace(ws), store=None, limits=Limits())

    def read_bytes_so_far() -> int:
        with open("/proc/self/io") as io_stats:
            return int(next(line for line in io_stats if line.startswith("rchar:")).split()[1])

    before = read_bytes_so_far()
    result = await tools.call(ToolCall(id="1", name="read_file", arguments='{"path": "sparse.log"}'),
                              ToolContext())
    used = read_bytes_so_far() - before
    text = result.content[0].text
    assert not result.is_error and "first line" in text
    assert "stopped after the first 128 MB" in text
    assert used < 200 * 1024**2, f"read {used / 1024**2:.0f} MB of a 20 GB file"
