"""Who may /stop a turn in a group: whoever started it, an administrator of the group, or one of
TALON_APPROVERS; anyone else gets a one-line refusal and the turn goes on. End to end through the
fake Bot API (getChatMember answers who administers the group)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from talon.config import Settings
from tests.conftest import make_settings
from tests.conftest import running_telegram as running
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram

GROUP = -1001234567890
CAROL, MALLORY, DANA, ERIN = 333, 666, 444, 555
BOT = "@talon_test_bot"
REFUSAL = "Only the person who asked, an administrator of this group or an approver can stop what I am doing."


def _says(tg: FakeTelegram, user: int, name: str, text: str) -> dict[str, Any]:
    return tg.text_message(GROUP, text, user_id=user, username=name.lower(), first_name=name,
                           chat_type="supergroup", chat_title="Trip planning")


def _texts(tg: FakeTelegram) -> list[str]:
    return [c.params["text"] for c in tg.sent("sendMessage", GROUP)]


def _settings(tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI) -> Settings:
    return make_settings(tmp_path, tg.base_url, llm.base_url, TALON_TELEGRAM_ALLOWED_CHATS=str(GROUP),
                         TALON_APPROVERS=f"{ERIN}, @SomeoneElse", TALON_TELEGRAM_STREAMING="off")


async def test_only_the_starter_an_admin_or_an_approver_stops_a_group_turn(
    tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path
) -> None:
    tg.set_member_status(GROUP, DANA, "administrator")
    llm.queue("Friday at six.")
    async with running(_settings(tmp_path, tg, llm)) as runtime:
        # Carol's turn is under way (the model holds its answer); Mallory, a plain member, tries.
        llm.hang = True
        tg.push_update(_says(tg, CAROL, "Carol", f"{BOT} when do we leave?"))
        await llm.wait_for_requests(1)
        tg.push_update(_says(tg, MALLORY, "Mallory", "/stop"))
        await tg.wait_for("sendMessage", lambda c: c.params.get("text") == REFUSAL, timeout=15)
        llm.release()
        await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "Friday at six.", timeout=15)
        await runtime.bridge.idle()
        assert _texts(tg) == [REFUSAL, "Friday at six."]  # her turn was answered in full

        # An administrator, an approver and the starter herself may stop it.
        for stopper, name in ((DANA, "Dana"), (ERIN, "Erin"), (CAROL, "Carol")):
            seen = len(llm.requests)
            llm.hang = True
            tg.push_update(_says(tg, CAROL, "Carol", f"{BOT} and the hotel?"))
            await llm.wait_for_requests(seen + 1)
            tg.push_update(_says(tg, stopper, name, "/stop"))
            count = _texts(tg).count("Stopped.") + 1
            await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "Stopped.", count=count, timeout=15)
            llm.release()
            await runtime.bridge.idle()
    texts = _texts(tg)
    assert texts.count("Stopped.") == 3 and texts.count(REFUSAL) == 1, texts
    # The turns that were stopped gave no answer of their own.
    assert not any(t.startswith("echo:") for t in texts), texts
    # Only the /stop of people not otherwise known was checked with Telegram.
    checked = [c.params["user_id"] for c in tg.sent("getChatMember", chat_id=GROUP)]
    assert MALLORY in checked and DANA in checked


async def test_a_stop_in_a_private_chat_still_works_for_its_person(
    tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path
) -> None:
    from tests.conftest import ALICE

    async with running(_settings(tmp_path, tg, llm)) as runtime:
        llm.hang = True
        tg.push_update(tg.text_message(ALICE, "think hard", user_id=ALICE))
        await llm.wait_for_requests(1)
        tg.push_update(tg.text_message(ALICE, "/stop", user_id=ALICE))
        [stopped] = await tg.wait_for("sendMessage", lambda c: str(c.params.get("chat_id")) == str(ALICE),
                                      timeout=15)
        llm.release()
        await runtime.bridge.idle()
    assert stopped.params["text"] == "Stopped."
    assert tg.sent("getChatMember") == []
