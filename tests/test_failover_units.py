"""Model failover inside the agent (talon.agent.loop): the order, the cool-down, the refit to the
fallback's window, and what happens when every model is down."""

from __future__ import annotations

from pathlib import Path

import pytest

from talon.agent.context.tokens import estimate_request
from talon.agent.loop import Agent, ModelSlot
from talon.agent.providers.base import ModelRequest, ModelResponse, Provider, Usage
from talon.agent.providers.profiles import ModelProfile
from talon.content import Message
from talon.errors import ModelTimedOut, ProviderUnavailable, RateLimited
from talon.storage.embedded.sessions import JsonlSessions
from talon.storage.sessions import ChatKey

CHAT = ChatKey("telegram", "5")


class Scripted(Provider):
    name = "openai"

    def __init__(self, model: str, *outcomes: str | BaseException) -> None:
        self.model = model
        self.outcomes = list(outcomes)
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        outcome = self.outcomes.pop(0) if self.outcomes else f"{self.model} answers"
        if isinstance(outcome, BaseException):
            raise outcome
        return ModelResponse(message=Message.assistant(outcome), usage=Usage(100, 5))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(tmp_path: Path, first: Scripted, *others: tuple[Scripted, ModelProfile]) -> tuple[Agent, Clock]:
    agent = Agent(first, JsonlSessions(tmp_path / "data"), profile=ModelProfile(128_000, 4_000, True),
                  fallbacks=[ModelSlot(f"openai:{p.model}", p, profile) for p, profile in others],
                  fallback_cooldown_s=60, model_label="openai:first")
    clock = Clock()
    agent.clock = clock
    return agent, clock


async def test_order_cool_down_and_return_to_the_first(tmp_path: Path) -> None:
    first = Scripted("first", RateLimited("429 slow down"), "first is back")
    second = Scripted("second", ModelTimedOut("silent for 120 s"))
    third = Scripted("third")
    agent, clock = make(tmp_path, first, (second, ModelProfile(64_000, 4_000, True)),
                        (third, ModelProfile(64_000, 4_000, True)))
    result = await agent.run_turn(CHAT, Message.user("hi"), "t1")
    assert result.text == "third answers"
    assert [len(p.requests) for p in (first, second, third)] == [1, 1, 1]
    # Both failed ones rest; the next turn goes straight to the third.
    result = await agent.run_turn(CHAT, Message.user("again"), "t2")
    assert result.text == "third answers" and len(first.requests) == 1 and len(second.requests) == 1
    status = await agent.status_text(CHAT, "openai:first")
    assert "Model: openai:third, a fallback: openai:first failed (429 slow down); it is tried again in 60s" in status
    clock.now += 61
    result = await agent.run_turn(CHAT, Message.user("and now"), "t3")
    assert result.text == "first is back" and agent.active == 0
    assert "Model: openai:first (" in await agent.status_text(CHAT, "openai:first")


async def test_the_fallback_gets_the_request_fitted_to_its_window(tmp_path: Path) -> None:
    first = Scripted("big", ProviderUnavailable("the model server failed (503)"))
    small = Scripted("small", "short summary of the earlier talk", "small answers")
    agent, _ = make(tmp_path, first, (small, ModelProfile(8_000, 1_000, True)))
    sessions = agent.sessions
    earlier = [m for i in range(16) for m in (Message.user(f"question {i} " + "words " * 200),
                                              Message.assistant(f"answer {i} " + "words " * 200))]
    await sessions.append(CHAT, *earlier)
    result = await agent.run_turn(CHAT, Message.user("the newest question"), "t1")
    assert result.text == "small answers"
    big_request = first.requests[0]
    assert estimate_request(big_request) > 8_000  # all of it fitted the first model's window
    final = small.requests[-1]
    assert estimate_request(final) <= 8_000 - 1_000 and final.max_output_tokens == 1_000
    assert "the newest question" in str(final.messages[-1].content)


async def test_when_every_model_is_down_the_error_stands_and_the_first_is_tried_next(tmp_path: Path) -> None:
    first = Scripted("first", ProviderUnavailable("down"), "first answers")
    second = Scripted("second", ProviderUnavailable("down too"))
    agent, _ = make(tmp_path, first, (second, ModelProfile(64_000, 4_000, True)))
    with pytest.raises(ProviderUnavailable, match="down too"):
        await agent.run_turn(CHAT, Message.user("hi"), "t1")
    # All rest: the first is asked first (never nothing at all).
    result = await agent.run_turn(CHAT, Message.user("hi"), "t1")
    assert result.text == "first answers" and len(second.requests) == 1


async def test_one_model_alone_behaves_as_before(tmp_path: Path) -> None:
    only = Scripted("only", ProviderUnavailable("down"))
    agent, _ = make(tmp_path, only)
    with pytest.raises(ProviderUnavailable):
        await agent.run_turn(CHAT, Message.user("hi"), "t1")
    assert agent.answered_by.get(CHAT) is None and "Last answer by" not in await agent.status_text(CHAT, "x")

