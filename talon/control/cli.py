"""``talon usage``: the bot's model use, and ``--grant CHANNEL:ID AMOUNT`` to lift a person's cap.

A grant adds to that person's limits for the periods it falls in: ``--grant telegram:123 50000``
gives 50,000 more tokens today (and this month, for a monthly token limit); ``$5`` five more
dollars. It is written to the same store the workers read before every model call, so it holds at
once, on every worker.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from talon.config import Settings, normalize_whatsapp_number
from talon.control.caps import parse_grant, period_bounds
from talon.errors import ConfigError
from talon.storage.usage import UsageStore


@asynccontextmanager
async def open_usage(settings: Settings) -> AsyncIterator[UsageStore]:
    """The usage store alone, embedded or PostgreSQL, as ``talon run`` would open it."""
    if not settings.database_url:
        from talon.storage.embedded.control import SqliteUsageStore, open_control_db

        settings.ensure_dirs()
        runner = open_control_db(settings.data_dir / "control.sqlite3")
        try:
            yield SqliteUsageStore(runner)
        finally:
            await runner.aclose()
        return
    from talon.storage.postgres.control import PgUsageStore
    from talon.storage.postgres.db import AsyncDatabase
    from talon.storage.postgres.schema import migrate_schema

    db = AsyncDatabase(settings.database_url, max_size=2)
    await db.open()
    try:
        await migrate_schema(db)
        yield PgUsageStore(db)
    finally:
        await db.close()


def parse_person(value: str) -> tuple[str, str]:
    channel, _, person = value.partition(":")
    channel = channel.strip().lower()
    person = normalize_whatsapp_number(person) if channel == "whatsapp" else person.strip()
    if channel not in ("telegram", "whatsapp", "console") or not person:
        raise ConfigError(f"--grant takes CHANNEL:ID, e.g. telegram:123456789 or whatsapp:+14155550123 "
                          f"(got {value!r})", [])
    return channel, person


async def run_usage(settings: Settings, args: argparse.Namespace) -> int:
    zone = settings.zone
    async with open_usage(settings) as usage:
        if args.grant:
            channel, person = parse_person(args.grant[0])
            amount, unit = parse_grant(args.grant[1])
            await usage.grant(channel, person, amount, unit, time.time())
            shown = f"${amount:,.2f}" if unit == "usd" else f"{int(amount):,} tokens"
            print(f"granted {shown} to {channel}:{person} on top of TALON_LIMIT_PER_PERSON, for today and this "
                  "month (it holds at once, on every worker)")
            return 0
        now = time.time()
        day, _ = period_bounds("day", now, zone)
        month, _ = period_bounds("month", now, zone)
        print(f"model use of the whole bot (days begin at 00:00 {zone.key}):")
        for label, since in (("today", day), ("this month", month), ("all time", 0.0)):
            t = await usage.totals(since)
            cost = "no price known" if t.unpriced_calls == t.calls else f"about ${t.cost:,.4f}"
            estimated = f", ~{t.estimated_tokens:,} estimated" if t.estimated_tokens else ""
            print(f"  {label}: {t.tokens:,} tokens ({t.input_tokens:,} in, {t.output_tokens:,} out, "
                  f"{t.cached_tokens:,} cached{estimated}) in {t.calls:,} calls; {cost}")
    return 0


def cmd_usage(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio

    try:
        return asyncio.run(run_usage(settings, args))
    except ConfigError as exc:
        print(f"talon: {exc}", file=sys.stderr)
        return 2
