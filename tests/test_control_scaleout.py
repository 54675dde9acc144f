"""Control with two `talon run` workers on one PostgreSQL (webhook mode): a button pressed on the
worker that does not run the turn decides it, a cap reached through one worker holds on the other,
and /metrics on each worker parses."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ALICE, TOKEN
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram
from tests.scaleout_helpers import SECRET, WEBHOOK_PATH, Cluster, Worker, base_env, wait_healthy, webhook_env


_update_ids = itertools.count(1)


async def post_to(session: aiohttp.ClientSession, worker: Worker, update: dict[str, Any]) -> None:
    """Post an update to one worker, as Telegram would (each with its own update_id)."""
    async with session.post(worker.url + WEBHOOK_PATH, json={**update, "update_id": next(_update_ids)},
                            headers={"X-Telegram-Bot-Api-Secret-Token": SECRET}) as resp:
        assert resp.status == 200, await resp.text()


def pending_approval(pg_url: str) -> str | None:
    with psycopg.connect(pg_url) as conn:
        row = conn.execute("SELECT prompt_id FROM talon_approvals WHERE status = 'pending'").fetchone()
    return str(row[0]) if row and row[0] else None


def test_two_workers_share_approvals_and_caps(tmp_path: Path, pg_url: str) -> None:
    with FakeTelegram(token=TOKEN) as tg, FakeOpenAI() as llm:
        llm.queue(FakeOpenAI.tool_call("shell", {"command": "echo decided-elsewhere"}),
                  FakeOpenAI.reply("Approved on the other worker.", usage={"prompt_tokens": 50_000,
                                                                           "completion_tokens": 10}),
                  "Never asked.")
        env = base_env(tmp_path, tg.base_url, llm.base_url, pg_url, [ALICE], **webhook_env(),
                       TALON_SHELL_TOOL="true", TALON_SHELL_UNSANDBOXED="true", TALON_TELEGRAM_STREAMING="off",
                       TALON_MODEL_DISCOVERY="false", TALON_LIMIT_PER_PERSON="20000 tokens/day",
                       TALON_TELEGRAM_ACK_REACTION="")
        cluster = Cluster(tmp_path, env)
        first, second = cluster.start("w1"), cluster.start("w2")

        async def scenario() -> tuple[str, str]:
            async with aiohttp.ClientSession() as session:
                await wait_healthy(session, [first, second])
                await post_to(session, first, tg.text_message(ALICE, "run it", user_id=ALICE))
                [prompt] = await tg.wait_for("sendMessage", lambda c: bool(c.params.get("reply_markup")), timeout=30)
                deadline = time.monotonic() + 30
                while pending_approval(pg_url) is None:  # on record, so the press may land anywhere
                    assert time.monotonic() < deadline, cluster.logs()
                    await asyncio.sleep(0.05)
                data = next(b["callback_data"] for row in prompt.params["reply_markup"]["inline_keyboard"]
                            for b in row if b["text"] == "Approve")
                await post_to(session, second, tg.press_button(ALICE, prompt.result["message_id"], data,
                                                               user_id=ALICE, first_name="Alice"))
                await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "Approved on the other worker.",
                                  timeout=30)
                await post_to(session, second, tg.text_message(ALICE, "once more", user_id=ALICE))
                [limit] = await tg.wait_for("sendMessage", lambda c: "limit" in str(c.params.get("text")),
                                            timeout=30)
                pages = []
                for worker in (first, second):
                    async with session.get(worker.url + "/metrics") as resp:
                        pages.append(await resp.text())
                return str(limit.params["text"]), "\n".join(pages)

        try:
            limit_line, metrics = asyncio.run(scenario())
        finally:
            cluster.stop_all()
        logs = cluster.logs()
        assert limit_line.startswith("You have reached the limit of 20,000 tokens per day"), logs
        assert len(llm.requests) == 2, logs  # the capped message never reached the model
        tool = [m for m in llm.requests[1].json["messages"] if m.get("role") == "tool"]
        assert "decided-elsewhere" in str(tool[0]["content"]), logs
        # The turn waited on the first worker; the press was decided on the second.
        assert "waits for a decision" in first.log_text() and "shell approved" in second.log_text(), logs
        families = {f.name for f in text_string_to_metric_families(metrics)}
        assert {"talon_approvals", "talon_cap_refusals", "talon_leases_held"} <= families
