"""The Slack channel end to end: Talon's runtime with its real slack-sdk client against the
loopback fake of Slack (tests/fakes/slack.py), which also plays Slack's side of the Events API
(signed requests to Talon's HTTP server) and of Socket Mode; answers come from the fake model
server (issue 32)."""

from __future__ import annotations

import io
import logging
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from PIL import Image

from talon.runtime import build_runtime
from tests.fakes.openai_server import FakeOpenAI, image_urls, last_user_text
from tests.fakes.slack import APP_TOKEN, BOT_TOKEN, BOT_USER, SIGNING_SECRET, FakeSlack, sign
from tests.support.slack import (ALICE, CAROL, DM, GENERAL, MALLORY, STRANGER_DM, populate, running, slack_env,
                                 slack_settings)
from tests.support.slack import slack  # noqa: F401  (the fixture)


def png(color: str = "red") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), color).save(out, "PNG")
    return out.getvalue()


def texts(slack: FakeSlack, channel: str, thread: str | None = None) -> list[str]:
    return [m.text for m in slack.bot_messages(channel, thread) if m.text]


async def test_direct_messages_are_answered_in_order_and_a_stranger_gets_a_pairing_code_only(
        slack: FakeSlack, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.queue("First answer.", "Second **answer** for a < b & <!channel>.")
    settings = slack_settings(tmp_path, slack, llm, TALON_SLACK_STREAMING="false", TALON_PAIRING="true")
    async with running(settings) as (runtime, url):
        assert await slack.deliver(url, "event", slack.message_event(DM, ALICE, "one")) == 200
        assert await slack.deliver(url, "event", slack.message_event(DM, ALICE, "two")) == 200
        await slack.wait_until(lambda: len(texts(slack, DM)) >= 2, "two answers")
        await slack.deliver(url, "event", slack.message_event(STRANGER_DM, MALLORY, "let me in"))
        await slack.wait_until(lambda: texts(slack, STRANGER_DM), "the pairing code")
        health = runtime.channels[0].health()
        await slack.wait_until(lambda: not any(slack.reactions.values()), "the ack reactions taken away")
    assert texts(slack, DM) == ["First answer.", "Second *answer* for a &lt; b &amp; &lt;!channel&gt;."]
    assert [last_user_text(r) for r in llm.requests] == ["one", "two"]  # the stranger reached no model
    [code] = texts(slack, STRANGER_DM)
    assert "code:" in code
    assert health.ok and BOT_USER in health.detail
    assert [c.method for c in slack.calls].count("reactions.add") == 2


async def test_forged_stale_and_garbled_requests_are_refused_and_reach_nobody(
        slack: FakeSlack, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = slack_settings(tmp_path, slack, llm)
    event = slack.message_event(DM, ALICE, "forged")
    body, _ = slack.encode("event", event)
    async with running(settings) as (runtime, url):
        forged = sign("not-the-secret", body)
        stale = sign(SIGNING_SECRET, body, timestamp=int(time.time()) - 6 * 60)  # captured, replayed later
        future = sign(SIGNING_SECRET, body, timestamp=int(time.time()) + 6 * 60)
        statuses = [await slack.deliver(url, "event", event, tries=1, headers=h) for h in (
            forged, stale, future, {}, {"X-Slack-Request-Timestamp": "yesterday", "X-Slack-Signature": "v0=00"},
            {"X-Slack-Request-Timestamp": "9" * 40, "X-Slack-Signature": forged["X-Slack-Signature"]})]
        # A body changed after signing does not pass either.
        tampered = dict(sign(SIGNING_SECRET, body))
        async with aiohttp.ClientSession() as http:
            async with http.post(url, data=body.replace(b"forged", b"pwned!"),
                                 headers={**tampered, "Content-Type": "application/json"}) as resp:
                statuses.append(resp.status)
            challenge = b'{"type":"url_verification","challenge":"abc123"}'
            async with http.post(url, data=challenge, headers={**sign(SIGNING_SECRET, challenge),
                                                               "Content-Type": "application/json"}) as resp:
                answered = await resp.json()
            async with http.post(url, data=challenge, headers={"Content-Type": "application/json"}) as resp:
                unsigned_challenge = resp.status
            huge = b'{"type":"event_callback","pad":"' + b"x" * 600_000 + b'"}'
            async with http.post(url, data=huge, headers={**sign(SIGNING_SECRET, huge),
                                                          "Content-Type": "application/json"}) as resp:
                too_big = resp.status
    assert statuses == [401] * 7
    assert answered == {"challenge": "abc123"} and unsigned_challenge == 401 and too_big == 413
    assert llm.requests == []
    assert not slack.sent("chat.postMessage")


async def test_a_listed_channel_answers_mentions_only_and_a_thread_is_its_own_conversation(
        slack: FakeSlack, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.queue("The Louvre opens at 9.", "In the thread: yes.")
    settings = slack_settings(tmp_path, slack, llm, TALON_SLACK_STREAMING="false")
    async with running(settings) as (runtime, url):
        await slack.deliver(url, "event", slack.message_event(GENERAL, CAROL, "anyone up for lunch?",
                                                              channel_type="channel"))
        asked = slack.message_event(GENERAL, ALICE, f"<@{BOT_USER}> which museum opens first?", channel_type="channel")
        await slack.deliver(url, "event", asked)
        await slack.wait_until(lambda: texts(slack, GENERAL), "the answer")
        root = asked["event"]["ts"]
        await slack.deliver(url, "event", slack.message_event(GENERAL, CAROL, f"<@{BOT_USER}> open on Sunday?",
                                                              channel_type="channel", thread_ts=root))
        await slack.wait_until(lambda: texts(slack, GENERAL, root), "the thread answer")
        # An unlisted channel is not served, mention or not.
        slack.add_channel("C0OTHER01", "other")
        await slack.deliver(url, "event", slack.message_event("C0OTHER01", ALICE, f"<@{BOT_USER}> hi",
                                                              channel_type="channel"))
        from talon.storage.sessions import ChatKey
        main = await runtime.sessions.load(ChatKey("slack", GENERAL))
        thread = await runtime.sessions.load(ChatKey("slack", f"{GENERAL}:{root}"))
    assert len(llm.requests) == 2
    assert "anyone up for lunch?" in str(llm.requests[0].json)  # chatter travelled with the turn
    assert "<@" not in last_user_text(llm.requests[0])
    assert [m.text for m in main if m.role == "assistant"] == ["The Louvre opens at 9."]
    assert [m.text for m in thread if m.role == "assistant"] == ["In the thread: yes."]
    assert texts(slack, GENERAL, root) == ["In the thread: yes."]
    assert not slack.sent("chat.postMessage", "C0OTHER01")


async def test_an_image_is_understood_a_file_is_delivered_and_a_foreign_file_address_is_not_fetched(
        slack: FakeSlack, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = slack_settings(tmp_path, slack, llm, TALON_SLACK_STREAMING="false")
    async with running(settings) as (runtime, url):
        workspace = settings.workspace_dir("slack", DM)
        workspace.mkdir(parents=True, exist_ok=True)
        (workspace / "report.txt").write_text("the report\n")
        (workspace / "empty.txt").write_text("")
        llm.queue("A red square. Here: ![report](report.txt) and ![nothing](empty.txt)", "Nothing to see.")
        image = slack.add_file(png("red"), "square.png", "image/png")
        await slack.deliver(url, "event", slack.message_event(DM, ALICE, "what is this?", files=[image]))
        await slack.wait_until(lambda: any(m.files for m in slack.bot_messages(DM)), "the file")
        await slack.wait_until(lambda: any("empty.txt" in t for t in texts(slack, DM)), "the refusal")
        # A hostile event pointing the download (and the bot token) at another host.
        evil = {**slack.add_file(b"x", "evil.png", "image/png"), "url_private_download": "http://169.254.169.254/x",
                "url_private": "http://169.254.169.254/x"}
        await slack.deliver(url, "event", slack.message_event(DM, ALICE, "and this?", files=[evil]))
        await slack.wait_until(lambda: "Nothing to see." in texts(slack, DM), "the second answer")
    assert image_urls(llm.requests[0])  # the image went to the model
    [shared] = [m for m in slack.bot_messages(DM) if m.files]
    assert slack.files[shared.files[0]["id"]][0] == b"the report\n"
    [refusal] = [t for t in texts(slack, DM) if "empty.txt" in t]
    assert "Could not attach empty.txt" in refusal and str(tmp_path) not in refusal
    last = str(llm.requests[1].json["messages"][-1])
    assert "does not fetch" in last and "image_url" not in last


async def test_a_live_answer_is_edited_in_place_and_stop_ends_it(
        slack: FakeSlack, llm: FakeOpenAI, tmp_path: Path) -> None:
    long = "Tides come in twice a day because the moon pulls the sea. " * 30
    llm.chunk_delay = 0.3
    llm.queue(long, "Fresh answer.")
    settings = slack_settings(tmp_path, slack, llm)
    async with running(settings) as (runtime, url):
        await slack.deliver(url, "event", slack.message_event(DM, ALICE, "tell me about tides"))
        await slack.wait_for("chat.update")
        await slack.deliver(url, "command", slack.slash_command(DM, ALICE, "/stop"))
        await slack.wait_until(lambda: "Stopped." in texts(slack, DM), "Stopped.")
        llm.chunk_delay = 0.0
        await slack.deliver(url, "event", slack.message_event(DM, ALICE, "and now?"))
        await slack.wait_until(lambda: "Fresh answer." in texts(slack, DM), "the next answer")
    [live] = [m for m in slack.bot_messages(DM) if m.text.startswith("Tides")]
    assert len(live.versions) >= 2 and len(live.text) < len(long.strip())  # edited, then cut short
    assert texts(slack, DM)[-2:] == ["Stopped.", "Fresh answer."]
    assert last_user_text(llm.requests[-1]).endswith("and now?")


async def test_an_approval_pressed_by_someone_else_is_refused_and_the_askers_press_is_accepted(
        slack: FakeSlack, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.queue(FakeOpenAI.tool_call("shell", {"command": "echo channel-ran"}), "Done.")
    settings = slack_settings(tmp_path, slack, llm, TALON_SHELL_TOOL="true", TALON_SHELL_UNSANDBOXED="true",
                              TALON_SLACK_STREAMING="false", TALON_SLACK_ACK_REACTION="")
    async with running(settings) as (runtime, url):
        await slack.deliver(url, "event", slack.message_event(GENERAL, ALICE, f"<@{BOT_USER}> run it",
                                                              channel_type="channel"))
        [prompt] = await slack.wait_until(lambda: [m for m in slack.bot_messages(GENERAL) if m.blocks],
                                          "the approval prompt")
        await slack.deliver(url, "interactive", slack.button_press(GENERAL, prompt.ts, "talon_approval_approve", CAROL))
        await slack.wait_until(lambda: any("Only the person who asked" in t for t in texts(slack, GENERAL)),
                               "the refusal")
        assert len(llm.requests) == 1  # carol's press decided nothing
        approvals = runtime.stores.approvals  # type: ignore[union-attr]
        [pending] = await approvals.pending("slack", GENERAL)
        await slack.deliver(url, "interactive", slack.button_press(GENERAL, prompt.ts, "talon_approval_approve", ALICE))
        await slack.wait_until(lambda: "Done." in texts(slack, GENERAL), "the answer")
        decided = await approvals.get(pending.id)
    assert decided is not None and decided.status == "approved" and decided.decided_by.startswith(f"slack:{ALICE}")
    assert "channel-ran" in str(llm.requests[1].json)
    settled = slack.messages[(GENERAL, prompt.ts)]
    assert settled.blocks == [] and "pproved" in settled.text  # the buttons went away, the outcome shown


async def test_a_429_is_waited_out_and_every_part_arrives_in_order(
        slack: FakeSlack, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.queue("Part one.", "Part two.")
    slack.rate_limit_next("chat.postMessage", retry_after=1)
    settings = slack_settings(tmp_path, slack, llm, TALON_SLACK_STREAMING="false", TALON_SLACK_ACK_REACTION="")
    async with running(settings) as (runtime, url):
        await slack.deliver(url, "event", slack.message_event(DM, ALICE, "a"))
        await slack.deliver(url, "event", slack.message_event(DM, ALICE, "b"))
        await slack.wait_until(lambda: len(texts(slack, DM)) >= 2, "two answers")
        waited = runtime.channels[0].api.budget.waited_s  # type: ignore[attr-defined]
    assert texts(slack, DM) == ["Part one.", "Part two."]
    assert [c.status for c in slack.calls if c.method == "chat.postMessage"][:2] == [429, 200]
    assert waited > 0


async def test_socket_mode_needs_no_public_url(slack: FakeSlack, llm: FakeOpenAI, tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    from channels.slack import SlackChannel

    caplog.set_level(logging.INFO)
    llm.queue("Over the socket.")
    settings = slack_settings(tmp_path, slack, llm, SLACK_APP_TOKEN=APP_TOKEN, SLACK_SIGNING_SECRET="",
                              TALON_SLACK_STREAMING="false")
    channel = SlackChannel(settings)
    runtime = build_runtime(settings, [channel])
    await runtime.start()
    try:
        assert channel.http is None  # nothing listens
        await slack.push_socket("event", slack.message_event(DM, ALICE, "hello"))
        await slack.wait_until(lambda: texts(slack, DM), "the answer")
        health = channel.health()
    finally:
        await runtime.stop()
    assert texts(slack, DM) == ["Over the socket."]
    assert health.ok and "Socket Mode" in health.detail
    assert APP_TOKEN not in caplog.text and BOT_TOKEN not in caplog.text


# --- a worker killed mid-answer ------------------------------------------------------------------

@pytest.fixture
def threaded() -> Iterator[tuple[FakeSlack, FakeOpenAI]]:
    with FakeSlack() as fake, FakeOpenAI() as llm:
        populate(fake)
        yield fake, llm


def test_a_worker_killed_mid_answer_loses_nothing_and_the_restart_edits_the_same_message(
        tmp_path: Path, threaded: tuple[FakeSlack, FakeOpenAI]) -> None:
    import socket

    from tests.support.process import start_talon, stop_talon
    slack, llm = threaded
    with socket.socket() as probe:  # a fixed port: Slack's Request URL stays the same across restarts
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = slack_env(tmp_path, slack, llm.base_url, TALON_HTTP_PORT=str(port), TALON_SLACK_STREAM_INTERVAL="0.3")
    url = f"http://127.0.0.1:{port}/slack/events"
    answer = " ".join(f"Sentence {i} of a long answer about the sea." for i in range(1, 31))
    llm.chunk_delay = 0.3
    llm.queue(answer, answer)
    proc, log = start_talon(tmp_path, env, "first.log")
    try:
        deadline = time.monotonic() + 60
        status = 0
        while status != 200:  # Slack retries until the app answers; so does this
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
            status = slack.deliver_sync(url, "event", slack.message_event(DM, ALICE, "tell me about the sea",
                                                                          ts="1700000000.000001"), tries=1)
        slack.wait_for_sync("chat.update", count=2, timeout=60)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    [streamed] = slack.bot_messages(DM)
    assert not streamed.text.endswith("Sentence 30 of a long answer about the sea."), log.read_text()
    llm.chunk_delay = 0.01
    proc, log = start_talon(tmp_path, env, "second.log")
    try:
        slack.wait_for_sync("chat.update", lambda c: str(c.params.get("text", "")).endswith(
            "Sentence 30 of a long answer about the sea."), timeout=60)
        import httpx

        health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10)
    finally:
        stop_talon(proc)
    assert health.status_code == 200 and "channel slack" in health.text and BOT_USER in health.text
    assert BOT_TOKEN not in health.text and SIGNING_SECRET not in health.text
    assert BOT_TOKEN not in log.read_text() and SIGNING_SECRET not in log.read_text()
    assert [m.ts for m in slack.bot_messages(DM)] == [streamed.ts], slack.summary()  # no second copy
    assert slack.messages[(DM, streamed.ts)].text == answer, log.read_text()


async def test_a_429_on_a_live_edit_stops_the_live_view_and_the_whole_answer_still_arrives_in_place(
        slack: FakeSlack, llm: FakeOpenAI, tmp_path: Path) -> None:
    answer = " ".join(f"Line {i} about the tides." for i in range(1, 41))
    llm.chunk_delay = 0.05
    llm.queue(answer)
    slack.rate_limit_next("chat.update", retry_after=1)
    settings = slack_settings(tmp_path, slack, llm, TALON_SLACK_ACK_REACTION="")
    async with running(settings) as (runtime, url):
        await slack.deliver(url, "event", slack.message_event(DM, ALICE, "tides?"))
        await slack.wait_until(lambda: any(m.text == answer for m in slack.bot_messages(DM)), "the whole answer")
    [message] = slack.bot_messages(DM)  # one message: posted live, then edited to the end
    assert message.text == answer
    updates = [c.status for c in slack.calls if c.method == "chat.update"]
    assert updates[0] == 429 and updates[-1] == 200
