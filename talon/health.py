"""``GET /healthz`` on Talon's HTTP server: 200 when this worker can do its job, else 503.

A load balancer or an orchestrator asks it. Unhealthy means: the shared database does not answer
(with ``TALON_DATABASE_URL``), or a configured channel is not up, by its own account
(``Channel.health``): still starting or waiting for its platform (Telegram before getMe and
setWebhook or the first poll succeed), polling that keeps failing or has gone silent, a webhook
another process took over, a channel stopped. The body lists each check, one per line, so a
person reading it sees which failed and why.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from talon.runtime import Runtime

HEALTH_PATH = "/healthz"


async def health_checks(runtime: Runtime) -> list[tuple[str, bool, str]]:
    checks: list[tuple[str, bool, str]] = []
    stores = runtime.stores
    if stores is not None and stores.adb is not None:
        # The monitor's latest word, not a query of our own: /healthz answers at once, also
        # while the database hangs.
        problem = stores.adb.problem
        checks.append(("database", problem is None,
                       f"unavailable for {time.monotonic() - stores.adb.down_since:.0f}s: {problem}"
                       if problem else "reachable"))
    for channel in runtime.channels:
        health = channel.health()
        checks.append((f"channel {channel.name}", health.ok, health.detail))
    if stores is not None:
        checks.append(("worker", True, stores.worker_id))
    return checks


def add_health_route(runtime: Runtime) -> None:
    http = runtime.http
    if http is None or http.running or http.has_route("GET", HEALTH_PATH):
        return

    async def handle(request: web.Request) -> web.Response:
        checks = await health_checks(runtime)
        ok = all(good for _, good, _ in checks)
        body = "".join(f"{'ok  ' if good else 'FAIL'} {name}: {detail}\n" for name, good, detail in checks)
        return web.Response(status=200 if ok else 503, text=body)

    http.add_route("GET", HEALTH_PATH, handle)


async def database_rows(url: str) -> list[tuple[str, str]]:
    """``talon doctor``'s lines about the shared database: reachable, schema version, leases."""
    from talon.errors import ConfigError
    from talon.storage.postgres.db import AsyncDatabase, redact
    from talon.storage.postgres.leases import PgLeases
    from talon.storage.postgres.schema import SCHEMA_VERSION, schema_version

    rows = [("database", redact(url))]
    db = AsyncDatabase(url, max_size=1, timeout_s=5.0)
    try:
        await db.open()
    except ConfigError as exc:
        return rows + [("database status", f"UNREACHABLE: {exc}")]
    try:
        version = await schema_version(db)
        if version == SCHEMA_VERSION:
            rows.append(("database schema", f"ok: version {version}"))
        elif version < SCHEMA_VERSION:
            rows.append(("database schema", f"version {version} of {SCHEMA_VERSION}: the next `talon run` "
                                            "upgrades it"))
        else:
            rows.append(("database schema", f"NEWER ({version}) than this Talon knows ({SCHEMA_VERSION}): "
                                            "upgrade Talon"))
        if version >= 2:
            leases = PgLeases(db, "doctor", 0)
            summary = await leases.summary()
            poll = await leases.holder_of("telegram:poll")
            rows.append(("leases", f"{summary.live} live, held by {summary.holders} worker(s); {summary.expired} "
                                   "expired and not yet taken over"
                                   + (" (a worker died or is stuck)" if summary.expired else "")))
            rows.append(("telegram poller", poll or "none (webhook mode, or no worker is polling)"))
            pending = await db.fetchone("SELECT count(*), min(created) FROM talon_inbox WHERE status = 'pending'")
            if pending and pending[0]:
                rows.append(("inbox", f"{pending[0]} message(s) pending, oldest {time.time() - pending[1]:.0f}s old"))
            else:
                rows.append(("inbox", "nothing pending"))
    finally:
        await db.close()
    return rows
