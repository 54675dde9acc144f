"""Workspace tools on hostile-but-real files, found in review."""

from __future__ import annotations

import json
import re
import tracemalloc
from pathlib import Path

import pytest

from talon.agent.context.pipeline import tombstone
from talon.agent.loop import Agent
from talon.agent.providers.profiles import ModelProfile
from talon.agent.providers.base import ModelRequest, ModelResponse, Provider
from talon.storage.sessions import ChatKey
from talon.storage.embedded.sessions import JsonlSessions
from talon.agent.tools.registry import ToolRegistry
from talon.agent.tools.workspace import Workspace
from talon.agent.tools.workspace_tools import workspace_tools
from talon.storage.embedded.attachments import FileAttachments, FileBlobs
from talon.config import Limits
from talon.content import ImageBlock, Message, ToolCall
from tests.support.providers import Dump
from tests.support.images import make_video
def _tools(tmp_path: Path) -> tuple[Path, ToolRegistry]:
    root = tmp_path / "media_root"
    root.mkdir()
    store = FileAttachments(tmp_path / "data" / "attachments")
    return root, workspace_tools(Workspace(root), store=store, limits=Limits())


async def _call(tools: ToolRegistry, name: str, **args: object):  # type: ignore[no-untyped-def]
    return await tools.call(ToolCall(id="c1", name=name, arguments=json.dumps(args)))


async def test_read_file_of_one_huge_line_stays_in_bounded_memory(tmp_path: Path) -> None:
    # A minified dump or a log without newlines: one 64 MB line must not become a 64 MB string
    # (a 1 GB one would take the bot down).
    root, tools = _tools(tmp_path)
    with open(root / "dump.json", "wb") as fh:
        block = b'{"k":"' + b"v" * (1 << 20) + b'"},'
        for _ in range(64):
            fh.write(block)
        fh.write(b"\nthe second line\n")
    tracemalloc.start()
    try:
        result = await _call(tools, "read_file", path="dump.json")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    text = result.content[0].text
    assert not result.is_error, text
    assert peak < 16_000_000, f"peak {peak / 1e6:.0f} MB"
    assert "dump.json: lines 1-2 of 2" in text and "the second line" in text
    assert f"line cut, {64 * (len(block)) - 2000:,} more characters" in text


async def test_video_frames_from_read_file_say_how_to_see_them_again(tmp_path: Path) -> None:
    # Once old, a frame becomes a tombstone; it must name the video, which read_file can show
    # again, not tell the agent to ask the user to send it.
    root, tools = _tools(tmp_path)
    make_video(root / "clip.mp4", seconds=4)
    result = await _call(tools, "read_file", path="clip.mp4")
    frames = [b for b in result.content if isinstance(b, ImageBlock)]
    assert frames
    note = tombstone(frames[0].ref)
    assert 'read_file with path "clip.mp4"' in note and "ask the user" not in note


async def test_saved_output_is_readable_by_the_path_the_preview_gives_with_relative_dirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The defaults are relative (TALON_DATA_DIR=./.talon, TALON_MEDIA_ROOT=./media_root). The
    # preview of an evicted output (and the summary's archive) named ".talon/sessions/...", which
    # read_file resolves inside the workspace: the agent could never read it back.
    monkeypatch.chdir(tmp_path)
    workspace = Workspace(Path("media_root"))
    store = FileAttachments(Path(".talon") / "attachments")
    sessions = JsonlSessions(Path(".talon"))
    tools = workspace_tools(workspace, store=store)
    tools.add(Dump(60_000))
    agent = Agent(_ScriptedProvider(), sessions, tools=tools, workspace=workspace,
                  profile=ModelProfile(32_000, 2000, True))
    result = await agent.run_turn(ChatKey("telegram", "5"), Message.user("dump, then read it back"), "t1")
    assert result.text == "read it", result.text
    read_back = [m for m in await sessions.load(ChatKey("telegram", "5")) if m.role == "tool"][-1]
    assert not read_back.meta.get("error"), read_back.text
    assert "entry 00000" in read_back.text


class _ScriptedProvider(Provider):
    name = "openai"
    model = "scripted"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        last = request.messages[-1]
        if last.role == "user":
            return ModelResponse(Message(role="assistant", tool_calls=[ToolCall(id="d", name="dump")]))
        saved = re.search(r"saved in (\S+\.txt)", last.text)
        if last.tool_call_id == "d" and saved:
            args = json.dumps({"path": saved.group(1), "limit": 5})
            return ModelResponse(Message(role="assistant", tool_calls=[ToolCall(id="r", name="read_file", arguments=args)]))
        return ModelResponse(Message.assistant("read it" if last.tool_call_id == "r" else f"unexpected: {last.text[:200]}"))
