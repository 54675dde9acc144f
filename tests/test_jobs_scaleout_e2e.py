"""Background jobs with many workers on one PostgreSQL (talon.scaleout): two `talon run` workers
behind a load balancer (webhook mode). A running job has a lane (and lease) of its own in the shared
inbox, so the person is answered while it runs, and its answer reaches the chat exactly once."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import psycopg

from tests.conftest import TOKEN
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram
from tests.scaleout_helpers import Cluster, LoadBalancer, base_env, wait_healthy, webhook_env

USER = 7100


def _is_child(body: dict[str, Any]) -> bool:
    return "You are a sub-agent" in str(body["messages"][0]["content"])


def _texts(tg: FakeTelegram) -> list[str]:
    return [str(c.params.get("text")) for c in tg.sent("sendMessage", USER)]


def _wait(check: Any, timeout: float, what: str, cluster: Cluster) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{cluster.logs()}")
        time.sleep(0.05)


def test_with_two_workers_the_person_is_answered_while_a_job_runs_and_its_answer_arrives_once(
        tmp_path: Path, pg_url: str) -> None:
    release = threading.Event()
    children: list[dict[str, Any]] = []

    async def model(body: dict[str, Any]) -> Any:
        if _is_child(body):
            children.append(body)
            while not release.is_set():  # the job's sub-agent works until the test lets it finish
                await asyncio.sleep(0.05)
            return "The archive holds 7 boxes."
        if "hello" in str(body["messages"][-1]["content"]):
            return "Still here: hello!"
        return FakeOpenAI.reply("On it, in the background.", [
            FakeOpenAI.tool_call("delegate", {"task": "Survey the archive.", "background": True})])

    with FakeTelegram(token=TOKEN) as tg, FakeOpenAI() as llm:
        llm.queue(model, model, model, model)
        cluster = Cluster(tmp_path, base_env(tmp_path, tg.base_url, llm.base_url, pg_url, [USER],
                                             TALON_TELEGRAM_STREAMING="off", TALON_MODEL_DISCOVERY="false",
                                             **webhook_env()))
        workers = [cluster.start(f"j{i}") for i in (1, 2)]

        async def post(lb: LoadBalancer, update_id: int, text: str) -> str:
            return await lb.post({"update_id": update_id, **tg.text_message(USER, text, user_id=USER)})

        async def play() -> list[str]:
            async with aiohttp.ClientSession() as session:
                await wait_healthy(session, workers)
                lb = LoadBalancer(session, workers)
                took = [await post(lb, 1, "survey the archive, tell me later")]
                await asyncio.to_thread(_wait, lambda: "On it, in the background." in _texts(tg) and children,
                                        60, "the turn's answer and the job's sub-agent", cluster)
                took.append(await post(lb, 2, "hello"))  # the load balancer's next worker takes it
                await asyncio.to_thread(_wait, lambda: "Still here: hello!" in _texts(tg), 60,
                                        "the answer while the job runs", cluster)
                return took

        try:
            took = asyncio.run(play())
            assert not release.is_set() and len(children) == 1  # answered while the job was still running
            release.set()
            _wait(lambda: any(t.startswith("Background job") for t in _texts(tg)), 60, "the job's answer", cluster)

            def settled() -> bool:
                with psycopg.connect(pg_url) as conn:
                    row = conn.execute("SELECT count(*) FROM talon_inbox WHERE status = 'pending'").fetchone()
                return row == (0,)

            _wait(settled, 30, "an empty inbox", cluster)
        finally:
            release.set()
            codes = cluster.stop_all()
        logs = cluster.logs()
    sent = _texts(tg)
    answers = [t for t in sent if t.startswith("Background job")]
    assert len(answers) == 1 and answers[0].endswith("finished:\n\nThe archive holds 7 boxes."), (sent, logs)
    assert sent.index("On it, in the background.") < sent.index("Still here: hello!") < sent.index(answers[0])
    assert took[0] != took[1]  # the two messages reached different workers
    assert len(children) == 1, logs  # the job ran once
    assert codes == [0, 0], logs
    with psycopg.connect(pg_url) as conn:
        lanes = [r[0] for r in conn.execute("SELECT chat_id FROM talon_inbox ORDER BY seq")]
    # The job's run had a lane of its own; its answer came in the chat's, after the later message.
    assert lanes[0] == str(USER) and any(lane.startswith(f"{USER}/job:") for lane in lanes), lanes
    assert lanes[-1] == str(USER), lanes
