"""Scheduled tasks without a chat: reading `when` (fixed clocks, DST), the task store against all
three implementations (memory, SQLite, a real PostgreSQL), and the scheduler's decisions (once,
missed, no backlog, access revoked, paused after three failures) with an injected clock."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import datetime, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from talon.storage.access import AccessGate
from talon.storage.embedded.access import SqlitePairing
from talon.envelope import InboundMessage, OutboundReply
from talon.errors import ConfigError, DeliveryError, ScheduleError
from talon.runtime import build_scheduler
from talon.scheduler import Scheduler, SchedulerSettings
from talon.scheduler import when as w
from talon.storage.factory import open_stores
from talon.storage.tasks import (
    ACTIVE,
    CANCELLED,
    CLAIMED,
    DELIVERED,
    DONE,
    DUE,
    FAILED,
    MISSED,
    PAUSED,
    STARTED,
    MemoryTaskStore,
    Task,
    TaskRun,
    TaskStore,
)
from tests.conftest import make_settings
from tests.support.stores import store  # noqa: F401  (the fixture: memory, SQLite, PostgreSQL)

BERLIN = ZoneInfo("Europe/Berlin")
UTC = ZoneInfo("UTC")


def ts(*args: int, tz: ZoneInfo = UTC) -> float:
    return datetime(*args, tzinfo=tz).timestamp()  # type: ignore[misc]


def wall(at: float, tz: ZoneInfo = BERLIN) -> str:
    return datetime.fromtimestamp(at, tz).strftime("%Y-%m-%d %H:%M %Z")


# --- reading `when` -------------------------------------------------------------------------

NOW = ts(2026, 12, 1, 12, 0)


def test_iso_datetime_with_offset_durations_and_words() -> None:
    at = w.parse_when("2026-12-02T08:00:00+01:00", BERLIN, NOW, min_interval_s=300)
    assert (at.kind, at.first) == (w.ONCE, ts(2026, 12, 2, 7, 0))
    naive = w.parse_when("2026-12-02 08:00", BERLIN, NOW, min_interval_s=300)
    assert naive.first == ts(2026, 12, 2, 8, 0, tz=BERLIN)  # no offset: the task's zone
    assert w.parse_when("PT90S", UTC, NOW, min_interval_s=300).first == NOW + 90
    assert w.parse_when("in 2 hours", UTC, NOW, min_interval_s=300).first == NOW + 7200
    assert w.parse_when("in 1 hour 30 minutes", UTC, NOW, min_interval_s=300).first == NOW + 5400
    assert w.parse_when("in an hour", UTC, NOW, min_interval_s=300).first == NOW + 3600
    every = w.parse_when("every 2 hours", UTC, NOW, min_interval_s=300)
    assert (every.kind, every.spec, every.first) == (w.EVERY, "7200", NOW + 7200)
    assert w.parse_when("every PT10M", UTC, NOW, min_interval_s=300).spec == "600"
    cron = w.parse_when("0 8 * * 1-5", BERLIN, NOW, min_interval_s=300)  # Tue 1 Dec 2026, 13:00 there
    assert (cron.kind, wall(cron.first)) == (w.CRON, "2026-12-02 08:00 CET")


@pytest.mark.parametrize("when, says", [
    ("", "when is empty"),
    ("tomorrow-ish", "could not read"),
    ("2026-11-30T08:00:00+00:00", "has already passed"),
    ("PT0S", "not a positive duration"),
    ("P1M", "months or years"),
    ("in 3 fortnights", "could not read"),
    ("61 8 * * *", "not a valid five-field cron"),
    ("every 1 minute", "more often than the limit of once every 5 min"),
    ("* * * * *", "more often than the limit"),
])
def test_bad_when_is_refused_with_the_reason(when: str, says: str) -> None:
    with pytest.raises(ScheduleError, match=says):
        w.parse_when(when, UTC, NOW, min_interval_s=300)


def test_unknown_time_zone_is_named() -> None:
    with pytest.raises(ScheduleError, match="unknown time zone 'Mars/Olympus'"):
        w.zone_named("Mars/Olympus")
    with pytest.raises(ScheduleError, match="not a time zone"):
        w.zone_named("../etc/passwd")


def test_cron_keeps_the_wall_clock_across_both_dst_changes() -> None:
    # Berlin: summer time starts Sun 29 Mar 2026 (02:00 -> 03:00), ends Sun 25 Oct 2026 (03:00 -> 02:00).
    runs = w.upcoming(w.CRON, "0 8 * * *", BERLIN, ts(2026, 3, 27, 12, 0), 4)
    assert [wall(r) for r in runs] == ["2026-03-28 08:00 CET", "2026-03-29 08:00 CEST",
                                       "2026-03-30 08:00 CEST", "2026-03-31 08:00 CEST"]
    assert runs[1] - runs[0] == 23 * 3600  # the short day
    autumn = w.upcoming(w.CRON, "0 8 * * *", BERLIN, ts(2026, 10, 24, 12, 0), 2)
    assert [wall(r) for r in autumn] == ["2026-10-25 08:00 CET", "2026-10-26 08:00 CET"]
    assert autumn[0] - ts(2026, 10, 24, 6, 0) == 25 * 3600  # the long day


def test_cron_in_the_skipped_and_the_repeated_hour() -> None:
    # 02:30 does not exist on 29 Mar: it runs at the same wall time after the jump, once.
    spring = w.upcoming(w.CRON, "30 2 * * *", BERLIN, ts(2026, 3, 28, 12, 0), 2)
    assert [wall(r) for r in spring] == ["2026-03-29 03:30 CEST", "2026-03-30 02:30 CEST"]
    # 02:30 happens twice on 25 Oct: it runs once, the first time.
    autumn = w.upcoming(w.CRON, "30 2 * * *", BERLIN, ts(2026, 10, 24, 12, 0), 2)
    assert autumn[0] == ts(2026, 10, 25, 0, 30) and wall(autumn[1]) == "2026-10-26 02:30 CET"
    # Hourly across the jump: no run is doubled, none is at or before the one before.
    hourly = w.upcoming(w.CRON, "0 * * * *", BERLIN, ts(2026, 3, 29, 0, 30), 3)
    assert [wall(r) for r in hourly] == ["2026-03-29 03:00 CEST", "2026-03-29 04:00 CEST",
                                         "2026-03-29 05:00 CEST"]


def test_a_repeat_that_was_held_up_goes_on_from_now_without_backlog() -> None:
    due = ts(2026, 12, 1, 12, 0)
    assert w.next_run_from(w.EVERY, "600", UTC, due, due + 5) == due + 600
    assert w.next_run_from(w.EVERY, "600", UTC, due, due + 3 * 600 + 5) == due + 4 * 600  # rhythm kept
    assert w.next_run_from(w.CRON, "0 8 * * *", BERLIN, ts(2026, 11, 20, 7, 0), due) == ts(2026, 12, 2, 7, 0)
    assert w.next_run_from(w.ONCE, "", UTC, due, due) is None


# --- the store, three ways ------------------------------------------------------------------


def task(task_id: str, chat: str = "1", *, next_run: float | None = NOW, kind: str = w.ONCE, spec: str = "",
         thread: str | None = None) -> Task:
    return Task(id=task_id, channel="telegram", chat_id=chat, thread_id=thread, owner_id="111", text=f"do {task_id}",
                kind=kind, spec=spec, timezone="UTC", next_run=next_run, created=NOW, origin="{}")


async def test_store_add_limit_list_and_cancel(store: TaskStore) -> None:
    assert await store.add(task("a"), max_active=2)
    assert await store.add(task("b", thread="7"), max_active=2)
    assert not await store.add(task("c"), max_active=2)  # the chat's limit counts its topics too
    assert await store.add(task("c", chat="2"), max_active=2)
    assert [t.id for t in await store.for_chat("telegram", "1", None)] == ["a"]
    assert [t.id for t in await store.for_chat("telegram", "1", "7")] == ["b"]
    cancelled = await store.set_status("a", CANCELLED)
    assert cancelled is not None and cancelled.status == CANCELLED
    assert await store.set_status("a", CANCELLED) is None  # already
    assert await store.add(task("d"), max_active=2)  # a cancelled task no longer counts
    assert await store.get("nope") is None
    await store.set_timezone("telegram", "1", "Europe/Berlin")
    await store.set_timezone("telegram", "1", "Asia/Tokyo")
    assert await store.timezone("telegram", "1") == "Asia/Tokyo"
    assert await store.timezone("telegram", "2") is None


async def test_store_claims_a_due_run_once(store: TaskStore) -> None:
    await store.add(task("r", kind=w.EVERY, spec="60"), max_active=5)
    await store.add(task("later", next_run=NOW + 100), max_active=5)
    [due] = await store.due(NOW)
    assert due.id == "r"
    results = await asyncio.gather(*(store.claim(due, NOW + 60, TaskRun("r", NOW, CLAIMED)) for _ in range(5)))
    assert sorted(results) == [False] * 4 + [True]  # one claim wins, however many race
    assert await store.due(NOW) == []
    moved = await store.get("r")
    assert moved is not None and moved.next_run == NOW + 60 and moved.status == ACTIVE
    assert [(r.status, r.due) for r in await store.runs("r")] == [(CLAIMED, NOW)]
    assert [(t.id, r.due) for t, r in await store.claimed_before(NOW + 10**6)] == [("r", NOW)]
    # Forward only: a late "due" does not undo "delivered".
    await store.record("r", NOW, STARTED)
    await store.record("r", NOW, DELIVERED)
    assert await store.record("r", NOW, DUE) == (None, False)
    assert [r.status for r in await store.runs("r")] == [DELIVERED]
    assert await store.claimed_before(NOW + 10**6) == []


async def test_store_pauses_after_three_failures_in_a_row(store: TaskStore) -> None:
    await store.add(task("f", kind=w.EVERY, spec="60"), max_active=5)
    for n in range(3):
        current = await store.get("f")
        assert current is not None and current.status == ACTIVE
        due = NOW + 60 * n
        assert await store.claim(current, due + 60, TaskRun("f", due, CLAIMED))
        updated, paused = await store.record("f", due, FAILED, "delivery refused: Forbidden", pause_after=3)
        assert updated is not None and paused == (n == 2)
    final = await store.get("f")
    assert final is not None and final.status == PAUSED and final.failures == 3
    assert final.last_status == FAILED and final.last_reason == "delivery refused: Forbidden"
    assert await store.due(NOW + 10**6) == []
    resumed = await store.set_status("f", ACTIVE, next_run=NOW + 999, only_from=(PAUSED,))
    assert resumed is not None and resumed.failures == 0 and resumed.next_run == NOW + 999
    once = task("o")
    await store.add(once, max_active=5)
    assert await store.claim(once, None, TaskRun("o", NOW, MISSED, "Talon was down"))
    done = await store.get("o")
    assert done is not None and done.status == DONE and done.last_status == MISSED


# --- the scheduler's decisions ------------------------------------------------------------

class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Gate:
    def __init__(self) -> None:
        self.allowed_ids = {"111"}

    async def allowed(self, channel: str, identities: list[str]) -> bool:
        return any(i in self.allowed_ids for i in identities)


class Chan:
    name = "telegram"
    gated = True

    def __init__(self) -> None:
        self.sent: list[tuple[str, OutboundReply]] = []
        self.refuse = False

    def serves(self, conversation: InboundMessage) -> str | None:
        return None

    async def deliver(self, chat_id: str, reply: OutboundReply, **kw: object) -> None:
        if self.refuse:
            raise DeliveryError("Forbidden: bot was blocked by the user", permanent=True)
        self.sent.append((chat_id, reply))


class FakeBridge:
    """Stands in for the bridge's submit: an inbox that drops duplicates by key."""

    def __init__(self) -> None:
        self.inbox: dict[str, InboundMessage] = {}
        self.channels = {"telegram": Chan()}

    async def submit(self, message: InboundMessage) -> bool:
        if message.key in self.inbox:
            return False
        self.inbox[message.key] = message
        return True


def person(text: str = "remind me", **kw: object) -> InboundMessage:
    return InboundMessage(channel="telegram", chat_id="111", sender_id="111", message_id="5", text=text,
                          sender_name="Alice", **kw)  # type: ignore[arg-type]


def make(clock: Clock, store: TaskStore | None = None, **settings: object) -> tuple[Scheduler, FakeBridge, Gate]:
    gate = Gate()
    scheduler = Scheduler(store or MemoryTaskStore(), gate, SchedulerSettings(**settings),  # type: ignore[arg-type]
                          clock=clock)
    bridge = FakeBridge()
    scheduler.attach(bridge)  # type: ignore[arg-type]
    return scheduler, bridge, gate


async def test_a_due_run_goes_to_the_inbox_once_marked_as_scheduled() -> None:
    clock = Clock(NOW)
    scheduler, bridge, _ = make(clock)
    made = await scheduler.schedule(person(thread_id="9", chat_type="supergroup"), "in 10 minutes", "say hi")
    assert await scheduler.tick() == 0
    clock.now += 600
    assert await scheduler.tick() == 1
    assert await scheduler.tick() == 0  # done: nothing due twice
    [message] = bridge.inbox.values()
    assert message.scheduled is not None and message.scheduled.task_id == made.id
    assert message.thread_id == "9" and message.sender_id == "111" and message.text.endswith("\nsay hi")
    assert "This is not a new message from the person" in message.text
    assert [r.status for r in await scheduler.store.runs(made.id)] == [DUE]
    await scheduler.observe(message, STARTED)
    await scheduler.observe(message, DELIVERED)
    listing = await scheduler.listing(person(thread_id="9", chat_type="supergroup"))
    assert f"- {made.id}: 'say hi' (once) \u00b7 done \u00b7 last run" in listing and "delivered" in listing


async def test_a_run_missed_beyond_the_grace_is_reported_and_a_repeat_runs_no_backlog() -> None:
    clock = Clock(NOW)
    scheduler, bridge, _ = make(clock, misfire_grace_s=3600, min_interval_s=60)
    once = await scheduler.schedule(person(), "in 10 minutes", "once")
    repeat = await scheduler.schedule(person(), "every 10 minutes", "repeat")
    clock.now += 600 + 7200  # Talon "was down" for two hours
    assert await scheduler.tick() == 0
    assert bridge.inbox == {}
    gone = await scheduler.store.get(once.id)
    assert gone is not None and gone.status == DONE and gone.last_status == MISSED
    later = await scheduler.store.get(repeat.id)
    assert later is not None and later.status == ACTIVE and later.next_run is not None
    assert clock.now < later.next_run <= clock.now + 600  # from now on; no backlog
    notices = [r.text for _, r in bridge.channels["telegram"].sent]
    assert len(notices) == 2 and all("missed the scheduled task" in n for n in notices)
    # Within the grace: it runs once, late.
    clock.now = later.next_run + 1200
    assert await scheduler.tick() == 1
    assert await scheduler.tick() == 0


async def test_a_revoked_owner_does_not_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock(NOW)
    gate = AccessGate(SqlitePairing(tmp_path / "access.sqlite3"), {"telegram": set()}, pairing=True)
    pairing = await gate.request_pairing("telegram", "444", "Dora")
    assert pairing is not None
    await gate.approve(pairing.code)
    scheduler = Scheduler(MemoryTaskStore(), gate, SchedulerSettings(), clock=clock)
    bridge = FakeBridge()
    scheduler.attach(bridge)  # type: ignore[arg-type]
    dora = person().model_copy(update={"chat_id": "444", "sender_id": "444", "sender_name": "Dora"})
    allowed = await scheduler.schedule(dora, "in 10 minutes", "allowed")
    revoked = await scheduler.schedule(dora, "in 20 minutes", "secret")
    clock.now += 601
    assert await scheduler.tick() == 1  # still allowed: it runs
    await gate.revoke("telegram", "444")
    clock.now += 600
    assert await scheduler.tick() == 0
    assert [m.scheduled.task_id for m in bridge.inbox.values() if m.scheduled] == [allowed.id]
    [run] = await scheduler.store.runs(revoked.id)
    assert run.status == FAILED and run.reason == "access revoked: Dora is no longer allowed to use this bot"
    assert f"task {revoked.id} in telegram:444 does not run" in caplog.text
    await gate.close()


async def test_the_console_has_no_gate_to_check() -> None:
    clock = Clock(NOW)
    scheduler, bridge, gate = make(clock)
    gate.allowed_ids.clear()
    bridge.channels["console"] = Chan()
    bridge.channels["console"].gated = False
    local = person().model_copy(update={"channel": "console", "chat_id": "local", "sender_id": "console"})
    await scheduler.schedule(local, "in 1 minute", "tea")
    clock.now += 61
    assert await scheduler.tick() == 1


async def test_three_failed_runs_pause_the_task_and_the_owner_is_told() -> None:
    clock = Clock(NOW)
    scheduler, bridge, _ = make(clock, min_interval_s=60)
    made = await scheduler.schedule(person(), "every 1 minute", "ping")
    for _ in range(3):
        clock.now += 60
        assert await scheduler.tick() == 1
        message = list(bridge.inbox.values())[-1]
        await scheduler.observe(message, FAILED, "delivery refused: Forbidden")
    paused = await scheduler.store.get(made.id)
    assert paused is not None and paused.status == PAUSED
    [(chat, notice)] = bridge.channels["telegram"].sent
    assert chat == "111" and "paused the scheduled task" in notice.text and f"/tasks resume {made.id}" in notice.text
    clock.now += 600
    assert await scheduler.tick() == 0  # paused: not due
    assert "Resumed task" in await scheduler.command(person(f"/tasks resume {made.id}"))
    clock.now += 61
    assert await scheduler.tick() == 1


async def test_limits_and_commands_say_what_is_wrong() -> None:
    clock = Clock(NOW)
    scheduler, _, _ = make(clock, tasks_per_chat=2)
    await scheduler.schedule(person(), "in 1 hour", "one")
    await scheduler.schedule(person(), "in 2 hours", "two")
    with pytest.raises(ScheduleError, match="already has 2 scheduled tasks, the limit"):
        await scheduler.schedule(person(), "in 3 hours", "three")
    with pytest.raises(ScheduleError, match="task is empty"):
        await scheduler.schedule(person(), "in 3 hours", "  ")
    assert "no task 'zzzz' in this chat" in await scheduler.command(person("/tasks cancel zzzz"))
    assert "Usage:" in await scheduler.command(person("/tasks frobnicate"))
    other_chat = person().model_copy(update={"chat_id": "222"})
    [mine, _] = await scheduler.tasks_of(person())
    assert "no task" in await scheduler.command(other_chat.model_copy(update={"text": f"/tasks cancel {mine.id}"}))
    assert "Cancelled task" in await scheduler.command(person(f"/tasks cancel {mine.id}"))


async def test_the_chat_time_zone_shows_times_and_reads_cron() -> None:
    clock = Clock(NOW)  # 12:00 UTC, 13:00 in Berlin
    scheduler, _, _ = make(clock, timezone="UTC")
    assert "time zone UTC" in await scheduler.listing(person())
    await scheduler.set_zone(person(), "Europe/Berlin")
    made = await scheduler.schedule(person(), "0 8 * * *", "morning report")
    assert made.timezone == "Europe/Berlin" and wall(made.next_run or 0) == "2026-12-02 08:00 CET"
    listing = await scheduler.listing(person())
    assert "It is now Tue 01 Dec 2026 13:00 CET (time zone Europe/Berlin)" in listing
    assert "next Wed 02 Dec 2026 08:00 CET" in listing
    tokyo = await scheduler.schedule(person(), "0 8 * * *", "tokyo", "Asia/Tokyo")
    assert tokyo.next_run == ts(2026, 12, 2, 8, 0, tz=ZoneInfo("Asia/Tokyo"))


async def test_a_run_claimed_by_a_worker_that_died_is_handed_over_once() -> None:
    clock = Clock(NOW)
    store = MemoryTaskStore()
    scheduler, bridge, _ = make(clock, store)
    made = await scheduler.schedule(person(), "in 10 minutes", "survive")
    current = await store.get(made.id)
    assert current is not None and current.next_run is not None
    # A worker claimed it and died before the inbox had it.
    assert await store.claim(current, None, TaskRun(made.id, current.next_run, CLAIMED, updated=current.next_run))
    clock.now = current.next_run + 1
    assert await scheduler.tick() == 0  # not yet: that worker may still be handing it over
    clock.now += 60
    assert await scheduler.tick() == 1
    assert await scheduler.tick() == 0
    assert len(bridge.inbox) == 1


def test_local_times_use_the_zone_name() -> None:
    assert w.local_time(ts(2026, 7, 1, 6, 0), BERLIN) == "Wed 01 Jul 2026 08:00 CEST"
    assert datetime.fromtimestamp(NOW, timezone.utc).hour == 12


async def test_a_broken_task_holds_up_no_other(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock(NOW)
    store = MemoryTaskStore()
    scheduler, bridge, _ = make(clock, store)
    await store.add(dataclasses.replace(task("bad", chat="111", next_run=NOW + 1), origin="not json"), max_active=9)
    good = await scheduler.schedule(person(), "in 2 seconds", "fine")
    clock.now += 3
    assert await scheduler.tick() == 1
    assert [m.scheduled.task_id for m in bridge.inbox.values() if m.scheduled] == [good.id]
    assert "task bad in telegram:111: could not be handled now (ValidationError" in caplog.text


async def test_an_unknown_talon_timezone_is_a_config_error_naming_it(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9/v1", TALON_TIMEZONE="Mars/Olympus")
    stores = open_stores(settings)
    try:
        with pytest.raises(ConfigError, match="TALON_TIMEZONE: unknown time zone 'Mars/Olympus'") as err:
            build_scheduler(settings, stores)
        assert err.value.missing == ["TALON_TIMEZONE"]
    finally:
        await stores.aclose()
