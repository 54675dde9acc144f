"""WhatsApp on two workers sharing one PostgreSQL: Twilio's webhook reaches one worker, its fetch
of the reply's media link reaches the other, and a retried webhook to the other is answered once."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from channels.whatsapp import WhatsAppChannel
from talon.config import Settings
from talon.runtime import Runtime, build_runtime
from talon.storage.factory import open_stores
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.twilio import FakeTwilio
from tests.support.whatsapp import ALICE, PUBLIC, post, twilio, wa_settings  # noqa: F401
from tests.support.images import png, wav


@contextlib.asynccontextmanager
async def worker(settings: Settings) -> AsyncIterator[tuple[Runtime, WhatsAppChannel]]:
    stores = open_stores(settings)
    channel = WhatsAppChannel(settings, retry_base_s=0.01, media_drain_s=0.0, links=stores.links)
    runtime = build_runtime(settings, [channel], stores=stores)
    await runtime.start()
    try:
        yield runtime, channel
    finally:
        await runtime.stop()


async def get(channel: WhatsAppChannel, media_url: str) -> tuple[int, str, bytes]:
    assert media_url.startswith(PUBLIC + "/media/")
    async with aiohttp.ClientSession() as session:
        async with session.get(channel.http.local_url + urlsplit(media_url).path) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), await resp.read()


async def test_webhook_to_one_worker_media_link_fetched_from_the_other(
    tmp_path: Path, twilio: FakeTwilio, llm: FakeOpenAI, pg_url: str
) -> None:
    shared = dict(TALON_DATABASE_URL=pg_url)
    settings_a = wa_settings(tmp_path, twilio, llm, TALON_WORKER_ID="wa-1", **shared)
    settings_b = wa_settings(tmp_path, twilio, llm, TALON_WORKER_ID="wa-2", **shared)
    root = settings_a.workspace_dir("whatsapp", ALICE)  # the chat's own workspace, on shared storage
    root.mkdir(parents=True, exist_ok=True)
    chart = png()
    (root / "chart.png").write_bytes(chart)
    (root / "answer.wav").write_bytes(wav())
    llm.queue("![c](chart.png) ![voice reply](answer.wav)")
    async with worker(settings_a) as (_, a), worker(settings_b) as (runtime_b, b):
        params = twilio.inbound_params(ALICE, "send the chart")
        assert (await post(a, params, sign_with=twilio))[0] == 200
        sent = await twilio.wait_for_messages(2, to=ALICE)
        # Twilio retries the same webhook, and the load balancer sends it to the other worker.
        assert (await post(b, params, sign_with=twilio))[0] == 200
        image_url, voice_url = (m.media_urls[0] for m in sent)
        # b made neither link (its own table in memory would not know them).
        status, mime, body = await get(b, image_url)
        v_status, v_mime, voice = await get(b, voice_url)
        assert (await get(b, image_url.replace(urlsplit(image_url).path.split("/")[2], "x" * 43)))[0] == 404
        assert (await get(a, image_url))[0] == 200  # any worker, any number of times until expiry
        await runtime_b.bridge.idle()
    assert (status, mime, body) == (200, "image/png", chart)
    # The transcoded voice note: bytes Talon made, kept in the shared attachment store.
    assert v_status == 200 and v_mime == "audio/ogg" and voice.startswith(b"OggS")
    assert len(twilio.sent(to=ALICE)) == 2  # the retry was not answered again
    assert len(llm.requests) == 1
