"""The opt-in shell runs in a bubblewrap sandbox: it sees the chat's workspace and the system's
programs, not Talon's environment, processes, data dir or .env, and a timeout kills all of it.
Where no sandbox can start, the shell is refused unless TALON_SHELL_UNSANDBOXED=true."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import talon.agent.workspace_tools as workspace_tools_module
from talon.agent.sandbox import sandbox_problem
from talon.agent.tools import ToolContext, ToolRegistry
from talon.agent.workspace import Workspace
from talon.agent.workspace_tools import ShellTool, workspace_tools
from talon.content import ToolCall
from talon.errors import ConfigError
from talon.runtime import build_runtime
from tests.conftest import make_settings

needs_bwrap = pytest.mark.skipif(sandbox_problem() is not None,
                                 reason=f"no sandbox can start here: {sandbox_problem()}")


async def shell(tools: ToolRegistry, command: str, timeout: float = 20.0) -> tuple[bool, str]:
    result = await tools.call(ToolCall(id="1", name="shell",
                                       arguments=json.dumps({"command": command, "timeout": timeout})),
                              ToolContext())
    return result.is_error, "".join(getattr(b, "text", "") for b in result.content)


@needs_bwrap
async def test_the_sandbox_sees_only_the_workspace_and_its_own_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "123:BOT-TOKEN-IN-TALONS-ENV")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-in-talons-env")
    install = tmp_path / "talon-install"
    data = install / ".talon"
    data.mkdir(parents=True)
    (install / ".env").write_text("OPENAI_API_KEY=sk-secret-in-dotenv\n")
    (data / "inbox.sqlite3").write_text("sessions and approvals")
    ws = install / "media_root" / "telegram" / "111"
    ws.mkdir(parents=True)
    (ws / "mine.txt").write_text("my own file\n")
    tools = workspace_tools(Workspace(ws), store=None, shell=True)

    _, env = await shell(tools, "cat /proc/$PPID/environ /proc/1/environ 2>&1; env")
    _, ps = await shell(tools, "ls /proc | grep -E '^[0-9]+$' | wc -l; cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
    _, files = await shell(tools, f"cat mine.txt; ls ..; cat ../.env {install}/.env {data}/inbox.sqlite3 "
                                  f"{Path.cwd()}/.env 2>&1; ls /root /home /srv 2>&1; echo written > new.txt")
    for secret in ("BOT-TOKEN-IN-TALONS-ENV", "sk-secret-in-talons-env", "sk-secret-in-dotenv",
                   "sessions and approvals"):
        assert secret not in env + ps + files
    processes = int(ps.split("\n", 2)[1])
    host = sum(1 for name in os.listdir("/proc") if name.isdigit())
    # Its own PID namespace: bwrap's init, the shell and its pipeline, not the host's processes.
    assert processes <= 8 and processes < host, (processes, host, ps)
    assert "python" not in ps and "my own file" in files  # none of the host's processes (Talon, pytest)
    assert (ws / "new.txt").read_text() == "written\n"  # the workspace is writable
    error, out = await shell(tools, "touch /usr/x /etc/x /tmp/x 2>&1; echo done")
    assert "Read-only file system" in out or "Permission denied" in out
    assert not os.path.exists("/usr/x")


@needs_bwrap
async def test_a_timeout_kills_the_whole_sandbox_even_setsid_children(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    tools = workspace_tools(Workspace(ws), store=None, shell=True)
    started = time.monotonic()
    error, out = await shell(tools, "setsid sh -c 'sleep 3; echo escaped > survivor.txt' & "
                                    "nohup sh -c 'sleep 3; echo escaped > nohup.txt' >/dev/null 2>&1 & "
                                    "sleep 60", timeout=1.0)
    assert error and "timed out after 1s" in out
    assert time.monotonic() - started < 30
    time.sleep(4)  # the children would have written by now, had they outlived the sandbox
    assert not (ws / "survivor.txt").exists() and not (ws / "nohup.txt").exists()


def test_without_a_sandbox_the_shell_is_refused_unless_explicitly_unsandboxed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Whatever this machine has, pretend bwrap cannot start: the refusal path must hold.
    monkeypatch.setattr(workspace_tools_module, "sandbox_problem",
                        lambda: "bubblewrap (bwrap) is not installed")
    with pytest.raises(ConfigError) as caught:
        workspace_tools(Workspace(tmp_path), store=None, shell=True)
    assert caught.value.missing == ["TALON_SHELL_UNSANDBOXED"] and "bwrap" in str(caught.value)
    settings = make_settings(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", TALON_SHELL_TOOL="true")
    with pytest.raises(ConfigError):
        build_runtime(settings)
    bare = workspace_tools(Workspace(tmp_path), store=None, shell=True, shell_unsandboxed=True)
    tool = bare.tools["shell"]
    assert isinstance(tool, ShellTool) and not tool.sandboxed
    assert "shell" not in workspace_tools(Workspace(tmp_path), store=None).tools  # off by default


@needs_bwrap
async def test_a_stopped_turn_takes_its_shell_command_with_it(tmp_path: Path) -> None:
    import asyncio

    ws = tmp_path / "ws"
    ws.mkdir()
    tools = workspace_tools(Workspace(ws), store=None, shell=True)
    call = asyncio.create_task(shell(tools, "sleep 2; echo still here > late.txt", timeout=60))
    await asyncio.sleep(0.5)
    call.cancel()  # what Bridge.stop does to a turn in flight on SIGTERM
    with pytest.raises(asyncio.CancelledError):
        await call
    time.sleep(2.5)
    assert not (ws / "late.txt").exists()
