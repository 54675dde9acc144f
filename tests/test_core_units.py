"""Unit tests of the foundation's stores and the agent loop's resume logic (no network)."""

from __future__ import annotations

from pathlib import Path

import pytest

from talon.agent.loop import Agent
from talon.agent.providers.base import ModelRequest, ModelResponse, Provider
from talon.storage.embedded.sessions import JsonlSessions
from talon.storage.sessions import ChatKey
from talon.storage.embedded.attachments import FileAttachments
from talon.config import Settings, normalize_whatsapp_number, split_model
from talon.content import Message, TextBlock, ToolCall
from talon.envelope import InboundMessage
from talon.errors import ConfigError, DownloadTooLarge
from talon.storage.embedded.inbox import SqliteInbox

CHAT = ChatKey("telegram", "42")


class ScriptedProvider(Provider):
    name = "scripted"
    model = "scripted"

    def __init__(self, replies: list[Message]) -> None:
        self.replies = list(replies)
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        return ModelResponse(message=self.replies.pop(0))


async def test_session_append_load_and_torn_line(tmp_path: Path) -> None:
    store = JsonlSessions(tmp_path)
    await store.append(CHAT, Message.user("one"))
    path = store.thread_path(CHAT)
    with open(path, "a") as fh:
        fh.write('{"role": "user", "content": [{"type": "te')  # a crash mid-write
    await store.append(CHAT, Message.user("two"))
    assert [m.text for m in await store.load(CHAT)] == ["one", "two"]


async def test_new_thread_keeps_old_one(tmp_path: Path) -> None:
    store = JsonlSessions(tmp_path)
    await store.append(CHAT, Message.user("old"))
    old = store.thread_path(CHAT)
    await store.new_thread(CHAT)
    assert await store.load(CHAT) == []
    assert old.exists() and "old" in old.read_text()


async def test_inbox_dedup_order_and_progress(tmp_path: Path) -> None:
    inbox = SqliteInbox(tmp_path / "inbox.sqlite3")
    a = InboundMessage(channel="telegram", chat_id="1", sender_id="1", message_id="10", text="a")
    b = InboundMessage(channel="telegram", chat_id="1", sender_id="1", message_id="11", text="b")
    assert await inbox.add(a) is not None
    assert await inbox.add(b) is not None
    assert await inbox.add(a) is None  # duplicate
    await inbox.set_delivered_parts(a.key, 2)
    await inbox.close()
    reopened = SqliteInbox(tmp_path / "inbox.sqlite3")
    pending = await reopened.pending()
    assert [p.message.text for p in pending] == ["a", "b"]
    assert pending[0].delivered_parts == 2
    await reopened.mark_done(a.key)
    assert [p.message.text for p in await reopened.pending()] == ["b"]
    assert await reopened.add(a) is None  # still a duplicate after it was done


async def test_attachment_store_dedup_and_cap(tmp_path: Path) -> None:
    store = FileAttachments(tmp_path)
    r1 = await store.put_bytes(b"hello", mime="text/plain", name="a.txt")
    r2 = store.blocking.put_chunks([b"hel", b"lo"], mime="text/plain", name="b.txt")
    assert r1.id == r2.id and await store.read_bytes(r1) == b"hello"
    with pytest.raises(DownloadTooLarge):
        store.blocking.put_chunks([b"x" * 10, b"y" * 10], mime="application/octet-stream", name="big", limit=15)
    assert list((tmp_path / "tmp").iterdir()) == []  # the partial file is gone


async def test_turn_replay_after_crash_does_not_ask_model_again(tmp_path: Path) -> None:
    sessions = JsonlSessions(tmp_path)
    provider = ScriptedProvider([Message.assistant("first answer")])
    agent = Agent(provider, sessions)
    result = await agent.run_turn(CHAT, Message.user("hi"), turn_id="t1")
    assert result.text == "first answer" and not result.replayed
    # The process died before delivery; the same turn runs again after restart.
    again = await Agent(ScriptedProvider([]), sessions).run_turn(CHAT, Message.user("hi"), turn_id="t1")
    assert again.replayed and again.text == "first answer"
    assert [m.role for m in await sessions.load(CHAT)] == ["user", "assistant"]


async def test_turn_resume_runs_only_unanswered_tool_calls(tmp_path: Path) -> None:
    from talon.agent.tools.registry import Tool, ToolResult

    calls: list[str] = []

    class Echo(Tool):
        name = "echo"
        description = "echo"
        parameters = {"type": "object", "properties": {"v": {"type": "string"}}}

        async def run(self, args: dict) -> ToolResult:
            calls.append(args["v"])
            return ToolResult.text(args["v"])

    sessions = JsonlSessions(tmp_path)
    user = Message(role="user", content=[TextBlock(text="go")], meta={"turn_id": "t"})
    ask = Message(role="assistant", tool_calls=[ToolCall(id="c1", name="echo", arguments='{"v": "a"}'),
                                                 ToolCall(id="c2", name="echo", arguments='{"v": "b"}')],
                  meta={"turn_id": "t"})
    done = Message(role="tool", content=[TextBlock(text="a")], tool_call_id="c1", meta={"turn_id": "t"})
    await sessions.append(CHAT, user, ask, done)  # crashed after the first tool result
    agent = Agent(ScriptedProvider([Message.assistant("done")]), sessions)
    agent.tools.add(Echo())
    result = await agent.run_turn(CHAT, Message.user("go"), turn_id="t")
    assert result.text == "done"
    assert calls == ["b"]
    assert [m.role for m in await sessions.load(CHAT)] == ["user", "assistant", "tool", "tool", "assistant"]


async def test_bad_tool_arguments_reach_the_agent_as_an_error(tmp_path: Path) -> None:
    sessions = JsonlSessions(tmp_path)
    provider = ScriptedProvider([
        Message(role="assistant", tool_calls=[ToolCall(id="c", name="nope", arguments="{broken")]),
        Message.assistant("ok"),
    ])
    await Agent(provider, sessions).run_turn(CHAT, Message.user("x"), turn_id="t")
    tool = [m for m in await sessions.load(CHAT) if m.role == "tool"][0]
    assert tool.text.startswith("Error:") and tool.meta.get("error")


def test_settings_model_checks_name_missing() -> None:
    with pytest.raises(ConfigError) as info:
        Settings(_env_file=None).check_model()
    assert "TALON_MODEL" in info.value.missing
    with pytest.raises(ConfigError) as info:
        Settings(_env_file=None, TALON_MODEL="openai:gpt-4.1-mini").check_model()
    assert info.value.missing == ["OPENAI_API_KEY or OPENAI_BASE_URL"]  # either one is enough
    assert split_model("anthropic:claude-x") == ("anthropic", "claude-x")
    assert normalize_whatsapp_number("whatsapp:+1 (415) 555-0100") == "+14155550100"


async def test_context_settings_reach_the_agent(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from talon.runtime import build_runtime

    settings = Settings(_env_file=None, TALON_MODEL="openai:gpt-4.1-mini", OPENAI_BASE_URL="http://127.0.0.1:9/v1",
                        TALON_DATA_DIR=str(tmp_path / "d"), TALON_MEDIA_ROOT=str(tmp_path / "m"),
                        TALON_CONTEXT_TRIGGER="0.5", TALON_CONTEXT_KEEP_TAIL="0.2", TALON_CONTEXT_IMAGE_TURNS="1")
    runtime = build_runtime(settings)
    try:
        budget = runtime.agent.budget
        assert runtime.agent.policy.image_keep_turns == 1
        assert budget.trigger <= 0.5 * budget.window and budget.keep_tail == int(0.2 * budget.window)
    finally:
        await runtime.stop()
    with pytest.raises(ValidationError):
        Settings(_env_file=None, TALON_CONTEXT_TRIGGER="1.5")


def test_partial_downloads_left_by_a_crash_are_removed_at_start(tmp_path: Path) -> None:
    import os
    import time

    FileAttachments(tmp_path)
    stale = tmp_path / "tmp" / "in-stale"
    fresh = tmp_path / "tmp" / "in-fresh"
    stale.write_bytes(b"half a download")
    fresh.write_bytes(b"a download in progress")
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    FileAttachments(tmp_path)
    assert not stale.exists() and fresh.exists()
