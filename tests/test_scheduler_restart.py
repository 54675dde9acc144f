"""Scheduled tasks across crashes and workers: `talon run` as real processes against the Bot API and
OpenAI fakes. A task scheduled before a SIGKILL runs once after the restart; a run cut off by a
SIGKILL while it was being answered is answered once after it; two workers on one PostgreSQL run a
due task once."""

from __future__ import annotations

import signal
import sqlite3
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import ALICE, TOKEN, settings_env
from tests.fakes.openai_server import FakeOpenAI, last_user_text
from tests.fakes.telegram import FakeTelegram
from tests.scaleout_helpers import Cluster, base_env
from tests.support.process import start_talon, stop_talon
from tests.support.waiting import until_sync as wait_until

SCHEDULED = "[Scheduled task "


@pytest.fixture
def fakes() -> Iterator[tuple[FakeTelegram, FakeOpenAI]]:
    with FakeTelegram(token=TOKEN) as tg, FakeOpenAI() as llm:
        yield tg, llm


def env_for(tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI) -> dict[str, str]:
    return settings_env(tmp_path, tg.base_url, llm.base_url, TALON_TASK_POLL_INTERVAL="0.1",
                        TALON_TELEGRAM_STREAMING="off", TALON_MODEL_DISCOVERY="false", TALON_TRANSCRIBER="off")


def texts_to(tg: FakeTelegram, chat: int) -> list[str]:
    return [str(c.params.get("text")) for c in tg.sent("sendMessage", chat)]


def reminder_model(llm: FakeOpenAI, delay_s: float) -> list[float]:
    """The model schedules "Remind <who> to stretch" ``delay_s`` from its call, as an ISO time with
    its offset, once per chat (all at the same moment); a run answers "Reminder: <task>"."""
    due: list[float] = []

    def respond(request: dict[str, Any]) -> Any:
        if request["messages"][-1]["role"] == "tool":
            return "Done."
        text = last_user_text(request)
        if SCHEDULED in text:
            return f"Reminder: {text.splitlines()[-1]}"
        if text.startswith("remind"):
            if not due:
                due.append(time.time() + delay_s)
            when = datetime.fromtimestamp(due[0], timezone(timedelta(hours=1))).isoformat()
            return FakeOpenAI.tool_call("schedule_task", {"when": when, "task": f"Remind {text.split()[-1]} to stretch"})
        return f"echo: {text}"

    llm.default_responder = respond
    return due


def answered(tmp_path: Path, key: str) -> bool:
    """Whether the embedded inbox marked ``key`` done: a reply sent but not yet recorded when the
    process dies is sent again after the restart (the one documented source of duplicates), which
    these tests are not about."""
    with sqlite3.connect(tmp_path / "data" / "inbox.sqlite3") as conn:
        row = conn.execute("SELECT status FROM inbox WHERE key=?", (key,)).fetchone()
    return row is not None and row[0] == "done"


def tasks_listing(tg: FakeTelegram, chat: int) -> str:
    tg.push_update(tg.text_message(chat, "/tasks", user_id=chat))
    [listing] = tg.wait_for_sync("sendMessage", lambda c: str(c.params.get("chat_id")) == str(chat)
                                 and "It is now" in str(c.params.get("text")), timeout=30)
    return str(listing.params["text"])


def test_a_task_scheduled_before_a_sigkill_runs_once_after_the_restart(
        tmp_path: Path, fakes: tuple[FakeTelegram, FakeOpenAI]) -> None:
    tg, llm = fakes
    due = reminder_model(llm, delay_s=6.0)
    env = env_for(tmp_path, tg, llm)
    proc, first = start_talon(tmp_path, env, "first.log")
    try:
        update = tg.text_message(ALICE, f"remind me later {ALICE}", user_id=ALICE)
        tg.push_update(update)
        tg.wait_for_sync("sendMessage", lambda c: c.params.get("text") == "Done.", timeout=60)
        wait_until(lambda: answered(tmp_path, f"telegram:{ALICE}:{update['message']['message_id']}"), 30,
                   "the request to be recorded as answered")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    assert time.time() < due[0], "killed only after the task was due: the test proves nothing"
    wait_until(lambda: time.time() > due[0] + 0.5, 30, "the due time to pass while Talon is down")
    assert not [r for r in llm.requests if SCHEDULED in last_user_text(r)]
    proc, second = start_talon(tmp_path, env, "second.log")
    try:
        tg.wait_for_sync("sendMessage", lambda c: str(c.params.get("text")).startswith("Reminder:"), timeout=60)
        listing = tasks_listing(tg, ALICE)
    finally:
        stop_talon(proc)
    log = second.read_text()
    assert texts_to(tg, ALICE)[:2] == ["Done.", f"Reminder: Remind {ALICE} to stretch"], log
    assert len([t for t in texts_to(tg, ALICE) if t.startswith("Reminder:")]) == 1
    assert len([r for r in llm.requests if SCHEDULED in last_user_text(r)]) == 1
    assert ": delivered" in listing and "(once) \u00b7 done" in listing, listing
    assert "is in the inbox as telegram:" in log and "delivered" in log


def test_a_run_cut_off_by_a_sigkill_is_answered_once_after_the_restart(
        tmp_path: Path, fakes: tuple[FakeTelegram, FakeOpenAI]) -> None:
    tg, llm = fakes
    reminder_model(llm, delay_s=2.0)
    env = env_for(tmp_path, tg, llm)
    proc, first = start_talon(tmp_path, env, "first.log")
    try:
        tg.push_update(tg.text_message(ALICE, f"remind me later {ALICE}", user_id=ALICE))
        tg.wait_for_sync("sendMessage", lambda c: c.params.get("text") == "Done.", timeout=60)
        llm.hang = True  # the run's model call is held: Talon dies while answering it
        wait_until(lambda: any(SCHEDULED in last_user_text(r) for r in llm.requests), 30, "the run to start")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    llm.release()
    proc, second = start_talon(tmp_path, env, "second.log")
    try:
        tg.wait_for_sync("sendMessage", lambda c: str(c.params.get("text")).startswith("Reminder:"), timeout=60)
        listing = tasks_listing(tg, ALICE)
    finally:
        stop_talon(proc)
    reminders = [t for t in texts_to(tg, ALICE) if t.startswith("Reminder:")]
    assert reminders == [f"Reminder: Remind {ALICE} to stretch"], second.read_text()
    # The same run (one inbox key) was asked twice: before the kill and after; never a second run.
    keys = {line.split("in the inbox as ")[1].strip() for line in
            (first.read_text() + second.read_text()).splitlines() if "in the inbox as " in line}
    assert len(keys) == 1, keys
    assert ": delivered" in listing, listing


def test_two_workers_on_postgresql_run_each_due_task_once(tmp_path: Path, pg_url: str) -> None:
    users = [5001, 5002, 5003, 5004]
    with FakeTelegram(token=TOKEN) as tg, FakeOpenAI() as llm:
        reminder_model(llm, delay_s=5.0)
        cluster = Cluster(tmp_path, base_env(tmp_path, tg.base_url, llm.base_url, pg_url, users,
                                             TALON_TASK_POLL_INTERVAL="0.1", TALON_TELEGRAM_STREAMING="off",
                                             TALON_MODEL_DISCOVERY="false", TALON_LEASE_SECONDS="5"))
        workers = [cluster.start("w1"), cluster.start("w2")]
        try:
            for user in users:
                tg.push_update(tg.text_message(user, f"remind me later {user}", user_id=user))
            tg.wait_for_sync("sendMessage", lambda c: str(c.params.get("text")).startswith("Reminder:"),
                             count=len(users), timeout=90)
            listings = {user: tasks_listing(tg, user) for user in users}
        finally:
            codes = cluster.stop_all()
        logs = cluster.logs()
        assert all(w.alive() is False for w in workers) and codes == [0, 0], logs
    for user in users:
        reminders = [t for t in texts_to(tg, user) if t.startswith("Reminder:")]
        assert reminders == [f"Reminder: Remind {user} to stretch"], logs
        assert ": delivered" in listings[user], listings[user]
    assert len([r for r in llm.requests if SCHEDULED in last_user_text(r)]) == len(users)
    handed = [line for w in workers for line in w.log_text().splitlines() if "is in the inbox as" in line]
    assert len(handed) == len(users), logs
    with psycopg.connect(pg_url) as conn:
        runs = conn.execute("SELECT status, count(*) FROM talon_task_runs GROUP BY status").fetchall()
    assert runs == [("delivered", len(users))]


def test_runs_missed_beyond_the_grace_are_reported_and_a_repeat_runs_no_backlog(
        tmp_path: Path, fakes: tuple[FakeTelegram, FakeOpenAI]) -> None:
    tg, llm = fakes
    runs: list[str] = []

    def respond(request: dict[str, Any]) -> Any:
        if request["messages"][-1]["role"] == "tool":
            return "Done."
        text = last_user_text(request)
        if SCHEDULED in text:
            runs.append(text)
            return f"Ran: {text.splitlines()[-1]}"
        if text.startswith("set up"):
            return [FakeOpenAI.tool_call("schedule_task", {"when": "PT4S", "task": "Once"}),
                    FakeOpenAI.tool_call("schedule_task", {"when": "every PT2S", "task": "Repeat"})]
        return f"echo: {text}"

    llm.default_responder = respond
    env = {**env_for(tmp_path, tg, llm), "TALON_TASK_MISFIRE_GRACE": "1", "TALON_TASK_MIN_INTERVAL": "1"}
    proc, first = start_talon(tmp_path, env, "first.log")
    try:
        update = tg.text_message(ALICE, "set up two tasks", user_id=ALICE)
        tg.push_update(update)
        tg.wait_for_sync("sendMessage", lambda c: c.params.get("text") == "Done.", timeout=60)
        wait_until(lambda: answered(tmp_path, f"telegram:{ALICE}:{update['message']['message_id']}"), 30,
                   "the request to be recorded as answered")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    killed_at = time.time()
    assert not runs, "a task ran before the kill: the test proves nothing"
    # Down for over three repeats and well past the grace of both runs.
    wait_until(lambda: time.time() > killed_at + 8, 30, "eight seconds of downtime")
    proc, second = start_talon(tmp_path, env, "second.log")
    try:
        tg.wait_for_sync("sendMessage", lambda c: c.params.get("text") == "Ran: Repeat", count=2, timeout=60)
        restarted = time.time()
        listing = tasks_listing(tg, ALICE)
    finally:
        stop_talon(proc)
    log = second.read_text()
    notices = [t for t in texts_to(tg, ALICE) if t.startswith("I missed the scheduled task")]
    assert len(notices) == 2 and any("'Once'" in n for n in notices) and any("'Repeat'" in n for n in notices), log
    assert "missed its run due" in log
    assert not any(r.endswith("\nOnce") for r in runs)  # the one-off is missed, not run late
    # No backlog: after the restart, runs only at the regular ticks from then on.
    assert len(runs) <= 2 + (time.time() - restarted) / 2 + 1, runs
    assert "'Once' (once) \u00b7 done \u00b7 last run" in listing and ": missed (it was due" in listing, listing
