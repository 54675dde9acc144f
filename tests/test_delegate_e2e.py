"""Sub-agents end to end (talon.agent.tools.delegate): Talon with its Telegram channel against the
fake OpenAI-compatible model. The child's requests are told apart by the sub-agent note in their
system prompt."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from talon.agent.tools.delegate import DelegateTool
from tests.conftest import ALICE, make_settings
from tests.conftest import running_telegram as running
from tests.fakes.openai_server import FakeOpenAI, Req
from tests.fakes.telegram import FakeTelegram


def to_alice(c) -> bool:
    return str(c.params.get("chat_id")) == str(ALICE)


def is_child(req: Req | dict[str, Any]) -> bool:
    body = req.json if isinstance(req, Req) else req
    return "You are a sub-agent" in str(body["messages"][0]["content"])


def tool_names(req: Req) -> list[str]:
    return [t["function"]["name"] for t in req.json.get("tools", [])]


def task_of(body: dict[str, Any]) -> str:
    return str(body["messages"][1]["content"])


async def test_a_child_gets_the_task_alone_and_its_answer_comes_back(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, tg.base_url, llm.base_url)
    llm.queue("Noted.",
              FakeOpenAI.tool_call("delegate", {"task": "Write the capital of France into capital.txt."}),
              FakeOpenAI.tool_call("write_file", {"path": "capital.txt", "content": "Paris\n"}),
              "The capital is Paris; it is in capital.txt.",
              "The sub-agent says: Paris.")
    async with running(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "my locker code is 4417-SECRET", user_id=ALICE))
        await tg.wait_for("sendMessage", to_alice)
        tg.push_update(tg.text_message(ALICE, "find out the capital of France", user_id=ALICE))
        await tg.wait_for("sendMessage", to_alice, count=3)
        tg.push_update(tg.text_message(ALICE, "/usage", user_id=ALICE))
        _, line, *replies = await tg.wait_for("sendMessage", to_alice, count=4)
        workspace = settings.workspace_dir("telegram", str(ALICE))
        assert (workspace / "capital.txt").read_text() == "Paris\n"  # the same workspace as the parent
        metrics = runtime.bridge.metrics
        assert metrics is not None
        child_calls = metrics.registry.get_sample_value("talon_model_calls_total",
                                                        {"model": "fake-model", "purpose": "subagent"})
    _, parent, child1, child2, final = llm.requests
    assert "delegate" in tool_names(parent) and not is_child(parent)
    # The child: the task and nothing of the parent's conversation, and no delegate to call.
    assert is_child(child1) and [m["role"] for m in child1.json["messages"]] == ["system", "user"]
    assert task_of(child1.json) == "Write the capital of France into capital.txt."
    assert "4417-SECRET" not in json.dumps(child1.json) and "4417-SECRET" not in json.dumps(child2.json)
    assert "delegate" not in tool_names(child1) and "write_file" in tool_names(child1)
    # Its answer (and the file it wrote) is the parent's tool result.
    [result] = [m for m in final.json["messages"] if m["role"] == "tool"]
    assert "The capital is Paris" in result["content"] and "Files it wrote: capital.txt" in result["content"]
    # The chat saw one line about the delegation, then the answer (not the child's words).
    assert line.params["text"] == "↳ Delegated to a sub-agent: Write the capital of France into capital.txt."
    assert replies[0].params["text"] == "The sub-agent says: Paris."
    # The child's calls are the person's usage: 5 model calls, 2 of them the child's.
    assert child_calls == 2
    assert "in 5 model calls" in replies[1].params["text"]


async def test_three_delegations_in_one_step_run_at_the_same_time(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, tg.base_url, llm.base_url)
    arrived: list[str] = []
    all_there = asyncio.Event()

    async def child(body: dict[str, Any]) -> str:
        # Each child answers only once all three are waiting: run one after another, the first
        # would wait for ever (and the test fail on its timeout).
        arrived.append(task_of(body))
        if len(arrived) == 3:
            all_there.set()
        await asyncio.wait_for(all_there.wait(), 20)
        return f"done: {task_of(body)}"

    tasks = ["count the apples", "count the pears", "count the plums"]
    llm.queue(FakeOpenAI.reply(tool_calls=[FakeOpenAI.tool_call("delegate", {"task": t}) for t in tasks]),
              child, child, child, "All three are counted.")
    async with running(settings):
        tg.push_update(tg.text_message(ALICE, "count the fruit", user_id=ALICE))
        *lines, reply = await tg.wait_for("sendMessage", to_alice, count=4)
    assert reply.params["text"] == "All three are counted."
    assert sorted(x.params["text"] for x in lines) == sorted(f"↳ Delegated to a sub-agent: {t}" for t in tasks)
    assert sorted(arrived) == sorted(tasks)
    results = [m["content"] for m in llm.requests[-1].json["messages"] if m["role"] == "tool"]
    assert results == [f"done: {t}" for t in tasks]  # in the order the model asked


async def test_stop_ends_a_delegation_within_two_seconds(tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, tg.base_url, llm.base_url)
    never = asyncio.Event()

    async def stuck(body: dict[str, Any]) -> str:
        await never.wait()
        return "too late"

    llm.queue(FakeOpenAI.tool_call("delegate", {"task": "think for ever"}), stuck)
    async with running(settings) as runtime:
        delegate = runtime.agent.tools.tools["delegate"]
        assert isinstance(delegate, DelegateTool)
        tg.push_update(tg.text_message(ALICE, "go", user_id=ALICE))
        requests = await llm.wait_for_requests(2)
        assert is_child(requests[1]) and delegate.running == 1
        stopped_at = time.monotonic()
        tg.push_update(tg.text_message(ALICE, "/stop", user_id=ALICE))
        while delegate.running and time.monotonic() - stopped_at < 2.0:
            await asyncio.sleep(0.01)
        took = time.monotonic() - stopped_at
        replies = await tg.wait_for("sendMessage", lambda c: to_alice(c) and c.params["text"] == "Stopped.")
        never.set()
    assert delegate.running == 0 and took < 2.0, f"the child still ran {took:.2f}s after /stop"
    assert any(r.params["text"] == "Stopped." for r in replies)


async def test_a_childs_risky_call_asks_in_the_chat_like_any_other(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_SHELL_TOOL=True,
                             TALON_TELEGRAM_STREAMING="off")  # the default approvals: the shell asks
    llm.queue(FakeOpenAI.tool_call("delegate", {"task": "make child.txt with the shell"}),
              FakeOpenAI.tool_call("shell", {"command": "echo child > child.txt"}),
              "Made child.txt.", "The sub-agent made child.txt.")
    made = settings.workspace_dir("telegram", str(ALICE)) / "child.txt"
    async with running(settings):
        tg.push_update(tg.text_message(ALICE, "have a helper make a file", user_id=ALICE))
        [prompt] = await tg.wait_for("sendMessage", lambda c: to_alice(c) and bool(c.params.get("reply_markup")))
        assert "echo child > child.txt" in prompt.params["text"] and not made.exists()
        approve = {b["text"]: b["callback_data"] for row in prompt.params["reply_markup"]["inline_keyboard"]
                   for b in row}["Approve"]
        tg.push_update(tg.press_button(ALICE, prompt.result["message_id"], approve, user_id=ALICE, first_name="Alice"))
        await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "The sub-agent made child.txt.")
    assert made.read_text() == "child\n"
    assert is_child(llm.requests[1]) and is_child(llm.requests[2])
