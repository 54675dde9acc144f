"""The tool layer: named tools with a JSON-schema, run by the agent loop.

Tools enforce their own boundaries (the workspace root); the prompt is never the guard.

A tool call gets a ``ToolContext``: what is specific to the chat being served (the read-only
directory holding its archive and saved large outputs) and how much text one result may carry.
Tools that need it override ``invoke``; simple tools implement ``run`` alone.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from talon.agent.providers.base import ToolSpec
from talon.content import ContentBlock, TextBlock, ToolCall
from talon.errors import ToolError

log = logging.getLogger(__name__)


@dataclass
class ToolResult:
    content: list[ContentBlock]
    is_error: bool = False
    # The id of the background job this call started (``delegate(..., background=true)``): the
    # agent loop ends the turn after the step (``talon.agent.loop``).
    job: str | None = None

    @classmethod
    def text(cls, text: str, *, is_error: bool = False) -> "ToolResult":
        return cls(content=[TextBlock(text=text)], is_error=is_error)


@dataclass(frozen=True)
class ToolContext:
    """Per-call facts a tool may need; the defaults suit a call outside any chat."""

    # Directories (absolute) this call may read but never write: the chat's context directory.
    read_only_roots: tuple[Path, ...] = ()
    # Most characters of text one result should carry; longer output is cut with a note saying
    # how to see the rest (context management would otherwise evict it to a file anyway).
    max_output_chars: int = 40_000
    # The workspace of the chat being served (a ``talon.agent.tools.workspace.Workspace``); None: the
    # tool's own. Typed loosely because the workspace module builds on this one.
    workspace: Any = None
    # Seconds a tool's own loops should aim to finish within (the registry enforces its limit
    # from outside anyway).
    time_budget_s: float = 60.0
    # The chat being served (a ``ChatKey``), what the turn was lent (``TurnHooks``: its call
    # guard and approvals) and how deep in delegation the call is (0: the chat's own agent).
    chat: Any = None
    hooks: Any = None
    depth: int = 0


class Tool(abc.ABC):
    name: str
    description: str
    parameters: dict[str, Any]

    @abc.abstractmethod
    async def run(self, args: dict[str, Any]) -> ToolResult: ...

    async def invoke(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Run with the call's context; tools that need none just implement ``run``."""
        return await self.run(args)

    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)

    # Calls of a tool marked ``parallel`` in one step run at the same time (``delegate``).
    parallel: bool = False

    @property
    def offered(self) -> bool:
        """Whether the model is offered this tool now (an MCP server that is down: not, though a
        call still gets an error saying why)."""
        return True

    def time_limit(self, args: dict[str, Any], default: float) -> float:
        """Wall-clock seconds this call may take before the registry stops waiting for it."""
        return default


class ToolSource(abc.ABC):
    """Something that adds tools to a registry from outside Talon (the MCP servers)."""

    @abc.abstractmethod
    async def prepare(self, ctx: ToolContext) -> None: ...

    @abc.abstractmethod
    def status_lines(self) -> list[str]: ...


@dataclass
class ToolRegistry:
    tools: dict[str, Tool] = field(default_factory=dict)
    # Every call is bounded from outside the tool: after this many seconds the agent gets an
    # error and the turn goes on (work in a thread is abandoned; the tools keep theirs bounded).
    timeout_s: float = 60.0
    # Tool sources that live outside Talon (MCP servers): made ready before a turn, and what
    # /status should say about them.
    sources: list["ToolSource"] = field(default_factory=list)

    def add(self, tool: Tool) -> None:
        self.tools[tool.name] = tool

    def specs(self) -> list[ToolSpec]:
        return [t.spec() for t in self.tools.values() if t.offered]

    async def prepare(self, ctx: ToolContext) -> None:
        """Before a turn: let each source start what the chat's tools need (bounded by the source)."""
        for source in self.sources:
            await source.prepare(ctx)

    def status_lines(self) -> list[str]:
        return [line for source in self.sources for line in source.status_lines()]

    async def call(self, call: ToolCall, ctx: ToolContext | None = None) -> ToolResult:
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return ToolResult.text(f"Error: no tool named {call.name!r} (available: {known})", is_error=True)
        try:
            args = call.parsed_arguments()
        except ValueError as exc:
            return ToolResult.text(f"Error: {exc}", is_error=True)
        ctx = ctx or ToolContext()
        limit = tool.time_limit(args, self.timeout_s)
        try:
            return await asyncio.wait_for(tool.invoke(args, ctx), limit)
        except TimeoutError:
            log.warning("tool %s stopped after %.0fs (TALON_TOOL_TIMEOUT)", call.name, limit)
            return ToolResult.text(
                f"Error: {call.name} did not finish within {limit:g}s and was stopped; try a smaller "
                "piece of work (a narrower path or pattern)", is_error=True)
        except ToolError as exc:
            return ToolResult.text(f"Error: {exc}", is_error=True)
        except TypeError as exc:
            return ToolResult.text(f"Error: bad arguments for {call.name}: {exc}", is_error=True)
        except Exception as exc:  # a tool bug must not kill the turn; the agent is told
            log.exception("tool %s failed", call.name)
            return ToolResult.text(f"Error: {call.name} failed: {type(exc).__name__}: {exc}", is_error=True)
