"""WhatsApp's 24-hour window, templates, delivery receipts and approval buttons (issue 33), end to
end: signed webhooks to Talon's HTTP server, the real twilio client sending to the fake Twilio
(which refuses free-form messages outside the window it holds closed with 63016, takes Content
templates, and posts signed status callbacks), the real openai client to the fake model."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from talon.envelope import InboundMessage, OutboundReply, ScheduledRun
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.twilio import FakeTwilio
from tests.support.whatsapp import ALICE, BOB, HOOK, PUBLIC, post, running, wa_settings

REOPEN = "HX" + "a" * 32
REMINDER = "HX" + "b" * 32
APPROVAL = "HX" + "c" * 32
DAY = 86400.0


@pytest_asyncio.fixture
async def twilio() -> AsyncIterator[FakeTwilio]:
    async with FakeTwilio() as fake:
        yield fake


def templated(tmp_path: Path, twilio: FakeTwilio, llm: FakeOpenAI, **extra: object):  # type: ignore[no-untyped-def]
    return wa_settings(tmp_path, twilio, llm, TALON_MODEL_DISCOVERY="false",
                       TALON_WHATSAPP_TEMPLATE_REOPEN=f'{REOPEN} {{"1": "Talon"}}',
                       TALON_WHATSAPP_TEMPLATE_REMINDER=REMINDER, **extra)


async def close_window(channel, twilio: FakeTwilio, number: str = ALICE) -> None:  # type: ignore[no-untyped-def]
    """The person last wrote 25 hours ago: Talon's store and the fake agree the window is closed."""
    await channel.state.seen(number, time.time() - 25 * 3600)
    twilio.close_window(number)


async def test_a_scheduled_task_outside_the_window_sends_the_reminder_and_the_message_follows_in_order(
        tmp_path: Path, twilio: FakeTwilio, llm: FakeOpenAI) -> None:
    llm.queue("Time to water the plants: the ficus first.", "You're welcome!")
    async with running(templated(tmp_path, twilio, llm)) as (runtime, channel):
        await close_window(channel, twilio)
        run = InboundMessage(channel="whatsapp", chat_id=ALICE, sender_id=ALICE, message_id="task-1-run",
                             text="remind me to water the plants", scheduled=ScheduledRun(task_id="t1", due=time.time()))
        await runtime.bridge.submit(run)
        [template] = await twilio.wait_for_messages(1, to=ALICE)
        assert template.content_sid == REMINDER and template.body == ""
        assert template.content_variables == {"1": "remind me to water the plants"}
        await runtime.bridge.idle()
        assert await channel.state.pending_count(ALICE) == 1
        assert [m.status for m in twilio.messages] == [201]  # no free-form message was even tried
        # The person answers: what waited goes first, then the answer to the new message.
        await post(channel, twilio.inbound_params(ALICE, "thanks"), sign_with=twilio)
        sent = await twilio.wait_for_messages(3, to=ALICE)
        await runtime.bridge.idle()
    assert [m.body for m in sent[1:]] == ["Time to water the plants: the ficus first.", "You're welcome!"]
    assert all(m.content_sid is None for m in sent[1:])


async def test_an_answer_refused_with_63016_is_not_lost_but_delivered_after_the_next_message(
        tmp_path: Path, twilio: FakeTwilio, llm: FakeOpenAI) -> None:
    twilio.fail_next(400, 63016, "Failed to send freeform message because you are outside the allowed window.")
    llm.queue("The long-awaited answer.", "And the next one.")
    async with running(templated(tmp_path, twilio, llm)) as (runtime, channel):
        await post(channel, twilio.inbound_params(ALICE, "a slow question"), sign_with=twilio)
        [template] = await twilio.wait_for_messages(1, to=ALICE)
        assert template.content_sid == REOPEN and template.content_variables == {"1": "Talon"}
        await runtime.bridge.idle()
        assert await channel.state.pending_count(ALICE) == 1
        await post(channel, twilio.inbound_params(ALICE, "hello?"), sign_with=twilio)
        sent = await twilio.wait_for_messages(3, to=ALICE)
        await runtime.bridge.idle()
        assert await channel.state.pending_count(ALICE) == 0
    assert [m.body for m in sent[1:]] == ["The long-awaited answer.", "And the next one."]


async def test_without_a_template_nothing_is_dropped_and_the_owner_is_told(
        tmp_path: Path, twilio: FakeTwilio, llm: FakeOpenAI, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    llm.queue("Your daily summary.", "Second summary.", "Got it.")
    settings = wa_settings(tmp_path, twilio, llm, TALON_MODEL_DISCOVERY="false")
    async with running(settings) as (runtime, channel):
        await close_window(channel, twilio)
        for n in (1, 2):
            await runtime.bridge.submit(InboundMessage(
                channel="whatsapp", chat_id=ALICE, sender_id=ALICE, message_id=f"run-{n}", text="daily summary",
                scheduled=ScheduledRun(task_id="t1", due=time.time())))
            await runtime.bridge.idle()
        assert twilio.messages == []  # nothing could be sent, nothing was tried
        assert await channel.state.pending_count(ALICE) == 2
        lines = await channel.status_lines(ALICE)
        assert any("closed" in line for line in lines)
        assert any("2 message part(s) waiting" in line for line in lines)
        assert any("TALON_WHATSAPP_TEMPLATE_REOPEN" in line for line in lines)
        await post(channel, twilio.inbound_params(ALICE, "morning"), sign_with=twilio)
        sent = await twilio.wait_for_messages(3, to=ALICE)
        await runtime.bridge.idle()
    assert [m.body for m in sent] == ["Your daily summary.", "Second summary.", "Got it."]
    told = [r for r in caplog.records if r.levelno == logging.ERROR and "TALON_WHATSAPP_TEMPLATE_REOPEN" in r.getMessage()]
    assert len(told) == 1  # once, not for every message


async def test_waiting_messages_expire_after_the_pending_days_with_a_log_line(
        tmp_path: Path, twilio: FakeTwilio, llm: FakeOpenAI, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    async with running(templated(tmp_path, twilio, llm, TALON_WHATSAPP_PENDING_DAYS=2)) as (_, channel):
        await close_window(channel, twilio)
        await channel.state.add_pending(ALICE, ['{"kind": "text", "body": "old news"}'], time.time() - 3 * DAY)
        await channel.state.add_pending(ALICE, ['{"kind": "text", "body": "fresh"}'], time.time() - DAY)
        await channel.window.sweep()
        assert [p.payload for p in await channel.state.pending(ALICE)] == ['{"kind": "text", "body": "fresh"}']
    assert any("old news" in r.getMessage() and "TALON_WHATSAPP_PENDING_DAYS" in r.getMessage() for r in caplog.records)


# --- delivery receipts --------------------------------------------------------------------------


def metrics_text(runtime) -> str:  # type: ignore[no-untyped-def]
    return runtime.bridge.metrics.render().decode()


async def test_status_callbacks_are_recorded_counted_and_a_read_marks_the_chat_read(
        tmp_path: Path, twilio: FakeTwilio, llm: FakeOpenAI) -> None:
    llm.queue("Hello Alice.")
    async with running(templated(tmp_path, twilio, llm)) as (runtime, channel):
        twilio.callbacks_to(PUBLIC, channel.http.local_url)
        twilio.statuses_next("sent", "delivered", "read")
        await post(channel, twilio.inbound_params(ALICE, "hi"), sign_with=twilio)
        [answer] = await twilio.wait_for_messages(1, to=ALICE)
        assert answer.status_callback == f"{PUBLIC}{HOOK}/status"
        callbacks = await twilio.wait_for_callbacks(3)
        assert [c.answered for c in callbacks] == [200, 200, 200]
        assert await channel.state.last_read(ALICE) is not None
        assert await channel.state.last_failure(ALICE) is None
        text = metrics_text(runtime)
    for status in ("sent", "delivered", "read"):
        assert f'talon_delivery_statuses_total{{channel="whatsapp",status="{status}"}} 1.0' in text


async def test_status_callbacks_with_a_bad_signature_or_for_a_message_not_ours_record_nothing(
        tmp_path: Path, twilio: FakeTwilio, llm: FakeOpenAI) -> None:
    llm.queue("Hello.")
    async with running(templated(tmp_path, twilio, llm)) as (runtime, channel):
        await post(channel, twilio.inbound_params(ALICE, "hi"), sign_with=twilio)
        [answer] = await twilio.wait_for_messages(1, to=ALICE)
        await runtime.bridge.idle()
        forged = {"MessageSid": answer.sid, "MessageStatus": "failed", "ErrorCode": "30008",
                  "To": f"whatsapp:{ALICE}", "From": twilio.whatsapp_from, "AccountSid": twilio.account_sid}
        path = f"{HOOK}/status"
        assert (await post(channel, forged, path=path, signature="AAAA"))[0] == 403
        assert (await post(channel, forged, path=path))[0] == 403  # no signature at all
        other = FakeTwilio(account_sid=twilio.account_sid, auth_token="another-token")  # signed with the wrong key
        assert (await post(channel, forged, path=path, sign_with=other))[0] == 403
        assert (await post(channel, {**forged, "AccountSid": "AC" + "0" * 32}, path=path, sign_with=twilio))[0] == 403
        assert await channel.state.last_failure(ALICE) is None
        # signed, but for a message Talon never sent: answered, nothing recorded, nothing sent
        stranger = {**forged, "MessageSid": "SM" + "9" * 32}
        assert (await post(channel, stranger, path=path, sign_with=twilio))[0] == 200
        assert await channel.state.last_failure() is None
        # a shifted or made-up id and an unknown status are ignored
        for bad in ({**forged, "MessageSid": "SM123"}, {**forged, "MessageStatus": "exploded"}):
            assert (await post(channel, bad, path=path, sign_with=twilio))[0] == 200
        assert await channel.state.last_failure() is None
        assert len(twilio.sent(to=ALICE)) == 1


async def test_a_failed_answer_is_sent_once_more_then_reported_with_twilios_words(
        tmp_path: Path, twilio: FakeTwilio, llm: FakeOpenAI) -> None:
    llm.queue("An answer WhatsApp will not take.")
    async with running(templated(tmp_path, twilio, llm)) as (runtime, channel):
        twilio.callbacks_to(PUBLIC, channel.http.local_url)
        twilio.statuses_next("sent", "failed", error_code=30008)
        twilio.statuses_next("sent", "undelivered", error_code=30008)
        await post(channel, twilio.inbound_params(ALICE, "hi"), sign_with=twilio)
        sent = await twilio.wait_for_messages(3, to=ALICE)
        await channel.receipts.idle()
        failure = await channel.state.last_failure(ALICE)
        lines = await channel.status_lines(ALICE)
    assert [m.body for m in sent[:2]] == ["An answer WhatsApp will not take."] * 2  # retried once
    assert "could not be delivered" in sent[2].body and "30008: unknown delivery error" in sent[2].body
    assert failure is not None and failure.error_code == 30008 and failure.status == "undelivered"
    assert any("last failed delivery" in line and "30008" in line for line in lines)


# --- hostile tries ----------------------------------------------------------------------------


async def test_huge_or_malformed_content_variables_never_reach_twilio_from_settings(tmp_path: Path, twilio: FakeTwilio,
                                                                                     llm: FakeOpenAI) -> None:
    from talon.errors import ConfigError
    from channels.whatsapp import WhatsAppChannel

    for value in (f"{REOPEN} " + '{"1": "' + "x" * 2000 + '"}', f"{REOPEN} not json", "HXnope",
                  f"{REOPEN} " + '{"1": 5}', f"{REOPEN} " + '{"1": "two\\nlines"}'):
        with pytest.raises(ConfigError) as err:
            WhatsAppChannel(wa_settings(tmp_path, twilio, llm, TALON_WHATSAPP_TEMPLATE_REOPEN=value))
        assert "TALON_WHATSAPP_TEMPLATE_REOPEN" in str(err.value)


async def test_a_reminder_too_long_for_a_template_variable_uses_the_reopen_template(
        tmp_path: Path, twilio: FakeTwilio, llm: FakeOpenAI) -> None:
    task = "summarise " + "the news " * 200  # far over a template variable
    answer = "Here is the summary. " + "z" * 1700  # an answer over 1,600 characters: several messages
    llm.queue(answer)
    async with running(templated(tmp_path, twilio, llm)) as (runtime, channel):
        await close_window(channel, twilio)
        await runtime.bridge.submit(InboundMessage(channel="whatsapp", chat_id=ALICE, sender_id=ALICE, message_id="r",
                                                   text=task, scheduled=ScheduledRun(task_id="t", due=time.time())))
        [template] = await twilio.wait_for_messages(1, to=ALICE)
        await runtime.bridge.idle()
        assert template.content_sid == REOPEN
        llm.queue("ok")
        await post(channel, twilio.inbound_params(ALICE, "go on"), sign_with=twilio)
        parts = len(channel.reply_parts(OutboundReply(text=answer)))
        assert parts >= 2
        sent = await twilio.wait_for_messages(parts + 2, to=ALICE)
        await runtime.bridge.idle()
    assert all(len(m.body) <= 1600 for m in sent)
    assert sent[1].body.startswith("Here is the summary.") and all(set(m.body) == {"z"} for m in sent[2:-1])
    assert sent[-1].body == "ok"


async def test_another_persons_window_is_their_own(tmp_path: Path, twilio: FakeTwilio, llm: FakeOpenAI) -> None:
    llm.queue("for bob")
    async with running(templated(tmp_path, twilio, llm)) as (runtime, channel):
        await close_window(channel, twilio, ALICE)
        await post(channel, twilio.inbound_params(BOB, "hi"), sign_with=twilio)
        [m] = await twilio.wait_for_messages(1, to=BOB)
        await runtime.bridge.idle()
        assert m.body == "for bob" and await channel.window.state(ALICE) == "closed"
        assert await channel.window.state(BOB) == "open"


async def test_waiting_messages_survive_a_restart_and_go_after_the_person_writes(
        tmp_path: Path, twilio: FakeTwilio, llm: FakeOpenAI) -> None:
    settings = templated(tmp_path, twilio, llm)
    llm.queue("Kept across the restart.")
    async with running(settings) as (runtime, channel):
        await close_window(channel, twilio)
        await runtime.bridge.submit(InboundMessage(channel="whatsapp", chat_id=ALICE, sender_id=ALICE, message_id="r1",
                                                   text="report", scheduled=ScheduledRun(task_id="t", due=time.time())))
        await twilio.wait_for_messages(1, to=ALICE)
        await runtime.bridge.idle()
    llm.queue("Welcome back.")
    async with running(settings) as (runtime, channel):
        assert await channel.state.pending_count(ALICE) == 1
        await post(channel, twilio.inbound_params(ALICE, "back"), sign_with=twilio)
        sent = await twilio.wait_for_messages(3, to=ALICE)
        await runtime.bridge.idle()
    assert [m.body for m in sent[1:]] == ["Kept across the restart.", "Welcome back."]


# --- approval buttons -------------------------------------------------------------------------


async def test_an_approval_is_decided_by_its_button_once_and_forged_or_foreign_presses_are_refused(
        tmp_path: Path, twilio: FakeTwilio, llm: FakeOpenAI) -> None:
    llm.queue(FakeOpenAI.tool_call("write_file", {"path": "note.txt", "content": "pressed"}), "Written.")
    settings = templated(tmp_path, twilio, llm, TALON_APPROVAL="write", TALON_WHATSAPP_TEMPLATE_APPROVAL=APPROVAL)
    workspace = settings.workspace_dir("whatsapp", ALICE)
    async with running(settings) as (runtime, channel):
        await post(channel, twilio.inbound_params(ALICE, "write a note"), sign_with=twilio)
        [prompt, buttons] = await twilio.wait_for_messages(2, to=ALICE)
        assert "write the file note.txt" in prompt.body and "Reply yes" not in prompt.body
        assert buttons.content_sid == APPROVAL
        variables = buttons.content_variables
        assert "note.txt" in variables["1"]
        approve, deny = variables["2"], variables["3"]
        assert approve.startswith("approve:") and deny.startswith("deny:") and approve[8:] != deny[5:]
        # forged: a token never issued; a token from another chat (Bob pressing Alice's button)
        for who, payload in ((ALICE, "approve:" + "A" * 32), (BOB, approve)):
            await post(channel, twilio.inbound_params(who, "Approve", ButtonPayload=payload, ButtonText="Approve"),
                       sign_with=twilio)
        await twilio.wait_for_messages(1, to=BOB)
        assert not (workspace / "note.txt").exists()
        assert all("not valid" in m.body for m in twilio.sent(to=BOB))
        # the right person presses Approve: decided, the turn goes on
        await post(channel, twilio.inbound_params(ALICE, "Approve", ButtonPayload=approve, ButtonText="Approve",
                                                  profile_name="Alice"), sign_with=twilio)
        await runtime.bridge.idle()
        await wait_until(lambda: any(m.body == "Written." for m in twilio.sent(to=ALICE)))
        # replayed: the same press again, and the Deny of the same prompt, are refused
        before = len(twilio.sent(to=ALICE))
        for payload in (approve, deny):
            await post(channel, twilio.inbound_params(ALICE, "x", ButtonPayload=payload), sign_with=twilio)
        await twilio.wait_for_messages(before + 2, to=ALICE)
        await runtime.bridge.idle()
    bodies = [m.body for m in twilio.sent(to=ALICE)]
    assert (workspace / "note.txt").read_text() == "pressed"
    assert "Written." in bodies and any("Approved by" in b for b in bodies)
    assert [b for b in bodies[-2:]] and all("not valid" in b for b in bodies[-2:])
    assert len(llm.requests) == 2  # no press started a turn


async def test_a_malformed_button_payload_is_refused_with_400(tmp_path: Path, twilio: FakeTwilio,
                                                              llm: FakeOpenAI) -> None:
    async with running(templated(tmp_path, twilio, llm)) as (_, channel):
        for payload in ("approve:<script>", "deny:" + "x" * 200, "approve:short"):
            status, _, _ = await post(channel, twilio.inbound_params(ALICE, "x", ButtonPayload=payload),
                                      sign_with=twilio)
            assert status == 400
    assert twilio.messages == [] and llm.requests == []


async def wait_until(check, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_outside_the_window_a_short_call_goes_whole_in_the_approval_template_and_a_press_decides(
        tmp_path: Path, twilio: FakeTwilio, llm: FakeOpenAI) -> None:
    llm.queue(FakeOpenAI.tool_call("write_file", {"path": "late.txt", "content": "ok"}), "Done late.")
    settings = templated(tmp_path, twilio, llm, TALON_APPROVAL="write", TALON_WHATSAPP_TEMPLATE_APPROVAL=APPROVAL)
    async with running(settings) as (runtime, channel):
        await close_window(channel, twilio)
        await runtime.bridge.submit(InboundMessage(channel="whatsapp", chat_id=ALICE, sender_id=ALICE, message_id="r",
                                                   text="write late.txt", scheduled=ScheduledRun(task_id="t", due=time.time())))
        [buttons] = await twilio.wait_for_messages(1, to=ALICE)
        assert buttons.content_sid == APPROVAL and "late.txt" in buttons.content_variables["1"]
        assert "\n" not in buttons.content_variables["1"]  # one template variable, on one line
        await post(channel, twilio.inbound_params(ALICE, "Approve", ButtonPayload=buttons.content_variables["2"]),
                   sign_with=twilio)
        await wait_until(lambda: any(m.body == "Done late." for m in twilio.sent(to=ALICE)))
        await runtime.bridge.idle()
    assert (settings.workspace_dir("whatsapp", ALICE) / "late.txt").read_text() == "ok"


async def test_outside_the_window_a_long_call_waits_and_comes_whole_with_its_buttons_when_the_person_writes(
        tmp_path: Path, twilio: FakeTwilio, llm: FakeOpenAI) -> None:
    content = "\n".join(f"line {i}: " + "text " * 20 for i in range(40))  # far over one template variable
    llm.queue(FakeOpenAI.tool_call("write_file", {"path": "big.txt", "content": content}), "Big file written.")
    settings = templated(tmp_path, twilio, llm, TALON_APPROVAL="write", TALON_WHATSAPP_TEMPLATE_APPROVAL=APPROVAL)
    async with running(settings) as (runtime, channel):
        await close_window(channel, twilio)
        await runtime.bridge.submit(InboundMessage(channel="whatsapp", chat_id=ALICE, sender_id=ALICE, message_id="r",
                                                   text="write big.txt", scheduled=ScheduledRun(task_id="t", due=time.time())))
        [template] = await twilio.wait_for_messages(1, to=ALICE)
        assert template.content_sid == REOPEN  # no buttons for a call the person has not seen
        assert await channel.state.pending_count(ALICE) == 1
        await post(channel, twilio.inbound_params(ALICE, "what is it?"), sign_with=twilio)
        await wait_until(lambda: any(m.content_sid == APPROVAL for m in twilio.sent(to=ALICE)))
        sent = twilio.sent(to=ALICE)
        buttons = next(m for m in sent if m.content_sid == APPROVAL)
        shown = "".join(m.body for m in sent[1:sent.index(buttons)])
        assert "line 39:" in shown and all(len(m.body) <= 1600 for m in sent)  # the whole call, before the buttons
        await post(channel, twilio.inbound_params(ALICE, "Deny", ButtonPayload=buttons.content_variables["3"]),
                   sign_with=twilio)
        await wait_until(lambda: any("Denied by" in m.body for m in twilio.sent(to=ALICE)))
        await runtime.bridge.idle()
    assert not (settings.workspace_dir("whatsapp", ALICE) / "big.txt").exists()


async def test_after_a_63016_the_window_counts_as_closed_until_the_person_writes(
        tmp_path: Path, twilio: FakeTwilio, llm: FakeOpenAI) -> None:
    llm.queue("first", "second")
    async with running(templated(tmp_path, twilio, llm)) as (runtime, channel):
        await post(channel, twilio.inbound_params(ALICE, "hi"), sign_with=twilio)
        await twilio.wait_for_messages(1, to=ALICE)
        await runtime.bridge.idle()
        assert await channel.window.state(ALICE) == "open"
        twilio.close_window(ALICE)  # Twilio's clock disagrees with ours
        await channel.deliver(ALICE, OutboundReply(text="a late addition"))
        assert await channel.window.state(ALICE) == "closed"
        await channel.window.sweep()  # nothing is tried again in vain
        await channel.deliver(ALICE, OutboundReply(text="and another"))
        refused = [m for m in twilio.messages if m.status == 400]
        assert len(refused) == 1 and await channel.state.pending_count(ALICE) == 2
        await post(channel, twilio.inbound_params(ALICE, "back"), sign_with=twilio)
        await twilio.wait_for_messages(5, to=ALICE)
        await runtime.bridge.idle()
    bodies = [m.body for m in twilio.sent(to=ALICE)]
    assert bodies[0] == "first" and twilio.sent(to=ALICE)[1].content_sid == REOPEN
    assert bodies[2:] == ["a late addition", "and another", "second"]


async def test_status_in_the_chat_shows_the_window_and_the_last_failure(
        tmp_path: Path, twilio: FakeTwilio, llm: FakeOpenAI) -> None:
    async with running(templated(tmp_path, twilio, llm)) as (runtime, channel):
        sid = "SM" + "e" * 32
        await channel.state.record_sent(sid, ALICE, "answer", "", time.time())
        await channel.state.record_status(sid, "undelivered", 63019, "media could not be fetched", time.time())
        await post(channel, twilio.inbound_params(ALICE, "/status"), sign_with=twilio)
        [status] = await twilio.wait_for_messages(1, to=ALICE)
        await runtime.bridge.idle()
    assert "WhatsApp window: open for" in status.body
    assert "last failed delivery" in status.body and "63019" in status.body and "media could not be fetched" in status.body


async def test_a_real_scheduled_task_due_after_the_window_closed_sends_the_reminder_then_follows_in_order(
        tmp_path: Path, twilio: FakeTwilio, llm: FakeOpenAI) -> None:
    llm.queue(FakeOpenAI.tool_call("schedule_task", {"when": "PT2S", "task": "Remind Alice to drink water"}),
              "Done.", "Time to drink water!", "You're welcome.")
    settings = templated(tmp_path, twilio, llm, TALON_TASK_POLL_INTERVAL=0.1)
    async with running(settings) as (runtime, channel):
        await post(channel, twilio.inbound_params(ALICE, "remind me in 2 seconds to drink water"), sign_with=twilio)
        [done] = await twilio.wait_for_messages(1, to=ALICE)
        assert done.body == "Done."
        # Before the task is due, WhatsApp closes the window (as if a day had passed).
        await channel.window.refused(ALICE)
        twilio.close_window(ALICE)
        [_, reminder] = await twilio.wait_for_messages(2, to=ALICE)
        assert reminder.content_sid == REMINDER
        assert reminder.content_variables == {"1": "Remind Alice to drink water"}
        await runtime.bridge.idle()
        await post(channel, twilio.inbound_params(ALICE, "thanks"), sign_with=twilio)
        sent = await twilio.wait_for_messages(4, to=ALICE)
        await runtime.bridge.idle()
    assert [m.body for m in sent[2:]] == ["Time to drink water!", "You're welcome."]


async def test_a_store_that_does_not_answer_makes_the_webhook_503_so_twilio_tries_again(
        tmp_path: Path, twilio: FakeTwilio, llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    from talon.errors import StoreUnavailable

    async def down(*args: object) -> None:
        raise StoreUnavailable("the database gave no connection within 5s")

    llm.queue("after the outage")
    async with running(templated(tmp_path, twilio, llm)) as (runtime, channel):
        params = twilio.inbound_params(ALICE, "hi")
        with monkeypatch.context() as patched:
            patched.setattr(channel.state, "seen", down)
            patched.setattr(channel.state, "record_status", down)
            assert (await post(channel, params, sign_with=twilio))[0] == 503
            status = {"MessageSid": "SM" + "1" * 32, "MessageStatus": "delivered", "AccountSid": twilio.account_sid}
            assert (await post(channel, status, path=f"{HOOK}/status", sign_with=twilio))[0] == 503
        assert not await runtime.inbox.pending() and llm.requests == []
        assert (await post(channel, params, sign_with=twilio))[0] == 200  # Twilio's retry, once it answers
        [m] = await twilio.wait_for_messages(1, to=ALICE)
        await runtime.bridge.idle()
    assert m.body == "after the outage"
