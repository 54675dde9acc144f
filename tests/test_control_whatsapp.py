"""Approvals on WhatsApp: the prompt asks for a yes/no reply, and the reply answers it without
becoming a turn; with nothing waiting, "yes" is an ordinary message."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.twilio import FakeTwilio
from tests.support.whatsapp import ALICE, post, running, wa_settings
@pytest_asyncio.fixture
async def twilio() -> AsyncIterator[FakeTwilio]:
    async with FakeTwilio() as fake:
        yield fake


def tool_results(body: dict) -> list[str]:
    return [str(m.get("content")) for m in body["messages"] if m.get("role") == "tool"]


async def test_a_yes_reply_on_whatsapp_approves_and_no_turn_is_started_for_it(
        tmp_path: Path, twilio: FakeTwilio, llm: FakeOpenAI) -> None:
    llm.queue("Yes to what?",
              FakeOpenAI.tool_call("write_file", {"path": "note.txt", "content": "from whatsapp"}), "Written.",
              FakeOpenAI.tool_call("write_file", {"path": "other.txt", "content": "x"}), "Left it.")
    settings = wa_settings(tmp_path, twilio, llm, TALON_APPROVAL="write", TALON_MODEL_DISCOVERY="false")
    workspace = settings.workspace_dir("whatsapp", ALICE)
    async with running(settings) as (runtime, channel):
        # Nothing waits: "yes" is an ordinary message.
        await post(channel, twilio.inbound_params(ALICE, "yes"), sign_with=twilio)
        await twilio.wait_for_messages(1, to=ALICE)
        await post(channel, twilio.inbound_params(ALICE, "write a note"), sign_with=twilio)
        [_, prompt] = await twilio.wait_for_messages(2, to=ALICE)
        assert "write the file note.txt (13 characters)" in prompt.body and "Reply yes" in prompt.body
        await post(channel, twilio.inbound_params(ALICE, "yes", profile_name="Alice"), sign_with=twilio)
        await twilio.wait_for_messages(4, to=ALICE)
        await runtime.bridge.idle()
        await post(channel, twilio.inbound_params(ALICE, "write another"), sign_with=twilio)
        await twilio.wait_for_messages(5, to=ALICE)
        await post(channel, twilio.inbound_params(ALICE, "/deny"), sign_with=twilio)
        await twilio.wait_for_messages(7, to=ALICE)
        await runtime.bridge.idle()
        assert not await runtime.inbox.pending()
    bodies = [m.body for m in twilio.sent(to=ALICE)]
    assert bodies[0] == "Yes to what?"
    assert any("Approved by Alice" in b for b in bodies) and "Written." in bodies and "Left it." in bodies
    assert any("Denied by" in b for b in bodies)
    assert (workspace / "note.txt").read_text() == "from whatsapp" and not (workspace / "other.txt").exists()
    assert len(llm.requests) == 5  # the replies answered the approvals; neither started a turn
    assert "denied by the user" in tool_results(llm.requests[4].json)[-1]
