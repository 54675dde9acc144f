"""Flat for weeks: every per-chat structure is bounded and forgets idle chats (issue 28, part 2).

Each test drives many more chats than the bound through the real component, with the bounds made
small and a clock of the test's own (``talon.bounded.DEFAULTS``), and checks the size never passes
the bound and that advancing the clock past the idle time drops what the idle chats left.
"""

from __future__ import annotations

import gc
from collections.abc import Sized
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from channels.send_budget import SendBudget, Window
from channels.telegram.groups import ChatterLog
from talon import bounded
from talon.agent.context.memo import DerivedCache
from talon.bounded import BoundedMap, Bounds
from talon.content import Message, TextBlock
from talon.metrics import Metrics
from tests.conftest import ALICE, make_settings
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram

BOUND = 20
IDLE = 100.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(bounded, "DEFAULTS", Bounds(max_entries=BOUND, idle_s=IDLE, clock=clock))
    return clock


def test_a_bounded_map_keeps_the_most_recent_and_forgets_the_idle(clock: Clock) -> None:
    m: BoundedMap[int, int] = BoundedMap("t")
    for n in range(10 * BOUND):
        m[n] = n
        assert len(m) <= BOUND
    assert sorted(m) == list(range(9 * BOUND, 10 * BOUND))
    assert m.get(9 * BOUND) == 9 * BOUND  # read: now the most recent
    m[-1] = -1
    assert 9 * BOUND in m and 9 * BOUND + 1 not in m
    clock.now += IDLE + 1
    m["fresh"] = 0  # type: ignore[index]
    assert list(m) == ["fresh"]


def test_entries_in_use_are_never_dropped(clock: Clock) -> None:
    busy = {3, 5}
    m: BoundedMap[int, int] = BoundedMap("t", in_use=lambda v: v in busy)
    for n in range(10 * BOUND):
        m[n] = n
    assert 3 in m and 5 in m and len(m) <= BOUND
    clock.now += IDLE + 1
    m[-1] = -1
    assert sorted(m) == [-1, 3, 5]


async def test_send_budgets_of_many_chats_stay_bounded_and_idle_chats_are_forgotten(clock: Clock) -> None:
    async def no_sleep(seconds: float) -> None:
        clock.now += seconds

    budget = SendBudget(lambda chat: Window(20, 60.0), cosmetic_for=lambda chat: Window(5, 60.0),
                        clock=clock, sleep=no_sleep)
    books = (budget._spent, budget._cosmetic, budget._locks, budget._blocked_until)
    for n in range(50 * BOUND):
        chat = str(n)
        await budget.acquire(chat)
        assert budget.try_spend(chat)
        budget.penalize(chat, 0.5)
        clock.now += 1.0
        assert all(len(book) <= BOUND for book in books), [len(book) for book in books]
    clock.now += IDLE + 1
    await budget.acquire("last")
    budget.try_spend("last")
    budget.penalize("last", 0.5)
    assert [len(book) for book in books] == [1, 1, 1, 1]


def test_group_chatter_of_groups_that_never_address_the_bot_is_bounded_and_forgotten(clock: Clock) -> None:
    chatter = ChatterLog(size=5)
    for n in range(20 * BOUND):
        chatter.add(f"-100{n}", "Bob", "not for the bot")
        assert len(chatter._lines) <= BOUND
    assert [c.text for c in chatter.take(f"-100{20 * BOUND - 1}")] == ["not for the bot"]
    clock.now += IDLE + 1
    chatter.add("-1", "Bob", "hello")
    assert len(chatter._lines) == 1


def test_the_memo_is_bounded_and_forgets_what_was_not_used(clock: Clock) -> None:
    cache = DerivedCache(max_entries=BOUND)
    sources = [object() for _ in range(10 * BOUND)]
    for source in sources:
        cache.derive(source, "t", id)
        assert len(cache) <= BOUND
    clock.now += IDLE + 1
    cache.derive(sources[0], "t", id)
    assert len(cache) == 1


def test_the_memo_lets_go_of_messages_nothing_else_holds(clock: Clock) -> None:
    """A chat's log read again from disk is new message objects: the memo must not keep the old
    ones (and their copies) alive until its size bound."""
    cache = DerivedCache(max_entries=10 * BOUND)
    for _ in range(5 * BOUND):
        old = Message(role="user", content=[TextBlock(text="x" * 1000)])
        cache.derive(old, "t", lambda m: m.model_copy())
    del old
    gc.collect()
    kept = Message(role="user", content=[TextBlock(text="kept")])
    copy = cache.derive(kept, "t", lambda m: m.model_copy())
    assert len(cache) == 1
    assert cache.derive(kept, "t", lambda m: m.model_copy()) is copy  # still a hit


def test_metrics_show_rss_and_each_cache(clock: Clock) -> None:
    budget = SendBudget(lambda chat: None, clock=clock)
    for n in range(3):
        budget.penalize(f"chat {n}", 1.0)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(Metrics().render().decode())
               for s in family.samples}
    assert samples[("process_resident_memory_bytes", ())] > 10_000_000
    assert samples[("talon_cache_entries", (("cache", "send_budget_blocked"),))] >= 3
    assert ("talon_cache_entries", (("cache", "send_budget"),)) in samples


async def test_many_telegram_chats_leave_bounded_state_everywhere(tmp_path: Path, tg: FakeTelegram,
                                                                    llm: FakeOpenAI, clock: Clock) -> None:
    """Five times the bound of chats through the real runtime (Telegram, drafts, reactions,
    typing, the agent): every per-chat structure stays within the bound, and after the idle time one
    more message leaves only its own chat's state in the agent."""
    from channels.telegram import TelegramChannel
    from talon.runtime import build_runtime

    chats = [ALICE + 1 + n for n in range(5 * BOUND)]
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_MODEL_DISCOVERY="false",
                             TALON_TELEGRAM_ALLOWED_USERS=",".join(str(c) for c in [ALICE, *chats]))
    channel = TelegramChannel(settings)
    runtime = build_runtime(settings, [channel])
    agent = runtime.bridge.agent

    def per_chat() -> list[Sized]:
        return [agent.last_usage, agent._threads, agent._chat_workspaces, channel.budget._spent,
                channel.budget._cosmetic, channel.budget._locks]

    await runtime.start()
    try:
        for batch in range(0, len(chats), 10):
            for chat in chats[batch:batch + 10]:
                tg.push_update(tg.text_message(chat, f"hello from {chat}", user_id=chat))
            await tg.wait_for("sendMessage", lambda c: "echo:" in str(c.params.get("text", "")),
                              count=batch + 10, timeout=60)
            await runtime.bridge.idle()
            assert all(0 < len(m) <= BOUND for m in per_chat()), [len(m) for m in per_chat()]
        per_chat_now = per_chat()
        clock.now += IDLE + 1
        tg.push_update(tg.text_message(ALICE, "still here", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "echo: still here", timeout=30)
        await runtime.bridge.idle()
        # The agent's maps follow the test's clock; the channel's send budget keeps to its own
        # (real) clock, and its idle forgetting is the test above.
        assert [len(m) for m in per_chat_now[:3]] == [1, 1, 1]
        assert all(len(m) <= BOUND for m in per_chat_now)
        others: list[Sized] = [channel.reactions._acknowledged, channel.live._views, channel.intake._albums,
                  runtime.bridge._live_ids, runtime.bridge._stops]
        assert all(len(m) <= BOUND for m in others), [len(m) for m in others]
    finally:
        await runtime.stop()


async def test_the_metrics_route_serves_rss_and_cache_sizes(tmp_path: Path, tg: FakeTelegram,
                                                           llm: FakeOpenAI) -> None:
    import httpx

    from channels.http import HttpServer
    from channels.telegram import TelegramChannel
    from talon.runtime import build_runtime

    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_MODEL_DISCOVERY="false",
                             TALON_HTTP_HOST="127.0.0.1", TALON_HTTP_PORT=0)
    http = HttpServer("127.0.0.1", 0)
    runtime = build_runtime(settings, [TelegramChannel(settings)], http=http)
    await runtime.start()
    try:
        tg.push_update(tg.text_message(ALICE, "hello", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "echo: hello", timeout=30)
        await runtime.bridge.idle()
        async with httpx.AsyncClient(base_url=http.local_url) as client:
            text = (await client.get("/metrics")).text
    finally:
        await runtime.stop()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("process_resident_memory_bytes", ())] > 10_000_000
    assert samples[("talon_cache_entries", (("cache", "agent_threads"),))] >= 1
    assert samples[("talon_cache_entries", (("cache", "send_budget"),))] >= 1
    assert str(ALICE) not in {value for (_, pairs) in samples for _, value in pairs}  # no chat in a label
