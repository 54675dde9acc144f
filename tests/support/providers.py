"""Provider test helpers: a workspace and agent set up in tmp_path, the real SDK providers on the
loopback fakes, a tool with a long output."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from PIL import Image

from talon.agent.loop import Agent
from talon.agent.providers.anthropic import AnthropicProvider
from talon.agent.providers.base import Provider, data_url
from talon.agent.providers.openai import OpenAIProvider
from talon.agent.providers.profiles import ModelProfile
from talon.agent.tools.registry import Tool, ToolResult
from talon.agent.tools.workspace import Workspace
from talon.agent.tools.workspace_tools import workspace_tools
from talon.content import ImageBlock
from talon.storage.embedded.attachments import FileAttachments
from talon.storage.embedded.sessions import JsonlSessions
from talon.storage.sessions import ChatKey
from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.openai_server import FakeOpenAI


CHAT = ChatKey("telegram", "7")


def png(color: tuple[int, int, int] = (220, 20, 20)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), color).save(buf, "PNG")
    return buf.getvalue()


class Dump(Tool):
    """A tool with a large text output (like a long log or a web page)."""

    name = "dump"
    description = "dump a lot of text"
    parameters = {"type": "object", "properties": {}}

    def __init__(self, chars: int) -> None:
        self.chars = chars

    async def run(self, args: dict[str, Any]) -> ToolResult:
        lines = [f"entry {i:05d}: status ok, value {i * 7}" for i in range(self.chars // 20 + 1)]
        return ToolResult.text("\n".join(lines)[: self.chars])


class Setup:
    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "media_root"
        self.workspace = Workspace(self.root)
        self.store = FileAttachments(tmp_path / "data" / "attachments")
        self.sessions = JsonlSessions(tmp_path / "data")
        (self.root / "pic.png").write_bytes(png())

    def hydrate(self, block: ImageBlock) -> str:
        return data_url(block.ref.mime, self.store.blocking.read_bytes(block.ref))

    def agent(self, provider: Provider, profile: ModelProfile | None = None, **kw: Any) -> Agent:
        tools = workspace_tools(self.workspace, store=self.store)
        return Agent(provider, self.sessions, tools=tools, workspace=self.workspace, profile=profile, **kw)


def openai_provider(fake: FakeOpenAI, setup: Setup, **kw: Any) -> OpenAIProvider:
    return OpenAIProvider(kw.pop("model", "gpt-4o"), api_key="k", base_url=fake.base_url, hydrate=setup.hydrate,
                          max_retries=0, **kw)


def anthropic_provider(fake: FakeAnthropic, setup: Setup, **kw: Any) -> AnthropicProvider:
    return AnthropicProvider("claude-fake", api_key="k", base_url=fake.base_url, hydrate=setup.hydrate,
                             max_retries=0, **kw)
