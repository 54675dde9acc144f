"""Sub-agents in the agent alone (talon.agent.tools.delegate with talon.agent.loop): a restart while
a child ran, the depth limit and the task check."""

from __future__ import annotations

import json
from pathlib import Path

from talon.agent.loop import Agent
from talon.agent.providers.base import ModelRequest, ModelResponse, Provider, Usage
from talon.agent.providers.profiles import ModelProfile
from talon.agent.tools.delegate import DelegateTool, SubAgentLimits
from talon.agent.tools.registry import ToolContext, ToolRegistry
from talon.content import Message, ToolCall
from talon.storage.embedded.sessions import JsonlSessions
from talon.storage.sessions import ChatKey

CHAT = ChatKey("telegram", "8")


class Scripted(Provider):
    name, model = "openai", "scripted"

    def __init__(self, *replies: str) -> None:
        self.replies = list(replies)
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        return ModelResponse(message=Message.assistant(self.replies.pop(0)), usage=Usage(10, 2))


def make(tmp_path: Path, provider: Provider, limits: SubAgentLimits | None = None) -> tuple[Agent, DelegateTool]:
    tools = ToolRegistry()
    agent = Agent(provider, JsonlSessions(tmp_path / "data"), tools=tools, profile=ModelProfile(32_000, 2_000, True))
    delegate = DelegateTool(agent, limits)
    tools.add(delegate)
    return agent, delegate


async def test_a_delegation_cut_off_by_a_restart_is_reported_to_the_turn(tmp_path: Path) -> None:
    # The log holds a delegate call without a result: the process died while the child ran.
    provider = Scripted("I will delegate it again later.")
    agent, _ = make(tmp_path, provider)
    call = ToolCall(id="d1", name="delegate", arguments='{"task": "long research"}')
    await agent.sessions.append(CHAT, Message.user("research this", turn_id="t1"),
                                Message(role="assistant", tool_calls=[call], meta={"turn_id": "t1"}))
    result = await agent.run_turn(CHAT, Message.user("research this"), "t1")
    assert result.text == "I will delegate it again later."
    [request] = provider.requests  # no child was started: the only call is the turn's own
    [tool] = [m for m in request.messages if m.role == "tool"]
    assert "restarted while this sub-agent was working" in tool.text


async def test_depth_and_task_are_checked(tmp_path: Path) -> None:
    agent, delegate = make(tmp_path, Scripted(), SubAgentLimits(depth=2))
    registry = agent.tools

    async def call(args: dict[str, object], depth: int) -> str:
        result = await registry.call(ToolCall(id="c", name="delegate", arguments=json.dumps(args)),
                                     ToolContext(chat=CHAT, depth=depth))
        assert result.is_error
        return result.content[0].text

    assert "cannot delegate further (TALON_SUBAGENT_DEPTH=2)" in await call({"task": "x"}, 2)
    assert "task must be" in await call({"task": "  "}, 0)
    assert "no tool 'shell'" in await call({"task": "x", "tools": ["shell"]}, 0)
    # A child one level down may still delegate (depth 2); at the limit it is not offered the tool.
    assert delegate._tool_names(None, 1) == ["delegate"] and delegate._tool_names(None, 2) == []
