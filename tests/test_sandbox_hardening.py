"""The shell sandbox's limits hold for the whole command (issue 27, part 7): memory for all its
processes together (a memory cgroup; a warning at start where none can be made), and the
workspace's size limit (TALON_WORKSPACE_MAX) for what its commands write."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import talon.agent.tools.sandbox as sandbox_module
from talon.agent.tools.sandbox import SandboxLimits, find_sandbox
from talon.agent.tools.registry import ToolContext, ToolRegistry
from talon.agent.tools.workspace import Workspace, WorkspacePolicy, disk_usage
from talon.agent.tools.workspace_tools import workspace_tools
from talon.content import ToolCall
from talon.errors import SandboxUnavailable

pytestmark = pytest.mark.e2e  # bubblewrap sandboxes, real processes


def _sandbox_problem() -> str | None:
    try:
        find_sandbox()
    except SandboxUnavailable as exc:
        return str(exc)
    return None


needs_bwrap = pytest.mark.skipif(_sandbox_problem() is not None,
                                 reason=f"no sandbox can start here: {_sandbox_problem()}")
needs_memory_cgroup = pytest.mark.skipif(
    _sandbox_problem() is not None or find_sandbox().memory_cgroup is None,
    reason="no memory cgroup can be made here (the limit is then per process, and said so at start)")


async def shell(tools: ToolRegistry, command: str, timeout: float = 60.0) -> tuple[bool, str]:
    result = await tools.call(ToolCall(id="1", name="shell",
                                       arguments=json.dumps({"command": command, "timeout": timeout})),
                              ToolContext())
    return result.is_error, "".join(getattr(b, "text", "") for b in result.content)


# Three processes of about 100 MB each (each under the per-process limit of 200 MB), together
# over the command's 200 MB. They start together, each touches its memory and says "held" only
# once all three hold theirs at the same time (all ready, and none gone after that was seen); a
# sibling killed meanwhile ends the wait.
GREEDY = """import os, time
open(f'/tmp/start-{os.getpid()}', 'w').close()
deadline = time.monotonic() + 20
def listed(prefix):
    return [int(n[len(prefix):]) for n in os.listdir('/tmp') if n.startswith(prefix)]
def gone(pid):
    try:
        with open(f'/proc/{pid}/cmdline', 'rb') as fh:
            return fh.read() == b''
    except OSError:
        return True
while len(listed('start-')) < 3 and time.monotonic() < deadline:
    time.sleep(0.02)
block = b'x' * 95_000_000
open(f'/tmp/ready-{os.getpid()}', 'w').close()
while time.monotonic() < deadline:
    if any(gone(pid) for pid in listed('start-')):
        print('a sibling is gone', flush=True)
        break
    # All three ready AND, checked after that, none gone: all three held their memory at once.
    # (A sibling killed after it said ready must not count: the third's memory may be its.)
    if len(listed('ready-')) == 3 and not any(gone(pid) for pid in listed('start-')):
        print('held', flush=True)
        break
    time.sleep(0.05)
"""


@needs_memory_cgroup
async def test_several_processes_together_cannot_pass_the_commands_memory_limit(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "greedy.py").write_text(GREEDY)
    tools = workspace_tools(Workspace(ws), store=None, shell=True,
                            sandbox_limits=SandboxLimits(max_memory=200_000_000))
    is_error, out = await shell(tools, "for i in 1 2 3; do python3 greedy.py $i & done; wait; echo finished")
    assert is_error, out
    assert "out of memory" in out and "TALON_SHELL_MAX_MEMORY" in out and "200.0 MB" in out, out
    assert "held" not in out, out  # never all three at once
    # One process alone, under the limit, runs as usual.
    is_error, out = await shell(tools, "python3 -c \"b = b'x' * 60_000_000; print('fine')\"")
    assert not is_error and "fine" in out and "out of memory" not in out, out


@needs_bwrap
def test_without_a_memory_cgroup_a_warning_says_the_limit_is_per_process(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    real = sandbox_module._cgroup_parent
    monkeypatch.setattr(sandbox_module, "_cgroup_parent", lambda c: None if c == "memory" else real(c))
    sandbox_module._warn_memory_per_process.cache_clear()
    with caplog.at_level(logging.WARNING, logger="talon.agent.tools.sandbox"):
        first = find_sandbox(SandboxLimits(max_memory=300_000_000))
        find_sandbox(SandboxLimits(max_memory=300_000_000))
    assert first.memory_cgroup is None
    warnings = [r.getMessage() for r in caplog.records if "no memory cgroup" in r.getMessage()]
    assert len(warnings) == 1 and "per process" in warnings[0] and "TALON_SHELL_MAX_MEMORY" in warnings[0]
    sandbox_module._warn_memory_per_process.cache_clear()


@needs_bwrap
async def test_the_shell_cannot_write_past_the_workspace_limit(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    limit = 20_000_000
    workspace = Workspace(ws, WorkspacePolicy(max_bytes=limit))
    tools = workspace_tools(workspace, store=None, shell=True)
    # One big file: the room left is its file-size limit.
    is_error, out = await shell(tools, "head -c 50000000 /dev/zero > one.bin; echo rc=$?; ls -l one.bin")
    assert "rc=0" not in out, out
    assert (ws / "one.bin").stat().st_size <= limit
    (ws / "one.bin").unlink()
    # Many files, each under the room left, written over seconds: the watch kills the command
    # soon after the workspace passes its limit (unbounded, it would write 200 MB).
    is_error, out = await shell(
        tools, "i=0; while [ $i -lt 200 ]; do head -c 1000000 /dev/zero > f$i; i=$((i+1)); sleep 0.05; done; "
               "echo wrote all", timeout=60)
    assert is_error and "killed" in out and "TALON_WORKSPACE_MAX" in out and "wrote all" not in out, out
    used = disk_usage(ws)
    assert limit < used < 3 * limit, used
    # Full: the next command is told so and cannot make any file grow; the file tools refuse too.
    is_error, out = await shell(tools, "echo more > more.txt; echo rc=$?")
    assert is_error and "the workspace is full" in out and "rc=0" not in out, out
    assert not (ws / "more.txt").exists() or (ws / "more.txt").stat().st_size == 0
    result = await tools.call(ToolCall(id="2", name="write_file",
                                       arguments=json.dumps({"path": "note.txt", "content": "hello"})),
                              ToolContext())
    assert result.is_error and "TALON_WORKSPACE_MAX" in result.content[0].text  # type: ignore[union-attr]
    # Deleting files is allowed while full, and afterwards writing works again.
    is_error, out = await shell(tools, "rm -f f*; echo cleaned")
    assert not is_error and "cleaned" in out and "full" not in out.split("cleaned", 1)[1], out
    is_error, out = await shell(tools, "echo more > more.txt; cat more.txt")
    assert not is_error and "more" in out, out
