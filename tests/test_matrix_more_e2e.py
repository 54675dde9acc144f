"""Matrix against a real Synapse, what the first builders left open (issue 32): a voice message
(``org.matrix.msc3245.voice``) is transcribed by the bundled Whisper model; a scheduled task made
in a thread is delivered into that thread; the text commands !status, !usage, !tasks and !new
answer in their conversation, and a stranger's command in a room gets nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from talon.config import Settings
from tests.fakes.openai_server import FakeOpenAI
from tests.support.matrix import joined, matrix_settings, people, running
from tests.support.matrix_people import Event, final_texts, from_user
from tests.support.scenarios import STANDUP, assert_command_answers, assert_heard_the_fox, standup_agent
from tests.support.synapse import Synapse

FIXTURES = Path(__file__).parent / "fixtures"


def settings_for(tmp_path: Path, synapse: Synapse, bot: Any, llm: FakeOpenAI, **extra: object) -> Settings:
    return matrix_settings(tmp_path, synapse, bot, llm, TALON_MATRIX_STREAMING=False, TALON_MATRIX_ACK_REACTION="",
                           TALON_MODEL_DISCOVERY=False, TALON_TASK_POLL_INTERVAL=0.1, **extra)


def in_thread(events: list[Event], user: str, root: str) -> list[str]:
    return [e["content"]["body"] for e in from_user(events, user)
            if (e["content"].get("m.relates_to") or {}).get("rel_type") == "m.thread"
            and e["content"]["m.relates_to"].get("event_id") == root]


async def test_a_voice_message_is_transcribed_by_the_bundled_model(
        synapse: Synapse, llm: FakeOpenAI, tmp_path: Path) -> None:
    bot = synapse.register("bot")
    llm.queue("Heard you.")
    voice = (FIXTURES / "speech_fox.ogg").read_bytes()
    with people(synapse, "alice") as (alice,):
        async with running(settings_for(tmp_path, synapse, bot, llm, TALON_MATRIX_ALLOWED_USERS=alice.id)):
            dm = alice.create_room([bot.user_id], direct=True)
            await joined(alice, dm, bot.user_id)
            mxc = alice.upload(voice, "audio/ogg", "voice-message.ogg")
            alice.send(dm, {"msgtype": "m.audio", "body": "Voice message", "url": mxc,
                            "info": {"mimetype": "audio/ogg", "size": len(voice), "duration": 4000},
                            "org.matrix.msc3245.voice": {}, "org.matrix.msc1767.audio": {"duration": 4000}})
            await alice.wait_for(dm, lambda ev: final_texts(ev, bot.user_id), what="the answer", timeout=180)
    assert_heard_the_fox(llm)


async def test_a_task_made_in_a_thread_is_delivered_into_that_thread(
        synapse: Synapse, llm: FakeOpenAI, tmp_path: Path) -> None:
    bot = synapse.register("bot")
    llm.default_responder = standup_agent()
    with people(synapse, "alice", "carol") as (alice, carol):
        room = alice.create_room([bot.user_id, carol.id], name="Standups")
        carol.join(room)
        async with running(settings_for(tmp_path, synapse, bot, llm, TALON_MATRIX_ALLOWED_ROOMS=room)):
            await joined(alice, room, bot.user_id)
            root = alice.say(room, "standup thread")
            thread = {"m.relates_to": {"rel_type": "m.thread", "event_id": root, "is_falling_back": True,
                                       "m.in_reply_to": {"event_id": root}}}
            carol.say(room, f"{bot.user_id}: remind us in 2 seconds",
                      **thread, **{"m.mentions": {"user_ids": [bot.user_id]}})
            await alice.wait_for(room, lambda ev: STANDUP in in_thread(ev, bot.user_id, root),
                                 what="the run in the thread")
            carol.say(room, "!tasks", **thread)
            carol.say(room, "!tasks")
            await alice.wait_for(room, lambda ev: sum("It is now" in t for t in final_texts(ev, bot.user_id)) >= 2,
                                 what="both /tasks answers")
        events = alice.timeline(room)
    assert final_texts(events, bot.user_id).count(STANDUP) == 1
    [listed] = [t for t in in_thread(events, bot.user_id, root) if "It is now" in t]
    [other] = [t for t in final_texts(events, bot.user_id) if "It is now" in t and t != listed]
    assert "delivered" in listed and "No scheduled tasks in this chat." in other


async def test_status_usage_tasks_and_new_as_text_commands_and_a_stranger_gets_nothing(
        synapse: Synapse, llm: FakeOpenAI, tmp_path: Path) -> None:
    bot = synapse.register("bot")
    llm.queue("First answer.")
    with people(synapse, "alice", "mallory") as (alice, mallory):
        async with running(settings_for(tmp_path, synapse, bot, llm, TALON_MATRIX_ALLOWED_USERS=alice.id)):
            dm = alice.create_room([bot.user_id, mallory.id])  # a room of three is not a direct chat
            mallory.join(dm)
            direct = alice.create_room([bot.user_id], direct=True)
            await joined(alice, direct, bot.user_id)
            alice.say(direct, "hello")
            await alice.wait_for(direct, lambda ev: final_texts(ev, bot.user_id), what="the first answer")
            for n, command in enumerate(("!status", "!usage", "!tasks", "!new"), start=2):
                alice.say(direct, command)
                await alice.wait_for(direct, lambda ev, n=n: len(final_texts(ev, bot.user_id)) >= n, what=command)
            mallory.say(dm, "!status")  # an unlisted room: nothing
            alice.say(direct, "!tasks")
            await alice.wait_for(direct, lambda ev: len(final_texts(ev, bot.user_id)) >= 6, what="the last /tasks")
        replies = final_texts(alice.timeline(direct), bot.user_id)
        elsewhere = final_texts(alice.timeline(dm), bot.user_id)
    assert_command_answers(*replies[1:5])
    assert elsewhere == [] and len(replies) == 6
    assert len(llm.requests) == 1  # the commands made no model call
