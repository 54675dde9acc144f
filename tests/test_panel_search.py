"""The panel's search over every chat (issue 30 part 4): the operator finds a message in any
conversation, each hit linking to it; hostile queries (FTS5 syntax, SQL, markup) are only words;
nothing without a session."""

from __future__ import annotations

from pathlib import Path

from talon.content import Message, TextBlock
from talon.storage.sessions import ChatKey
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram
from tests.support.panel import client_for, panel_settings, running_panel, sign_in

HOSTILE = ['"', '*', 'boiler OR x', 'NEAR(boiler', "body: boiler", "'; DROP TABLE lines; --", 'chat_tag : "zc',
           "boiler\" OR \"1\"=\"1", "<script>alert(1)</script>", "%_\\", "", "   ", "(((", "^boiler"]


def said(text: str, role: str = "user") -> Message:
    return Message(role=role, content=[TextBlock(text=text)])  # type: ignore[arg-type]


async def test_the_operator_searches_every_chat_and_each_hit_links_to_its_conversation(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = panel_settings(tmp_path, tg.base_url, llm.base_url)
    async with running_panel(settings) as runtime, client_for(runtime) as client:
        a, b = ChatKey("telegram", "111"), ChatKey("telegram", "-100222:7")
        await runtime.sessions.append(a, said("the boiler makes a knocking noise in March"))
        await runtime.sessions.append(b, said("we decided to replace the boiler valve", "assistant"))
        await runtime.sessions.append(b, said("an unrelated canary line"))
        # Without a session: the page redirects to sign-in and shows nothing of the index.
        anonymous = await client.get("/ui/search", params={"q": "boiler"})
        assert anonymous.status_code == 303 and anonymous.headers["Location"] == "/ui/signin"
        await sign_in(client)
        chats = await client.get("/ui/chats")
        assert 'action="/ui/search"' in chats.text  # the search box is on the chats page
        page = await client.get("/ui/search", params={"q": "Boiler"})
        assert page.status_code == 200
        assert "knocking noise" in page.text and "replace the boiler valve" in page.text
        assert 'href="/ui/chats/telegram:111"' in page.text
        assert 'href="/ui/chats/telegram:-100222:7"' in page.text
        assert "canary" not in page.text
        both = await client.get("/ui/search", params={"q": "boiler valve"})
        assert "replace the boiler valve" in both.text and "knocking" not in both.text
        # The linked conversation opens.
        assert (await client.get("/ui/chats/telegram:-100222:7")).status_code == 200

        for query in HOSTILE:
            answer = await client.get("/ui/search", params={"q": query})
            assert answer.status_code == 200, query
            assert "<script>alert(1)</script>" not in answer.text  # escaped, never markup
        # Syntax is words: a quote or OR finds what the words find, no more.
        tricky = await client.get("/ui/search", params={"q": 'boiler" OR "canary'})
        assert "No message matches" in tricky.text  # all of boiler, or, canary: no single message
        # The index survived the SQL-looking queries.
        again = await client.get("/ui/search", params={"q": "knocking"})
        assert "knocking noise" in again.text
