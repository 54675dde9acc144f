"""The Matrix channel end to end against a real homeserver (Synapse, started once per session by
``tests/support/synapse.py``), driven by people talking through the client-server API and
answered by Talon's runtime with the fake model server (issue 32)."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest
from PIL import Image

from talon.config import Settings
from talon.runtime import build_runtime
from tests.fakes.openai_server import FakeOpenAI, image_urls, last_user_text
from tests.support.matrix import joined, matrix_settings, people, running
from tests.support.matrix_people import final_texts, from_user
from tests.support.synapse import UPLOAD_MAX_BYTES, Synapse


def png(color: str = "red") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), color).save(out, "PNG")
    return out.getvalue()


async def test_direct_messages_are_answered_in_order_and_a_stranger_gets_nothing(
        synapse: Synapse, llm: FakeOpenAI, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    bot = synapse.register("bot")
    llm.queue("First answer.", "Second **answer**.")
    with people(synapse, "alice", "mallory") as (alice, mallory):
        settings = matrix_settings(tmp_path, synapse, bot, llm, TALON_MATRIX_ALLOWED_USERS=alice.id)
        async with running(settings) as runtime:
            dm = alice.create_room([bot.user_id], direct=True)
            await joined(alice, dm, bot.user_id)
            alice.say(dm, "one")
            alice.say(dm, "two")
            await alice.wait_for(dm, lambda ev: len(final_texts(ev, bot.user_id)) >= 2, what="two answers")
            # A stranger's invitation is not accepted, and nobody answers them.
            theirs = mallory.create_room([bot.user_id], direct=True)
            mallory.say(theirs, "let me in")
            await alice.wait_for(dm, lambda _: any(theirs in r.getMessage() for r in caplog.records),
                                 what="the refused invitation in the log")
            health = runtime.channels[0].health()
        events = alice.timeline(dm)
        strangers = mallory.members(theirs)
    assert final_texts(events, bot.user_id) == ["First answer.", "Second answer."]
    second = from_user(events, bot.user_id)[-1]["content"]
    if "m.new_content" in second:
        second = second["m.new_content"]
    assert second["formatted_body"] == "Second <strong>answer</strong>."
    assert [last_user_text(r) for r in llm.requests] == ["one", "two"]
    assert bot.user_id not in strangers
    assert health.ok and bot.user_id in health.detail


async def test_a_listed_room_answers_mentions_only_and_a_thread_is_its_own_conversation(
        synapse: Synapse, llm: FakeOpenAI, tmp_path: Path) -> None:
    bot = synapse.register("bot")
    llm.queue("The Louvre opens at 9.", "In the thread: yes.")
    with people(synapse, "alice", "carol") as (alice, carol):
        room = alice.create_room([bot.user_id, carol.id], name="Trip planning")
        carol.join(room)
        settings = matrix_settings(tmp_path, synapse, bot, llm, TALON_MATRIX_ALLOWED_ROOMS=room)
        async with running(settings) as runtime:
            await joined(alice, room, bot.user_id)
            carol.say(room, "anyone up for lunch?")
            asked = alice.say(room, f"{bot.user_id}: which museum opens first?",
                              **{"m.mentions": {"user_ids": [bot.user_id]}})
            await alice.wait_for(room, lambda ev: final_texts(ev, bot.user_id), what="the answer")
            carol.say(room, "is it open on Sunday?", **{"m.relates_to": {
                "rel_type": "m.thread", "event_id": asked, "is_falling_back": True,
                "m.in_reply_to": {"event_id": asked}}, "m.mentions": {"user_ids": [bot.user_id]}})
            await alice.wait_for(room, lambda ev: len(final_texts(ev, bot.user_id)) >= 2, what="the thread answer")
            sessions = runtime.sessions
            from talon.storage.sessions import ChatKey
            main = await sessions.load(ChatKey("matrix", room))
            thread = await sessions.load(ChatKey("matrix", f"{room}:{asked}"))
        events = alice.timeline(room)
    assert len(llm.requests) == 2  # carol's lunch question was not a turn
    first_request = llm.requests[0].json
    assert "anyone up for lunch?" in str(first_request)  # ...but it travelled as chatter
    mine = from_user(events, bot.user_id)
    answer = mine[0]["content"].get("m.new_content", mine[0]["content"])
    assert answer["body"] == "The Louvre opens at 9."
    threaded = [e for e in mine if (e["content"].get("m.relates_to") or {}).get("rel_type") == "m.thread"]
    assert threaded and threaded[0]["content"]["m.relates_to"]["event_id"] == asked
    assert [m.text for m in main if m.role == "assistant"] == ["The Louvre opens at 9."]
    assert [m.text for m in thread if m.role == "assistant"] == ["In the thread: yes."]


async def test_an_image_reaches_the_model_and_a_file_comes_back_and_a_huge_one_is_refused_clearly(
        synapse: Synapse, llm: FakeOpenAI, tmp_path: Path) -> None:
    bot = synapse.register("bot")
    with people(synapse, "alice") as (alice,):
        settings = matrix_settings(tmp_path, synapse, bot, llm, TALON_MATRIX_ALLOWED_USERS=alice.id)
        async with running(settings):
            dm = alice.create_room([bot.user_id], direct=True)
            await joined(alice, dm, bot.user_id)
            workspace = settings.workspace_dir("matrix", dm)
            workspace.mkdir(parents=True, exist_ok=True)
            (workspace / "report.txt").write_text("the report\n")
            (workspace / "huge.bin").write_bytes(b"x" * (UPLOAD_MAX_BYTES + 1))
            llm.queue("A red square. Here: ![report](report.txt) and ![big](huge.bin)")
            picture = png("red")
            mxc = alice.upload(picture, "image/png", "square.png")
            alice.send(dm, {"msgtype": "m.image", "body": "square.png", "url": mxc,
                            "info": {"mimetype": "image/png", "size": len(picture), "w": 64, "h": 48}})
            await alice.wait_for(dm, lambda ev: any(e["content"].get("msgtype") == "m.file"
                                                    for e in from_user(ev, bot.user_id)), what="the file")
            await alice.wait_for(dm, lambda ev: any("huge.bin" in str(e["content"].get("body"))
                                                    for e in from_user(ev, bot.user_id)), what="the refusal")
        events = alice.timeline(dm)
        files = [e["content"] for e in from_user(events, bot.user_id) if e["content"].get("msgtype") == "m.file"]
        fetched = [alice.download(f["url"]) for f in files]
    assert image_urls(llm.requests[0])  # the image went to the model
    assert [f["body"] for f in files] == ["report.txt"]
    assert fetched == [b"the report\n"]
    [refusal] = [e["content"]["body"] for e in from_user(events, bot.user_id) if "huge.bin" in e["content"]["body"]]
    assert "Could not attach huge.bin" in refusal and "upload limit" in refusal
    assert str(tmp_path) not in refusal


async def test_an_approval_reaction_by_someone_else_is_refused_and_the_askers_is_accepted(
        synapse: Synapse, llm: FakeOpenAI, tmp_path: Path) -> None:
    bot = synapse.register("bot")
    llm.queue(FakeOpenAI.tool_call("shell", {"command": "echo room-ran"}), "Done.")
    with people(synapse, "alice", "carol") as (alice, carol):
        room = alice.create_room([bot.user_id, carol.id], name="Ops")
        carol.join(room)
        settings = matrix_settings(tmp_path, synapse, bot, llm, TALON_MATRIX_ALLOWED_ROOMS=room,
                                   TALON_SHELL_TOOL="true", TALON_SHELL_UNSANDBOXED="true", TALON_MODEL_DISCOVERY="false",
                                   TALON_MATRIX_STREAMING="false", TALON_MATRIX_ACK_REACTION="")
        async with running(settings) as runtime:
            await joined(alice, room, bot.user_id)
            alice.say(room, f"{bot.user_id}: run it", **{"m.mentions": {"user_ids": [bot.user_id]}})
            prompt = await alice.wait_for(room, lambda ev: next(
                (e for e in from_user(ev, bot.user_id) if "org.talon.approval" in e["content"]), None),
                what="the approval prompt")
            carol.react(room, prompt["event_id"], "\N{THUMBS UP SIGN}")
            await alice.wait_for(room, lambda ev: any("Only the person who asked" in str(e["content"].get("body"))
                                                      for e in from_user(ev, bot.user_id)), what="the refusal")
            assert len(llm.requests) == 1  # still waiting: carol's press decided nothing
            approvals = runtime.stores.approvals  # type: ignore[union-attr]
            [pending] = await approvals.pending("matrix", room)
            alice.react(room, prompt["event_id"], "\N{THUMBS UP SIGN}")
            await alice.wait_for(room, lambda ev: "Done." in final_texts(ev, bot.user_id), what="the answer")
            decided = await approvals.get(pending.id)
        events = alice.timeline(room)
    assert decided is not None and decided.status == "approved" and decided.decided_by.startswith(f"matrix:{alice.id}")
    assert "room-ran" in str(llm.requests[1].json)
    # the prompt was edited to say what was decided
    assert any("Approved" in t or "approved" in t for t in final_texts(events, bot.user_id))


async def test_a_live_answer_is_edited_in_place_and_stop_ends_it(
        synapse: Synapse, llm: FakeOpenAI, tmp_path: Path) -> None:
    bot = synapse.register("bot")
    llm.chunk_delay = 0.3  # a long answer: many seconds if let run
    llm.queue("Tides come in twice a day because the moon pulls the sea. " * 30, "Fresh answer.")
    with people(synapse, "alice") as (alice,):
        settings = matrix_settings(tmp_path, synapse, bot, llm, TALON_MATRIX_ALLOWED_USERS=alice.id)
        async with running(settings):
            dm = alice.create_room([bot.user_id], direct=True)
            await joined(alice, dm, bot.user_id)
            alice.say(dm, "tell me about tides")
            await alice.wait_for(dm, lambda ev: any((e["content"].get("m.relates_to") or {}).get("rel_type")
                                                    == "m.replace" for e in from_user(ev, bot.user_id)),
                                 what="an edit of the live answer")
            alice.say(dm, "!stop")
            await alice.wait_for(dm, lambda ev: "Stopped." in final_texts(ev, bot.user_id), what="Stopped.")
            llm.chunk_delay = 0.0
            alice.say(dm, "and now?")
            await alice.wait_for(dm, lambda ev: "Fresh answer." in final_texts(ev, bot.user_id), what="the next answer")
        events = alice.timeline(dm)
    texts = final_texts(events, bot.user_id)
    live = texts[0]
    assert live.startswith("Tides come in") and len(live) < len("Tides come in twice a day because the moon pulls the sea. " * 30)
    assert texts[-2:] == ["Stopped.", "Fresh answer."]
    assert last_user_text(llm.requests[-1]).endswith("and now?")


async def test_m_limit_exceeded_is_waited_out_and_every_part_arrives_in_order(
        synapse: Synapse, llm: FakeOpenAI, tmp_path: Path) -> None:
    bot = synapse.register("bot")
    synapse.limit_messages(bot, per_second=1, burst=1)
    llm.queue("Part one.", "Part two.", "Part three.")
    with people(synapse, "alice") as (alice,):
        settings = matrix_settings(tmp_path, synapse, bot, llm, TALON_MATRIX_ALLOWED_USERS=alice.id,
                                   TALON_MATRIX_STREAMING="false", TALON_MATRIX_ACK_REACTION="")
        async with running(settings) as runtime:
            dm = alice.create_room([bot.user_id], direct=True)
            await joined(alice, dm, bot.user_id)
            for word in ("a", "b", "c"):
                alice.say(dm, word)
            await alice.wait_for(dm, lambda ev: len(final_texts(ev, bot.user_id)) >= 3, what="three answers")
            penalized = runtime.channels[0].api.budget.waited_s  # type: ignore[attr-defined]
        events = alice.timeline(dm)
    assert final_texts(events, bot.user_id) == ["Part one.", "Part two.", "Part three."]
    assert penalized > 0  # the homeserver's M_LIMIT_EXCEEDED was waited out, not retried blindly


async def test_a_homeserver_that_hangs_leaves_the_channel_down_and_saying_why_never_frozen(
        tmp_path: Path, llm: FakeOpenAI) -> None:
    import asyncio
    import socket

    from channels.matrix import MatrixChannel
    from talon.doctor_checks import matrix_account_row

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)  # accepts connections, never answers
    base = f"http://127.0.0.1:{server.getsockname()[1]}"
    try:
        settings = Settings(_env_file=None, MATRIX_HOMESERVER=base, MATRIX_USER_ID="@bot:localhost",  # type: ignore[call-arg]
                            MATRIX_ACCESS_TOKEN="secret-token-value", TALON_MATRIX_TIMEOUT=0.5,
                            TALON_DATA_DIR=str(tmp_path / "data"), TALON_MEDIA_ROOT=str(tmp_path / "media"),
                            OPENAI_BASE_URL=llm.base_url, OPENAI_API_KEY="k", TALON_MODEL="openai:fake-model")
        channel = MatrixChannel(settings)
        runtime = build_runtime(settings, [channel])
        starting = asyncio.create_task(channel.start(runtime.bridge))
        deadline = asyncio.get_running_loop().time() + 30
        while "cannot reach the homeserver" not in channel.health().detail:
            assert asyncio.get_running_loop().time() < deadline, channel.health()
            await asyncio.sleep(0.05)
        health = channel.health()
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await channel.stop()
        name, row = await matrix_account_row(settings.model_copy(update={"matrix_timeout_s": 0.5}))
    finally:
        server.close()
    assert not health.ok and base in health.detail and "secret-token-value" not in health.detail
    assert row.startswith("UNREACHABLE") and "MATRIX_HOMESERVER" in row and "secret-token-value" not in row
