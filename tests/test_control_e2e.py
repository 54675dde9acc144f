"""Control end to end through the fake Bot API and the fake model: approvals with inline buttons,
caps before every model call, /usage, and /metrics."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ALICE, BOB, running_telegram
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram
from tests.support.control import GROUP, buttons, control_settings, has_keyboard, tool_results


def to(chat: int) -> Any:
    return lambda call: str(call.params.get("chat_id")) == str(chat)


@pytest.mark.parametrize("streaming", ["off", "draft"])
async def test_a_shell_call_waits_for_approve_then_runs_and_the_model_gets_its_output(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path, streaming: str) -> None:
    llm.queue(FakeOpenAI.tool_call("shell", {"command": "echo made > made.txt && echo the-output"}), "It ran.")
    settings = control_settings(tmp_path, tg, llm, TALON_TELEGRAM_STREAMING=streaming)
    made = settings.workspace_dir("telegram", str(ALICE)) / "made.txt"
    async with running_telegram(settings):
        tg.push_update(tg.text_message(ALICE, "make a file", user_id=ALICE))
        [prompt] = await tg.wait_for("sendMessage", has_keyboard)
        assert "echo made > made.txt" in prompt.params["text"]
        assert set(buttons(prompt)) == {"Approve", "Deny", "Always in this chat"}
        await asyncio.sleep(0.5)  # a wrongly ungated call would have run (and asked the model again) by now
        assert not made.exists() and len(llm.requests) == 1
        tg.push_update(tg.press_button(ALICE, prompt.result["message_id"], buttons(prompt)["Approve"],
                                       user_id=ALICE, first_name="Alice"))
        await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "It ran.")
        [edit] = await tg.wait_for("editMessageText", lambda c: c.params["message_id"] == prompt.result["message_id"])
    assert made.read_text() == "made\n"
    assert "the-output" in tool_results(llm.requests[1])[0]
    [answered] = tg.sent("answerCallbackQuery")
    assert answered.params["text"] == "Approved."
    assert "Approved by Alice" in edit.params["text"]
    assert "reply_markup" not in tg.messages[(ALICE, prompt.result["message_id"])]  # the buttons are gone


async def test_deny_gives_the_model_denied_and_nothing_runs(tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.queue(FakeOpenAI.tool_call("shell", {"command": "touch nope.txt"}), "Understood, I did not run it.")
    settings = control_settings(tmp_path, tg, llm)
    async with running_telegram(settings):
        tg.push_update(tg.text_message(ALICE, "touch a file", user_id=ALICE))
        [prompt] = await tg.wait_for("sendMessage", has_keyboard)
        tg.push_update(tg.press_button(ALICE, prompt.result["message_id"], buttons(prompt)["Deny"], user_id=ALICE,
                                       first_name="Alice"))
        await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "Understood, I did not run it.")
        [edit] = await tg.wait_for("editMessageText")
    assert not (settings.workspace_dir("telegram", str(ALICE)) / "nope.txt").exists()
    [result] = tool_results(llm.requests[1])
    assert "denied by the user" in result
    assert "Denied by Alice" in edit.params["text"]


@pytest.mark.parametrize("streaming", ["off", "draft"])  # draft: groups see an edited message
async def test_in_a_group_a_press_by_someone_else_is_refused_and_the_asker_decides(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path, streaming: str) -> None:
    llm.queue(FakeOpenAI.tool_call("shell", {"command": "echo group-ran"}), "Done.")
    settings = control_settings(tmp_path, tg, llm, TALON_TELEGRAM_ALLOWED_CHATS=str(GROUP),
                                TALON_TELEGRAM_STREAMING=streaming)
    async with running_telegram(settings) as runtime:
        tg.push_update(tg.text_message(GROUP, "@talon_test_bot run it", user_id=ALICE, chat_type="supergroup"))
        [prompt] = await tg.wait_for("sendMessage", has_keyboard)
        mid = prompt.result["message_id"]
        tg.push_update(tg.press_button(GROUP, mid, buttons(prompt)["Approve"], user_id=BOB, username="bob"))
        [refused] = await tg.wait_for("answerCallbackQuery")
        assert refused.params["show_alert"] is True and "Only the person who asked" in refused.params["text"]
        await asyncio.sleep(0.5)
        assert len(llm.requests) == 1 and not tg.sent("editMessageText")  # still waiting
        [pending] = await runtime.stores.approvals.pending("telegram", str(GROUP))  # type: ignore[union-attr]
        assert pending.requester == str(ALICE)
        tg.push_update(tg.press_button(GROUP, mid, buttons(prompt)["Approve"], user_id=ALICE, first_name="Alice"))
        await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "Done.")
        decided = await runtime.stores.approvals.get(pending.id)  # type: ignore[union-attr]
    assert "group-ran" in tool_results(llm.requests[1])[0]
    assert decided is not None and decided.status == "approved" and decided.decided_by.startswith(f"telegram:{ALICE}")
    assert decided.decided_at is not None


async def test_an_approver_may_decide_in_a_group_and_always_skips_the_next_prompt(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.queue(FakeOpenAI.tool_call("shell", {"command": "echo one"}), "First done.",
              FakeOpenAI.tool_call("shell", {"command": "echo two"}), "Second done.")
    settings = control_settings(tmp_path, tg, llm, TALON_TELEGRAM_ALLOWED_CHATS=str(GROUP),
                                TALON_APPROVERS=f"telegram:{BOB}")
    async with running_telegram(settings):
        tg.push_update(tg.text_message(GROUP, "@talon_test_bot first", user_id=ALICE, chat_type="supergroup"))
        [prompt] = await tg.wait_for("sendMessage", has_keyboard)
        tg.push_update(tg.press_button(GROUP, prompt.result["message_id"], buttons(prompt)["Always in this chat"],
                                       user_id=BOB, username="bob"))
        await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "First done.")
        tg.push_update(tg.text_message(GROUP, "@talon_test_bot second", user_id=ALICE, chat_type="supergroup"))
        await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "Second done.")
    assert len([c for c in tg.sent("sendMessage") if has_keyboard(c)]) == 1  # the second ran unasked
    assert "two" in tool_results(llm.requests[3])[-1]


async def test_no_answer_in_time_gives_the_model_the_timeout_and_edits_the_prompt(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.queue(FakeOpenAI.tool_call("shell", {"command": "touch late.txt"}), "Nobody answered, so I did not.")
    settings = control_settings(tmp_path, tg, llm, TALON_APPROVAL_TIMEOUT="1.5")
    async with running_telegram(settings):
        tg.push_update(tg.text_message(ALICE, "touch it", user_id=ALICE))
        [prompt] = await tg.wait_for("sendMessage", has_keyboard)
        await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "Nobody answered, so I did not.")
        [edit] = await tg.wait_for("editMessageText")
    assert "no answer in 1.5 seconds" in tool_results(llm.requests[1])[0]
    assert "no answer in time" in edit.params["text"] and edit.params["message_id"] == prompt.result["message_id"]
    assert not (settings.workspace_dir("telegram", str(ALICE)) / "late.txt").exists()


async def test_stop_while_an_approval_waits_stops_the_turn_and_closes_the_prompt(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.queue(FakeOpenAI.tool_call("shell", {"command": "touch stopped.txt"}))
    settings = control_settings(tmp_path, tg, llm)
    async with running_telegram(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "touch it", user_id=ALICE))
        [prompt] = await tg.wait_for("sendMessage", has_keyboard)
        tg.push_update(tg.text_message(ALICE, "/stop", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "Stopped.")
        [edit] = await tg.wait_for("editMessageText")
        assert await runtime.stores.approvals.pending("telegram", str(ALICE)) == []  # type: ignore[union-attr]
    assert "the turn was stopped" in edit.params["text"]
    assert len(llm.requests) == 1


async def test_past_the_cap_the_model_gets_no_request_and_usage_shows_the_reported_tokens(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.queue(FakeOpenAI.reply("First answer.", usage={"prompt_tokens": 900, "completion_tokens": 150}),
              "Never sent.")
    settings = control_settings(tmp_path, tg, llm, TALON_LIMIT_PER_PERSON="1000 tokens/day",
                                TALON_TIMEZONE="Europe/Berlin")
    async with running_telegram(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "hello", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "First answer.")
        tg.push_update(tg.text_message(ALICE, "and again", user_id=ALICE))
        [limit] = await tg.wait_for("sendMessage", lambda c: "limit" in c.params.get("text", ""))
        tg.push_update(tg.text_message(ALICE, "/usage", user_id=ALICE))
        [usage] = await tg.wait_for("sendMessage", lambda c: "Your use" in c.params.get("text", ""))
        await runtime.bridge.idle()
        pending = await runtime.inbox.pending()
    assert len(llm.requests) == 1  # the message past the cap never reached the model
    assert limit.params["text"] == ("You have reached the limit of 1,000 tokens per day for today, so I did not "
                                    "ask the model; it resets at 00:00 Europe/Berlin.")
    assert "1,050 tokens (900 in, 150 out) in 1 model call" in usage.params["text"]
    assert "no price known for the model" in usage.params["text"]
    assert pending == []  # the capped message was closed with its notice, not left to come back


async def test_a_grant_lifts_the_cap_for_that_person(tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.queue(FakeOpenAI.reply("One.", usage={"prompt_tokens": 900, "completion_tokens": 200}), "Two.")
    settings = control_settings(tmp_path, tg, llm, TALON_LIMIT_PER_PERSON="1000 tokens/day")
    async with running_telegram(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "hello", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "One.")
        tg.push_update(tg.text_message(ALICE, "more", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: "limit" in c.params.get("text", ""))
        assert runtime.stores is not None and runtime.stores.usage is not None
        await runtime.stores.usage.grant("telegram", str(ALICE), 5000, "tokens", time.time())
        tg.push_update(tg.text_message(ALICE, "more please", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "Two.")
    assert len(llm.requests) == 2


async def test_metrics_count_and_parse(tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    from channels.http import HttpServer
    from channels.telegram import TelegramChannel
    from talon.runtime import build_runtime

    llm.queue(FakeOpenAI.tool_call("shell", {"command": "echo hi"}),
              FakeOpenAI.reply("Counted.", usage={"prompt_tokens": 300, "completion_tokens": 20}))
    settings = control_settings(tmp_path, tg, llm, TALON_HTTP_HOST="127.0.0.1", TALON_HTTP_PORT=0)
    http = HttpServer("127.0.0.1", 0)
    runtime = build_runtime(settings, [TelegramChannel(settings)], http=http)
    await runtime.start()
    try:
        async with httpx.AsyncClient(base_url=http.local_url) as client:
            before = samples((await client.get("/metrics")).text)
            tg.push_update(tg.text_message(ALICE, "count me", user_id=ALICE))
            [prompt] = await tg.wait_for("sendMessage", has_keyboard)
            tg.push_update(tg.press_button(ALICE, prompt.result["message_id"], buttons(prompt)["Approve"],
                                           user_id=ALICE))
            await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "Counted.")
            await runtime.bridge.idle()
            response = await client.get("/metrics")
    finally:
        await runtime.stop()
    assert response.headers["content-type"].startswith("text/plain")
    after = samples(response.text)
    assert before.get(("talon_messages_received_total", (("channel", "telegram"),)), 0) == 0
    assert after[("talon_messages_received_total", (("channel", "telegram"),))] == 1
    assert after[("talon_messages_answered_total", (("channel", "telegram"),))] == 1
    assert after[("talon_turns_total", (("channel", "telegram"), ("outcome", "answered")))] == 1
    assert after[("talon_model_calls_total", (("model", "fake-model"), ("purpose", "turn")))] == 2
    assert after[("talon_model_tokens_total", (("model", "fake-model"), ("type", "output")))] >= 20
    assert after[("talon_tool_calls_total", (("outcome", "ok"), ("tool", "shell")))] == 1
    assert after[("talon_approvals_total", (("kind", "shell"), ("outcome", "approved")))] == 1
    assert after[("talon_turn_duration_seconds_count", (("channel", "telegram"),))] == 1
    assert ("talon_inbox_depth", ()) in after
    assert "count me" not in response.text  # no chat content
    labels = {value for (_, pairs) in after for _, value in pairs}
    assert str(ALICE) not in labels and not any("count" in value for value in labels)  # nor who or where


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text page, parsed by the official parser."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


async def test_metrics_off_serves_no_route_and_polling_alone_listens_only_when_a_port_is_named(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    from channels.http import HttpServer
    from channels.telegram import TelegramChannel
    from talon.runtime import build_runtime, shared_http_server

    assert shared_http_server(control_settings(tmp_path, tg, llm)) is None
    assert shared_http_server(control_settings(tmp_path, tg, llm, TALON_HTTP_PORT=0)) is not None
    assert shared_http_server(control_settings(tmp_path, tg, llm, TALON_HTTP_PORT=0, TALON_METRICS="false")) is None
    settings = control_settings(tmp_path, tg, llm, TALON_METRICS="false")
    http = HttpServer("127.0.0.1", 0)
    runtime = build_runtime(settings, [TelegramChannel(settings)], http=http)
    await runtime.start()
    try:
        async with httpx.AsyncClient(base_url=http.local_url) as client:
            assert (await client.get("/metrics")).status_code == 404
            assert (await client.get("/healthz")).status_code == 200
    finally:
        await runtime.stop()


async def test_send_approval_holds_the_files_of_a_reply(tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    from PIL import Image

    llm.queue("Here is the chart: ![chart](chart.png)", "Again: ![chart](chart.png)")
    settings = control_settings(tmp_path, tg, llm, TALON_APPROVAL="send")
    workspace = settings.workspace_dir("telegram", str(ALICE))
    workspace.mkdir(parents=True)
    Image.new("RGB", (40, 30), (200, 10, 10)).save(workspace / "chart.png")
    async with running_telegram(settings):
        tg.push_update(tg.text_message(ALICE, "the chart please", user_id=ALICE))
        [prompt] = await tg.wait_for("sendMessage", has_keyboard)
        assert "send these files into the chat: chart.png" in prompt.params["text"]
        tg.push_update(tg.press_button(ALICE, prompt.result["message_id"], buttons(prompt)["Deny"], user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: "not sent (denied by the user): chart.png" in c.params.get("text", ""))
        assert not tg.sent("sendPhoto")
        tg.push_update(tg.text_message(ALICE, "please, really", user_id=ALICE))
        [_, second] = await tg.wait_for("sendMessage", has_keyboard, count=2)
        tg.push_update(tg.press_button(ALICE, second.result["message_id"], buttons(second)["Approve"], user_id=ALICE))
        [photo] = await tg.wait_for("sendPhoto")
    assert photo.media[0].file is not None
    assert "Here is the chart:" in " ".join(tg.texts(ALICE))


async def test_usage_in_a_group_shows_the_asker_and_the_group(tg: FakeTelegram, llm: FakeOpenAI,
                                                              tmp_path: Path) -> None:
    llm.queue(FakeOpenAI.reply("Hi Alice.", usage={"prompt_tokens": 400, "completion_tokens": 30,
                                                   "prompt_tokens_details": {"cached_tokens": 100}}))  # type: ignore[dict-item]
    settings = control_settings(tmp_path, tg, llm, TALON_TELEGRAM_ALLOWED_CHATS=str(GROUP),
                                TALON_LIMIT_PER_CHAT="100000 tokens/day")
    async with running_telegram(settings):
        tg.push_update(tg.text_message(GROUP, "@talon_test_bot hello", user_id=ALICE, chat_type="supergroup"))
        await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "Hi Alice.")
        tg.push_update(tg.text_message(GROUP, "/usage@talon_test_bot", user_id=BOB, username="bob",
                                       chat_type="supergroup"))
        [usage] = await tg.wait_for("sendMessage", lambda c: "Your use" in c.params.get("text", ""))
    text = usage.params["text"]
    mine, group = text.split("This group:")
    assert mine.count("nothing yet") == 3  # Bob asked nothing of the model
    assert group.count("430 tokens (400 in, 30 out, 100 of them cached) in 1 model call") == 3
    assert "Limits: 100,000 tokens per day per chat (days begin at 00:00 UTC)." in text
