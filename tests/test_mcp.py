"""MCP servers as tools, end to end with real servers: mcp-server-time and mcp-server-git from PyPI
over stdio, and the SDK's own MCPServer (tests/mcp_test_server.py) over stdio and streamable HTTP
for the misbehaviour cases (a crash mid-call, a hang, images, hostile text). The model is the
loopback fake, driven through the real openai client; chats come through the fake Bot API."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil
import pytest
from PIL import Image

from talon.agent.tools import mcp as mcp_module
from talon.agent.tools.mcp import McpManager, mcp_tool_name
from talon.agent.tools.mcp_config import load_mcp_config, parse_mcp_config
from talon.storage.sessions import ChatKey
from talon.agent.tools.registry import ToolContext, ToolRegistry
from talon.storage.embedded.attachments import FileAttachments as AttachmentStore
from talon.config import Limits, Settings
from talon.content import ImageBlock, ToolCall
from talon.errors import ConfigError
from tests.support.ports import free_port
from tests.conftest import ALICE, BOB, make_settings
from tests.conftest import running_telegram as running
from tests.fakes.openai_server import FakeOpenAI, decode_data_url, image_urls, last_user_text
from tests.fakes.telegram import FakeTelegram
from tests.support.waiting import until

TEST_SERVER = str(Path(__file__).with_name("mcp_test_server.py"))


# --- helpers --------------------------------------------------------------------------------
def mcp_settings(tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI, servers: dict[str, Any],
                 **extra: object) -> Settings:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    return make_settings(tmp_path, tg.base_url, llm.base_url, TALON_MCP_CONFIG=str(path), **extra)


def tool_names(body: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in body.get("tools") or []]


def tool_results(body: dict[str, Any]) -> list[str]:
    """The text of the tool messages of the request's last step."""
    out: list[str] = []
    for message in reversed(body["messages"]):
        if message["role"] != "tool":
            content = message.get("content")
            images_only = isinstance(content, list) and any(p.get("type") == "image_url" for p in content)
            if out or message["role"] != "user" or not images_only:
                break  # a synthetic turn carrying the results' images is skipped, nothing else
            continue
        content = message["content"]
        out.insert(0, content if isinstance(content, str) else "".join(p.get("text", "") for p in content))
    return out


def mcp_children(pattern: str) -> list[psutil.Process]:
    """Live child processes of this test whose command line contains ``pattern``: the servers
    themselves, not the bwrap (or the shell that moves it into a cgroup) they run in."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            command = child.cmdline()
            if child.status() == psutil.STATUS_ZOMBIE or not command or pattern not in " ".join(command):
                continue
            if Path(command[0]).name in ("bwrap", "sh"):
                continue
            found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def to(chat: int) -> Callable[[Any], bool]:
    return lambda call: str(call.params.get("chat_id")) == str(chat)


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=Test", "-c", "user.email=test@example.com", *args], cwd=cwd,
                   check=True, capture_output=True)


# --- the time server over stdio -------------------------------------------------------------
async def test_time_server_tool_is_called_by_the_model_and_its_result_reaches_the_answer(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = mcp_settings(tmp_path, tg, llm, {
        "time": {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"], "denyTools": ["convert_time"]}})
    seen: dict[str, Any] = {}

    def respond(body: dict[str, Any]) -> Any:
        results = tool_results(body)
        if results:
            seen["result"] = results[0]
            stamp = re.search(r'"datetime": "([^"]+)"', results[0])
            return f"In Berlin it is {stamp.group(1) if stamp else 'unknown'}."
        seen["tools"] = tool_names(body)
        return FakeOpenAI.reply(tool_calls=[FakeOpenAI.tool_call("mcp__time__get_current_time",
                                                                 {"timezone": "Europe/Berlin"})])

    llm.default_responder = respond
    async with running(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "what time is it in Berlin?", user_id=ALICE))
        [answer] = await tg.wait_for("sendMessage", to(ALICE), timeout=60)
        assert runtime.mcp is not None
        [time_server] = runtime.mcp.shared.values()
        pid_check = mcp_children("mcp-server-time")
    assert "mcp__time__get_current_time" in seen["tools"] and "web_fetch" in seen["tools"]
    assert "mcp__time__convert_time" not in seen["tools"]  # denyTools
    assert seen["result"].startswith('<<<UNTRUSTED TOOL RESULT server="time" tool="get_current_time">>>')
    assert '"timezone": "Europe/Berlin"' in seen["result"]
    stamp = re.search(r"In Berlin it is (\S+)\.", answer.params["text"])
    assert stamp, answer.params["text"]
    told = datetime.fromisoformat(stamp.group(1))
    assert told.utcoffset() is not None and told.utcoffset().total_seconds() in (3600, 7200)
    assert abs((told - datetime.now(timezone.utc)).total_seconds()) < 600  # the server's clock, now
    assert len(pid_check) == 1 and time_server.state == "stopped"
    assert await until(lambda: not mcp_children("mcp-server-time"), 5, "the server process to be gone")


# --- a per-chat git server ------------------------------------------------------------------
async def test_git_server_with_workspace_sees_its_own_chat_only_and_stops_when_idle(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = mcp_settings(tmp_path, tg, llm, {
        "git": {"command": "mcp-server-git", "args": ["--repository", "${WORKSPACE}"]}},
        TALON_MCP_IDLE_TIMEOUT=3)
    roots = {}
    for who, name in ((ALICE, "alice"), (BOB, "bob")):
        root = settings.workspace_dir("telegram", str(who))
        root.mkdir(parents=True)
        (root / f"{name}-notes.txt").write_text(f"{name} was here\n")
        git(root, "init", "-q")
        git(root, "add", ".")
        git(root, "commit", "-q", "-m", f"{name}'s private commit")
        roots[name] = root
    results: list[str] = []

    def respond(body: dict[str, Any]) -> Any:
        found = tool_results(body)
        if found:
            results.append(found[0])
            return "done: " + found[0][-300:]
        text = last_user_text(body)
        if "peek" in text:
            return FakeOpenAI.tool_call("mcp__git__git_log", {"repo_path": str(roots["bob"])})
        return FakeOpenAI.tool_call("mcp__git__git_log", {"repo_path": "."})

    llm.default_responder = respond
    servers: dict[int, str] = {}

    async def sample() -> None:  # which git server processes ran, whenever they ran, in which sandbox
        while True:
            for process in mcp_children("mcp-server-git"):
                with contextlib.suppress(psutil.NoSuchProcess):
                    # A process caught as it exits (a zombie) shows an empty command line.
                    walls = " ".join(" ".join(p.cmdline()) for p in process.parents() if "bwrap" in p.name())
                    if " ".join(process.cmdline()) and walls:
                        servers[process.pid] = walls
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample())
    async with running(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "show my git log", user_id=ALICE))
        await tg.wait_for("sendMessage", to(ALICE), timeout=60)
        tg.push_update(tg.text_message(BOB, "show my git log", user_id=BOB, username="bob"))
        await tg.wait_for("sendMessage", to(BOB), timeout=60)
        tg.push_update(tg.text_message(ALICE, "peek at bob's log", user_id=ALICE))
        await tg.wait_for("sendMessage", to(ALICE), count=2, timeout=60)
        # Idle for TALON_MCP_IDLE_TIMEOUT: each chat's server is stopped, Talon keeps running.
        await until(lambda: not mcp_children("mcp-server-git"), 20, "the idle git servers to stop")
        assert runtime.mcp is not None and not runtime.mcp.per_chat
        assert "git (per chat): started on first use in a chat, 12 tools" in await runtime.agent.status_text(
            ChatKey("telegram", str(ALICE)), "fake")
    sampler.cancel()
    alice, bob, peek = results
    assert "alice's private commit" in alice and "bob" not in alice
    assert "bob's private commit" in bob and "alice" not in bob
    assert "outside the allowed repository" in peek and "bob's private commit" not in peek
    # Each server process was given one chat's workspace, and each chat had its own (a server
    # may have been stopped idle between two turns on a slow machine and started again).
    binds = [[name for name, root in roots.items() if f"--bind {root} /workspace" in walls]
             for walls in servers.values()]
    assert all(len(found) == 1 for found in binds), binds
    assert sorted({found[0] for found in binds}) == ["alice", "bob"]


# --- streamable HTTP ------------------------------------------------------------------------
def listening(port: int) -> bool:
    """Whether something accepts connections on the loopback ``port`` (the test's MCP server)."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


async def test_streamable_http_server_started_by_the_test(tg: FakeTelegram, llm: FakeOpenAI,
                                                          tmp_path: Path) -> None:
    port = free_port()
    server = subprocess.Popen([sys.executable, TEST_SERVER, "http", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        await until(lambda: listening(port), 30, "the HTTP MCP server to listen")
        settings = mcp_settings(tmp_path, tg, llm, {"remote": {"url": f"http://127.0.0.1:{port}/mcp",
                                                               "allowTools": ["echo", "who*"]}})
        llm.queue(FakeOpenAI.tool_call("mcp__remote__echo", {"text": "over http"}),
                  lambda body: "the server said: " + tool_results(body)[0])
        async with running(settings):
            tg.push_update(tg.text_message(ALICE, "say it over http", user_id=ALICE))
            [answer] = await tg.wait_for("sendMessage", to(ALICE), timeout=60)
        first = llm.requests[0].json
    finally:
        server.terminate()
        server.wait(10)
    assert sorted(n for n in tool_names(first) if n.startswith("mcp__")) == ["mcp__remote__echo",
                                                                            "mcp__remote__whoami"]
    assert f"echo from pid {server.pid}: over http" in answer.params["text"]
    assert 'server="remote"' in answer.params["text"]


async def test_an_http_server_that_goes_away_is_reconnected_when_it_is_back(tmp_path: Path) -> None:
    port = free_port()

    async def serve() -> subprocess.Popen[bytes]:
        process = subprocess.Popen([sys.executable, TEST_SERVER, "http", str(port)], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)

        await until(lambda: listening(port), 30, "the HTTP MCP server to listen")
        return process

    first = await serve()
    registry = ToolRegistry()
    manager = McpManager(parse_mcp_config({"mcpServers": {"h": {"url": f"http://127.0.0.1:{port}/mcp"}}}),
                         registry, store=None, limits=Limits(), call_timeout_s=10)
    second = None
    try:
        await manager.start()
        await registry.prepare(ToolContext())
        crashed = await registry.call(ToolCall(id="1", name="mcp__h__crash", arguments="{}"))
        first.wait(10)
        connection = manager.shared["h"]
        await until(lambda: connection.client is None, 10, "the connection to drop")
        assert not registry.tools["mcp__h__whoami"].offered  # not offered while it is away
        second = await serve()
        await until(lambda: connection.client is not None, 60, "the reconnection")
        again = await registry.call(ToolCall(id="2", name="mcp__h__whoami", arguments="{}"))
    finally:
        await manager.close()
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(10)
    assert crashed.is_error and "stopped during the call to crash" in crashed.content[0].text
    assert not again.is_error and f"pid={second.pid}" in again.content[0].text


# --- crashes, failures, hangs ---------------------------------------------------------------
async def test_a_server_that_crashes_mid_call_gives_a_tool_error_and_is_restarted(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    settings = mcp_settings(tmp_path, tg, llm, {"t": {"command": sys.executable, "args": [TEST_SERVER, "stdio"]}})
    llm.queue(FakeOpenAI.tool_call("mcp__t__crash"),
              lambda body: "the tool broke: " + tool_results(body)[0],
              FakeOpenAI.tool_call("mcp__t__echo", {"text": "again"}),
              lambda body: "now: " + tool_results(body)[0])
    caplog.set_level(logging.INFO)
    async with running(settings) as runtime:
        assert runtime.mcp is not None
        tg.push_update(tg.text_message(ALICE, "crash it", user_id=ALICE))
        [broke] = await tg.wait_for("sendMessage", to(ALICE), timeout=60)
        connection = runtime.mcp.shared["t"]
        await until(lambda: connection.client is not None, 30, "the restarted server")
        tg.push_update(tg.text_message(ALICE, "try again", user_id=ALICE))
        replies = await tg.wait_for("sendMessage", to(ALICE), count=2, timeout=60)
    text = broke.params["text"]
    assert text.startswith("the tool broke: Error: the MCP server 't' stopped during the call to crash")
    assert replies[1].params["text"].startswith("now: ") and "again" in replies[1].params["text"]
    assert "about to crash" in caplog.text  # the server's stderr, in Talon's log under its name
    assert any(r.name == "talon.mcp.t" and "about to crash" in r.getMessage() for r in caplog.records)
    assert "MCP server t stopped working" in caplog.text


async def test_a_server_that_fails_to_start_leaves_talon_running_without_its_tools(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The first retry a minute after the failure, not a second: within the test the broken server
    # stays failed (with a 1 s backoff a loaded machine's /status could catch it starting again).
    monkeypatch.setattr(mcp_module, "_BACKOFF_FIRST_S", 60.0)
    settings = mcp_settings(tmp_path, tg, llm, {
        "broken": {"command": sys.executable,
                   "args": ["-c", "import sys; sys.stderr.write('boom: no API key configured\\n'); sys.exit(2)"]},
        "missing": {"command": "no-such-mcp-server-anywhere"},
        "t": {"command": sys.executable, "args": [TEST_SERVER, "stdio"]},
    })
    caplog.set_level(logging.INFO)
    llm.queue("hello there")
    async with running(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "hi", user_id=ALICE))
        [answer] = await tg.wait_for("sendMessage", to(ALICE), timeout=60)
        tg.push_update(tg.text_message(ALICE, "/status", user_id=ALICE))
        [_, status] = await tg.wait_for("sendMessage", to(ALICE), count=2, timeout=30)
        # A call to a tool of a server that is down gets a tool error saying why.
        assert runtime.mcp is not None
        runtime.mcp._learn(runtime.mcp.configs["broken"], [_remote("anything")])
        result = await runtime.agent.tools.call(ToolCall(id="1", name="mcp__broken__anything", arguments="{}"),
                                                ToolContext())
    assert answer.params["text"] == "hello there"
    names = tool_names(llm.requests[0].json)
    assert "mcp__t__echo" in names and not any("broken" in n or "missing" in n for n in names)
    assert "MCP server broken could not start" in caplog.text and "boom: no API key configured" in caplog.text
    assert "'no-such-mcp-server-anywhere' was not found" in caplog.text
    assert "broken (stdio): failed" in status.params["text"] and "t (stdio): ready" in status.params["text"]
    assert result.is_error and "the MCP server 'broken' is not running" in result.content[0].text
    assert "boom: no API key configured" in result.content[0].text and "tries again in" in result.content[0].text


def _remote(name: str) -> Any:
    from mcp_types import Tool as RemoteTool

    return RemoteTool(name=name, description="a tool", input_schema={"type": "object", "properties": {}})


async def test_stop_cancels_a_hung_call_and_no_server_outlives_talon(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = mcp_settings(tmp_path, tg, llm, {"t": {"command": sys.executable, "args": [TEST_SERVER, "stdio"]},
                                                "clock": {"command": "mcp-server-time"}},
                            TALON_MCP_TIMEOUT=120)
    llm.queue(FakeOpenAI.tool_call("mcp__t__hang"), FakeOpenAI.tool_call("mcp__t__echo", {"text": "x"}),
              lambda body: "fresh: " + tool_results(body)[0])
    async with running(settings) as runtime:
        assert runtime.mcp is not None
        connection = runtime.mcp.shared["t"]
        tg.push_update(tg.text_message(ALICE, "wait for ever", user_id=ALICE))
        await until(lambda: connection.in_flight == 1 and "hanging now" in connection.stderr_tail, 60,
                    "the hung call")
        tg.push_update(tg.text_message(ALICE, "/stop", user_id=ALICE))
        [stopped] = await tg.wait_for("sendMessage", to(ALICE), timeout=10)  # not the 120 s call limit
        assert connection.in_flight == 0
        tg.push_update(tg.text_message(ALICE, "and now?", user_id=ALICE))
        replies = await tg.wait_for("sendMessage", to(ALICE), count=2, timeout=60)
        assert len(mcp_children(TEST_SERVER)) == 1 and len(mcp_children("mcp-server-time")) == 1
    assert stopped.params["text"] == "Stopped."
    assert replies[1].params["text"].startswith("fresh: ")  # the server still answers other calls
    assert await until(lambda: not mcp_children(TEST_SERVER) and not mcp_children("mcp-server-time"), 5,
                       "every MCP server process to be gone after stop")


async def test_a_call_past_the_time_limit_is_an_error_and_the_hung_server_restarts(tmp_path: Path) -> None:
    registry = ToolRegistry()
    configs = parse_mcp_config({"mcpServers": {"t": {"command": sys.executable, "args": [TEST_SERVER, "stdio"]}}})
    manager = McpManager(configs, registry, store=None, limits=Limits(), call_timeout_s=1.5)
    await manager.start()
    try:
        await registry.prepare(ToolContext())
        first_pid = (await registry.call(ToolCall(id="1", name="mcp__t__whoami", arguments="{}"))).content[0].text
        result = await registry.call(ToolCall(id="2", name="mcp__t__hang", arguments="{}"))
        assert result.is_error and "did not answer within 1.5s (TALON_MCP_TIMEOUT)" in result.content[0].text
        connection = manager.shared["t"]
        await until(lambda: connection.client is not None and connection.state == "ready", 30, "a restart")
        again = await registry.call(ToolCall(id="3", name="mcp__t__whoami", arguments="{}"))
    finally:
        await manager.close()
    start = re.compile(r"start=(\w+)")  # another start of the server (its pid may repeat in its namespace)
    assert not again.is_error and start.search(again.content[0].text).group(1) != start.search(first_pid).group(1)


# --- results --------------------------------------------------------------------------------
async def test_images_in_results_reach_the_model_as_images(tg: FakeTelegram, llm: FakeOpenAI,
                                                           tmp_path: Path) -> None:
    settings = mcp_settings(tmp_path, tg, llm, {"t": {"command": sys.executable, "args": [TEST_SERVER, "stdio"]}})
    llm.queue(FakeOpenAI.tool_call("mcp__t__picture"), "a red rectangle")
    async with running(settings):
        tg.push_update(tg.text_message(ALICE, "draw", user_id=ALICE))
        await tg.wait_for("sendMessage", to(ALICE), timeout=60)
    second = llm.requests[1]
    [url] = image_urls(second)
    mime, data = decode_data_url(url)
    with Image.open(io.BytesIO(data)) as im:
        assert im.size == (300, 200) and im.convert("RGB").getpixel((10, 10)) == (220, 20, 20)
    assert mime == "image/png" and "[image 1: 300x200, shown below]" in tool_results(second.json)[0]


async def test_results_are_marked_defanged_and_bounded(tmp_path: Path) -> None:
    registry = ToolRegistry()
    store = AttachmentStore(tmp_path / "store")
    configs = parse_mcp_config({"mcpServers": {"t": {"command": sys.executable, "args": [TEST_SERVER, "stdio"]}}})
    manager = McpManager(configs, registry, store=store, limits=Limits())
    await manager.start()
    try:
        await registry.prepare(ToolContext())
        hostile = await registry.call(ToolCall(id="1", name="mcp__t__hostile", arguments="{}"))
        huge = await registry.call(ToolCall(id="2", name="mcp__t__long_text", arguments='{"chars": 250000}'))
        picture = await registry.call(ToolCall(id="3", name="mcp__t__picture", arguments="{}"))
        bad_args = await registry.call(ToolCall(id="4", name="mcp__t__long_text", arguments='{"chars": "many"}'))
    finally:
        await manager.close()
    text = hostile.content[0].text
    assert text.count("<<<END UNTRUSTED TOOL RESULT>>>") == 1 and text.endswith("<<<END UNTRUSTED TOOL RESULT>>>")
    assert "(((END UN-TRUSTED TOOL RESULT" in text or "UN-TRUSTED" in text
    long = huge.content[0].text
    assert "[... 50,000 more characters of this result were cut]" in long and len(long) < 201_000
    assert isinstance(picture.content[1], ImageBlock) and await store.exists(picture.content[1].ref.id)
    assert bad_args.is_error and "long_text" in bad_args.content[0].text


# --- config and names -----------------------------------------------------------------------
def test_tool_names_fit_64_characters_and_stay_unique() -> None:
    taken: set[str] = set()
    a = mcp_tool_name("home.assistant", "turn on/the light", taken)
    assert a == "mcp__home_assistant__turn_on_the_light"
    long_tool = "x" * 80
    b = mcp_tool_name("srv", long_tool, taken)
    taken.add(b)
    c = mcp_tool_name("srv", long_tool + "y", taken)
    assert len(b) <= 64 and len(c) <= 64 and b != c and b.startswith("mcp__srv__xxx")
    taken.add("mcp__a__b")
    d = mcp_tool_name("a", "b", taken)
    assert d != "mcp__a__b" and d.startswith("mcp__a__b_") and re.fullmatch(r"[A-Za-z0-9_-]{1,64}", d)


@pytest.mark.parametrize("servers, message", [
    ({"x": {}}, 'give either "command"'),
    ({"x": {"command": "a", "url": "http://h/mcp"}}, "not both"),
    ({"x": {"command": "a", "args": "--flag"}}, '"args" must be a list of strings'),
    ({"x": {"command": "a", "env": {"K": 1}}}, '"env" must be an object of strings'),
    ({"x": {"url": "ftp://h/mcp"}}, "http:// or https://"),
    ({"x": {"url": "http://h/mcp", "type": "sse"}}, "'sse' is not supported"),
    ({"x": {"command": "a", "colour": "red"}}, "unknown key(s) colour"),
    ({"bad name!": {"command": "a"}}, "a server name is 1-64 letters"),
    ({"x": {"url": "http://h/${WORKSPACE}"}}, "only for stdio servers"),
    ({"x": {"command": "a", "allowTools": "git_log"}}, '"allowTools" must be a list'),
])
def test_config_mistakes_are_specific(servers: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_mcp_config({"mcpServers": servers}, source="mcp.json")
    assert message in str(caught.value) and "mcp.json" in str(caught.value)


def test_config_file_errors_and_workspace_substitution(tmp_path: Path) -> None:
    assert load_mcp_config(tmp_path / "absent.json", explicit=False) == []
    with pytest.raises(ConfigError, match="does not exist"):
        load_mcp_config(tmp_path / "absent.json", explicit=True)
    broken = tmp_path / "mcp.json"
    broken.write_text('{"mcpServers": {"a": {"command": "x",}}}')
    with pytest.raises(ConfigError, match="not valid JSON: .* at line 1, column"):
        load_mcp_config(broken, explicit=True)
    broken.write_text(json.dumps({"mcpServers": {
        "fs": {"command": "srv", "args": ["--root", "${WORKSPACE}"], "env": {"HOME": "${WORKSPACE}/h"}},
        "shared": {"command": "srv", "allowTools": ["get_*"], "denyTools": ["get_secret"], "autoApprove": []},
        "off": {"command": "srv", "disabled": True},
    }}))
    fs, shared = load_mcp_config(broken, explicit=True)
    assert fs.per_chat and not shared.per_chat
    chat = fs.for_workspace(tmp_path / "ws")
    assert chat.args == ("--root", str(tmp_path / "ws")) and chat.env == {"HOME": f"{tmp_path / 'ws'}/h"}
    assert chat.cwd == str(tmp_path / "ws")
    assert shared.wants("get_time") and not shared.wants("get_secret") and not shared.wants("set_time")


async def test_doctor_lists_each_server_with_state_and_tool_count(tmp_path: Path) -> None:
    from talon.agent.tools.mcp import doctor_rows

    configs = parse_mcp_config({"mcpServers": {
        "time": {"command": "mcp-server-time"},
        "git": {"command": "mcp-server-git", "args": ["--repository", "${WORKSPACE}"]},
        "broken": {"command": sys.executable, "args": ["-c", "raise SystemExit(4)"]},
    }})
    rows = dict(await doctor_rows(configs, start_timeout_s=30))
    assert rows["mcp time"].startswith("ready (stdio): 2 tool(s)")
    assert rows["mcp git"].startswith("per chat (${WORKSPACE}): started in each chat's workspace on first use")
    assert rows["mcp broken"].startswith("FAILED (stdio): ")
    assert not mcp_children("mcp-server-time")


def test_talon_doctor_reads_mcp_json_beside_env_and_lists_each_server(tmp_path: Path) -> None:
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": {
        "time": {"command": "mcp-server-time"},
        "git": {"command": "mcp-server-git", "args": ["--repository", "${WORKSPACE}"]},
        "broken": {"command": sys.executable, "args": ["-c", "import sys; sys.stderr.write('no token\\n'); sys.exit(1)"]},
    }}))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TALON_MODEL": "", "PYTHONPATH": str(Path(__file__).parent.parent)}
    result = subprocess.run([sys.executable, "-m", "talon.cli", "doctor"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    rows = {line.split("  ", 1)[0]: line.split("  ", 1)[1].strip() for line in result.stdout.splitlines() if "  " in line}
    assert rows["mcp config"] == str(tmp_path / "mcp.json")
    assert rows["mcp time"].startswith("ready (stdio): 2 tool(s)")  # found beside Talon's Python
    assert rows["mcp git"].startswith("per chat (${WORKSPACE})")
    assert rows["mcp broken"].startswith("FAILED (stdio): ") and "no token" in rows["mcp broken"]
    assert rows["web fetch"] == "on (private hosts allowed: none)"
    assert result.returncode == 1 and "mcp broken" in result.stderr


def test_an_invalid_mcp_config_stops_talon_at_start_with_the_reason(tmp_path: Path) -> None:
    from talon.runtime import outside_tools

    bad = tmp_path / "servers.json"
    bad.write_text(json.dumps({"mcpServers": {"git": {"command": "mcp-server-git", "args": "--repository"}}}))
    settings = make_settings(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", TALON_MCP_CONFIG=str(bad))
    with pytest.raises(ConfigError, match=r"servers.json: server 'git': \"args\" must be a list of strings"):
        outside_tools(settings, ToolRegistry(), AttachmentStore(tmp_path / "store"))
    missing = make_settings(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9",
                            TALON_MCP_CONFIG=str(tmp_path / "nope.json"))
    with pytest.raises(ConfigError, match="TALON_MCP_CONFIG=.*nope.json: the file does not exist"):
        outside_tools(missing, ToolRegistry(), AttachmentStore(tmp_path / "store"))
