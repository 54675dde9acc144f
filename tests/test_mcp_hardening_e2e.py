"""MCP servers inside the walls, and their output bounded (issue 27, parts 1 and 2), against real
servers: mcp-server-git and mcp-server-time from PyPI, and the SDK's MCPServer in
tests/mcp_test_server.py. Each test reproduces a break the red team found: git run by a per-chat
server executing a planted ``core.fsmonitor`` (hooks, filters, external diff...), a planted module
run by ``python -m``, a server reading Talon's token, a daemon outliving Talon, 30 chats starting
31 processes, one chat's failed start hiding a server's tools from every chat, a 100 MB result
line stalling the bot, a stderr flood filling the log."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from talon.agent.tools.mcp import McpManager, doctor_rows
from talon.agent.tools.mcp_config import parse_mcp_config
from talon.agent.tools.mcp_launch import Launcher
from talon.agent.tools.registry import ToolContext, ToolRegistry
from talon.config import Limits
from talon.content import ToolCall
from tests.support.waiting import until

TEST_SERVER = str(Path(__file__).with_name("mcp_test_server.py"))
TOKEN = "123456:FAKE-telegram-token-for-the-walls-test"


# --- helpers --------------------------------------------------------------------------------
def ctx(workspace: Path) -> ToolContext:
    return ToolContext(workspace=SimpleNamespace(real_root=workspace))


def text(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


def payload(result: Any) -> dict[str, Any]:
    body = text(result)
    return json.loads(body[body.index("{"):body.rindex("}") + 1])


def manager_for(servers: dict[str, Any], **kwargs: Any) -> tuple[McpManager, ToolRegistry]:
    registry = ToolRegistry()
    manager = McpManager(parse_mcp_config({"mcpServers": servers}), registry, store=None, limits=Limits(), **kwargs)
    return manager, registry


async def call(registry: ToolRegistry, name: str, args: dict[str, Any], context: ToolContext) -> Any:
    await registry.prepare(context)
    return await registry.call(ToolCall(id=f"c{time.monotonic_ns()}", name=name, arguments=json.dumps(args)),
                               context)


def processes_with(marker: str) -> list[psutil.Process]:
    """Every live process on the host whose command line contains ``marker``."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        try:
            if process.info["status"] != psutil.STATUS_ZOMBIE and marker in " ".join(process.info["cmdline"] or []):
                found.append(process)
        except psutil.NoSuchProcess:
            continue
    return found


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=Test", "-c", "user.email=test@example.com", *args], cwd=cwd,
                   check=True, capture_output=True, env={"PATH": "/usr/bin:/bin", "HOME": str(cwd)})


@pytest.fixture
def token_in_env(monkeypatch: pytest.MonkeyPatch) -> str:
    """Talon's own secrets, in Talon's environment as in production."""
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", TOKEN)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fake-talon-key")
    return TOKEN


# --- the walls of a per-chat server -----------------------------------------------------------
async def test_a_per_chat_server_runs_as_nobody_without_capabilities_secrets_or_talons_processes(
        tmp_path: Path, token_in_env: str) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    manager, registry = manager_for({"t": {"command": sys.executable, "args": [TEST_SERVER, "stdio"],
                                           "env": {"MCP_TEST_MARK": "${WORKSPACE}/mark"}}})
    await manager.start()
    try:
        seen = payload(await call(registry, "mcp__t__inspect", {"needle": token_in_env}, ctx(workspace)))
    finally:
        await manager.close()
    assert seen["uid"] == seen["euid"] == seen["gid"] == 65534
    assert int(seen["cap_eff"], 16) == 0 and int(seen["cap_bnd"], 16) == 0
    assert seen["found"] == [] and token_in_env not in json.dumps(seen["env"])
    assert "OPENAI_API_KEY" not in seen["env"] and "TELEGRAM_BOT_TOKEN" not in seen["env"]
    assert seen["env"]["MCP_TEST_MARK"] == "/workspace/mark"  # ${WORKSPACE} is /workspace inside
    assert seen["cwd"] == "/workspace" and seen["env"]["HOME"] == "/tmp"
    assert seen["env"]["PYTHONSAFEPATH"] == "1" and seen["env"]["GIT_CONFIG_NOSYSTEM"] == "1"
    assert os.getpid() not in seen["pids"] and len(seen["pids"]) <= 4  # its own PID namespace
    assert max(seen["pids"]) < 100


async def test_a_shared_server_gets_only_what_its_config_names(tmp_path: Path, token_in_env: str) -> None:
    manager, registry = manager_for({"t": {"command": sys.executable, "args": [TEST_SERVER, "stdio"],
                                           "env": {"MCP_TEST_MARK": "named-by-config"}}})
    await manager.start()
    try:
        seen = payload(await call(registry, "mcp__t__inspect", {"needle": token_in_env}, ToolContext()))
    finally:
        await manager.close()
    assert seen["found"] == [] and token_in_env not in json.dumps(seen["env"])
    assert seen["env"]["MCP_TEST_MARK"] == "named-by-config"
    allowed = {"HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LC_ALL", "TZ", "MCP_TEST_MARK",
               "TALON_MCP_TREE", "PYTHONSAFEPATH", "PYTHONNOUSERSITE", "PYTHONDONTWRITEBYTECODE",
               "GIT_PYTHON_GIT_EXECUTABLE", "PWD", "PYTHONPATH"}
    assert {k for k in seen["env"] if not k.startswith("GIT_") and k != "SSH_ASKPASS"} <= allowed
    assert os.getpid() not in seen["pids"]  # it does not see Talon's processes either


async def test_without_a_sandbox_a_per_chat_server_is_refused_with_the_reason_never_run_on_the_host(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    marker = f"no-sandbox-{os.getpid()}-{time.monotonic_ns()}"
    servers = {"t": {"command": sys.executable, "args": [TEST_SERVER, "stdio", marker],
                     "cwd": "${WORKSPACE}"}}
    problem = "bubblewrap (bwrap) is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    manager, registry = manager_for(servers, launcher=Launcher(sandbox_problem=problem))
    await manager.start()
    try:
        await registry.prepare(ctx(workspace))
        [connection] = manager.per_chat.values()
        await until(lambda: connection.state == "failed", 10, "the refusal")
        assert not processes_with(marker)
        [status] = manager.status_lines()
        # A call (had its tools been learned elsewhere) gets the reason as a tool error.
        from mcp_types import Tool as RemoteTool

        manager._learn(manager.configs["t"], [RemoteTool(name="echo", input_schema={"type": "object"})])
        refused = await registry.call(ToolCall(id="1", name="mcp__t__echo", arguments="{}"), ctx(workspace))
    finally:
        await manager.close()
    assert "t (per chat): refused" in status and problem in status
    assert refused.is_error and "run only in a sandbox" in text(refused) and problem in text(refused)
    assert "per-chat MCP servers run only in a sandbox" in caplog.text
    rows = dict(await doctor_rows(parse_mcp_config({"mcpServers": servers}), start_timeout_s=10,
                                  launcher=Launcher(sandbox_problem=problem)))
    assert rows["mcp t"].startswith("FAILED: a per-chat server runs only in a sandbox") and problem in rows["mcp t"]


# --- git never runs what a repository names ------------------------------------------------
PWN = """#!/bin/sh
echo "$1 ran as $(id -u)" >> pwned.txt
touch "{canary}" 2>/dev/null
for f in /proc/*/environ; do tr '\\0' '\\n' < "$f" 2>/dev/null | grep TELEGRAM_BOT_TOKEN >> pwned.txt; done
cat "$2" 2>/dev/null
exit 0
"""


def plant_git(repo: Path, canary: Path) -> None:
    """The red team's plant: a repository whose config and attributes run pwn.sh every way git can."""
    (repo / "a.txt").write_text("one\n")
    git(repo, "init", "-q")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", "first")
    (repo / "pwn.sh").write_text(PWN.format(canary=canary))
    (repo / "pwn.sh").chmod(0o755)
    (repo / ".gitattributes").write_text("*.txt filter=evil diff=evil merge=evil\n")
    hooks = repo / ".git" / "hooks"
    for hook in ("pre-commit", "commit-msg", "post-commit", "post-checkout", "post-index-change",
                 "reference-transaction", "pre-auto-gc", "fsmonitor-watchman"):
        (hooks / hook).write_text(f"#!/bin/sh\nsh ./pwn.sh hook-{hook}\n")
        (hooks / hook).chmod(0o755)
    with (repo / ".git" / "config").open("a") as config:
        config.write(
            "[core]\n\tfsmonitor = sh pwn.sh fsmonitor\n\tpager = sh pwn.sh pager\n"
            "\tsshCommand = sh pwn.sh ssh\n"
            '[filter "evil"]\n\tclean = sh pwn.sh filter-clean\n\tsmudge = sh pwn.sh filter-smudge\n'
            '[diff "evil"]\n\tcommand = sh pwn.sh diff-command\n\ttextconv = sh pwn.sh textconv\n'
            "[diff]\n\texternal = sh pwn.sh diff-external\n"
            '[merge "evil"]\n\tdriver = sh pwn.sh merge-driver\n'
            "[credential]\n\thelper = !sh pwn.sh credential\n"
            "[gpg]\n\tprogram = sh pwn.sh gpg\n[commit]\n\tgpgSign = true\n[log]\n\tshowSignature = true\n")
    (repo / "a.txt").write_text("one\ntwo\n")  # a change, so status and diff have work to do
    (repo / "b.txt").write_text("new\n")


@pytest.mark.parametrize("kind", ["per_chat", "shared"])
async def test_git_in_a_server_never_runs_what_the_repository_names(tmp_path: Path, token_in_env: str,
                                                                    kind: str) -> None:
    repo = tmp_path / "ws"
    repo.mkdir()
    canary = tmp_path / "CANARY-outside-the-workspace"
    plant_git(repo, canary)
    # The plant works with plain git: the test's plant is real.
    probe = tmp_path / "probe"
    subprocess.run(["cp", "-a", str(repo), str(probe)], check=True)
    subprocess.run(["git", "status"], cwd=probe, capture_output=True, env={"PATH": "/usr/bin:/bin"})
    assert "fsmonitor ran" in (probe / "pwned.txt").read_text() and canary.exists()
    canary.unlink()
    where = "${WORKSPACE}" if kind == "per_chat" else str(repo)
    manager, registry = manager_for({"git": {"command": "mcp-server-git", "args": ["--repository", where]}})
    context = ctx(repo) if kind == "per_chat" else ToolContext()
    path = "/workspace" if kind == "per_chat" else str(repo)
    await manager.start()
    try:
        results = {}
        for tool, args in (("git_status", {}), ("git_diff_unstaged", {}), ("git_add", {"files": ["a.txt", "b.txt"]}),
                           ("git_diff_staged", {}), ("git_diff", {"target": "HEAD"}),
                           ("git_commit", {"message": "planted"}), ("git_log", {}),
                           ("git_create_branch", {"branch_name": "side"}), ("git_checkout", {"branch_name": "side"}),
                           ("git_show", {"revision": "HEAD"})):
            results[tool] = await call(registry, f"mcp__git__{tool}", {"repo_path": path, **args}, context)
    finally:
        await manager.close()
    assert not (repo / "pwned.txt").exists(), (repo / "pwned.txt").read_text()
    assert not canary.exists()
    assert not results["git_status"].is_error and "b.txt" in text(results["git_status"])
    assert not results["git_log"].is_error and "planted" in text(results["git_log"])  # git still works


# --- Python never imports from the workspace ---------------------------------------------------
PLANT = """import pathlib
pathlib.Path("{evidence}").write_text("the planted {name} ran")
try:
    pathlib.Path("{canary}").write_text("ran")
except OSError:
    pass
"""


@pytest.mark.parametrize("kind", ["per_chat", "shared"])
async def test_python_m_never_runs_a_module_planted_in_its_working_directory(tmp_path: Path, kind: str) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    canary = tmp_path / "CANARY-outside-the-workspace"
    evidence = "/workspace/EVIDENCE" if kind == "per_chat" else str(workspace / "EVIDENCE")
    for name in ("mcp_server_time", "sitecustomize", "usercustomize", "mcp_types", "pydantic"):
        (workspace / f"{name}.py").write_text(PLANT.format(evidence=evidence, canary=canary, name=name))
    cwd = "${WORKSPACE}" if kind == "per_chat" else str(workspace)
    manager, registry = manager_for({"time": {"command": sys.executable, "args": ["-m", "mcp_server_time"],
                                              "cwd": cwd}})
    await manager.start()
    try:
        result = await call(registry, "mcp__time__get_current_time", {"timezone": "UTC"},
                            ctx(workspace) if kind == "per_chat" else ToolContext())
    finally:
        await manager.close()
    assert not (workspace / "EVIDENCE").exists(), (workspace / "EVIDENCE").read_text()
    assert not canary.exists()
    assert not result.is_error and '"timezone": "UTC"' in text(result)  # the real server answered


# --- every process of a server ends with it ---------------------------------------------------
@pytest.mark.parametrize("kind", ["per_chat", "shared", "shared_without_namespace"])
async def test_a_daemonising_servers_grandchild_is_gone_after_close(tmp_path: Path, kind: str) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    seconds = f"{4000 + os.getpid() % 1000}.{time.monotonic_ns() % 10**6}"  # a mark only this test's sleep has
    args = [TEST_SERVER, "stdio"] + (["${WORKSPACE}"] if kind == "per_chat" else [])
    launcher = Launcher()
    if kind == "shared_without_namespace":
        launcher._reaper_checked = True  # as where bwrap cannot make a PID namespace: no wrapper
    manager, registry = manager_for({"t": {"command": sys.executable, "args": args}}, launcher=launcher)
    await manager.start()
    try:
        result = await call(registry, "mcp__t__daemon", {"seconds": seconds},
                            ctx(workspace) if kind == "per_chat" else ToolContext())
        assert not result.is_error, text(result)
        [left] = await until(lambda: processes_with(f"sleep {seconds}"), 10, "the daemon")
        assert left.ppid() != os.getpid()  # really detached from the server
    finally:
        await manager.close()
    assert not left.is_running() or left.status() == psutil.STATUS_ZOMBIE
    assert not processes_with(f"sleep {seconds}")


# --- a cap on per-chat processes; each chat on its own -----------------------------------------
# Twelve chats through a cap of four: eight servers stopped to make room, each a real sandboxed
# process start (thirty chats through eight showed nothing more, at three times the time).
CHATS, CAP = 12, 4


async def test_twelve_chats_run_at_most_the_cap_least_recently_used_stopped_first(tmp_path: Path) -> None:
    marker = f"cap-{os.getpid()}-{time.monotonic_ns()}"
    manager, registry = manager_for({"t": {"command": sys.executable, "args": [TEST_SERVER, "stdio", marker],
                                           "cwd": "${WORKSPACE}"}}, per_chat_max=CAP, call_timeout_s=120)
    workspaces = []
    for n in range(CHATS):
        workspaces.append(tmp_path / f"chat{n}")
        workspaces[-1].mkdir()
    most = 0

    def servers() -> int:  # the server processes themselves, not the bwrap around each
        return len([p for p in processes_with(marker) if Path(p.info["cmdline"][0]).name not in ("bwrap", "sh")])

    async def sample() -> None:  # how many run at once, sampled all along
        nonlocal most
        while True:
            most = max(most, servers(), len(manager.per_chat))
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample())
    await manager.start()
    try:
        # Chat 0 is mid-call (hung) all along: never the one stopped.
        busy = asyncio.create_task(call(registry, "mcp__t__hang", {}, ctx(workspaces[0])))
        await until(lambda: any(c.in_flight for c in manager.per_chat.values()), 30, "the busy call")
        busy_connection = manager.per_chat[("t", workspaces[0])]
        answers = []
        for workspace in workspaces[1:]:
            answers.append(await call(registry, "mcp__t__whoami", {}, ctx(workspace)))
        assert manager.per_chat.get(("t", workspaces[0])) is busy_connection and busy_connection.client is not None
        # The CAP most recently used remain: chat 0 (busy) and the last CAP - 1.
        assert set(manager.per_chat) == {("t", w) for w in [workspaces[0], *workspaces[-(CAP - 1):]]}
        busy.cancel()
    finally:
        sampler.cancel()
        await manager.close()
    assert all(not a.is_error and "start=" in text(a) for a in answers)
    assert most <= CAP
    await until(lambda: not processes_with(marker), 10, "every server gone")


async def test_one_chats_failed_start_never_hides_the_tools_from_another(tmp_path: Path) -> None:
    plain, repo = tmp_path / "plain", tmp_path / "repo"
    plain.mkdir()
    repo.mkdir()
    (repo / "notes.txt").write_text("hi\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "the repo's own commit")
    manager, registry = manager_for({"git": {"command": "mcp-server-git", "args": ["--repository", "${WORKSPACE}"]}})
    await manager.start()
    try:
        await registry.prepare(ctx(plain))  # the first chat's workspace is no repository: its start fails
        first = manager.per_chat[("git", plain)]
        assert first.state == "failed" and not registry.tools.get("mcp__git__git_log")
        log = await call(registry, "mcp__git__git_log", {"repo_path": "/workspace"}, ctx(repo))
        status = await call(registry, "mcp__git__git_status", {"repo_path": "/workspace"}, ctx(plain))
    finally:
        await manager.close()
    assert not log.is_error and "the repo's own commit" in text(log)
    assert status.is_error and "not running" in text(status)
    assert "not a valid Git repository" in text(status) or "InvalidGitRepository" in text(status)


# --- bounded output -------------------------------------------------------------------------
async def _ticker(lateness: list[tuple[float, float]], stop: asyncio.Event) -> None:
    """Another chat's turn on the same loop, over and over: a turn takes many steps of the loop
    (reads, writes, model and Bot API round trips); here 100 of them, timed as a whole, in the
    loop thread's own CPU time and in wall time. The CPU time is what the loop spent on other
    work meanwhile (reading the flood): another process's load on the machine does not add to
    it, so the test need not run alone. The wall time catches a loop blocked without computing
    (a blocking read), with room for the scheduler of a busy machine."""
    while not stop.is_set():
        cpu, wall = time.thread_time(), time.monotonic()
        for _ in range(100):
            await asyncio.sleep(0)
        lateness.append((time.thread_time() - cpu, time.monotonic() - wall))
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("newline", [True, False], ids=["100MB-line", "endless-line"])
async def test_a_100_mb_result_line_fails_the_call_restarts_the_server_and_never_stalls_the_loop(
        tmp_path: Path, newline: bool) -> None:
    manager, registry = manager_for({"t": {"command": sys.executable, "args": [TEST_SERVER, "stdio"]}},
                                    call_timeout_s=120)
    await manager.start()
    lateness: list[tuple[float, float]] = []
    stop = asyncio.Event()
    try:
        before = text(await call(registry, "mcp__t__whoami", {}, ToolContext()))
        ticker = asyncio.create_task(_ticker(lateness, stop))
        started = time.monotonic()
        flooded = await call(registry, "mcp__t__flood_stdout", {"megabytes": 100, "newline": newline}, ToolContext())
        took = time.monotonic() - started
        stop.set()
        await ticker
        connection = manager.shared["t"]
        await until(lambda: connection.client is not None, 30, "the restart")
        after = text(await call(registry, "mcp__t__whoami", {}, ToolContext()))
    finally:
        await manager.close()
    assert flooded.is_error and "larger than 4,000,000 bytes (TALON_MCP_MAX_RESULT)" in text(flooded)
    assert "the server is being restarted" in text(flooded)
    assert re.findall(r"start=(\w+)", before) != re.findall(r"start=(\w+)", after)  # another start
    cpu, wall = max(c for c, _ in lateness), max(w for _, w in lateness)
    assert cpu < 0.5, f"another turn waited while the loop computed {cpu:.2f} s"
    assert wall < 2.0, f"another turn took {wall:.2f} s"
    assert took < 30


async def test_a_stderr_flood_leaves_the_log_small_and_says_how_much_was_dropped(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="talon.mcp.t")
    manager, registry = manager_for({"t": {"command": sys.executable, "args": [TEST_SERVER, "stdio"]}},
                                    call_timeout_s=120)
    await manager.start()
    try:
        result = await call(registry, "mcp__t__flood_stderr", {"megabytes": 100}, ToolContext())
        connection = manager.shared["t"]
    finally:
        await manager.close()
    records = [r for r in caplog.records if r.name == "talon.mcp.t"]
    logged = sum(len(r.getMessage()) for r in records)
    assert not result.is_error and "flooded" in text(result)
    assert logged < 2_000_000, f"{logged:,} characters of stderr logged"
    dropped = [r.getMessage() for r in records if "not logged" in r.getMessage()]
    assert dropped and re.search(r"\[[\d,]+ bytes of this server's stderr", dropped[-1])
    total = sum(int(m.group(1).replace(",", "")) for d in dropped if (m := re.search(r"\[([\d,]+) bytes", d)))
    assert total > 90_000_000  # the flood, counted
    assert connection.stderr_tail  # the last lines are still kept for error messages


# --- the red team's run, through a chat ----------------------------------------------------
async def test_a_chat_turn_calling_git_status_on_a_planted_workspace_runs_nothing_of_the_plant(
        tg: Any, llm: Any, tmp_path: Path, token_in_env: str) -> None:
    from tests.conftest import ALICE, make_settings
    from tests.conftest import running_telegram as running
    from tests.fakes.openai_server import FakeOpenAI

    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {
        "git": {"command": "mcp-server-git", "args": ["--repository", "${WORKSPACE}"]}}}))
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_MCP_CONFIG=str(config))
    workspace = settings.workspace_dir("telegram", str(ALICE))
    workspace.mkdir(parents=True)
    canary = tmp_path / "CANARY-outside-the-workspace"
    plant_git(workspace, canary)
    llm.queue(FakeOpenAI.tool_call("mcp__git__git_status", {"repo_path": "."}),
              FakeOpenAI.tool_call("mcp__git__git_diff_unstaged", {"repo_path": "."}),
              lambda body: "said: " + body["messages"][-1]["content"][-400:])
    async with running(settings):
        tg.push_update(tg.text_message(ALICE, "what is the state of my repo?", user_id=ALICE))
        [answer] = await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE),
                                     timeout=60)
    assert not (workspace / "pwned.txt").exists(), (workspace / "pwned.txt").read_text()
    assert not canary.exists()
    assert token_in_env not in answer.params["text"]
    assert "+two" in answer.params["text"] or "a.txt" in answer.params["text"]  # the real diff came back


@pytest.mark.parametrize("kind", ["per_chat", "shared"])
async def test_a_plant_that_does_run_still_sees_no_token(tmp_path: Path, token_in_env: str, kind: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The second wall: with git's guards taken away on purpose, the planted fsmonitor runs, and
    still finds Talon's token in no process it can see (a per-chat server: the sandbox's PID
    namespace and environment; a shared one: its own PID namespace and built environment)."""
    import talon.agent.tools.mcp_launch as launch

    monkeypatch.setattr(launch, "git_guard_env", lambda guard_bin=None: {})
    monkeypatch.setattr(launch, "_GIT_WRAPPER", '#!/bin/sh\nreal=%(real)s\nexec "$real" "$@"\n')
    repo = tmp_path / "ws"
    repo.mkdir()
    plant_git(repo, tmp_path / "canary")
    where = "${WORKSPACE}" if kind == "per_chat" else str(repo)
    manager, registry = manager_for({"git": {"command": "mcp-server-git", "args": ["--repository", where]}})
    await manager.start()
    try:
        await call(registry, "mcp__git__git_status", {"repo_path": "/workspace" if kind == "per_chat" else str(repo)},
                   ctx(repo) if kind == "per_chat" else ToolContext())
    finally:
        await manager.close()
    evidence = (repo / "pwned.txt").read_text()
    assert "fsmonitor ran" in evidence  # the plant ran (the guards were taken away)
    assert "TELEGRAM_BOT_TOKEN" not in evidence and token_in_env not in evidence
    if kind == "per_chat":
        assert "ran as 65534" in evidence and not (tmp_path / "canary").exists()


@pytest.mark.parametrize("how", [["status"], ["diff"], ["add", "-A"], ["log", "-p", "-1"], ["-c", "x.y=1", "diff"]])
@pytest.mark.parametrize("where", ["cwd", "-C", "--git-dir"])
def test_the_git_wrapper_finds_the_repository_however_it_is_named(tmp_path: Path, how: list[str],
                                                                  where: str) -> None:
    """git as a server may run it (the guard's environment, the wrapper first on PATH), from the
    repository, or from elsewhere with ``-C`` or ``--git-dir``/``--work-tree``: nothing planted runs."""
    from talon.agent.tools.mcp_launch import git_guard_env

    repo = tmp_path / "ws"
    repo.mkdir()
    canary = tmp_path / "canary"
    plant_git(repo, canary)
    (repo / "pwn.sh").write_text(PWN.format(canary=canary).replace("pwned.txt", str(repo / "pwned.txt")))
    launcher = Launcher()
    try:
        guard = launcher.guard_dir() / "bin"
        env = {"PATH": f"{guard}:/usr/bin:/bin", "HOME": str(tmp_path)} | git_guard_env(str(guard))
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        prefix = {"cwd": [], "-C": ["-C", str(repo)],
                  "--git-dir": [f"--git-dir={repo / '.git'}", "--work-tree", str(repo)]}[where]
        done = subprocess.run(["git", *prefix, *how], cwd=repo if where == "cwd" else elsewhere, env=env,
                              capture_output=True, text=True, timeout=60)
    finally:
        launcher.close()
    assert not (repo / "pwned.txt").exists(), (repo / "pwned.txt").read_text()
    assert not canary.exists()
    assert done.returncode == 0 or "external diff died" in done.stderr or "cannot run" in done.stderr, done.stderr
