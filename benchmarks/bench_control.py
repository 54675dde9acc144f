"""What the call guard adds to a model call: the caps check before it and the usage record after.

Run: ``python benchmarks/bench_control.py [POSTGRES_URL]``. Against the loopback OpenAI fake (the
cheapest model call there is; a real one takes hundreds of times longer), it times the same
calls three ways in one run: no guard, the guard with no caps (the usage record, written beside
the turn), and the guard with a cap in each scope (the previous call's record awaited, then three
sums before every call, over a store already holding 10,000 calls). Embedded SQLite always; PostgreSQL too when a URL is given. It reports each as a
ratio of the unguarded call.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from zoneinfo import ZoneInfo

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from talon.agent.hooks import guarding, model_call  # noqa: E402
from talon.agent.providers.openai import OpenAIProvider  # noqa: E402
from talon.agent.providers.base import ModelRequest  # noqa: E402
from talon.content import Message  # noqa: E402
from talon.control import Control  # noqa: E402
from talon.control.approvals import ApprovalPolicy, Approvals  # noqa: E402
from talon.control.caps import Caps, parse_limits  # noqa: E402
from talon.control.prices import PriceTable  # noqa: E402
from talon.storage.approvals import MemoryApprovalStore  # noqa: E402
from talon.storage.usage import UsageRecord, UsageStore  # noqa: E402
from tests.fakes.openai_server import FakeOpenAI  # noqa: E402

CALLS = 200
PREFILL = 10_000


def control(usage: UsageStore, capped: bool) -> Control:
    limits = parse_limits("100000000 tokens/day", "X") if capped else []
    caps = Caps(usage, limits, limits, limits, ZoneInfo("UTC"))
    return Control(usage, PriceTable({}), caps, Approvals(MemoryApprovalStore(), ApprovalPolicy.parse("off")))


async def timed(provider: OpenAIProvider, ctl: Control | None) -> float:
    request = ModelRequest(system="be brief", messages=[Message.user("hi")])
    samples = []
    for i in range(CALLS):
        start = time.perf_counter()
        if ctl is None:
            await model_call(provider, request)
        else:
            with guarding(ctl.guard("telegram", f"chat{i % 50}", f"person{i % 50}")):
                await model_call(provider, request)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


async def prefill(usage: UsageStore) -> None:
    now = time.time()
    for i in range(PREFILL):
        await usage.record(UsageRecord(now - i, "telegram", f"chat{i % 50}", f"person{i % 50}", "fake-model",
                                       100, 10))


async def measure(name: str, usage: UsageStore, provider: OpenAIProvider) -> None:
    await prefill(usage)
    bare = await timed(provider, None)
    uncapped, limited = control(usage, capped=False), control(usage, capped=True)
    recorded = await timed(provider, uncapped)
    await uncapped.settled()
    capped = await timed(provider, limited)
    await limited.settled()
    print(f"{name}: median call {bare * 1000:.2f} ms unguarded; with the usage record x{recorded / bare:.2f}; "
          f"with caps in three scopes x{capped / bare:.2f} (store of {PREFILL:,} calls)")


async def main() -> None:
    async with FakeOpenAI() as llm:
        provider = OpenAIProvider("fake-model", api_key="k", base_url=llm.base_url, hydrate=lambda b: "")
        with tempfile.TemporaryDirectory() as tmp:
            from talon.storage.embedded.control import SqliteUsageStore, open_control_db

            runner = open_control_db(Path(tmp) / "control.sqlite3")
            try:
                await measure("embedded (SQLite)", SqliteUsageStore(runner), provider)
            finally:
                runner.close()
        if len(sys.argv) > 1:
            from talon.storage.postgres.control import PgUsageStore
            from talon.storage.postgres.db import AsyncDatabase
            from talon.storage.postgres.schema import migrate_schema

            db = AsyncDatabase(sys.argv[1], max_size=4)
            await db.open()
            try:
                await migrate_schema(db)
                await measure("PostgreSQL", PgUsageStore(db), provider)
            finally:
                await db.close()
        await provider.aclose()


if __name__ == "__main__":
    asyncio.run(main())
