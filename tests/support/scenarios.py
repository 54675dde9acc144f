"""Scenarios the chat platforms' end-to-end tests share (Discord, Slack and Matrix: issue 32): the
same scripted model and the same checks of what it was sent or what came back; each test file
keeps how its platform is spoken to (its fake or server, its conversations, its commands)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.fakes.openai_server import FakeOpenAI, last_user_text

SCHEDULED = "[Scheduled task "  # how a scheduled task's run reaches the model
STANDUP = "Standup in 5 minutes!"  # what the standup agent answers a scheduled run with


def scripted_agent(tools: dict[str, Callable[[], Any]], on_scheduled: str) -> Callable[[dict[str, Any]], Any]:
    """A model that calls ``tools[start]()`` for a message containing ``start``, answers a
    scheduled run with ``on_scheduled``, "Done." after a tool, and echoes anything else."""
    def respond(request: dict[str, Any]) -> Any:
        if request["messages"][-1]["role"] == "tool":
            return "Done."
        text = last_user_text(request)
        if SCHEDULED in text:
            return on_scheduled
        for start, call in tools.items():
            if start in text:
                return call()
        return f"echo: {text}"
    return respond


def standup_agent() -> Callable[[dict[str, Any]], Any]:
    """"remind us ..." schedules a task in 2 seconds; its run answers ``STANDUP``."""
    return scripted_agent({"remind us": lambda: FakeOpenAI.tool_call(
        "schedule_task", {"when": "in 2 seconds", "task": "Tell the thread the standup starts"})}, STANDUP)


def assert_heard_the_fox(llm: FakeOpenAI) -> None:
    """The first turn carried the transcript of tests/fixtures/speech_fox.ogg, marked as one."""
    text = last_user_text(llm.requests[0]).lower()
    for word in ("quick", "brown", "fox", "lazy", "dog"):
        assert word in text, text
    assert "transcri" in text


def assert_command_answers(status: str, usage: str, tasks: str, new: str) -> None:
    """The answers to /status, /usage, /tasks and /new in a chat with one turn and no tasks."""
    assert "fake-model" in status
    assert "token" in usage.lower() or "call" in usage.lower(), usage
    assert "No scheduled tasks in this chat." in tasks
    assert new.startswith("Started a new conversation")
