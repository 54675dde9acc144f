"""A step that starts a background job is the turn's last (talon.agent.loop): the model gets no
further request in that turn, the step's other tool calls still run and are recorded, and the
person is answered with the step's text or a line naming the job."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

from tests.conftest import ALICE, make_settings
from tests.conftest import running_telegram as running
from tests.fakes.openai_server import FakeOpenAI, Req
from tests.fakes.telegram import FakeTelegram


def _child(req: Req) -> bool:
    return "You are a sub-agent" in str(req.json["messages"][0]["content"])


def _to_alice(c: Any) -> bool:
    return str(c.params.get("chat_id")) == str(ALICE)


async def test_the_turn_ends_after_the_step_that_started_a_job_without_another_model_request(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_TELEGRAM_STREAMING="off")
    release = asyncio.Event()

    async def child(body: dict[str, Any]) -> str:
        await asyncio.wait_for(release.wait(), 60)
        return "Found 3 typos."

    # One step, no text: a background delegation beside an ordinary tool call. If the loop asked the
    # model again, that request would take the child's scripted answer (and the turn would hang on it).
    llm.queue(FakeOpenAI.reply(None, [
        FakeOpenAI.tool_call("delegate", {"task": "Proofread notes.md.", "background": True}),
        FakeOpenAI.tool_call("write_file", {"path": "todo.txt", "content": "proofread\n"})]), child)
    async with running(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "proofread my notes later, and note it", user_id=ALICE))
        [reply] = await tg.wait_for("sendMessage",
                                    lambda c: _to_alice(c) and "Started background job" in c.params["text"])
        await llm.wait_for_requests(2)
        assert _child(llm.requests[1])
        jobs = runtime.bridge.jobs
        assert jobs is not None
        [job_id] = list(jobs.active)
        release.set()
        await tg.wait_for("sendMessage", lambda c: _to_alice(c) and "finished" in c.params["text"])
        await runtime.bridge.idle()
        parents = [r for r in llm.requests if not _child(r)]
        assert len(parents) == 1, [r.json["messages"][-1] for r in parents]  # the turn made one request
        # The next turn's request shows both calls' results and the turn's closing note in the log.
        llm.queue("ok")
        tg.push_update(tg.text_message(ALICE, "thanks", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: _to_alice(c) and c.params["text"] == "ok")
    assert re.fullmatch(rf"Started background job {job_id}; the answer will arrive here as a message of its own "
                        r"when it is done \(/jobs shows it meanwhile\)\.", reply.params["text"]), reply.params["text"]
    assert (settings.workspace_dir("telegram", str(ALICE)) / "todo.txt").read_text() == "proofread\n"
    messages = llm.requests[-1].json["messages"]
    tools = [m for m in messages if m["role"] == "tool"]
    assert len(tools) == 2 and f"Started background job {job_id}" in str(tools[0]["content"])
    # The closing line is in the log as Talon's note (shown to the model, not as its own words).
    assert any(f"Started background job {job_id};" in str(m.get("content")) for m in messages
               if m["role"] != "tool")


async def test_the_steps_own_text_is_the_answer_and_a_refused_job_does_not_end_the_turn(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_TELEGRAM_STREAMING="off",
                             TALON_SUBAGENTS="1")
    never = asyncio.Event()

    async def stuck(body: dict[str, Any]) -> str:
        await never.wait()
        return "too late"

    llm.queue(FakeOpenAI.reply("On it, I will report back.", [
        FakeOpenAI.tool_call("delegate", {"task": "first job", "background": True})]), stuck,
        # Over the limit: the call fails, no job started, so the model is asked again as usual.
        FakeOpenAI.tool_call("delegate", {"task": "second job", "background": True}), "Could not start it.")
    async with running(settings):
        tg.push_update(tg.text_message(ALICE, "go", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: _to_alice(c) and c.params["text"] == "On it, I will report back.")
        await llm.wait_for_requests(2)
        tg.push_update(tg.text_message(ALICE, "another", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: _to_alice(c) and c.params["text"] == "Could not start it.")
        never.set()
    assert len([r for r in llm.requests if not _child(r)]) == 3
