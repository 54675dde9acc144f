"""``talon ui password`` (an argon2 hash for TALON_UI_PASSWORD_HASH) and ``talon ui link`` (a
one-time sign-in link, good for 10 minutes, stored as its sha256 in the panel's store)."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from talon.config import Settings
from talon.errors import ConfigError
from talon.storage.panel import PanelStore
from talon.ui import security as sec

MIN_PASSWORD = 12


@asynccontextmanager
async def open_panel_store(settings: Settings) -> AsyncIterator[PanelStore]:
    """The panel's store alone, embedded or PostgreSQL, as ``talon run`` opens it."""
    if not settings.database_url:
        from talon.storage.embedded.control import open_control_db
        from talon.storage.embedded.panel import SqlitePanelStore

        settings.ensure_dirs()
        runner = open_control_db(settings.data_dir / "control.sqlite3")
        try:
            yield SqlitePanelStore(runner)
        finally:
            await runner.aclose()
        return
    from talon.storage.postgres.db import AsyncDatabase
    from talon.storage.postgres.panel import PgPanelStore
    from talon.storage.postgres.schema import migrate_schema

    db = AsyncDatabase(settings.database_url, max_size=2)
    await db.open()
    try:
        await migrate_schema(db)
        yield PgPanelStore(db)
    finally:
        await db.close()


def read_password() -> str:
    if sys.stdin.isatty():
        first = getpass.getpass("New panel password: ")
        if getpass.getpass("Again: ") != first:
            raise ConfigError("the two passwords differ; nothing was made", [])
        return first
    return sys.stdin.readline().rstrip("\r\n")


def cmd_password(args: argparse.Namespace) -> int:
    password = read_password()
    if len(password) < MIN_PASSWORD:
        print(f"talon: the password must be at least {MIN_PASSWORD} characters", file=sys.stderr)
        return 2
    print(sec.hash_password(password))
    print("Set TALON_UI_PASSWORD_HASH to the line above (in .env, quoted with single quotes: "
          "the hash holds $ signs) and restart Talon.", file=sys.stderr)
    return 0


async def make_link(settings: Settings) -> str:
    token = sec.new_token()
    async with open_panel_store(settings) as store:
        await store.add_link(sec.token_hash(token), time.time() + sec.LINK_TTL_S)
    return sec.panel_link(settings, token)


def cmd_link(args: argparse.Namespace, settings: Settings) -> int:
    try:
        link = asyncio.run(make_link(settings))
    except ConfigError as exc:
        print(f"talon: {exc}", file=sys.stderr)
        return 2
    print(link)
    print(f"Open it within {int(sec.LINK_TTL_S // 60)} minutes; it signs in once.", file=sys.stderr)
    return 0
