"""A scripted conversation of several hundred turns, full of images and large tool output.

Every request stays inside the model's window, the archive grows with each summary, the agent
reads its archive (and an evicted tool output) back with read_file / grep, and the session log
never holds base64.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

from PIL import Image

from talon.agent.loop import Agent
from talon.agent.providers.profiles import ModelProfile
from talon.agent.providers.base import ModelRequest, ModelResponse, Provider, Usage
from talon.storage.sessions import ChatKey
from talon.storage.embedded.sessions import JsonlSessions
from talon.agent.context.session import is_checkpoint
from talon.agent.context.summary import SUMMARY_SYSTEM
from talon.agent.context.tokens import estimate_request
from talon.agent.tools.registry import Tool, ToolResult
from talon.agent.tools.workspace import Workspace
from talon.agent.tools.workspace_tools import workspace_tools
from talon.storage.embedded.attachments import FileAttachments
from talon.content import ImageBlock, Message, TextBlock, ToolCall

CHAT = ChatKey("telegram", "4242")
WINDOW = 16_000
MAX_OUTPUT = 1_000
TURNS = 320
SECRET = "PINEAPPLE-42"
BASE64_RUN = re.compile(r"[A-Za-z0-9+/]{120,}={0,2}")


class Dump(Tool):
    name = "fetch_log"
    description = "fetch the service log"
    parameters = {"type": "object", "properties": {"service": {"type": "string"}}}

    async def run(self, args: dict[str, Any]) -> ToolResult:
        service = args.get("service", "svc")
        return ToolResult.text("\n".join(f"{service} entry {i:05d}: request served in {i % 97} ms" for i in range(1500)))


def png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (48 + seed, 32 + seed), ((seed * 37) % 256, (seed * 91) % 256, 128)).save(buf, "PNG")
    return buf.getvalue()


class ScriptedModel(Provider):
    """Plays the model: a tool action per turn, then an answer; writes summaries when asked."""

    name, model = "openai", "scripted"

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []
        self.summaries = 0
        self.turn = 0
        self.step = 0
        self.seen_results: list[str] = []

    def call(self, name: str, **args: Any) -> ModelResponse:
        return ModelResponse(message=Message(role="assistant", tool_calls=[
            ToolCall(id=f"c{self.turn}-{self.step}", name=name, arguments=json.dumps(args))]))

    def say(self, text: str) -> ModelResponse:
        return ModelResponse(message=Message.assistant(text),
                             usage=Usage(input_tokens=estimate_request(self.requests[-1]), output_tokens=20))

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        if request.system == SUMMARY_SYSTEM:
            self.summaries += 1
            prompt = request.messages[-1].text
            assert "base64" not in prompt and "data:image" not in prompt
            # A verbose summarizer: the summary budget must hold it anyway.
            return ModelResponse(message=Message.assistant(f"- summary {self.summaries}: " + "detail. " * 900))
        self.step += 1
        last = request.messages[-1]
        if last.role == "tool":
            self.seen_results.append(last.text)
        k = self.turn
        if k == TURNS:  # the final question: look in the archive
            archive = re.search(r"archive (/\S+?\.archive\.md)", request.messages[0].text)
            assert archive, "the summary must name the archive"
            if self.step == 1:
                return self.call("grep", pattern=SECRET, path=archive.group(1))
            if self.step == 2:
                return self.call("read_file", path=archive.group(1), offset=1, limit=40)
            return self.say("The code was in the archive.")
        if self.step == 1:
            action = k % 5
            if action == 0:
                return self.call("fetch_log", service=f"svc{k}")
            if action == 1:
                return self.call("read_file", path=f"pics/p{k % 7}.png")
            if action == 2:
                return self.call("write_file", path=f"notes/turn{k}.md", content=f"# Turn {k}\n" + "note line\n" * 800)
            if action == 3:
                return self.call("glob", pattern="**/*.md")
            return self.say(f"Answer to turn {k}.")
        if self.step == 2 and k % 20 == 0 and "saved in" in last.text:
            saved = re.search(r"saved in (/\S+\.txt)", last.text)
            assert saved
            return self.call("read_file", path=saved.group(1), offset=1000, limit=3)
        return self.say(f"Done with turn {k}.")


async def test_hundreds_of_turns_stay_in_the_window_and_the_archive_can_be_read(tmp_path: Path) -> None:
    root = tmp_path / "media_root"
    workspace = Workspace(root)
    store = FileAttachments(tmp_path / "data" / "attachments")
    sessions = JsonlSessions(tmp_path / "data")
    (root / "pics").mkdir(parents=True)
    (root / "inbox").mkdir()
    for i in range(7):
        (root / "pics" / f"p{i}.png").write_bytes(png(i))
    tools = workspace_tools(workspace, store=store)
    tools.add(Dump())
    model = ScriptedModel()
    agent = Agent(model, sessions, tools=tools, workspace=workspace,
                  profile=ModelProfile(WINDOW, MAX_OUTPUT, True))

    archive = sessions.archive_path(CHAT, "main")
    sizes: list[int] = []
    for k in range(TURNS):
        model.turn, model.step = k, 0
        photo = png(k % 11)
        (root / "inbox" / f"photo{k}.png").write_bytes(photo)
        ref = (await store.put_bytes(photo, mime="image/png", name=f"photo{k}.png")).model_copy(
            update={"path": f"inbox/photo{k}.png"})
        text = f"turn {k}: what about this photo?" + (f" The secret code is {SECRET}." if k == 1 else "")
        user = Message(role="user", content=[TextBlock(text=text), ImageBlock(ref=ref)])
        await agent.run_turn(CHAT, user, turn_id=f"t{k}")
        sizes.append(archive.stat().st_size if archive.exists() else 0)

    model.turn, model.step = TURNS, 0
    result = await agent.run_turn(CHAT, Message.user("final question: what was the secret code?"), "final")
    assert result.text == "The code was in the archive."

    # Every request, summaries included, fits the window with its reply reservation.
    assert len(model.requests) > 1.5 * TURNS
    for request in model.requests:
        assert estimate_request(request) + (request.max_output_tokens or 0) <= WINDOW
        assert all(m.meta in ({}, {"error": True}) for m in request.messages)
        assert sum(len(m.images()) for m in request.messages) <= 20
    # Summaries happened many times and the archive only ever grew.
    checkpoints = sum(is_checkpoint(m) for m in await sessions.load(CHAT))
    assert model.summaries >= 10 and checkpoints >= 10
    assert sizes == sorted(sizes) and len(set(sizes)) > 10
    text = archive.read_text()
    assert SECRET in text and "turn 0: what about this photo?" in text
    assert text.count("<!-- talon:archived") == checkpoints
    assert "[image inbox/photo0.png" in text  # images are described in the archive, not embedded
    # The agent read it back: grep found the code, read_file showed the archive.
    grep_result, read_result = model.seen_results[-2:]
    assert SECRET in grep_result and "main.archive.md:" in grep_result
    assert "# Conversation archive" in read_result
    # An evicted tool output was read back from its file.
    assert any("svc20 entry 00999" in r or "entry 00999" in r for r in model.seen_results)
    # The log is complete and holds no base64.
    log = await sessions.load(CHAT)
    assert sum(1 for m in log if m.role == "user" and m.meta.get("turn_id")) == TURNS + 1
    raw = sessions.thread_path(CHAT).read_text()
    assert "data:image" not in raw and "base64" not in raw
    assert BASE64_RUN.search(raw) is None
    assert len(raw) < 30_000_000
    status = await agent.status_text(CHAT, "openai:scripted")
    assert "summaries so far" in status and "reported by the provider" in status
