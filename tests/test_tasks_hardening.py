"""Tasks that cannot run away (issue 27, part 5), as the red team tried them.

- A task that schedules itself again "in 1 second" ran 20 times a minute against a 300 s
  TALON_TASK_MIN_INTERVAL: one-off tasks made by a scheduled run now count toward the minimum for
  the chat (every topic of it), driven here by the scheduler's injected clock and its polls.
- ``/new`` does not cancel tasks; ``/tasks cancel all`` does.
- A group removed from TALON_TELEGRAM_ALLOWED_CHATS kept its tasks (the scheduler read an attribute
  the composed Telegram channel no longer had): the scheduler now asks ``Channel.serves``, which
  every channel implements; the delisted group's task does not run after a restart, is logged and
  paused.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from channels.console import ConsoleChannel
from channels.telegram import TelegramChannel
from channels.whatsapp import WhatsAppChannel
from talon.envelope import InboundMessage, OutboundReply
from talon.ports import Channel
from talon.runtime import Runtime
from talon.scheduler import Scheduler, SchedulerSettings
from talon.scheduler import when as w
from talon.storage.tasks import ACTIVE, CANCELLED, FAILED, PAUSED, MemoryTaskStore, Task, TaskStore
from tests.conftest import ALICE, make_settings
from tests.conftest import running_telegram as running
from tests.fakes.openai_server import FakeOpenAI, last_user_text
from tests.fakes.telegram import FakeTelegram
from tests.support.stores import store  # noqa: F401  (the three task stores)
from tests.support.waiting import until as wait_until

NOW = 1_796_126_400.0  # Tue 1 Dec 2026 12:00 UTC
GROUP = -1001234567890
OTHER_GROUP = -1005555555555
CAROL = 333
BOT = "@talon_test_bot"
SCHEDULED = "[Scheduled task "


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Gate:
    def __init__(self, allowed: set[str]) -> None:
        self.allowed_ids = allowed

    async def allowed(self, channel: str, identities: list[str]) -> bool:
        return any(i in self.allowed_ids for i in identities)


class Bridge:
    """The scheduler's door into the inbox: keeps what it is given, answers nothing."""

    def __init__(self, channels: dict[str, Any]) -> None:
        self.inbox: list[InboundMessage] = []
        self.channels = channels

    async def submit(self, message: InboundMessage) -> bool:
        if any(m.key == message.key for m in self.inbox):
            return False
        self.inbox.append(message)
        return True


class Quiet(Channel):
    """A channel that serves every conversation and records what is sent."""

    name = "telegram"

    def __init__(self) -> None:
        self.sent: list[OutboundReply] = []

    def serves(self, conversation: InboundMessage) -> str | None:
        return None

    async def start(self, bridge: Any) -> None: ...

    async def stop(self) -> None: ...

    async def deliver(self, chat_id: str, reply: OutboundReply, **kw: Any) -> None:
        self.sent.append(reply)


def person(chat: str = "111", *, thread: str | None = None, chat_type: str = "private",
           sender: str = "111", channel: str = "telegram") -> InboundMessage:
    return InboundMessage(channel=channel, chat_id=chat, sender_id=sender, message_id="5", text="hi",
                          sender_name="Alice", thread_id=thread, chat_type=chat_type)


def scheduler_with(channels: dict[str, Any], *, allowed: set[str] | None = None,
                   min_interval_s: float = 300.0) -> tuple[Scheduler, Bridge, Clock]:
    clock = Clock(NOW)
    scheduler = Scheduler(MemoryTaskStore(), Gate(allowed or {"111"}),  # type: ignore[arg-type]
                          SchedulerSettings(min_interval_s=min_interval_s), clock=clock)
    bridge = Bridge(channels)
    scheduler.attach(bridge)  # type: ignore[arg-type]
    return scheduler, bridge, clock


async def drive_chain(scheduler: Scheduler, bridge: Bridge, clock: Clock, seconds: int) -> list[float]:
    """Poll once a simulated second for ``seconds``; every run "answers" by scheduling itself again
    in 1 second, as the red team's model did (the run's message is the turn's). The runs' due times."""
    answered = len(bridge.inbox)
    for _ in range(seconds):
        clock.now += 1
        await scheduler.tick()
        for run in bridge.inbox[answered:]:
            await scheduler.schedule(run, "in 1 second", "schedule yourself again in 1 second")
        answered = len(bridge.inbox)
    return [m.scheduled.due for m in bridge.inbox if m.scheduled is not None]


# --- (a) a chain of one-off tasks fires at most once per minimum interval --------------------------

async def test_a_self_rescheduling_one_off_chain_fires_at_most_once_per_minimum_interval() -> None:
    scheduler, bridge, clock = scheduler_with({"telegram": Quiet()})
    await scheduler.schedule(person(), "in 1 second", "schedule yourself again in 1 second")
    first_minute = await drive_chain(scheduler, bridge, clock, 60)
    # The red team saw 20 a minute; the person's own first task runs, its offspring waits 300 s.
    assert len(first_minute) == 1, first_minute
    dues = await drive_chain(scheduler, bridge, clock, 1800)  # half an hour more
    gaps = [b - a for a, b in zip(dues, dues[1:])]
    assert 5 <= len(dues) <= 1 + 1860 // 300, dues
    assert all(gap >= 300 for gap in gaps), gaps


async def test_chains_in_two_topics_of_one_group_share_the_minimum() -> None:
    scheduler, bridge, clock = scheduler_with({"telegram": Quiet()})
    for topic in ("7", "8"):
        await scheduler.schedule(person(str(GROUP), thread=topic, chat_type="supergroup"), "in 1 second",
                                 "again")
    dues = await drive_chain(scheduler, bridge, clock, 1800)
    offspring = sorted(dues)[2:]  # the two the people made run at once; every later one is spaced
    assert all(b - a >= 300 for a, b in zip(offspring, offspring[1:])), offspring
    assert len(dues) <= 2 + 1800 // 300


async def test_a_task_made_by_a_run_waits_the_minimum_and_a_persons_own_one_offs_do_not() -> None:
    scheduler, bridge, clock = scheduler_with({"telegram": Quiet()})
    a = await scheduler.schedule(person(), "in 1 minute", "first")
    b = await scheduler.schedule(person(), "in 2 minutes", "second")
    assert (a.next_run, b.next_run) == (NOW + 60, NOW + 120)  # a person asking is no chain
    clock.now += 60
    await scheduler.tick()
    [run] = bridge.inbox
    made = await scheduler.schedule(run, "PT1S", "again")
    # After both the run that made it and the person's task due at +120 s.
    assert made.next_run == NOW + 120 + 300
    cron = await scheduler.schedule(run, "every 10 minutes", "a repeat keeps its own rule")
    assert cron.next_run == clock.now + 600


# --- (b) /new keeps tasks; /tasks cancel all cancels them -------------------------------------------

async def test_tasks_cancel_all_cancels_every_active_and_paused_task_of_the_conversation() -> None:
    scheduler, bridge, clock = scheduler_with({"telegram": Quiet()})
    one = await scheduler.schedule(person(), "in 1 hour", "one")
    two = await scheduler.schedule(person(), "every 10 minutes", "two")
    three = await scheduler.schedule(person(), "every 20 minutes", "three")
    other = await scheduler.schedule(person("222", sender="111"), "in 1 hour", "another chat's")
    await scheduler.store.set_status(three.id, PAUSED)
    says = await scheduler.command(person().model_copy(update={"text": "/tasks cancel all"}))
    assert says.startswith("Cancelled 3 tasks: ") and all(t.id in says for t in (one, two, three)), says
    for made in (one, two, three):
        got = await scheduler.store.get(made.id)
        assert got is not None and got.status == CANCELLED
    kept = await scheduler.store.get(other.id)
    assert kept is not None and kept.status == ACTIVE
    clock.now += 7200
    await scheduler.tick()
    assert [m.scheduled.task_id for m in bridge.inbox if m.scheduled] == [other.id]
    again = await scheduler.command(person().model_copy(update={"text": "/tasks cancel ALL"}))
    assert again == "There was no active or paused task to cancel in this chat."


# --- (c) the scheduler asks the channel whether it still serves the conversation ---------------------

def telegram(tmp_path: Path, allowed: str) -> TelegramChannel:
    return TelegramChannel(make_settings(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9",
                                         TALON_TELEGRAM_ALLOWED_CHATS=allowed))


def whatsapp(tmp_path: Path) -> WhatsAppChannel:
    settings = make_settings(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9",
                             TWILIO_ACCOUNT_SID="AC" + "1" * 32, TWILIO_AUTH_TOKEN="t",
                             TWILIO_WHATSAPP_FROM="whatsapp:+14155238886",
                             TWILIO_API_BASE_URL="http://127.0.0.1:9",
                             TALON_PUBLIC_BASE_URL="https://talon.example.org", TALON_HTTP_PORT=0,
                             TALON_WHATSAPP_ALLOWED_NUMBERS="whatsapp:+15550001111")
    return WhatsAppChannel(settings)


def test_every_channel_says_which_conversations_it_serves(tmp_path: Path) -> None:
    tg = telegram(tmp_path, str(GROUP))
    group = person(str(GROUP), chat_type="supergroup")
    assert tg.serves(group) is None and tg.serves(group.model_copy(update={"thread_id": "7"})) is None
    assert tg.serves(person()) is None
    delisted = tg.serves(person(str(OTHER_GROUP), chat_type="group"))
    assert delisted is not None and "TALON_TELEGRAM_ALLOWED_CHATS" in delisted and str(OTHER_GROUP) in delisted
    wa = whatsapp(tmp_path)
    assert wa.serves(person("whatsapp:+15550001111", channel="whatsapp")) is None
    assert wa.serves(person("x", chat_type="group", channel="whatsapp")) is not None
    console = ConsoleChannel()
    assert console.serves(person("local", channel="console")) is None
    # Every channel must answer: it is abstract on the port, no channel inherits a yes.
    assert "serves" in Channel.__abstractmethods__


@pytest.mark.parametrize("which", ["telegram", "whatsapp", "console"])
async def test_the_scheduler_checks_access_through_each_channel(tmp_path: Path, which: str,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    if which == "telegram":
        channel: Channel = telegram(tmp_path, str(GROUP))
        served = person(str(GROUP), chat_type="supergroup", sender=str(CAROL))
        refused = person(str(OTHER_GROUP), chat_type="supergroup", sender=str(CAROL))
    elif which == "whatsapp":
        channel = whatsapp(tmp_path)
        served = person("whatsapp:+15550001111", sender="whatsapp:+15550001111", channel="whatsapp")
        refused = person("whatsapp:+15550002222", sender="whatsapp:+15550002222", channel="whatsapp")
    else:
        channel = ConsoleChannel()
        served = person("local", sender="console", channel="console")
        refused = None
    scheduler, bridge, clock = scheduler_with({which: channel}, allowed={"111", "whatsapp:+15550001111"})
    ok = await scheduler.schedule(served, "every 10 minutes", "served")
    no = await scheduler.schedule(refused, "every 10 minutes", "refused") if refused is not None else None
    clock.now += 600
    await scheduler.tick()
    assert [m.scheduled.task_id for m in bridge.inbox if m.scheduled] == [ok.id]
    if no is not None:
        [run] = await scheduler.store.runs(no.id)
        assert run.status == FAILED and run.reason.startswith("access revoked: "), run
        paused = await scheduler.store.get(no.id)
        assert paused is not None and paused.status == PAUSED
        assert f"task {no.id} in {which}:{refused.chat_id} does not run" in caplog.text  # type: ignore[union-attr]


# --- the red team's case: a delisted group's task after a restart, on the composed Telegram channel ---

def model_for(llm: FakeOpenAI, reply: Callable[[str], Any]) -> None:
    def respond(request: dict[str, Any]) -> Any:
        if request["messages"][-1]["role"] == "tool":
            return "Done."
        return reply(last_user_text(request))
    llm.default_responder = respond


async def polls(runtime: Runtime, n: int) -> None:
    """Wait until the scheduler has polled ``n`` more times, then until the bridge is idle."""
    scheduler = runtime.scheduler
    assert scheduler is not None
    target = scheduler.ticks + n
    await wait_until(lambda: scheduler.ticks >= target, 30, f"{n} scheduler polls")
    await runtime.bridge.idle()


async def test_a_delisted_groups_task_does_not_run_after_a_restart(
        tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    scheduled: list[str] = []

    def reply(text: str) -> Any:
        if SCHEDULED in text:
            scheduled.append(text)
            return "The group's daily report."
        return FakeOpenAI.tool_call("schedule_task", {"when": "every 10 minutes", "task": "Post the report"})

    model_for(llm, reply)
    common = dict(TALON_TASK_POLL_INTERVAL=0.05, TALON_TELEGRAM_STREAMING="off", TALON_MODEL_DISCOVERY="false")
    listed = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_TELEGRAM_ALLOWED_CHATS=str(GROUP), **common)
    async with running(listed):
        tg.push_update(tg.text_message(GROUP, f"{BOT} post the report every 10 minutes", user_id=CAROL,
                                       first_name="Carol", chat_type="supergroup"))
        await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "Done.", timeout=20)
    # The operator removes the group; Talon restarts; the task falls due.
    delisted = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_TELEGRAM_ALLOWED_CHATS=str(OTHER_GROUP),
                             **common)
    async with running(delisted) as runtime:
        assert runtime.scheduler is not None
        [task] = await runtime.scheduler.store.for_chat("telegram", str(GROUP), None)
        clock = Clock(time.time() + 601)
        runtime.scheduler.clock = clock
        await polls(runtime, 3)
        clock.now += 600
        await polls(runtime, 3)
        after = await runtime.scheduler.store.get(task.id)
        runs = await runtime.scheduler.store.runs(task.id)
    assert scheduled == []  # the model was never asked to run it
    assert [c.params["text"] for c in tg.sent("sendMessage", GROUP)] == ["Done."]  # nothing more in the group
    assert after is not None and after.status == PAUSED
    assert [r.status for r in runs] == [FAILED]
    assert runs[0].reason == (f"access revoked: the group {GROUP} is no longer served (not in "
                              "TALON_TELEGRAM_ALLOWED_CHATS)")
    assert f"task {task.id} in telegram:{GROUP} does not run" in caplog.text
    assert f"task {task.id} in telegram:{GROUP} paused: access revoked" in caplog.text


# --- the red team's chain through the real runtime, /new, and /tasks cancel all ----------------------

async def test_a_chain_through_the_agent_is_held_to_the_minimum_and_only_cancel_all_stops_it(
        tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI) -> None:
    runs: list[str] = []

    def reply(text: str) -> Any:
        if SCHEDULED in text:
            runs.append(text)
            return FakeOpenAI.tool_call("schedule_task", {"when": "in 1 second", "task": "Do it again in 1 second"})
        if "start" in text:
            return FakeOpenAI.tool_call("schedule_task", {"when": "in 1 second", "task": "Do it again in 1 second"})
        return f"echo: {text}"

    model_for(llm, reply)
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_TASK_POLL_INTERVAL=0.05,
                             TALON_TELEGRAM_STREAMING="off", TALON_MODEL_DISCOVERY="false")
    assert settings.task_min_interval_s == 300  # the default the red team ran against
    async with running(settings) as runtime:
        assert runtime.scheduler is not None
        store = runtime.scheduler.store
        clock = Clock(time.time())
        runtime.scheduler.clock = clock
        tg.push_update(tg.text_message(ALICE, "start the chain", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "Done.", timeout=20)
        for _ in range(20):  # twenty simulated minutes, a poll each minute
            clock.now += 60
            await polls(runtime, 2)
        chain = await store.for_chat("telegram", str(ALICE), None)
        dues = sorted(t.last_due for t in chain if t.last_due is not None)
        assert 3 <= len(runs) == len(dues) <= 1 + 1200 // 300, (len(runs), dues)
        assert all(b - a >= 300 for a, b in zip(dues, dues[1:])), dues
        # /new starts a fresh conversation and keeps the tasks (docs/scheduling.md).
        tg.push_update(tg.text_message(ALICE, "/new", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: "Started a new conversation" in c.params.get("text", ""),
                          timeout=20)
        assert [t.status for t in await store.for_chat("telegram", str(ALICE), None)].count(ACTIVE) == 1
        tg.push_update(tg.text_message(ALICE, "/tasks cancel all", user_id=ALICE))
        [done] = await tg.wait_for("sendMessage", lambda c: "Cancelled 1 task" in c.params.get("text", ""),
                                   timeout=20)
        before = len(runs)
        for _ in range(10):
            clock.now += 120
            await polls(runtime, 2)
        assert len(runs) == before
        assert all(t.status != ACTIVE for t in await store.for_chat("telegram", str(ALICE), None))
    assert "None of them will run again." in done.params["text"]


# --- the store lists a chat's tasks of every topic (what the chain's spacing reads) -----------------

async def test_the_store_lists_a_chats_tasks_of_every_topic(store: TaskStore) -> None:
    def made(task_id: str, thread: str | None, chat: str = str(GROUP)) -> Task:
        return Task(id=task_id, channel="telegram", chat_id=chat, thread_id=thread, owner_id="1", text=task_id,
                    kind=w.ONCE, spec="", timezone="UTC", next_run=NOW, created=NOW)

    for task_id, thread in (("a", None), ("b", "7"), ("c", "8")):
        assert await store.add(made(task_id, thread), max_active=10)
    assert await store.add(made("d", None, chat="42"), max_active=10)
    assert [t.id for t in await store.for_chat("telegram", str(GROUP), "7")] == ["b"]
    assert [t.id for t in await store.for_chat("telegram", str(GROUP), None)] == ["a"]
    assert sorted(t.id for t in await store.for_chat("telegram", str(GROUP), "7", any_thread=True)) == ["a", "b", "c"]
