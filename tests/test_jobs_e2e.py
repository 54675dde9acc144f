"""Background delegation end to end (talon.jobs): Talon with its Telegram channel against the fake
OpenAI-compatible model. A job's sub-agent is told apart by the sub-agent note in its system prompt."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

from tests.conftest import ALICE, BOB, make_settings
from tests.conftest import running_telegram as running
from tests.fakes.openai_server import FakeOpenAI, Req
from tests.fakes.telegram import FakeTelegram


def to(chat: int):
    return lambda c: str(c.params.get("chat_id")) == str(chat)


def is_child(req: Req | dict[str, Any]) -> bool:
    body = req.json if isinstance(req, Req) else req
    return "You are a sub-agent" in str(body["messages"][0]["content"])


def texts(tg: FakeTelegram, chat: int) -> list[str]:
    return [str(c.params.get("text")) for c in tg.sent("sendMessage", chat)]


async def said(tg: FakeTelegram, chat: int, text: str, predicate) -> str:
    """Send ``text`` and return the first message to ``chat`` after it that matches."""
    before = len(tg.sent("sendMessage", chat))
    tg.push_update(tg.text_message(chat, text, user_id=chat))
    calls = await tg.wait_for("sendMessage", lambda c: to(chat)(c) and predicate(str(c.params.get("text"))),
                              count=1 + sum(1 for t in texts(tg, chat)[:before] if predicate(t)))
    return str(calls[-1].params["text"])


async def test_a_background_job_answers_in_a_message_of_its_own_after_the_turn(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_TELEGRAM_STREAMING="off")
    release = asyncio.Event()
    child_bodies: list[dict[str, Any]] = []

    async def child(body: dict[str, Any]) -> str:
        child_bodies.append(body)
        await asyncio.wait_for(release.wait(), 60)
        return "Report: 42 widgets counted."

    llm.queue(FakeOpenAI.reply("I started a background job; I will tell you when it is done.", [
            FakeOpenAI.tool_call("delegate", {"task": "Count the widgets in the store room.", "background": True})]),
              child,
              "Still here: hello!")
    async with running(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "my locker code is 4417-SECRET; count the widgets later",
                                       user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: to(ALICE)(c) and "started a background job" in c.params["text"])
        await llm.wait_for_requests(2)  # the job's sub-agent is working (held) ...
        assert is_child(llm.requests[1])
        # ... while the turn that started it has ended, and the chat goes on meanwhile.
        listing = await said(tg, ALICE, "/jobs", lambda t: t.startswith("Background jobs"))
        found = re.findall(r"• ([0-9a-f]{8}): 'Count the widgets in the store room\.' · running", listing)
        assert len(found) == 1, listing
        job_id = found[0]
        assert await said(tg, ALICE, "hello", lambda t: t.startswith("Still here")) == "Still here: hello!"
        # /stop stops the chat's turn, never a background job.
        assert (await said(tg, ALICE, "/stop", lambda t: t.startswith("Nothing to stop"))).startswith("Nothing")
        assert job_id in runtime.bridge.jobs.active  # type: ignore[union-attr]
        release.set()
        result = await tg.wait_for("sendMessage", lambda c: to(ALICE)(c) and "finished" in c.params["text"])
        done = await said(tg, ALICE, "/jobs", lambda t: t.startswith("Finished"))
    assert result[-1].params["text"] == f"Background job {job_id} finished:\n\nReport: 42 widgets counted."
    assert f"• {job_id}: 'Count the widgets in the store room.' · done" in done
    # The child saw the task alone, not the parent's conversation.
    [body] = child_bodies
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert "4417-SECRET" not in str(body)
    # Its own message, after the turn's answer and after the later exchange.
    sent = texts(tg, ALICE)
    assert sent.index("I started a background job; I will tell you when it is done.") \
        < sent.index("Still here: hello!") < sent.index(result[-1].params["text"])


async def test_a_chat_cannot_see_or_cancel_another_chats_job(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_TELEGRAM_STREAMING="off",
                             TALON_TELEGRAM_ALLOWED_USERS=f"{ALICE},{BOB}")
    release = asyncio.Event()

    async def child(body: dict[str, Any]) -> str:
        await asyncio.wait_for(release.wait(), 60)
        return "Alice's private findings."

    llm.queue(FakeOpenAI.reply("Started.", [
            FakeOpenAI.tool_call("delegate", {"task": "Dig through Alice's notes.", "background": True})]), child)
    async with running(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "dig later", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: to(ALICE)(c) and c.params["text"] == "Started.")
        await llm.wait_for_requests(2)
        jobs = runtime.bridge.jobs
        assert jobs is not None
        [job_id] = list(jobs.active)
        # Bob lists nothing, and his tries with Alice's real id and guessed ones all miss.
        assert await said(tg, BOB, "/jobs", lambda t: "jobs" in t) == "No background jobs in this chat."
        for guess in (job_id, job_id.upper(), "00000000", "../" + job_id, "%"):
            answer = await said(tg, BOB, f"/jobs cancel {guess}", lambda t: t.startswith("Could not"))
            assert "there is no job" in answer
        # The model in Bob's chat asks with Alice's id: no such job for it either.
        llm.queue(FakeOpenAI.tool_call("job_status", {"id": job_id}), "ok",
                  FakeOpenAI.tool_call("cancel_job", {"id": job_id}), "ok")
        await said(tg, BOB, "what is job " + job_id, lambda t: t == "ok")
        await said(tg, BOB, "cancel job " + job_id, lambda t: t == "ok")
        assert job_id in jobs.active
        release.set()
        await tg.wait_for("sendMessage", lambda c: to(ALICE)(c) and "finished" in c.params["text"])
    tool_results = [m["content"] for r in llm.requests[-3:] for m in r.json["messages"] if m["role"] == "tool"]
    assert tool_results and all("there is no job" in str(t) for t in tool_results), tool_results
    assert not any("Alice's private findings" in t for t in texts(tg, BOB))


async def test_jobs_cancel_stops_a_running_job_and_nothing_is_sent(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_TELEGRAM_STREAMING="off")
    never = asyncio.Event()

    async def stuck(body: dict[str, Any]) -> str:
        await never.wait()
        return "too late"

    llm.queue(FakeOpenAI.reply("Started.", [
            FakeOpenAI.tool_call("delegate", {"task": "think for ever", "background": True})]), stuck)
    async with running(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "go", user_id=ALICE))
        await llm.wait_for_requests(2)
        jobs = runtime.bridge.jobs
        assert jobs is not None
        [job_id] = list(jobs.active)
        answer = await said(tg, ALICE, f"/jobs cancel {job_id}", lambda t: t.startswith("Cancelled"))
        assert answer == f"Cancelled background job {job_id} ('think for ever')."
        await runtime.bridge.idle()
        assert not jobs.active
        listing = await said(tg, ALICE, "/jobs", lambda t: t.startswith("Finished"))
        await runtime.bridge.idle()
        assert await runtime.bridge.inbox.pending() == []  # the job's message is closed, not left to resume
        never.set()
    assert f"• {job_id}: 'think for ever' · cancelled" in listing
    assert not any(t.startswith("Background job") for t in texts(tg, ALICE))  # no result, no failure


async def test_more_jobs_than_talon_subagents_are_refused(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_TELEGRAM_STREAMING="off",
                             TALON_SUBAGENTS="1")
    never = asyncio.Event()

    async def stuck(body: dict[str, Any]) -> str:
        await never.wait()
        return "too late"

    llm.queue(FakeOpenAI.reply("Started one.", [
            FakeOpenAI.tool_call("delegate", {"task": "first job", "background": True})]), stuck,
              FakeOpenAI.tool_call("delegate", {"task": "second job", "background": True}), "Could not.")
    async with running(settings):
        tg.push_update(tg.text_message(ALICE, "go", user_id=ALICE))
        await llm.wait_for_requests(2)
        await said(tg, ALICE, "another", lambda t: t == "Could not.")
        never.set()
    [result] = [m["content"] for m in llm.requests[-1].json["messages"] if m["role"] == "tool"][-1:]
    assert "already has 1 background jobs unfinished" in str(result) and "TALON_SUBAGENTS" in str(result)


async def test_a_jobs_risky_call_asks_in_the_chat_and_its_calls_are_the_persons_usage(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_SHELL_TOOL=True,
                             TALON_TELEGRAM_STREAMING="off")  # the default approvals: the shell asks
    llm.queue(FakeOpenAI.reply("Started.", [
            FakeOpenAI.tool_call("delegate", {"task": "make job.txt with the shell", "background": True})]),
              FakeOpenAI.tool_call("shell", {"command": "echo job > job.txt"}),
              "Made job.txt.")
    made = settings.workspace_dir("telegram", str(ALICE)) / "job.txt"
    async with running(settings):
        tg.push_update(tg.text_message(ALICE, "make a file in the background", user_id=ALICE))
        [prompt] = await tg.wait_for("sendMessage", lambda c: to(ALICE)(c) and bool(c.params.get("reply_markup")))
        assert "echo job > job.txt" in prompt.params["text"] and not made.exists()
        assert "Started." in texts(tg, ALICE)  # asked after the turn that started the job had ended
        approve = {b["text"]: b["callback_data"] for row in prompt.params["reply_markup"]["inline_keyboard"]
                   for b in row}["Approve"]
        tg.push_update(tg.press_button(ALICE, prompt.result["message_id"], approve, user_id=ALICE, first_name="Alice"))
        await tg.wait_for("sendMessage", lambda c: to(ALICE)(c) and "finished" in c.params["text"])
        usage = await said(tg, ALICE, "/usage", lambda t: "model calls" in t)
    assert made.read_text() == "job\n"
    assert "in 3 model calls" in usage, usage  # the turn's one (it ends after starting the job) and the job's two


async def test_a_job_cut_off_too_often_is_reported_to_the_chat_as_failed(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    from talon.bridge import MAX_ATTEMPTS
    from talon.envelope import BackgroundJobRun, InboundMessage
    from talon.storage.jobs import RUNNING, Job

    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_TELEGRAM_STREAMING="off")
    async with running(settings) as runtime:
        bridge = runtime.bridge
        assert bridge.jobs is not None
        # A job left running by earlier runs that were each killed while it worked.
        job = Job(id="0badc0de", channel="telegram", conversation=str(ALICE), owner_id=str(ALICE),
                  task="a long survey", tools="[]", status=RUNNING, created=1.0, updated=1.0)
        assert await bridge.jobs.store.add(job, max_unfinished=3)
        message = InboundMessage(channel="telegram", chat_id=str(ALICE), sender_id=str(ALICE),
                                 message_id="job-0badc0de", job=BackgroundJobRun(job_id=job.id))
        await bridge.inbox.add(message)
        for _ in range(MAX_ATTEMPTS):
            await bridge.inbox.begin_attempt(message.key)
        assert await bridge.recover() == 1
        [sent] = await tg.wait_for("sendMessage", lambda c: to(ALICE)(c) and "failed" in c.params["text"])
        await bridge.idle()
        assert await bridge.inbox.pending() == []
        listing = await said(tg, ALICE, "/jobs", lambda t: t.startswith("Finished"))
    assert sent.params["text"] == ("Background job 0badc0de failed: it was cut off 3 times (Talon restarted while it "
                                   "ran); ask again if it is still wanted")
    assert llm.requests == []  # not started a fourth time
    assert "• 0badc0de: 'a long survey' · failed" in listing


async def test_in_a_group_the_jobs_answer_is_a_message_of_its_own_not_a_reply(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    group, carol = -1001234567890, 333
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_TELEGRAM_ALLOWED_CHATS=str(group),
                             TALON_TELEGRAM_STREAMING="off")
    llm.queue(FakeOpenAI.reply("On it.", [
            FakeOpenAI.tool_call("delegate", {"task": "Find a hotel.", "background": True})]),
              "The Harbour Inn has rooms.")
    async with running(settings):
        tg.push_update(tg.text_message(group, "@talon_test_bot find us a hotel later", user_id=carol,
                                       username="carol", first_name="Carol", chat_type="supergroup",
                                       chat_title="Trip planning"))
        calls = await tg.wait_for("sendMessage", lambda c: to(group)(c) and "finished" in c.params["text"])
    [answer] = [c for c in calls if "finished" in c.params["text"]]
    assert answer.params["text"].endswith("finished:\n\nThe Harbour Inn has rooms.")
    assert "reply_to_message_id" not in answer.params and "reply_parameters" not in answer.params


async def test_with_postgresql_a_job_runs_and_answers_once(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path, pg_url: str) -> None:
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_TELEGRAM_STREAMING="off",
                             TALON_DATABASE_URL=pg_url)
    llm.queue(FakeOpenAI.reply("Started.", [
            FakeOpenAI.tool_call("delegate", {"task": "Tally the votes.", "background": True})]),
              "12 votes for, 3 against.")
    async with running(settings) as runtime:
        assert runtime.bridge.jobs_inline  # the shared bridge: the job runs in a lane of its own
        tg.push_update(tg.text_message(ALICE, "tally later", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: to(ALICE)(c) and "finished" in c.params["text"])
        listing = await said(tg, ALICE, "/jobs", lambda t: t.startswith("Finished"))
        await runtime.bridge.idle()
        pending = await runtime.bridge.inbox.pending()
    results = [t for t in texts(tg, ALICE) if t.startswith("Background job")]
    assert len(results) == 1 and results[0].endswith("finished:\n\n12 votes for, 3 against."), results
    assert "· done" in listing and pending == []


async def test_a_job_over_talon_subagent_timeout_is_reported_failed(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_TELEGRAM_STREAMING="off",
                             TALON_SUBAGENT_TIMEOUT="1")
    never = asyncio.Event()

    async def stuck(body: dict[str, Any]) -> str:
        await never.wait()
        return "too late"

    llm.queue(FakeOpenAI.reply("Started.", [
            FakeOpenAI.tool_call("delegate", {"task": "think for ever", "background": True})]), stuck)
    async with running(settings):
        tg.push_update(tg.text_message(ALICE, "go", user_id=ALICE))
        [sent] = await tg.wait_for("sendMessage", lambda c: to(ALICE)(c) and "failed" in c.params["text"])
        never.set()
    assert "did not finish within 1s (TALON_SUBAGENT_TIMEOUT)" in sent.params["text"]


async def test_in_a_group_only_the_starter_an_admin_or_an_approver_cancels_a_job(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    group, carol, mallory, dana = -1001234567890, 333, 666, 444
    tg.set_member_status(group, dana, "administrator")
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_TELEGRAM_ALLOWED_CHATS=str(group),
                             TALON_TELEGRAM_STREAMING="off")
    never = asyncio.Event()

    async def stuck(body: dict[str, Any]) -> str:
        await never.wait()
        return "too late"

    def says(user: int, name: str, text: str) -> dict[str, Any]:
        return tg.text_message(group, text, user_id=user, username=name.lower(), first_name=name,
                               chat_type="supergroup", chat_title="Trip planning")

    llm.queue(FakeOpenAI.reply("On it.", [
            FakeOpenAI.tool_call("delegate", {"task": "Plan the route.", "background": True})]), stuck)
    async with running(settings) as runtime:
        tg.push_update(says(carol, "Carol", "@talon_test_bot plan the route later"))
        await llm.wait_for_requests(2)
        jobs = runtime.bridge.jobs
        assert jobs is not None
        [job_id] = list(jobs.active)
        tg.push_update(says(mallory, "Mallory", f"/jobs cancel {job_id}"))
        [refused] = await tg.wait_for("sendMessage", lambda c: to(group)(c) and "someone else" in c.params["text"])
        assert job_id in jobs.active
        tg.push_update(says(dana, "Dana", f"/jobs cancel {job_id}"))
        await tg.wait_for("sendMessage", lambda c: to(group)(c) and c.params["text"].startswith("Cancelled"))
        await runtime.bridge.idle()
        never.set()
    assert "only they, an administrator of this group or an approver can cancel it" in refused.params["text"]
    assert not jobs.active


async def test_job_status_tells_the_model_running_then_the_answer(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_TELEGRAM_STREAMING="off")
    release = asyncio.Event()
    ids: list[str] = []

    async def child(body: dict[str, Any]) -> str:
        await asyncio.wait_for(release.wait(), 60)
        return "The cellar holds 9 bottles."

    def ask_status(body: dict[str, Any]) -> Any:
        return FakeOpenAI.reply(tool_calls=[FakeOpenAI.tool_call("job_status", {"id": ids[0]})])

    llm.queue(FakeOpenAI.reply("Started.", [
            FakeOpenAI.tool_call("delegate", {"task": "Count the bottles.", "background": True})]), child)
    async with running(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "count later", user_id=ALICE))
        await llm.wait_for_requests(2)
        assert runtime.bridge.jobs is not None
        ids.extend(runtime.bridge.jobs.active)
        llm.queue(ask_status, "It is still running.")
        await said(tg, ALICE, "how is it going?", lambda t: t == "It is still running.")
        running_result = [m["content"] for m in llm.requests[-1].json["messages"] if m["role"] == "tool"][-1]
        release.set()
        await tg.wait_for("sendMessage", lambda c: to(ALICE)(c) and "finished" in c.params["text"])
        llm.queue(ask_status, "Nine bottles.")
        await said(tg, ALICE, "and now?", lambda t: t == "Nine bottles.")
        done_result = [m["content"] for m in llm.requests[-1].json["messages"] if m["role"] == "tool"][-1]
    assert str(running_result).startswith(f"Job {ids[0]} ('Count the bottles.'): running, started")
    assert done_result == f"Job {ids[0]} ('Count the bottles.'): done. Its answer:\nThe cellar holds 9 bottles."
