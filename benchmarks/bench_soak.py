"""Flat for weeks: Talon's memory over a long run of messages from many chats.

Run: ``python benchmarks/bench_soak.py`` (50,000 messages over 5,000 chats; on two busy cores that
takes long, so ``--messages 10000 --chats 1000`` gives the same shape in minutes). ``talon run``
is started as a process of its own with its defaults (Telegram, embedded stores, drafts in
private chats, the reaction and typing), against the fake Bot API and the scripted OpenAI fake
(which answers at once); each message comes from a chat of its own in turn (message n from chat
n mod chats, so every chat speaks every ``chats`` messages), in batches of ``--batch`` sent at once
and all answered before the next. Talon's RSS (its whole process tree) and each bounded
structure's size are read from its own ``/metrics`` after the first ``chats`` messages (every chat
has spoken once) and at the end. Growth is the end's RSS over the first one's, minus one; the
issue's bound is 10%.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conftest import TOKEN, settings_env  # noqa: E402
from tests.fakes.openai_server import FakeOpenAI  # noqa: E402
from tests.fakes.telegram import Call, FakeTelegram  # noqa: E402
from tests.processes import tree_rss  # noqa: E402

FIRST_USER = 10_000_000  # chat n is user FIRST_USER + n (private chats)


async def scrape(url: str) -> tuple[float, dict[str, float]]:
    """The process's RSS and each cache's size, from Talon's /metrics."""
    async with httpx.AsyncClient() as client:
        text = (await client.get(url)).text
    rss = 0.0
    caches: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "process_resident_memory_bytes":
                rss = sample.value
            elif sample.name == "talon_cache_entries":
                caches[sample.labels["cache"]] = sample.value
    return rss, caches


async def soak(messages: int, chats: int, batch: int) -> None:
    async with FakeTelegram(token=TOKEN) as tg, FakeOpenAI() as llm:
        with tempfile.TemporaryDirectory() as tmp:
            port = _free_port()
            users = ",".join(str(FIRST_USER + n) for n in range(chats))
            env = {**os.environ, **settings_env(Path(tmp), tg.base_url, llm.base_url,
                                                TALON_TELEGRAM_ALLOWED_USERS=users,
                                                TALON_MODEL_DISCOVERY="false",
                                                TALON_HTTP_HOST="127.0.0.1", TALON_HTTP_PORT=str(port),
                                                TALON_LOG_LEVEL="WARNING")}
            log = open(Path(tmp) / "talon.log", "wb")
            proc = subprocess.Popen([sys.executable, "-m", "talon.cli", "run"], cwd=tmp, env=env,
                                    stdout=log, stderr=subprocess.STDOUT)
            url = f"http://127.0.0.1:{port}/metrics"
            try:
                await _ready(url, proc)
                first: tuple[float, int, dict[str, float]] | None = None
                start = time.monotonic()
                sent = 0
                while sent < messages:
                    count = min(batch, messages - sent)
                    for n in range(sent, sent + count):
                        user = FIRST_USER + n % chats
                        tg.push_update(tg.text_message(user, f"message {n}", user_id=user))
                    await tg.wait_for("sendMessage", _answer, count=count, timeout=count * 2 + 120)
                    with tg._cond:
                        tg.calls.clear()  # the fake's own record, so waiting stays linear
                        tg.messages.clear()
                    sent += count
                    if first is None and sent >= chats:
                        rss, caches = await scrape(url)
                        first = (rss, tree_rss(psutil.Process(proc.pid)), caches)
                        print(f"after {sent:,} messages ({time.monotonic() - start:.0f} s): RSS "
                              f"{rss / 1e6:.1f} MB (process tree {first[1] / 1e6:.1f} MB)", flush=True)
                    elif sent % (10 * batch) == 0:
                        rss, _ = await scrape(url)
                        print(f"  {sent:,} messages: RSS {rss / 1e6:.1f} MB", flush=True)
                rss, caches = await scrape(url)
                tree = tree_rss(psutil.Process(proc.pid))
                elapsed = time.monotonic() - start
            finally:
                proc.terminate()
                proc.wait(30)
                log.close()
    assert first is not None
    print(f"after {messages:,} messages ({elapsed:.0f} s, {messages / elapsed:.0f} messages/s): RSS "
          f"{rss / 1e6:.1f} MB (process tree {tree / 1e6:.1f} MB)")
    print(f"growth from message {chats:,} to the end: {(rss / first[0] - 1) * 100:+.1f}% "
          f"(process tree {(tree / first[1] - 1) * 100:+.1f}%); bound +10%")
    print(f"\n{'cache':28} {'first':>8} {'end':>8}")
    for name in sorted(set(caches) | set(first[2])):
        print(f"{name:28} {first[2].get(name, 0):>8.0f} {caches.get(name, 0):>8.0f}")


def _answer(call: Call) -> bool:
    return "echo:" in str(call.params.get("text", ""))


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    """Until Talon's /metrics answers (it is started), or the process has ended."""
    async with httpx.AsyncClient() as client:
        for _ in range(600):
            if proc.poll() is not None:
                raise RuntimeError(f"talon run exited with {proc.returncode}")
            try:
                if (await client.get(url)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError("talon run did not start within 60 s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=50_000, help="messages in all (default 50,000)")
    parser.add_argument("--chats", type=int, default=5_000, help="chats they come from (default 5,000)")
    parser.add_argument("--batch", type=int, default=100, help="messages sent at once (default 100)")
    args = parser.parse_args()
    asyncio.run(soak(args.messages, args.chats, args.batch))
