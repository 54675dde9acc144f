"""The overview's chart counts messages answered per day (issue 29): a message counts once the
agent's reply to it is delivered; one whose turn failed (the apology is not an answer) or a
command does not, and received messages alone never do."""

from __future__ import annotations

import re
import time
from pathlib import Path

from tests.conftest import ALICE
from tests.fakes.openai_server import ErrorReply, FakeOpenAI
from tests.fakes.telegram import FakeTelegram
from tests.support.panel import client_for, panel_settings, running_panel, sign_in

_BAR = re.compile(r"<title>(\d\d-\d\d): (\d+)</title>")


def today_bar(html: str) -> int:
    bars = dict(_BAR.findall(html))
    return int(bars[time.strftime("%m-%d", time.gmtime())])


async def test_the_overview_chart_counts_messages_answered_not_received(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = panel_settings(tmp_path, tg.base_url, llm.base_url)
    llm.queue("First answer.", ErrorReply(400, "the model refused this request"), "Second answer.")
    async with running_panel(settings) as runtime, client_for(runtime) as client:
        indexer = runtime.indexer
        assert indexer is not None
        await sign_in(client)
        tg.push_update(tg.text_message(ALICE, "hello", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: "First answer." in str(c.params.get("text")))
        tg.push_update(tg.text_message(ALICE, "this one fails", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: "First answer." not in str(c.params.get("text")), count=1)
        tg.push_update(tg.text_message(ALICE, "/help", user_id=ALICE))
        tg.push_update(tg.text_message(ALICE, "again", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: "Second answer." in str(c.params.get("text")))
        await runtime.bridge.idle()
        await indexer.flush()
        page = await client.get("/ui/")
        assert "Messages answered per day" in page.text
        assert today_bar(page.text) == 2  # hello and again; not the failed one, not /help
        rows = await runtime.stores.panel.chats()  # type: ignore[union-attr]
        assert [r.messages for r in rows] == [4]  # the chats page still counts what was received
