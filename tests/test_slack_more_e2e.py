"""Slack, what the first builders left open (issue 32): a voice clip is transcribed by the bundled
Whisper model; a scheduled task made in a thread is delivered into that thread (and not to the
channel); the text commands !status, !usage, !tasks and !new and the same slash commands answer
in their conversation; a slash command from someone not allowed, or forged, gets nothing."""

from __future__ import annotations

from pathlib import Path

from talon.config import Settings
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack import BOT_USER, FakeSlack
from tests.support.scenarios import STANDUP, assert_command_answers, assert_heard_the_fox, standup_agent
from tests.support.slack import ALICE, CAROL, DM, GENERAL, MALLORY, running, slack_settings
from tests.support.slack import slack  # noqa: F401  (the fixture)

FIXTURES = Path(__file__).parent / "fixtures"


def settings_for(tmp_path: Path, slack: FakeSlack, llm: FakeOpenAI) -> Settings:
    return slack_settings(tmp_path, slack, llm, TALON_SLACK_STREAMING="false", TALON_SLACK_ACK_REACTION="",
                          TALON_TASK_POLL_INTERVAL="0.1")


def texts(slack: FakeSlack, channel: str, thread: str | None = None) -> list[str]:
    return [m.text for m in slack.bot_messages(channel, thread) if m.text]


async def test_a_voice_clip_is_transcribed_by_the_bundled_model(
        slack: FakeSlack, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.queue("Heard you.")
    async with running(settings_for(tmp_path, slack, llm)) as (_, url):
        clip = {**slack.add_file((FIXTURES / "speech_fox.ogg").read_bytes(), "audio_message.ogg", "audio/ogg"),
                "subtype": "slack_audio"}
        assert await slack.deliver(url, "event", slack.message_event(DM, ALICE, "", files=[clip])) == 200
        await slack.wait_until(lambda: texts(slack, DM), "the answer", timeout=180)
    assert_heard_the_fox(llm)


async def test_a_task_made_in_a_thread_is_delivered_into_that_thread(
        slack: FakeSlack, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.default_responder = standup_agent()
    async with running(settings_for(tmp_path, slack, llm)) as (_, url):
        root = slack.message_event(GENERAL, CAROL, "standup thread", channel_type="channel")
        await slack.deliver(url, "event", root)
        ts = root["event"]["ts"]
        await slack.deliver(url, "event", slack.message_event(GENERAL, CAROL, f"<@{BOT_USER}> remind us in 2 seconds",
                                                              channel_type="channel", thread_ts=ts))
        await slack.wait_until(lambda: STANDUP in texts(slack, GENERAL, ts), "the run in the thread")
        await slack.deliver(url, "event", slack.message_event(GENERAL, CAROL, "!tasks", channel_type="channel",
                                                              thread_ts=ts))
        await slack.deliver(url, "event", slack.message_event(GENERAL, CAROL, "!tasks", channel_type="channel"))
        await slack.wait_until(lambda: any("It is now" in t for t in texts(slack, GENERAL, ts)), "/tasks in thread")
        await slack.wait_until(lambda: [m for m in slack.bot_messages(GENERAL) if "It is now" in m.text
                                         and m.thread_ts != ts], "/tasks in the channel")
    runs = [m for m in slack.bot_messages(GENERAL) if m.text == STANDUP]
    assert [m.thread_ts for m in runs] == [ts], slack.summary()  # once, in the thread
    [in_thread] = [t for t in texts(slack, GENERAL, ts) if "It is now" in t]
    [in_channel] = [m.text for m in slack.bot_messages(GENERAL) if "It is now" in m.text and m.thread_ts != ts]
    assert "delivered" in in_thread and "No scheduled tasks in this chat." in in_channel


async def test_status_usage_tasks_and_new_as_text_and_slash_commands(
        slack: FakeSlack, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.queue("First answer.")
    async with running(settings_for(tmp_path, slack, llm)) as (_, url):
        await slack.deliver(url, "event", slack.message_event(DM, ALICE, "hello"))
        await slack.wait_until(lambda: texts(slack, DM), "the first answer")
        for n, command in enumerate(("!status", "!usage", "!tasks", "!new"), start=2):
            await slack.deliver(url, "event", slack.message_event(DM, ALICE, command))
            await slack.wait_until(lambda n=n: len(texts(slack, DM)) >= n, command)  # type: ignore[misc]
        assert await slack.deliver(url, "command", slack.slash_command(DM, ALICE, "/status")) == 200
        await slack.wait_until(lambda: len(texts(slack, DM)) >= 6, "/status as a slash command")
        # Hostile: a stranger's slash command in Alice's DM, and a forged (unsigned) one.
        assert await slack.deliver(url, "command", slack.slash_command(DM, MALLORY, "/usage")) == 200
        assert await slack.deliver(url, "command", slack.slash_command(DM, ALICE, "/new"), tries=1,
                                   headers={}) == 401
        await slack.deliver(url, "event", slack.message_event(DM, ALICE, "!tasks"))
        await slack.wait_until(lambda: len(texts(slack, DM)) >= 7, "the last /tasks")
    replies = texts(slack, DM)
    assert_command_answers(*replies[1:5])
    assert "fake-model" in replies[5]  # /status as a slash command
    assert len(replies) == 7 and "No scheduled tasks" in replies[6], replies  # mallory and the forgery got nothing
    assert len(llm.requests) == 1  # the commands made no model call
