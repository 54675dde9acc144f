"""Discord, what the first builders left open (issue 32): a message in a thread the gateway never
announced (made while offline) is served as that thread's; a voice message is transcribed by the
bundled Whisper model; a scheduled task made in a thread is delivered into that thread; the text
commands /status, /usage, /tasks and /new answer in the conversation they were typed in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from talon.config import Settings
from tests.fakes.discord import BOT_ID, FakeDiscord
from tests.fakes.openai_server import FakeOpenAI
from tests.support.discord import ALICE, CAROL, DM, GENERAL, GUILD, OTHER, THREAD, discord_settings, running
from tests.support.discord import discord_fake  # noqa: F401  (the fixture)
from tests.support.scenarios import STANDUP, assert_command_answers, assert_heard_the_fox, standup_agent

FIXTURES = Path(__file__).parent / "fixtures"


def settings_for(tmp_path: Path, fake: FakeDiscord, llm: FakeOpenAI) -> Settings:
    return discord_settings(tmp_path, fake, llm, TALON_DISCORD_STREAMING="false", TALON_DISCORD_ACK_REACTION="",
                            TALON_TASK_POLL_INTERVAL="0.1")


async def say(fake: FakeDiscord, channel: int, user: int, text: str, **kw: Any) -> dict[str, Any]:
    data = fake.message_create(channel, user, text, **kw)
    await fake.dispatch("MESSAGE_CREATE", data)
    return data


def mention(text: str) -> str:
    return f"<@{BOT_ID}> {text}"


async def test_a_thread_made_while_offline_is_served_as_its_own_conversation_and_hostile_ones_are_not(
        discord_fake: FakeDiscord, llm: FakeOpenAI, tmp_path: Path) -> None:
    new_thread, stray_thread, missing = 710, 711, 799
    llm.queue("In the new thread.", "Still here.")
    async with running(settings_for(tmp_path, discord_fake, llm)) as runtime:
        # Made after the bot's GUILD_CREATE and never announced (no THREAD_CREATE): unknown to the cache.
        discord_fake.add_channel(new_thread, "made offline", guild_id=GUILD, parent_id=GENERAL)
        discord_fake.add_channel(stray_thread, "elsewhere", guild_id=GUILD, parent_id=OTHER)  # unlisted parent
        await say(discord_fake, stray_thread, ALICE, mention("answer me here"), mentions=(BOT_ID,))
        ghost = discord_fake.message_create(new_thread, ALICE, mention("a channel that does not exist"),
                                            mentions=(BOT_ID,))
        ghost["channel_id"] = str(missing)  # the look-up gets a 404
        await discord_fake.dispatch("MESSAGE_CREATE", ghost)
        foreign = discord_fake.message_create(new_thread, ALICE, mention("from a server the bot is not in"),
                                              mentions=(BOT_ID,))
        foreign["guild_id"] = "999"  # not a direct message, whatever the cache lacks
        await discord_fake.dispatch("MESSAGE_CREATE", foreign)
        await say(discord_fake, new_thread, ALICE, mention("does this work?"), mentions=(BOT_ID,))
        await discord_fake.wait_until(lambda: discord_fake.texts(new_thread), "the answer in the new thread")
        await say(discord_fake, new_thread, ALICE, mention("and again?"), mentions=(BOT_ID,))
        await discord_fake.wait_until(lambda: len(discord_fake.texts(new_thread)) == 2, "the second answer")
        from talon.storage.sessions import ChatKey
        thread = await runtime.sessions.load(ChatKey("discord", f"{GENERAL}:{new_thread}"))
    assert discord_fake.texts(new_thread) == ["In the new thread.", "Still here."]
    assert [m.text for m in thread if m.role == "assistant"] == ["In the new thread.", "Still here."]
    assert not discord_fake.bot_messages(stray_thread) and not discord_fake.bot_messages(GENERAL)
    assert len(llm.requests) == 2  # neither the unlisted thread, the missing channel nor the foreign server made a turn
    assert "made offline" in str(llm.requests[0].json)  # the thread's name, from the look-up
    lookups = [c for c in discord_fake.calls if c.method == "GET" and c.path.endswith(f"/channels/{new_thread}")]
    assert len(lookups) == 1, discord_fake.summary()  # looked up once, then remembered


async def test_a_voice_message_is_transcribed_by_the_bundled_model(
        discord_fake: FakeDiscord, llm: FakeOpenAI, tmp_path: Path) -> None:
    voice = (FIXTURES / "speech_fox.ogg").read_bytes()
    llm.queue("Heard you.")
    async with running(settings_for(tmp_path, discord_fake, llm)):
        note = {**discord_fake.add_attachment(DM, voice, "voice-message.ogg", "audio/ogg"),
                "duration_secs": 4.0, "waveform": "AAAA"}
        await say(discord_fake, DM, ALICE, "", attachments=[note])
        await discord_fake.wait_until(lambda: discord_fake.texts(DM), "the answer", timeout=180)
    assert_heard_the_fox(llm)


async def test_a_task_made_in_a_thread_is_delivered_into_that_thread(
        discord_fake: FakeDiscord, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.default_responder = standup_agent()
    async with running(settings_for(tmp_path, discord_fake, llm)):
        await say(discord_fake, THREAD, CAROL, mention("remind us in 2 seconds"), mentions=(BOT_ID,))
        await discord_fake.wait_until(lambda: STANDUP in discord_fake.texts(THREAD),
                                      "the task's run in the thread", timeout=30)
        await say(discord_fake, THREAD, CAROL, "!tasks")
        await say(discord_fake, GENERAL, CAROL, "!tasks")
        await discord_fake.wait_until(lambda: any("It is now" in t for t in discord_fake.texts(GENERAL)),
                                      "/tasks in the channel")
        await discord_fake.wait_until(lambda: any("It is now" in t for t in discord_fake.texts(THREAD)),
                                      "/tasks in the thread")
    assert discord_fake.texts(THREAD).count(STANDUP) == 1
    assert STANDUP not in discord_fake.texts(GENERAL)
    [in_thread] = [t for t in discord_fake.texts(THREAD) if "It is now" in t]
    [in_channel] = [t for t in discord_fake.texts(GENERAL) if "It is now" in t]
    assert "delivered" in in_thread and "No scheduled tasks in this chat." in in_channel


async def test_status_usage_tasks_and_new_answer_as_text_commands(
        discord_fake: FakeDiscord, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.queue("First answer.")
    async with running(settings_for(tmp_path, discord_fake, llm)):
        await say(discord_fake, DM, ALICE, "hello")
        await discord_fake.wait_until(lambda: discord_fake.texts(DM), "the first answer")
        for n, command in enumerate(("!status", "/usage", "!tasks", "!new"), start=2):
            await say(discord_fake, DM, ALICE, command)
            await discord_fake.wait_until(lambda n=n: len(discord_fake.texts(DM)) >= n, command)  # type: ignore[misc]
    assert_command_answers(*discord_fake.texts(DM)[1:5])
    assert len(llm.requests) == 1  # the commands made no model call

