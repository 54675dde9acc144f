"""Search over past conversations end to end, through the fake Bot API and the real OpenAI client:
``/search`` and the agent's ``search_conversations`` find a message of an earlier session (before
/new) in the same chat, with its date, and never one from another chat (a canary in Bob's chat),
whatever the model puts in the query."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ALICE, BOB, make_settings
from tests.conftest import running_telegram as running
from tests.fakes.openai_server import FakeOpenAI, last_user_text
from tests.fakes.telegram import Call, FakeTelegram

CANARY = "quetzalcanary"


def to(chat: int, part: str) -> Callable[[Call], bool]:
    return lambda c: str(c.params.get("chat_id")) == str(chat) and part in str(c.params.get("text"))


def tool_results(llm: FakeOpenAI) -> list[str]:
    """The tool results of the current thread, in order, as the last request carries them."""
    return [m["content"] if isinstance(m["content"], str) else json.dumps(m["content"])
            for m in llm.requests[-1].json["messages"] if m["role"] == "tool"]


QUERIES = [CANARY, f'"{CANARY}" OR boiler', f"{CANARY}*", f"NEAR(boiler {CANARY})", f"chat_id:{BOB} {CANARY}",
           f"telegram:{BOB} {CANARY}", f"') OR 1=1 -- {CANARY}"]


async def test_search_finds_an_earlier_session_in_this_chat_and_never_another_chats(
        tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI) -> None:
    queries = iter(QUERIES + ["boiler"])

    def respond(request: dict[str, Any]) -> Any:
        if request["messages"][-1]["role"] == "tool":
            return "Searched."
        text = last_user_text(request)
        if text.startswith("what did we say"):
            return FakeOpenAI.tool_call("search_conversations", {"query": next(queries), "limit": 50})
        return f"noted: {text}"

    llm.default_responder = respond
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_TELEGRAM_STREAMING="off",
                             TALON_MODEL_DISCOVERY="false")
    async with running(settings):
        tg.push_update(tg.text_message(BOB, f"my boiler secret is {CANARY}", user_id=BOB, username="bob"))
        await tg.wait_for("sendMessage", to(BOB, "noted:"), timeout=20)
        tg.push_update(tg.text_message(ALICE, "The boiler pressure is 1.5 bar", user_id=ALICE))
        await tg.wait_for("sendMessage", to(ALICE, "noted: The boiler"), timeout=20)
        tg.push_update(tg.text_message(ALICE, "/new", user_id=ALICE))
        await tg.wait_for("sendMessage", to(ALICE, "Started a new conversation"), timeout=20)
        # The person searches: the earlier session is found, with its date; Bob's chat is not.
        tg.push_update(tg.text_message(ALICE, "/search boiler", user_id=ALICE))
        [found] = await tg.wait_for("sendMessage", to(ALICE, "match"), timeout=20)
        for n, _ in enumerate(QUERIES + ["boiler"], 1):
            tg.push_update(tg.text_message(ALICE, f"what did we say {n}?", user_id=ALICE))
            await tg.wait_for("sendMessage", to(ALICE, "Searched."), count=n, timeout=30)
        tg.push_update(tg.text_message(ALICE, f"/search {CANARY}", user_id=ALICE))
        [nothing] = await tg.wait_for("sendMessage", to(ALICE, "No earlier message"), timeout=20)
    text = found.params["text"]
    assert "The boiler pressure is 1.5 bar" in text and " UTC, user " in text, text
    assert CANARY not in text and CANARY not in nothing.params["text"].replace(f"'{CANARY}'", "")
    results = tool_results(llm)
    assert len(results) == len(QUERIES) + 1, results
    for result in results[:-1]:
        assert "bar" not in result or "boiler" in result  # only Alice's own words can come back
        assert f"is {CANARY}" not in result, result
    assert "The boiler pressure is 1.5 bar" in results[-1] and "UTC" in results[-1]
    # The model's query never reached Bob's chat in any form.
    assert all("my boiler secret" not in r for r in results)


@pytest.mark.parametrize("args", [{"query": ""}, {"query": 5}, {"query": "x", "limit": "all"},
                                  {"query": "x", "limit": True}])
async def test_the_tool_refuses_bad_arguments_with_the_reason(args: dict[str, Any], tmp_path: Path) -> None:
    from talon.agent.tools.search import SearchConversationsTool
    from talon.envelope import TURN_MESSAGE, InboundMessage
    from talon.errors import ToolError
    from talon.storage.sessions import MemorySessions

    tool = SearchConversationsTool(MemorySessions(tmp_path))
    token = TURN_MESSAGE.set(InboundMessage(channel="telegram", chat_id="1", message_id="1", sender_id="1",
                                            text="q"))
    try:
        with pytest.raises(ToolError):
            await tool.run(args)
    finally:
        TURN_MESSAGE.reset(token)
    with pytest.raises(ToolError, match="only in a chat"):
        await tool.run({"query": "x"})
