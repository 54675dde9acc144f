"""Sub-agents: ``delegate(task, tools?)`` runs a child agent with a fresh context and returns its
final answer as the tool's result.

The child starts from the task text alone (no conversation history, no ``AGENTS.md``), with the
base system prompt, the workspace guide and the chat's skills list, and a note that it works for
another agent. It is offered the parent's tools (or the subset ``tools`` names) minus
``delegate`` itself once it is as deep as ``TALON_SUBAGENT_DEPTH`` allows (1: children never
delegate). It works in the same workspace, on the same model (the one in use, so failover holds)
or ``TALON_SUBAGENT_MODEL``.

The chat is shown one line per delegation ("↳ Delegated to a sub-agent: <the task's start>"),
not the child's stream. Everything the turn was lent holds for the child too: its model calls go through the turn's call
guard (``talon.agent.hooks``: the caps and usage of the person who asked; ``purpose`` is
"subagent"), its tool calls through the turn's approvals (asked in the chat), and it runs inside
the tool call, so ``/stop`` (which cancels the turn) cancels the child's model request at once.
At most ``TALON_SUBAGENTS`` children run at once per chat (more wait), each for at most
``TALON_SUBAGENT_TIMEOUT`` seconds. Several ``delegate`` calls in one step run in parallel (the
tool is ``parallel``; ``talon.agent.loop``).

The child's own messages are not kept in the chat's log: the parent gets its final answer and the
files it wrote, which is what the parent's next step needs. A child cut off by a restart is
reported to the resumed turn as such (``talon.agent.loop``), never started again unseen.

``background=true`` makes it a durable background job instead (``talon.jobs``): the call returns
the job's id at once (``ToolResult.job``), the agent loop ends the turn after that step, and the
bridge runs the same child later, beside the chat's turns.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from talon.agent.context.memory import build_system_prompt, workspace_guide
from talon.agent.hooks import model_call
from talon.agent.providers.base import ModelRequest, Provider, ToolSpec
from talon.agent.tools.registry import Tool, ToolContext, ToolResult
from talon.content import Message, ToolCall
from talon.errors import ProviderError, ToolError

if TYPE_CHECKING:
    from talon.agent.loop import Agent

log = logging.getLogger(__name__)

SUBAGENT_NOTE = (
    "## Sub-agent\n"
    "You are a sub-agent: another agent handed you the task below and will read your final answer "
    "(nobody else sees this conversation, and you cannot ask questions back). Do the task with your "
    "tools, then answer with the result in full: what you found or did, and the paths of files you "
    "wrote. Keep to the task."
)
_WRITES = ("write_file", "edit_file")


@dataclass(frozen=True)
class SubAgentLimits:
    depth: int = 1  # TALON_SUBAGENT_DEPTH: how deep delegation may go (1: children never delegate)
    at_once: int = 3  # TALON_SUBAGENTS: children running at once per chat
    timeout_s: float = 600.0  # TALON_SUBAGENT_TIMEOUT: one child's wall-clock limit


class DelegateTool(Tool):
    name = "delegate"
    description = (
        "Hand a self-contained task to a sub-agent that starts with a fresh context (it sees only the "
        "task text, not this conversation) and works with your tools in the same workspace; you get "
        "its final answer and the files it wrote. Write the task so it stands alone. Several delegate "
        "calls in one step run in parallel: use it to split independent work."
    )
    parameters = {
        "type": "object",
        "properties": {
            "task": {"type": "string", "description": "The whole task, with every fact the sub-agent needs."},
            "tools": {"type": "array", "items": {"type": "string"},
                      "description": "Optional: only these of your tools (default: all of them)."},
            "background": {"type": "boolean",
                           "description": "Optional: run it as a background job. You get a job id at once and "
                                          "your turn ends after this step; its answer comes to the chat as a message of "
                                          "its own when done (job_status, cancel_job)."},
        },
        "required": ["task"],
    }
    parallel = True

    def __init__(self, agent: "Agent", limits: SubAgentLimits | None = None, *,
                 provider: Provider | None = None) -> None:
        self.agent = agent
        self.limits = limits or SubAgentLimits()
        self.provider = provider  # TALON_SUBAGENT_MODEL; None: the model the agent uses now
        self._slots: dict[Any, asyncio.Semaphore] = {}
        self._users: dict[Any, int] = {}
        self.running = 0  # children running now (all chats)
        self.jobs: Any = None  # talon.jobs.Jobs: background delegation; None: not offered

    def time_limit(self, args: dict[str, Any], default: float) -> float:
        return self.limits.timeout_s + 30.0  # its own limit, plus a wait for a free slot

    async def run(self, args: dict[str, Any]) -> ToolResult:
        return await self.invoke(args, ToolContext())

    async def invoke(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        task = args.get("task")
        if not isinstance(task, str) or not task.strip():
            raise ToolError("task must be the text of the task")
        if ctx.depth >= self.limits.depth:
            raise ToolError(f"a sub-agent cannot delegate further (TALON_SUBAGENT_DEPTH={self.limits.depth})")
        names = self._tool_names(args.get("tools"), ctx.depth + 1)
        if args.get("background") is True:
            return await self._background(task.strip(), args.get("tools") or [], ctx)
        chat = ctx.chat
        slot = self._slots.setdefault(chat, asyncio.Semaphore(self.limits.at_once))
        self._users[chat] = self._users.get(chat, 0) + 1
        try:
            async with slot:
                self.running += 1
                try:
                    async with asyncio.timeout(self.limits.timeout_s):
                        return await self._child(task.strip(), names, replace(ctx, depth=ctx.depth + 1))
                except TimeoutError:
                    log.warning("chat %s: a sub-agent did not finish within %gs (TALON_SUBAGENT_TIMEOUT)", chat,
                                self.limits.timeout_s)
                    return ToolResult.text(f"Error: the sub-agent did not finish within {self.limits.timeout_s:g}s "
                                           "(TALON_SUBAGENT_TIMEOUT) and was stopped; give it a smaller task",
                                           is_error=True)
                finally:
                    self.running -= 1
        finally:
            self._users[chat] -= 1
            if not self._users[chat]:
                del self._users[chat], self._slots[chat]

    async def _background(self, task: str, tools: list[str], ctx: ToolContext) -> ToolResult:
        from talon.envelope import TURN_MESSAGE
        from talon.errors import JobError

        message = TURN_MESSAGE.get()
        if self.jobs is None or message is None or message.job is not None or ctx.depth > 0:
            raise ToolError("background jobs can only be started by the chat's own agent")
        try:
            job = await self.jobs.start(message, task, tools)
        except JobError as exc:
            raise ToolError(str(exc)) from None
        if ctx.hooks is not None and getattr(ctx.hooks, "notice", None) is not None:
            await ctx.hooks.notice(f"↳ Background job {job.id}: {_one_line(task)}")
        started = ToolResult.text(f"Started background job {job.id}. Its answer will arrive in the chat as a "
                                  "message of its own when it is done; job_status and cancel_job take this id. "
                                  "This turn ends after this step.")
        return replace(started, job=job.id)  # the agent loop ends the turn after this step

    def _tool_names(self, wanted: object, depth: int) -> list[str]:
        tools = self.agent.tools.tools if self.agent.tools_available else {}
        offered = [n for n, t in tools.items() if t.offered and (n != self.name or depth < self.limits.depth)]
        if wanted in (None, []):
            return offered
        if not isinstance(wanted, list) or not all(isinstance(w, str) for w in wanted):
            raise ToolError("tools must be a list of tool names")
        unknown = [w for w in wanted if w not in offered]
        if unknown:
            raise ToolError(f"no tool {', '.join(map(repr, unknown))} for a sub-agent (tools: {', '.join(offered)})")
        return list(dict.fromkeys(wanted))

    def _system(self, ctx: ToolContext, names: list[str]) -> str:
        agent = self.agent
        workspace = ctx.workspace
        guide = workspace_guide(sorted(n for n in names if n in _WORKSPACE_TOOLS)) if workspace is not None else ""
        skills = agent.skills.prompt_block(workspace.root if workspace is not None else None) \
            if agent.skills is not None and "load_skill" in names else ""
        base = f"{agent.system_prompt.rstrip()}\n\n{SUBAGENT_NOTE}"
        return build_system_prompt(base, guide, "", skills).text

    async def _child(self, task: str, names: list[str], ctx: ToolContext) -> ToolResult:
        agent = self.agent
        hooks = ctx.hooks
        specs: list[ToolSpec] = [agent.tools.tools[n].spec() for n in names]
        allowed = set(names)
        system = self._system(ctx, names)
        messages: list[Message] = [Message.user(task)]
        written: list[str] = []
        log.info("chat %s: delegated to a sub-agent (depth %d): %.80s", ctx.chat, ctx.depth, task)
        if hooks is not None and getattr(hooks, "notice", None) is not None:
            await hooks.notice(f"↳ Delegated to a sub-agent: {_one_line(task)}")
        for _ in range(agent.max_steps):
            provider = self.provider or agent.provider
            sent = specs
            if agent.tool_budget is not None:  # many tools: the same budget (and find_tools) as the parent
                sent = agent.tool_budget.choose(specs, agent.budget.window, ctx.chat)
            request = ModelRequest(system=system, messages=[_wire(m) for m in messages], tools=sent,
                                   max_output_tokens=agent.budget.max_output)
            try:
                response = await model_call(provider, request, purpose="subagent")
            except ProviderError as exc:
                return ToolResult.text(f"Error: the sub-agent's model failed: {exc}", is_error=True)
            reply = response.message
            messages.append(reply)
            if not reply.tool_calls:
                text = reply.text.strip() or "(the sub-agent gave no answer)"
                files = f"\n\nFiles it wrote: {', '.join(dict.fromkeys(written))}" if written else ""
                return ToolResult.text(f"{text}{files}")
            for call in reply.tool_calls:
                result = await self._tool(call, allowed, ctx, hooks)
                if call.name in _WRITES and not result.is_error:
                    path = _path_of(call)
                    if path:
                        written.append(path)
                messages.append(Message(role="tool", content=result.content, tool_call_id=call.id,
                                        tool_name=call.name, meta={"error": True} if result.is_error else {}))
        return ToolResult.text(f"Error: the sub-agent stopped after {agent.max_steps} steps without finishing",
                               is_error=True)

    async def _tool(self, call: ToolCall, allowed: set[str], ctx: ToolContext, hooks: Any) -> ToolResult:
        if call.name not in allowed:
            return ToolResult.text(f"Error: no tool named {call.name!r} here (tools: {', '.join(sorted(allowed))})",
                                   is_error=True)
        refusal = await hooks.approve(call) if hooks is not None and hooks.approve is not None else None
        if refusal is not None:
            return ToolResult.text(refusal, is_error=True)
        result = await self.agent.tools.call(call, ctx)
        if hooks is not None and hooks.tool_done is not None:
            hooks.tool_done(call.name, "error" if result.is_error else "ok")
        return result


_WORKSPACE_TOOLS = frozenset({"ls", "read_file", "write_file", "edit_file", "glob", "grep", "shell"})


def _one_line(text: str, limit: int = 100) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def _wire(message: Message) -> Message:
    return message.model_copy(update={"meta": {"error": True} if message.meta.get("error") else {}})


def _path_of(call: ToolCall) -> str:
    try:
        path = call.parsed_arguments().get("path")
    except ValueError:
        return ""
    return path if isinstance(path, str) else ""
