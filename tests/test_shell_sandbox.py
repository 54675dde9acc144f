"""The opt-in shell runs in a bubblewrap sandbox: it sees the chat's workspace and the system's
programs, not Talon's environment, processes, data dir or .env, and a timeout kills all of it.
Where no sandbox can start, the shell is refused unless TALON_SHELL_UNSANDBOXED=true."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

import talon.agent.tools.workspace_tools as workspace_tools_module
from talon.agent.tools.sandbox import find_sandbox
from talon.agent.tools.registry import ToolContext, ToolRegistry
from talon.agent.tools.workspace import Workspace
from talon.agent.tools.workspace_tools import ShellTool, workspace_tools
from talon.content import ToolCall
from talon.errors import ConfigError, SandboxUnavailable
from talon.runtime import build_runtime
from tests.conftest import ALICE, make_settings, running_telegram
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram
from tests.processes import running_with
from tests.support.waiting import until



def _sandbox_problem() -> str | None:
    try:
        find_sandbox()
    except SandboxUnavailable as exc:
        return str(exc)
    return None


needs_bwrap = pytest.mark.skipif(_sandbox_problem() is not None,
                                 reason=f"no sandbox can start here: {_sandbox_problem()}")


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
    token = secrets.token_hex(8)  # in every process's command line: found wherever it runs
    started = time.monotonic()
    error, out = await shell(tools, f"setsid sh -c 'sleep 3; echo escaped > survivor.txt # {token}' & "
                                    f"nohup sh -c 'sleep 3; echo escaped > nohup.txt # {token}' >/dev/null 2>&1 & "
                                    "sleep 60", timeout=1.0)
    assert error and "timed out after 1s" in out
    assert time.monotonic() - started < 30
    # None of them is left anywhere (an escaped one would run on, and write when its sleep ends).
    await until(lambda: not running_with(token), 30, "the sandbox's processes to be gone")
    assert not (ws / "survivor.txt").exists() and not (ws / "nohup.txt").exists()


def test_without_a_sandbox_the_shell_is_refused_unless_explicitly_unsandboxed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Whatever this machine has, pretend bwrap cannot start: the refusal path must hold.
    def no_bwrap(limits: object = None) -> None:
        raise SandboxUnavailable("bubblewrap (bwrap) is not installed")

    monkeypatch.setattr(workspace_tools_module, "find_sandbox", no_bwrap)
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
    token = secrets.token_hex(8)
    call = asyncio.create_task(shell(tools, f"sleep 2; echo still here > late.txt # {token}", timeout=60))
    await until(lambda: running_with(token), 30, "the command to run")
    call.cancel()  # what Bridge.stop does to a turn in flight on SIGTERM
    with pytest.raises(asyncio.CancelledError):
        await call
    await until(lambda: not running_with(token), 30, "the command's processes to be gone")
    assert not (ws / "late.txt").exists()


# --- the sandbox holds whoever runs Talon (root here) --------------------------------------------


def test_only_a_root_owned_bwrap_in_a_system_directory_is_trusted(tmp_path: Path) -> None:
    from talon.agent.tools.sandbox import trusted_program

    assert trusted_program("sh").startswith("/")  # the system's own sh passes
    writable = tmp_path / "open"
    writable.mkdir()
    fake = writable / "bwrap"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    writable.chmod(0o777)
    with pytest.raises(SandboxUnavailable, match="can be written by users other than root"):
        trusted_program("bwrap", dirs=(str(writable),))
    writable.chmod(0o755)
    os.chown(fake, 65534, 65534) if os.geteuid() == 0 else None
    if os.geteuid() == 0:
        with pytest.raises(SandboxUnavailable, match="owned by uid 65534"):
            trusted_program("bwrap", dirs=(str(writable),))
    with pytest.raises(SandboxUnavailable, match="not installed"):
        trusted_program("bwrap", dirs=(str(tmp_path / "nothing-here"),))


def _tool_results(req: Any) -> list[str]:
    return [str(m["content"]) for m in req.json["messages"] if m["role"] == "tool"]


@needs_bwrap
async def test_as_root_the_shell_has_no_capabilities_cannot_remount_and_never_runs_a_planted_bwrap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tg: FakeTelegram, llm: FakeOpenAI
) -> None:
    # A bwrap planted before the system's on Talon's PATH: running it would leave a mark.
    planted = tmp_path / "planted-bin"
    planted.mkdir()
    mark = tmp_path / "planted-bwrap-ran"
    (planted / "bwrap").write_text(f"#!/bin/sh\necho ran > {mark}\nexec /usr/bin/bwrap \"$@\"\n")
    (planted / "bwrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{planted}:{os.environ['PATH']}")
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_SHELL_TOOL="true",
                             TALON_APPROVAL="off")  # the sandbox is tested here, not approvals
    ws = settings.workspace_dir("telegram", str(ALICE))
    probe = ("grep -E '^(CapEff|CapPrm|CapBnd)' /proc/self/status; echo uid=$(id -u) gid=$(id -g); "
             "mount -o remount,bind,rw /usr 2>&1; echo remount=$?; "
             "mount -o remount,rw / 2>&1; echo remount_root=$?; "
             "unshare -U -r true 2>&1; echo userns=$?; "
             "touch /usr/planted 2>&1; echo touched=$?; "
             "cat /proc/self/mountinfo")
    llm.queue(FakeOpenAI.reply(tool_calls=[FakeOpenAI.tool_call("shell", {"command": probe})]), "Done.")
    async with running_telegram(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "check the sandbox", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE), timeout=30)
        await runtime.bridge.idle()
    [out] = _tool_results(llm.requests[1])
    assert "CapEff:\t0000000000000000" in out and "CapPrm:\t0000000000000000" in out, out
    assert "CapBnd:\t0000000000000000" in out
    assert "uid=65534 gid=65534" in out
    assert "remount=0" not in out and "remount_root=0" not in out and "userns=0" not in out
    assert "touched=0" not in out and not os.path.exists("/usr/planted")
    assert not mark.exists()  # the planted bwrap never ran
    # The mount table names the workspace's host path, but it leads nowhere inside.
    host_paths = {line.split()[3] for line in out.splitlines() if " /workspace " in line}
    assert host_paths, out
    ws_real = os.path.realpath(ws)
    tools = workspace_tools(Workspace(ws), store=None, shell=True)
    for host_path in host_paths:
        assert host_path == ws_real
        _, seen = await shell(tools, f"test -e '{host_path}' && echo reachable || echo absent; "
                                     f"ls -d '{os.path.dirname(host_path)}' 2>&1 | head -1")
        assert "absent" in seen and "reachable" not in seen, seen


def _sandboxed(ws: Path, limits: Any) -> ToolRegistry:
    tools = workspace_tools(Workspace(ws), store=None, shell=True, sandbox_limits=limits)
    tool = tools.tools["shell"]
    assert isinstance(tool, ShellTool) and tool.sandboxed
    return tools


def _count_with(marker: str) -> int:
    """Host processes whose command line holds ``marker``."""
    found = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                found += marker.encode() in Path(f"/proc/{name}/cmdline").read_bytes()
            except OSError:
                pass
    return found


@needs_bwrap
async def test_limits_hold_processes_file_size_and_memory(
    tmp_path: Path
) -> None:
    from talon.agent.tools.sandbox import SandboxLimits

    ws = tmp_path / "ws"
    ws.mkdir()
    tools = _sandboxed(ws, SandboxLimits(max_procs=24, max_memory=512_000_000, cpu_seconds=30,
                                         max_file_size=1_000_000))
    # A bounded spawn first: 60 sleepers asked for, the limit of 24 stops them (counted with a
    # glob, which needs no fork once the slots are taken).
    _, out = await shell(tools, "(i=0; while [ $i -lt 60 ]; do sleep 20 & i=$((i+1)); done) 2>/dev/null; "
                                "set -- /proc/[0-9]*; echo procs=$#", timeout=20)
    procs = int(out.rsplit("procs=", 1)[1].split()[0])
    assert 10 <= procs <= 24, out
    _, out = await shell(tools, "head -c 3000000 /dev/zero > big.bin; echo rc=$?; wc -c < big.bin")
    assert "rc=0" not in out and (ws / "big.bin").stat().st_size <= 1_000_000, out
    _, out = await shell(tools, "python3 -c 'x = bytearray(900_000_000)' 2>&1; echo rc=$?")
    assert "MemoryError" in out and "rc=0" not in out, out
    _, again = await shell(tools, "echo alive")
    assert "alive" in again


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("runuser") is None,
                    reason="needs root to run the sandbox as a normal user (runuser)")
def test_as_a_normal_user_the_same_command_line_holds_and_counts_its_own_processes() -> None:
    import dataclasses
    import tempfile

    from talon.agent.tools.sandbox import SandboxLimits

    # Talon as a normal user makes no cgroup: the process limit is RLIMIT_NPROC inside the
    # sandbox, counted in its own user namespace, whatever else that user runs.
    sandbox = dataclasses.replace(find_sandbox(SandboxLimits(max_procs=20)), pids_cgroup=None, launcher=None)
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        os.chmod(tmp, 0o755)
        ws = Path(tmp) / "ws"
        ws.mkdir()
        os.chown(ws, 65534, 65534)
        others = [subprocess.Popen(["runuser", "-u", "nobody", "--", "sleep", "30"]) for _ in range(25)]
        try:
            command = ("grep CapEff /proc/self/status; echo uid=$(id -u); "
                       "mount -o remount,bind,rw /usr 2>/dev/null; echo remount=$?; echo mine > mine.txt; "
                       "(i=0; while [ $i -lt 60 ]; do sleep 20 & i=$((i+1)); done) 2>/dev/null; "
                       "set -- /proc/[0-9]*; echo procs=$#")
            done = subprocess.run(["runuser", "-u", "nobody", "--", *sandbox.argv(ws, command)],
                                  capture_output=True, text=True, timeout=60)
        finally:
            for other in others:
                other.kill()
                other.wait()
        out = done.stdout
        assert "CapEff:\t0000000000000000" in out and "uid=65534" in out, out + done.stderr
        assert "remount=0" not in out
        procs = int(out.rsplit("procs=", 1)[1].split()[0])
        assert 10 <= procs <= 20, out  # its own 20, although nobody already ran 25 processes
        assert (ws / "mine.txt").read_text() == "mine\n"



@needs_bwrap
async def test_a_fork_bomb_in_a_real_run_stops_at_the_process_limit_and_leaves_the_host_alone(
    tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI
) -> None:
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_SHELL_TOOL="true",
                             TALON_SHELL_MAX_PROCS="24", TALON_APPROVAL="off")
    # The bomb's shells all carry the marker in their command line, so the host can count them
    # among everything else running on this machine.
    marker = secrets.token_hex(8)
    bounded = ("(i=0; while [ $i -lt 60 ]; do sleep 20 & i=$((i+1)); done) 2>/dev/null; "
               "set -- /proc/[0-9]*; echo procs=$#")
    bomb = f"b() {{ b | b & }}; b; exec sleep 30 # {marker}"
    llm.queue(FakeOpenAI.reply(tool_calls=[FakeOpenAI.tool_call("shell", {"command": bounded})]), "Counted.")
    async with running_telegram(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "count", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "Counted.", timeout=60)
        await runtime.bridge.idle()
        [out] = _tool_results(llm.requests[1])
        procs = int(out.rsplit("procs=", 1)[1].split()[0])
        assert 10 <= procs <= 24, out  # the limit holds for a bounded spawn: only then the bomb
        llm.queue(FakeOpenAI.reply(tool_calls=[FakeOpenAI.tool_call("shell", {"command": bomb, "timeout": 4})]),
                  "Stopped it.")
        tg.push_update(tg.text_message(ALICE, "bomb", user_id=ALICE))
        most = 0
        deadline = time.monotonic() + 90
        while len(tg.sent("sendMessage", ALICE)) < 2 and time.monotonic() < deadline:
            most = max(most, await asyncio.to_thread(_count_with, marker))
            await asyncio.sleep(0.05)
        await runtime.bridge.idle()
        bombed = _tool_results(llm.requests[3])[-1]
        assert "timed out after 4s" in bombed, bombed
        assert 1 <= most <= 24, most  # it ran, and never past the limit
        deadline = time.monotonic() + 30
        while _count_with(marker) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert _count_with(marker) == 0  # nothing of it outlived the call
        assert subprocess.run(["true"]).returncode == 0  # the host still forks
        # and Talon still answers
        llm.queue("Still here.")
        tg.push_update(tg.text_message(ALICE, "alive?", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "Still here.", timeout=30)
