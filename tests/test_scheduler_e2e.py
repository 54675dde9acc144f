"""Scheduled tasks end to end in one process: the fake model calls the tools through the real
OpenAI client, the run goes through the durable inbox and the agent, and its answer reaches the
Bot API fake (private chat, forum topic), or is refused (403) and shows as failed; a repeat runs
on each tick once and stops when cancelled; limits are refused with the reason."""

from __future__ import annotations

import json
import re
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from talon.runtime import Runtime
from talon.storage.tasks import DELIVERED, FAILED
from tests.conftest import ALICE, make_settings
from tests.conftest import running_telegram as running
from tests.fakes.openai_server import FakeOpenAI, last_user_text
from tests.fakes.telegram import Call, FakeTelegram
from tests.support.waiting import until as wait_until

FORUM = -1009876543210
CAROL = 333
BOT = "@talon_test_bot"
SCHEDULED = "[Scheduled task "


def settings_for(tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI, **extra: object) -> Any:
    return make_settings(tmp_path, tg.base_url, llm.base_url, TALON_TASK_POLL_INTERVAL=0.1,
                         TALON_TELEGRAM_STREAMING="off", TALON_TELEGRAM_ALLOWED_CHATS=str(FORUM),
                         TALON_MODEL_DISCOVERY="false", **extra)


def to(chat: int) -> Callable[[Call], bool]:
    return lambda c: str(c.params.get("chat_id")) == str(chat)


def text_is(chat: int, text: str) -> Callable[[Call], bool]:
    return lambda c: str(c.params.get("chat_id")) == str(chat) and c.params.get("text") == text


def tool_results(llm: FakeOpenAI) -> list[str]:
    out = []
    for req in llm.requests:
        for m in req.json["messages"]:
            if m["role"] == "tool" and m["content"] not in out:
                out.append(m["content"] if isinstance(m["content"], str) else json.dumps(m["content"]))
    return out


def scheduled_requests(llm: FakeOpenAI) -> list[str]:
    return [last_user_text(r) for r in llm.requests if SCHEDULED in last_user_text(r)]


def agent(on_scheduled: Callable[[str], Any], tools: dict[str, Callable[[], Any]]) -> Callable[[dict[str, Any]], Any]:
    """A model: a tool call when the person's words start with a key of ``tools``, "Done." after a
    tool result, ``on_scheduled(text)`` for a scheduled run, an echo otherwise."""
    def respond(request: dict[str, Any]) -> Any:
        if request["messages"][-1]["role"] == "tool":
            return "Done."
        text = last_user_text(request)
        if SCHEDULED in text:
            return on_scheduled(text)
        for start, call in tools.items():
            if start in text:
                return call()
        return f"echo: {text}"
    return respond


async def ticks_pass(runtime: Runtime, n: int) -> None:
    """Wait until the scheduler has polled ``n`` more times (each poll would find a due run)."""
    assert runtime.scheduler is not None
    target = runtime.scheduler.ticks + n
    await wait_until(lambda: runtime.scheduler is not None and runtime.scheduler.ticks >= target, 30,
                     f"{n} scheduler polls")


async def test_a_reminder_runs_once_in_the_chat_and_tasks_shows_it_delivered(
        tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI) -> None:
    llm.default_responder = agent(lambda text: "Time to drink water!", {
        "remind me": lambda: FakeOpenAI.tool_call("schedule_task", {"when": "PT2S", "task": "Remind Alice to drink water"}),
    })
    async with running(settings_for(tmp_path, tg, llm)) as runtime:
        tg.push_update(tg.text_message(ALICE, "remind me in 2 seconds to drink water", user_id=ALICE))
        await tg.wait_for("sendMessage", text_is(ALICE, "Done."), timeout=20)
        [scheduled] = tool_results(llm)
        assert scheduled.startswith("Scheduled task ") and "time zone UTC" in scheduled, scheduled
        await tg.wait_for("sendMessage", text_is(ALICE, "Time to drink water!"), timeout=20)
        await ticks_pass(runtime, 5)
        tg.push_update(tg.text_message(ALICE, "/tasks", user_id=ALICE))
        [listing] = await tg.wait_for("sendMessage", lambda c: to(ALICE)(c) and "It is now" in c.params["text"],
                                      timeout=20)
    assert len(tg.sent("sendMessage", ALICE)) == 3  # the confirmation, the reminder once, /tasks
    [run_text] = scheduled_requests(llm)
    assert run_text.endswith("\nRemind Alice to drink water") and "not a new message from the person" in run_text
    text = listing.params["text"]
    assert "'Remind Alice to drink water' (once) \u00b7 done \u00b7 last run" in text and ": delivered" in text, text


async def test_a_task_made_in_a_forum_topic_answers_in_that_topic_without_replying(
        tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI) -> None:
    llm.default_responder = agent(lambda text: "Standup in 5 minutes!", {
        "remind us": lambda: FakeOpenAI.tool_call(
            "schedule_task", {"when": "in 2 seconds", "task": "Tell the topic the standup starts"}),
    })
    async with running(settings_for(tmp_path, tg, llm)) as runtime:
        tg.push_update(tg.text_message(FORUM, f"{BOT} remind us in 2 seconds", user_id=CAROL, username="carol",
                                       first_name="Carol", chat_type="supergroup", is_forum=True,
                                       message_thread_id=7))
        [answer] = await tg.wait_for("sendMessage", text_is(FORUM, "Standup in 5 minutes!"), timeout=20)
        await ticks_pass(runtime, 3)
        tg.push_update(tg.text_message(FORUM, "/tasks", user_id=CAROL, chat_type="supergroup", is_forum=True,
                                       message_thread_id=7))
        tg.push_update(tg.text_message(FORUM, "/tasks", user_id=CAROL, chat_type="supergroup", is_forum=True,
                                       message_thread_id=8))
        listings = await tg.wait_for("sendMessage", lambda c: to(FORUM)(c) and "It is now" in c.params["text"],
                                     count=2, timeout=20)
    assert answer.params.get("message_thread_id") == 7
    assert "reply_parameters" not in answer.params  # a scheduled run replies to no message
    by_topic = {c.params.get("message_thread_id"): c.params["text"] for c in listings}
    assert "delivered" in by_topic[7] and "No scheduled tasks in this chat." in by_topic[8]
    assert len([c for c in tg.sent("sendMessage", FORUM) if c.params["text"] == "Standup in 5 minutes!"]) == 1


async def test_refused_deliveries_show_as_failed_and_three_in_a_row_pause_the_task(
        tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    llm.default_responder = agent(lambda text: "Your quote.", {
        "quotes": lambda: FakeOpenAI.tool_call("schedule_task", {"when": "every PT1S", "task": "Send a quote"}),
    })
    tg.fail_when("sendMessage", lambda p: p.get("text") == "Your quote.", status=403,
                 description="Forbidden: bot was blocked by the user", times=None)
    async with running(settings_for(tmp_path, tg, llm, TALON_TASK_MIN_INTERVAL=1)) as runtime:
        tg.push_update(tg.text_message(ALICE, "quotes every second", user_id=ALICE))
        [notice] = await tg.wait_for("sendMessage", lambda c: to(ALICE)(c) and "I paused" in c.params["text"],
                                     timeout=30)
        assert runtime.scheduler is not None
        store = runtime.scheduler.store
        [task] = await store.for_chat("telegram", str(ALICE), None)
        await ticks_pass(runtime, 20)  # two seconds of polls: it would have run twice more
        tg.push_update(tg.text_message(ALICE, "/tasks", user_id=ALICE))
        [listing] = await tg.wait_for("sendMessage", lambda c: to(ALICE)(c) and "It is now" in c.params["text"],
                                      timeout=20)
        runs = await store.runs(task.id)
    refused = tg.sent("sendMessage", ALICE, include_failed=True)
    # The third failure pauses it; a run already in the inbox by then (a slow machine) still goes.
    assert 3 <= len(runs) <= 4 and [r.status for r in runs] == [FAILED] * len(runs)
    assert len([c for c in refused if c.params.get("text") == "Your quote." and not c.ok]) == len(runs)
    assert all(r.reason.startswith("delivery refused: ") and "Forbidden: bot was blocked by the user" in r.reason
               for r in runs), runs
    text = listing.params["text"]
    assert "PAUSED after 3 failed runs in a row" in text and "failed (delivery refused: " in text, text
    assert f"/tasks resume {task.id}" in notice.params["text"]
    assert caplog.text.count(f"task {task.id} in telegram:{ALICE}: run due") == len(runs)
    assert f"task {task.id} in telegram:{ALICE} paused after 3 failed runs in a row" in caplog.text


async def test_a_repeating_task_runs_on_each_tick_once_until_cancelled(
        tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI) -> None:
    task_ids: list[str] = []
    runs = 0

    def tick(text: str) -> str:
        nonlocal runs
        runs += 1
        return f"Tick {runs}"

    llm.default_responder = agent(tick, {
        "tick every": lambda: FakeOpenAI.tool_call("schedule_task", {"when": "every PT1S", "task": "Say tick"}),
        "stop ticking": lambda: FakeOpenAI.tool_call("cancel_task", {"id": task_ids[0]}),
    })
    async with running(settings_for(tmp_path, tg, llm, TALON_TASK_MIN_INTERVAL=1)) as runtime:
        assert runtime.scheduler is not None
        store = runtime.scheduler.store
        tg.push_update(tg.text_message(ALICE, "tick every second", user_id=ALICE))
        await tg.wait_for("sendMessage", text_is(ALICE, "Tick 3"), timeout=30)
        [task] = await store.for_chat("telegram", str(ALICE), None)
        task_ids.append(task.id)
        tg.push_update(tg.text_message(ALICE, "stop ticking", user_id=ALICE))
        await wait_until(lambda: any("Cancelled task" in t for t in tool_results(llm)), 30, "the cancel")
        done = runs
        await ticks_pass(runtime, 25)  # 2.5 s of polls: two more ticks had it not been cancelled
        history = await store.runs(task.id, limit=100)
    assert runs <= done + 1  # at most the run already in the inbox when it was cancelled
    ticks = [c.params["text"] for c in tg.sent("sendMessage", ALICE) if c.params["text"].startswith("Tick")]
    assert ticks == [f"Tick {n}" for n in range(1, runs + 1)]  # each tick answered once, in order
    assert len(scheduled_requests(llm)) == runs == len(history)
    dues = sorted(r.due for r in history)
    assert all(b - a >= 1.0 and (b - a) % 1.0 < 1e-6 for a, b in zip(dues, dues[1:]))  # one run per tick
    assert all(r.status == DELIVERED for r in history)


async def test_limits_refuse_with_the_reason(tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI) -> None:
    llm.default_responder = agent(lambda text: "ran", {
        "plan": lambda: [FakeOpenAI.tool_call("schedule_task", {"when": "in 1 hour", "task": "first"}),
                         FakeOpenAI.tool_call("schedule_task", {"when": "in 2 hours", "task": "second"})],
        "often": lambda: FakeOpenAI.tool_call("schedule_task", {"when": "every 10 seconds", "task": "spam"}),
        "zone is Berlin": lambda: FakeOpenAI.tool_call("set_timezone", {"timezone": "Berlin"}),
        "in Berlin": lambda: FakeOpenAI.tool_call("set_timezone", {"timezone": "Europe/Berlin"}),
    })
    async with running(settings_for(tmp_path, tg, llm, TALON_TASKS_PER_CHAT=1)):
        for n, words in enumerate(("plan two things", "often please", "zone is Berlin", "I am in Berlin"), start=1):
            tg.push_update(tg.text_message(ALICE, words, user_id=ALICE))
            await tg.wait_for("sendMessage", text_is(ALICE, "Done."), count=n, timeout=20)
        tg.push_update(tg.text_message(ALICE, "/tasks", user_id=ALICE))
        [listing] = await tg.wait_for("sendMessage", lambda c: to(ALICE)(c) and "It is now" in c.params["text"],
                                      timeout=20)
    assert re.search(r"It is now .* CES?T \(time zone Europe/Berlin\)", listing.params["text"]), listing.params["text"]
    results = tool_results(llm)
    assert results[0].startswith("Scheduled task ")
    assert ("Error: not scheduled: this chat already has 1 scheduled tasks, the limit (TALON_TASKS_PER_CHAT): "
            "cancel one first") in results[1]
    assert "more often than the limit of once every 5 min (TALON_TASK_MIN_INTERVAL)" in results[2]
    assert "unknown time zone 'Berlin'" in results[3]
    assert results[4].startswith("This chat's time zone is now Europe/Berlin")
