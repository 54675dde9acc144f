"""A catastrophic pattern cannot freeze the bot, and no tool call can run for ever."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from talon.agent.tools.registry import Tool, ToolContext, ToolRegistry, ToolResult
from talon.config import Settings
from talon.content import ToolCall
from tests.conftest import ALICE, BOB
from tests.fakes.openai_server import FakeOpenAI, last_user_text
from tests.fakes.telegram import FakeTelegram
from tests.conftest import running_telegram as running
EVIL = "(a+)+$"  # exponential for a backtracking engine on a line of a's that ends in b


async def test_another_chat_is_answered_while_a_catastrophic_grep_runs(
    tg: FakeTelegram, llm: FakeOpenAI, settings: Settings
) -> None:
    alice_ws = settings.workspace_dir("telegram", str(ALICE))
    alice_ws.mkdir(parents=True)
    line = b"a" * 48 + b"b\n"  # 49 characters: Python's re needs years for one such line
    for n in range(6):
        (alice_ws / f"log{n}.txt").write_bytes(line * (9_900_000 // len(line)))
    seen: dict[str, Any] = {}

    def respond(request: dict[str, Any]) -> Any:
        messages = request["messages"]
        if messages[-1]["role"] == "tool":  # Alice's grep is done: was Bob answered meanwhile?
            seen["bob_answered_during_grep"] = bool(tg.sent("sendMessage", chat_id=BOB))
            seen["grep_result"] = messages[-1]["content"]
            return "no such lines"
        if "bob" in last_user_text(request):
            seen["bob_asked_at"] = time.monotonic()
            return "hi bob"
        seen["grep_started_at"] = time.monotonic()
        return FakeOpenAI.reply(tool_calls=[FakeOpenAI.tool_call("grep", {"pattern": EVIL})])

    llm.default_responder = respond
    async with running(settings):
        tg.push_update(tg.text_message(ALICE, "find the bad lines", user_id=ALICE))
        while "grep_started_at" not in seen:
            await asyncio.sleep(0.01)
        tg.push_update(tg.text_message(BOB, "hello from bob", user_id=BOB, username="bob"))
        [to_bob] = await tg.wait_for("sendMessage", lambda c: str(c.params["chat_id"]) == str(BOB), timeout=30)
        await tg.wait_for("sendMessage", lambda c: str(c.params["chat_id"]) == str(ALICE), timeout=60)
    assert to_bob.params["text"] == "hi bob"
    assert seen["bob_answered_during_grep"], "Bob waited for Alice's grep to finish"
    assert "No matches" in seen["grep_result"]  # the 1.2M hostile lines were all searched


class _Stuck(Tool):
    name = "stuck"
    description = "never finishes"
    parameters: dict[str, Any] = {"type": "object", "properties": {}}

    async def run(self, args: dict[str, Any]) -> ToolResult:
        await asyncio.to_thread(time.sleep, 3.0)  # a thread nobody can cancel
        await asyncio.sleep(3600)
        return ToolResult.text("unreachable")


async def test_every_tool_call_has_a_wall_clock_limit_enforced_from_outside() -> None:
    registry = ToolRegistry(timeout_s=0.5)
    registry.add(_Stuck())
    started = time.monotonic()
    result = await registry.call(ToolCall(id="1", name="stuck", arguments="{}"), ToolContext())
    took = time.monotonic() - started
    assert result.is_error and "did not finish within 0.5s" in result.content[0].text
    assert took < 3.0  # returned at its limit, not when the thread let go


def test_grep_speaks_re2_and_says_so_for_what_re2_does_not_do(tmp_path: Path) -> None:
    from talon.agent.tools.workspace import Workspace
    from talon.agent.tools.workspace_tools import workspace_tools

    (tmp_path / "notes.md").write_text("alpha\nBeta\n")
    tools = workspace_tools(Workspace(tmp_path), store=None)

    def grep(**args: Any) -> str:
        result = asyncio.run(tools.call(ToolCall(id="1", name="grep", arguments=json.dumps(args))))
        return result.content[0].text

    assert grep(pattern="^b", ignore_case=True) == "notes.md:2: Beta"
    assert "RE2 syntax" in grep(pattern=r"(a)\1")


def test_sigterm_during_a_long_grep_stops_talon_within_its_stop_grace(tmp_path: Path) -> None:
    import signal

    from tests.conftest import TOKEN, settings_env
    from tests.support.process import start_talon
    ws = tmp_path / "media_root" / "telegram" / str(ALICE)
    ws.mkdir(parents=True)
    for n in range(4):  # 20 million short lines: far longer than the 10 s stop grace to search
        (ws / f"big{n}.txt").write_bytes(b"a\n" * 5_000_000)
    with FakeTelegram(token=TOKEN) as tg, FakeOpenAI() as llm:
        llm.queue(FakeOpenAI.reply(tool_calls=[FakeOpenAI.tool_call("grep", {"pattern": "b"})]))
        proc, log_path = start_talon(tmp_path, settings_env(tmp_path, tg.base_url, llm.base_url), "run.log")
        try:
            tg.push_update(tg.text_message(ALICE, "search it all", user_id=ALICE))
            llm.wait_for_requests_sync(1, timeout=30)
            time.sleep(1.5)  # the grep is running in its worker thread now
            assert proc.poll() is None
            proc.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            code = proc.wait(timeout=60)
            took = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    # Bridge.stop cancels the turn; the grep sees its stop flag within 1,024 lines, so the
    # interpreter's exit does not wait for the thread to finish its 20-second budget.
    assert code == 0, log_path.read_text()
    assert took < 10.0 + 5.0, f"stopped {took:.1f}s after SIGTERM"
    assert len(llm.requests) == 1  # the turn was cut off, not finished
