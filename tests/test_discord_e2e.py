"""The Discord channel end to end: Talon's runtime with its real discord.py client against the
loopback fake of Discord's REST API and gateway (tests/fakes/discord.py); answers come from the
fake model server (issue 32)."""

from __future__ import annotations

import asyncio
import io
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from talon.runtime import build_runtime
from tests.fakes.discord import BOT_ID, FakeDiscord
from tests.fakes.openai_server import FakeOpenAI, image_urls, last_user_text
from tests.support.discord import (ALICE, CAROL, DM, GENERAL, MALLORY, OTHER, STRANGER_DM, THREAD, discord_env,
                                   discord_settings, populate, running, say)
from tests.support.discord import discord_fake  # noqa: F401  (the fixture)


def png(color: str = "red") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), color).save(out, "PNG")
    return out.getvalue()


async def test_direct_messages_are_answered_in_order_and_a_stranger_gets_a_pairing_code_only(
        discord_fake: FakeDiscord, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.queue("First answer.", "Second **answer** for @everyone.")
    settings = discord_settings(tmp_path, discord_fake, llm, TALON_DISCORD_STREAMING="false", TALON_PAIRING="true")
    async with running(settings) as runtime:
        await say(discord_fake, DM, ALICE, "one")
        await say(discord_fake, DM, ALICE, "two")
        await discord_fake.wait_until(lambda: len(discord_fake.texts(DM)) >= 2, "two answers")
        await say(discord_fake, STRANGER_DM, MALLORY, "let me in")
        await discord_fake.wait_until(lambda: discord_fake.texts(STRANGER_DM), "the pairing code")
        health = runtime.channels[0].health()
        await discord_fake.wait_until(lambda: not any(discord_fake.reactions.values()), "the ack reactions gone")
    assert discord_fake.texts(DM) == ["First answer.", "Second **answer** for @everyone."]
    sends = [c for c in discord_fake.calls if c.route == "POST /channels/{channel_id}/messages" and c.ok]
    assert all(c.body.get("allowed_mentions") == {"parse": []} for c in sends)  # @everyone pings nobody
    assert [last_user_text(r) for r in llm.requests] == ["one", "two"]
    [code] = discord_fake.texts(STRANGER_DM)
    assert "code:" in code
    assert health.ok and str(BOT_ID) in health.detail
    assert any(c.route.startswith("PUT /channels/{channel_id}/messages/{id}/reactions") for c in discord_fake.calls)


async def test_a_listed_channel_answers_mentions_only_and_a_thread_is_its_own_conversation(
        discord_fake: FakeDiscord, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.queue("The Louvre opens at 9.", "In the thread: yes.")
    settings = discord_settings(tmp_path, discord_fake, llm, TALON_DISCORD_STREAMING="false")
    async with running(settings) as runtime:
        await say(discord_fake, GENERAL, CAROL, "anyone up for lunch?")
        asked = await say(discord_fake, GENERAL, ALICE, f"<@{BOT_ID}> which museum opens first?", mentions=(BOT_ID,))
        await discord_fake.wait_until(lambda: discord_fake.texts(GENERAL), "the answer")
        await say(discord_fake, THREAD, CAROL, f"<@{BOT_ID}> open on Sunday?", mentions=(BOT_ID,))
        await discord_fake.wait_until(lambda: discord_fake.texts(THREAD), "the thread answer")
        await say(discord_fake, OTHER, ALICE, f"<@{BOT_ID}> hi", mentions=(BOT_ID,))  # not listed
        from talon.storage.sessions import ChatKey
        main = await runtime.sessions.load(ChatKey("discord", str(GENERAL)))
        thread = await runtime.sessions.load(ChatKey("discord", f"{GENERAL}:{THREAD}"))
    assert len(llm.requests) == 2
    assert "anyone up for lunch?" in str(llm.requests[0].json)
    assert "<@" not in last_user_text(llm.requests[0])
    assert [m.text for m in main if m.role == "assistant"] == ["The Louvre opens at 9."]
    assert [m.text for m in thread if m.role == "assistant"] == ["In the thread: yes."]
    [answer] = discord_fake.bot_messages(GENERAL)
    assert answer.reference == int(str(asked["id"]))  # a reply to the message that asked
    assert not discord_fake.bot_messages(OTHER)


async def test_an_image_is_understood_a_file_is_delivered_and_a_foreign_address_is_not_fetched(
        discord_fake: FakeDiscord, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = discord_settings(tmp_path, discord_fake, llm, TALON_DISCORD_STREAMING="false")
    async with running(settings):
        workspace = settings.workspace_dir("discord", str(DM))
        workspace.mkdir(parents=True, exist_ok=True)
        (workspace / "report.txt").write_text("the report\n")
        (workspace / "huge.bin").write_bytes(b"x" * (10 * 1024 * 1024 + 1))
        llm.queue("A red square. Here: ![report](report.txt) and ![big](huge.bin)", "Nothing to see.")
        image = discord_fake.add_attachment(DM, png("red"), "square.png", "image/png")
        await say(discord_fake, DM, ALICE, "what is this?", attachments=[image])
        await discord_fake.wait_until(lambda: any("huge.bin" in t for t in discord_fake.texts(DM)), "the refusal")
        evil = {**discord_fake.add_attachment(DM, b"x", "evil.png", "image/png"), "url": "http://169.254.169.254/x"}
        await say(discord_fake, DM, ALICE, "and this?", attachments=[evil])
        await discord_fake.wait_until(lambda: "Nothing to see." in discord_fake.texts(DM), "the second answer")
    assert image_urls(llm.requests[0])
    uploads = [m for m in discord_fake.bot_messages(DM) if m.attachments]
    assert [a["filename"] for m in uploads for a in m.attachments] == ["report.txt"]
    [refusal] = [t for t in discord_fake.texts(DM) if "huge.bin" in t]
    assert "Could not attach huge.bin" in refusal and "upload limit" in refusal and str(tmp_path) not in refusal
    last = str(llm.requests[1].json["messages"][-1])
    assert "does not fetch" in last and "image_url" not in last


async def test_a_live_answer_is_edited_in_place_and_stop_ends_it(
        discord_fake: FakeDiscord, llm: FakeOpenAI, tmp_path: Path) -> None:
    long = "Tides come in twice a day because the moon pulls the sea. " * 30
    llm.chunk_delay = 0.3
    llm.queue(long, "Fresh answer.")
    settings = discord_settings(tmp_path, discord_fake, llm)
    async with running(settings):
        await say(discord_fake, DM, ALICE, "tell me about tides")
        await discord_fake.wait_until(lambda: any(len(m.versions) >= 2 for m in discord_fake.bot_messages(DM)),
                                      "an edit of the live answer")
        await say(discord_fake, DM, ALICE, "!stop")
        await discord_fake.wait_until(lambda: "Stopped." in discord_fake.texts(DM), "Stopped.")
        llm.chunk_delay = 0.0
        await say(discord_fake, DM, ALICE, "and now?")
        await discord_fake.wait_until(lambda: "Fresh answer." in discord_fake.texts(DM), "the next answer")
    [live] = [m for m in discord_fake.bot_messages(DM) if m.content.startswith("Tides")]
    assert len(live.versions) >= 2 and len(live.content) < len(long.strip())
    assert discord_fake.texts(DM)[-2:] == ["Stopped.", "Fresh answer."]
    assert last_user_text(llm.requests[-1]).endswith("and now?")


async def test_an_approval_pressed_by_someone_else_is_refused_and_the_askers_press_is_accepted(
        discord_fake: FakeDiscord, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.queue(FakeOpenAI.tool_call("shell", {"command": "echo channel-ran"}), "Done.")
    settings = discord_settings(tmp_path, discord_fake, llm, TALON_SHELL_TOOL="true",
                                TALON_SHELL_UNSANDBOXED="true", TALON_DISCORD_STREAMING="false",
                                TALON_DISCORD_ACK_REACTION="")
    async with running(settings) as runtime:
        await say(discord_fake, GENERAL, ALICE, f"<@{BOT_ID}> run it", mentions=(BOT_ID,))
        [prompt] = await discord_fake.wait_until(
            lambda: [m for m in discord_fake.bot_messages(GENERAL) if m.components], "the approval prompt")
        [approve] = [c["custom_id"] for row in prompt.components for c in row["components"]
                     if c["custom_id"].startswith("talon:ap:approve:")]
        wrong = discord_fake.button_press(GENERAL, prompt.id, approve, CAROL)
        await discord_fake.dispatch("INTERACTION_CREATE", wrong)
        await discord_fake.wait_until(lambda: discord_fake.interaction_answers.get(int(str(wrong["id"]))),
                                      "the refusal")
        assert len(llm.requests) == 1
        approvals = runtime.stores.approvals  # type: ignore[union-attr]
        [pending] = await approvals.pending("discord", str(GENERAL))
        await discord_fake.dispatch("INTERACTION_CREATE", discord_fake.button_press(GENERAL, prompt.id, approve, ALICE))
        await discord_fake.wait_until(lambda: "Done." in discord_fake.texts(GENERAL), "the answer")
        decided = await approvals.get(pending.id)
    [refusal] = discord_fake.interaction_answers[int(str(wrong["id"]))]
    assert refusal["type"] == 4 and refusal["data"]["flags"] == 64  # ephemeral: only carol sees it
    assert "Only the person who asked" in refusal["data"]["content"]
    assert decided is not None and decided.status == "approved" and decided.decided_by.startswith(f"discord:{ALICE}")
    assert "channel-ran" in str(llm.requests[1].json)
    settled = discord_fake.messages[(GENERAL, prompt.id)]
    assert settled.components == [] and "pproved" in settled.content


async def test_a_429_is_waited_out_and_every_part_arrives_in_order(
        discord_fake: FakeDiscord, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.queue("Part one.", "Part two.")
    discord_fake.rate_limit_next("POST /channels/{channel_id}/messages", retry_after=0.5)
    settings = discord_settings(tmp_path, discord_fake, llm, TALON_DISCORD_STREAMING="false",
                                TALON_DISCORD_ACK_REACTION="")
    async with running(settings):
        await say(discord_fake, DM, ALICE, "a")
        await say(discord_fake, DM, ALICE, "b")
        await discord_fake.wait_until(lambda: len(discord_fake.texts(DM)) >= 2, "two answers")
    assert discord_fake.texts(DM) == ["Part one.", "Part two."]
    statuses = [c.status for c in discord_fake.calls if c.route == "POST /channels/{channel_id}/messages"]
    assert statuses[:2] == [429, 200]


async def test_a_refused_token_is_named_and_nothing_connects(
        discord_fake: FakeDiscord, llm: FakeOpenAI, tmp_path: Path) -> None:
    from channels.discord import DiscordChannel
    from talon.doctor_checks import discord_bot_row
    from talon.errors import ConfigError

    settings = discord_settings(tmp_path, discord_fake, llm, DISCORD_BOT_TOKEN="wrong-secret-token")
    channel = DiscordChannel(settings)
    runtime = build_runtime(settings, [channel])
    with pytest.raises(ConfigError) as refused:
        await channel.start(runtime.bridge)
    await channel.stop()
    row = await discord_bot_row(settings)
    good = await discord_bot_row(discord_settings(tmp_path, discord_fake, llm))
    assert "DISCORD_BOT_TOKEN" in str(refused.value) and "wrong-secret-token" not in str(refused.value)
    assert row[1].startswith("FAILED") and "wrong-secret-token" not in row[1]
    assert good[1].startswith("ok:") and str(BOT_ID) in good[1]
    assert not discord_fake.connected()


# --- a worker killed mid-answer ------------------------------------------------------------------

@pytest.fixture
def threaded() -> Iterator[tuple[FakeDiscord, FakeOpenAI]]:
    with FakeDiscord() as fake, FakeOpenAI() as llm:
        populate(fake)
        yield fake, llm


def test_a_worker_killed_mid_answer_loses_nothing_and_the_restart_edits_the_same_message(
        tmp_path: Path, threaded: tuple[FakeDiscord, FakeOpenAI]) -> None:
    from tests.support.process import start_talon, stop_talon
    fake, llm = threaded
    env = discord_env(tmp_path, fake, llm.base_url, TALON_DISCORD_STREAM_INTERVAL="0.3")
    answer = " ".join(f"Sentence {i} of a long answer about the sea." for i in range(1, 31))
    last = "Sentence 30 of a long answer about the sea."
    llm.chunk_delay = 0.3
    llm.queue(answer, answer)
    proc, log = start_talon(tmp_path, env, "first.log")
    try:
        fake.wait_until_sync(fake.connected, "the first worker's gateway connection", timeout=60)
        fake.dispatch_sync("MESSAGE_CREATE", fake.message_create(DM, ALICE, "tell me about the sea"))
        fake.wait_until_sync(lambda: any(len(m.versions) >= 3 for m in fake.bot_messages(DM)), "two edits", timeout=60)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    [streamed] = fake.bot_messages(DM)
    assert not streamed.content.endswith(last), log.read_text()
    llm.chunk_delay = 0.01
    proc, log = start_talon(tmp_path, env, "second.log")
    try:
        fake.wait_until_sync(lambda: fake.messages[(DM, streamed.id)].content.endswith(last), "the whole answer",
                             timeout=60)
    finally:
        stop_talon(proc)
    assert [m.id for m in fake.bot_messages(DM)] == [streamed.id], fake.summary()  # no second copy
    assert fake.messages[(DM, streamed.id)].content == answer, log.read_text()


async def test_on_many_workers_one_holds_the_gateway_and_another_takes_it_over_when_it_dies(
        discord_fake: FakeDiscord, llm: FakeOpenAI, tmp_path: Path) -> None:
    from channels.discord import DiscordChannel
    from talon.storage.leases import MemoryLeases

    llm.queue("Answered by the survivor.")
    table: dict[str, tuple[str, float]] = {}  # one lease table, as two workers on one database share
    settings = discord_settings(tmp_path, discord_fake, llm, TALON_DISCORD_STREAMING="false",
                                TALON_DISCORD_ACK_REACTION="")
    first, second = DiscordChannel(settings), DiscordChannel(settings)
    class DiesHolding(MemoryLeases):
        async def release(self, name: str) -> None:  # a killed worker never gets to release its lease
            return None

    # A lease of 2 s: renewed well within it by a live holder even on a loaded machine.
    first.share_updates(DiesHolding("worker-1", 2.0, table))
    second.share_updates(MemoryLeases("worker-2", 2.0, table))
    runtime = build_runtime(settings, [second])
    await first.start(runtime.bridge)
    await asyncio.wait_for(first.ready.wait(), 60)
    await runtime.start()
    try:
        standing_by = second.health()
        connections = [s for s in discord_fake._sockets if s.identified and not s.ws.closed]  # noqa: SLF001
        assert len(connections) == 1 and second.gateway is None
        assert table["discord:gateway"][0] == "worker-1"
        # The first worker dies: its connection goes, its lease is not released but expires
        # (after which the second takes it: it may already have by the time this is checked).
        assert first._leading is not None  # noqa: SLF001
        first._leading.cancel()  # noqa: SLF001
        await asyncio.gather(first._leading, return_exceptions=True)  # noqa: SLF001
        await asyncio.wait_for(second.ready.wait(), 60)
        await say(discord_fake, DM, ALICE, "anyone there?")
        await discord_fake.wait_until(lambda: discord_fake.texts(DM), "the answer")
        took_over = second.health()
    finally:
        await runtime.stop()
        await first.stop()
    assert standing_by.ok and "standing by" in standing_by.detail
    assert took_over.ok and "gateway connected" in took_over.detail
    assert discord_fake.texts(DM) == ["Answered by the survivor."]
