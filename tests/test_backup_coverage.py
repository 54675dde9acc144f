"""A backup holds everything Talon keeps, and cannot silently stop doing so: every table the
PostgreSQL schema creates (read from the catalog after the migrations) and every SQLite file and
table the embedded stores create (read from a data dir they ran in) is either archived or named in
an explicit, commented exclusion list (``talon.storage.pg_export.NOT_ARCHIVED``,
``talon.storage.backup.EMBEDDED_NOT_ARCHIVED``). A new store, table or column without backup
coverage fails here, naming it."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

from talon.config import Settings
from talon.content import Message
from talon.storage import pg_export
from talon.storage.backup import EMBEDDED_DERIVED, EMBEDDED_NOT_ARCHIVED, _filled_tables, backup
from tests.support.archives import listing
from talon.storage.factory import open_stores
from talon.storage.migrate import EMBEDDED_FILES
from talon.storage.postgres.db import AsyncDatabase
from talon.storage.postgres.schema import migrate_schema
from talon.storage.sessions import ChatKey
from talon.storage.whatsapp import ButtonToken

HOW = ("archive it (talon.storage.pg_export.TABLES or FILE_TABLES, and talon.storage.migrate) or name it, "
       "with the reason, in an exclusion list (pg_export.NOT_ARCHIVED, backup.EMBEDDED_NOT_ARCHIVED)")


def _lite_tables(path: Path) -> dict[str, set[str]]:
    """The tables of a SQLite file and their columns (SQLite's own and FTS5's shadow tables aside)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        names = [str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                                 "AND name NOT LIKE 'sqlite_%'")]
        return {n: {str(c[1]) for c in conn.execute(f"PRAGMA table_info('{n}')")} for n in names}
    finally:
        conn.close()


async def _pg_catalog(url: str) -> dict[str, set[str]]:
    db = AsyncDatabase(url, max_size=1)
    await db.open()
    try:
        await migrate_schema(db)
        tables = [str(r[0]) for r in await db.fetchall(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")]
        out = {}
        for table in tables:
            out[table] = {str(r[0]) for r in await db.fetchall(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
                "AND table_name = %s", (table,))}
        return out
    finally:
        await db.close()


async def test_every_postgres_table_is_archived_or_named_as_left_out(pg_url: str) -> None:
    catalog = await _pg_catalog(pg_url)
    archived = set(pg_export.ARCHIVED_TABLES)
    assert len(archived) == len(pg_export.ARCHIVED_TABLES), "a table is archived twice"
    assert not archived & set(pg_export.NOT_ARCHIVED), "a table is both archived and left out"
    uncovered = sorted(set(catalog) - archived - set(pg_export.NOT_ARCHIVED))
    assert not uncovered, f"the schema creates {uncovered}, which no backup holds: {HOW}"
    stale = sorted((archived | set(pg_export.NOT_ARCHIVED)) - set(catalog))
    assert not stale, f"{stale} are declared but the schema has no such table"
    # A restore into PostgreSQL checks and fills exactly the archived tables; what they derive is
    # among the tables left out.
    assert set(_filled_tables()) == archived
    assert set(pg_export.DERIVED_TABLES) <= set(pg_export.NOT_ARCHIVED)
    # Every column of a table archived as an embedded store is carried, or left out on purpose.
    with_files = {pg: (file, lite) for file, tables in pg_export.TABLES.items() for pg, lite, _ in tables}
    dropped = {}
    for pg, (file, lite) in sorted(with_files.items()):
        lost = catalog[pg] - _embedded_columns(file, lite) - pg_export.SKIPPED_COLUMNS.get(pg, frozenset())
        if lost:
            dropped[f"{pg} -> {file}:{lite}"] = sorted(lost)
    assert not dropped, f"columns no backup holds: {dropped}: {HOW}"


_EMBEDDED_COLUMNS: dict[str, dict[str, set[str]]] = {}


def _embedded_columns(file: str, table: str) -> set[str]:
    """The columns of ``table`` in a store file made with the embedded store's own schema."""
    if file not in _EMBEDDED_COLUMNS:
        import tempfile

        with tempfile.TemporaryDirectory() as scratch:
            path = Path(scratch) / file
            pg_export._make_embedded(file, path)
            _EMBEDDED_COLUMNS[file] = _lite_tables(path)
    return _EMBEDDED_COLUMNS[file].get(table, set())


async def test_every_embedded_store_file_and_table_is_archived_or_named_as_left_out(tmp_path: Path) -> None:
    settings = Settings(_env_file=None, TALON_DATA_DIR=str(tmp_path / "data"),  # type: ignore[call-arg]
                        TALON_MEDIA_ROOT=str(tmp_path / "media_root"), TWILIO_ACCOUNT_SID="AC" + "0" * 32,
                        TWILIO_AUTH_TOKEN="t" * 32, TWILIO_WHATSAPP_FROM="whatsapp:+14155550100")
    # Every embedded store, each used once, so each has made its files.
    stores = open_stores(settings, check_dirs=False)
    await stores.start()
    try:
        chat = ChatKey("whatsapp", "+14155550123")
        await stores.sessions.append(chat, Message.user("the boiler", sender="+14155550123"))
        assert await stores.sessions.search(chat, "boiler")
        await stores.attachments.put_bytes(b"%PDF-1.4 tiny", mime="application/pdf", name="a.pdf")
        assert stores.whatsapp is not None
        await stores.whatsapp.add_pending(chat.chat_id, ['{"text": "waiting"}'], time.time())
        await stores.whatsapp.add_tokens([ButtonToken("t1", "approve", "a1", "d", chat.chat_id, time.time() + 60)])
        await stores.tasks.for_chat("whatsapp", chat.chat_id, None)
        await stores.gate.approvals()
    finally:
        await stores.aclose()

    files = sorted(p for p in settings.data_dir.rglob("*.sqlite3"))
    names = {p.name for p in files}
    assert {"inbox.sqlite3", "access.sqlite3", "tasks.sqlite3", "control.sqlite3", "whatsapp.sqlite3",
            "search.sqlite3"} <= names, names  # the stores ran: the listing below is of something
    for path in files:
        rel = path.relative_to(settings.data_dir).as_posix()
        if path.name in EMBEDDED_NOT_ARCHIVED or path.name in EMBEDDED_DERIVED:
            continue
        assert "/" not in rel, f"{rel}: a store file below the data dir's top, which nothing copies to PostgreSQL"
        assert path.name in pg_export.TABLES, f"{rel} is not made from PostgreSQL by a backup: {HOW}"
        assert path.name in EMBEDDED_FILES, f"{rel} is not copied into PostgreSQL by a restore or migrate: {HOW}"
        have = set(_lite_tables(path))
        declared = {lite for _, lite, _ in pg_export.TABLES[path.name]} | pg_export.NOT_CARRIED.get(path.name, set())
        assert have == declared, f"{rel} holds tables {sorted(have - declared)} no backup of PostgreSQL holds: {HOW}"
    assert set(EMBEDDED_FILES) == set(pg_export.TABLES), "restore/migrate and the PostgreSQL backup disagree"
    # And the embedded archive holds every file of the data dir but the ones named as left out.
    archive = tmp_path / "a.tar.gz"
    await asyncio.to_thread(backup, archive, settings.data_dir, settings.media_root)
    listed = listing(archive)
    for path in sorted(settings.data_dir.rglob("*")):
        rel = path.relative_to(settings.data_dir).as_posix()
        if not path.is_file() or rel.endswith(("-wal", "-shm", "-journal")):
            continue
        if path.name.startswith(tuple(EMBEDDED_NOT_ARCHIVED)):
            assert f"data/{rel}" not in listed
        else:
            assert f"data/{rel}" in listed, f"{rel} is not in the archive"


async def test_a_store_file_a_database_restore_cannot_copy_is_refused_not_deleted(tmp_path: Path,
                                                                                  pg_url: str) -> None:
    """A restore into PostgreSQL removes the embedded store files it copied; a store file it does
    not know (from a newer Talon, or planted) is refused by name, and nothing is left behind."""
    from talon.errors import BackupError
    from talon.storage.backup import restore

    data = tmp_path / "src" / "data"
    data.mkdir(parents=True)
    conn = sqlite3.connect(str(data / "future.sqlite3"))
    conn.execute("CREATE TABLE kept (x TEXT)")
    conn.execute("INSERT INTO kept VALUES ('something Talon keeps')")
    conn.commit()
    conn.close()
    archive = tmp_path / "a.tar.gz"
    await asyncio.to_thread(backup, archive, data, tmp_path / "src" / "media_root")
    assert "data/future.sqlite3" in listing(archive)
    target = tmp_path / "pg" / "data"
    with pytest.raises(BackupError, match=r"future\.sqlite3, a store this Talon cannot copy into a database"):
        await asyncio.to_thread(restore, archive, target, database_url=pg_url)
    assert not target.exists()
    # Without a database it restores as it is.
    await asyncio.to_thread(restore, archive, tmp_path / "embedded" / "data")
    back = sqlite3.connect(str(tmp_path / "embedded" / "data" / "future.sqlite3"))
    assert back.execute("SELECT x FROM kept").fetchall() == [("something Talon keeps",)]
    back.close()


async def test_a_failed_restore_into_postgres_empties_what_it_filled_and_what_that_derived(
        tmp_path: Path, pg_url: str) -> None:
    """The copy fails its checks (an attachment whose bytes do not match its name) after the usage
    rows are in: every archived table is emptied again, and so is the usage rollup the database's
    trigger built from them, so a second try does not count the usage twice."""
    import psycopg

    from talon.errors import BackupError
    from talon.storage.backup import restore
    from talon.storage.embedded.control import open_control_db

    data = tmp_path / "src" / "data"
    data.mkdir(parents=True)
    runner = open_control_db(data / "control.sqlite3")
    runner.run_blocking(lambda c: c.execute(
        "INSERT INTO usage (at, channel, chat_id, person, model, purpose, input_tokens, output_tokens, "
        "cached_tokens, cost, estimated, extra_share) VALUES (1e9, 'telegram', '1', '1', 'm', 'answer', 10, 5, 0, "
        "0.01, 0, 0)"))
    runner.close()
    bad = data / "attachments" / "aa" / ("aa" + "0" * 62)
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not the bytes this name promises")
    archive = tmp_path / "a.tar.gz"
    await asyncio.to_thread(backup, archive, data, tmp_path / "src" / "media_root")
    with pytest.raises(BackupError, match="failed its checks"):
        await asyncio.to_thread(restore, archive, tmp_path / "pg" / "data", database_url=pg_url)
    with psycopg.connect(pg_url) as conn:
        for table in (*pg_export.ARCHIVED_TABLES, *pg_export.DERIVED_TABLES):
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,), table
