"""WhatsApp's waiting messages on two workers sharing one PostgreSQL: a message that waits for the
24-hour window on one worker is delivered by the other when the person writes to it, before the
answer to their new message, once."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from channels.whatsapp import WhatsAppChannel
from talon.config import Settings
from talon.envelope import InboundMessage, ScheduledRun
from talon.runtime import Runtime, build_runtime
from talon.storage.factory import open_stores
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.twilio import FakeTwilio
from tests.support.whatsapp import ALICE, post, wa_settings

REOPEN = "HX" + "a" * 32


@pytest_asyncio.fixture
async def twilio() -> AsyncIterator[FakeTwilio]:
    async with FakeTwilio() as fake:
        yield fake


@contextlib.asynccontextmanager
async def worker(settings: Settings) -> AsyncIterator[tuple[Runtime, WhatsAppChannel]]:
    stores = open_stores(settings)
    channel = WhatsAppChannel(settings, retry_base_s=0.01, media_drain_s=0.0, links=stores.links,
                              state=stores.whatsapp, worker_id=stores.worker_id)
    runtime = build_runtime(settings, [channel], stores=stores)
    await runtime.start()
    try:
        yield runtime, channel
    finally:
        await runtime.stop()


async def test_a_message_waiting_on_one_worker_is_delivered_by_the_other_before_the_new_answer(
        tmp_path: Path, twilio: FakeTwilio, llm: FakeOpenAI, pg_url: str) -> None:
    shared: dict[str, object] = dict(TALON_DATABASE_URL=pg_url, TALON_MODEL_DISCOVERY="false",
                                     TALON_WHATSAPP_TEMPLATE_REOPEN=REOPEN)
    settings_a = wa_settings(tmp_path, twilio, llm, TALON_WORKER_ID="wa-1", **shared)
    settings_b = wa_settings(tmp_path, twilio, llm, TALON_WORKER_ID="wa-2", **shared)
    llm.queue("The report you scheduled.")
    async with worker(settings_a) as (runtime_a, a), worker(settings_b) as (runtime_b, b):
        await a.state.seen(ALICE, time.time() - 25 * 3600)
        twilio.close_window(ALICE)
        assert await b.window.state(ALICE) == "closed"  # one window, shared
        await runtime_a.bridge.submit(InboundMessage(
            channel="whatsapp", chat_id=ALICE, sender_id=ALICE, message_id="run-1", text="the report",
            scheduled=ScheduledRun(task_id="t1", due=time.time())))
        [template] = await twilio.wait_for_messages(1, to=ALICE)
        assert template.content_sid == REOPEN
        await runtime_a.bridge.idle()
        assert await b.state.pending_count(ALICE) == 1
        llm.queue("Good morning.")
        await post(b, twilio.inbound_params(ALICE, "morning"), sign_with=twilio)
        sent = await twilio.wait_for_messages(3, to=ALICE)
        await runtime_a.bridge.idle()
        await runtime_b.bridge.idle()
        assert await a.state.pending_count(ALICE) == 0
    assert [m.body for m in sent[1:]] == ["The report you scheduled.", "Good morning."]
    assert len(twilio.sent(to=ALICE)) == 3
