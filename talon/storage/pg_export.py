"""PostgreSQL into the archive's embedded layout (``talon backup`` with ``TALON_DATABASE_URL``).

One REPEATABLE READ, read-only transaction: every table is read from the same snapshot, with
``COPY (SELECT ...) TO STDOUT (FORMAT BINARY)``, row by row. The SQLite stores are built in a
scratch file with the embedded stores' own schemas, the session lines become one JSONL file per
thread (numbered as in the database), the attachments one file each, chunk by chunk; each goes
into the archive and is deleted before the next, so memory and scratch space stay small.

What is archived is declared here, table by table (``TABLES``, ``FILE_TABLES``), and so is what is
not (``NOT_ARCHIVED``, ``SKIPPED_COLUMNS``): ``tests/test_backup_coverage.py`` lists every table the
schema creates and fails for one that is in neither, so a new store cannot be left out unnoticed.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

from talon.storage.attachments import check_sha
from talon.storage.sessions import ChatKey, safe_path_part

if TYPE_CHECKING:
    import psycopg

    from talon.storage.backup import _Writer

# Embedded file -> (PostgreSQL table, SQLite table, order): these become the embedded store files.
TABLES: dict[str, list[tuple[str, str, str]]] = {
    "inbox.sqlite3": [("talon_inbox", "inbox", "seq")],
    "access.sqlite3": [("talon_pairing_pending", "pending", "id"), ("talon_pairing_replied", "replied", "channel"),
                       ("talon_approved", "approved", "channel")],
    "tasks.sqlite3": [("talon_tasks", "tasks", "id"), ("talon_task_runs", "task_runs", "task_id"),
                      ("talon_chat_zones", "chat_zones", "channel")],
    "control.sqlite3": [("talon_usage", "usage", "id"), ("talon_usage_grants", "usage_grants", "id"),
                        ("talon_approvals", "approvals", "id"), ("talon_approval_always", "approval_always", "channel"),
                        ("talon_panel_audit", "panel_audit", "id"), ("talon_panel_chats", "panel_chats", "channel"),
                        ("talon_panel_days", "panel_days", "day"), ("talon_panel_sent", "panel_sent", "at")],
    "whatsapp.sqlite3": [("talon_wa_windows", "wa_windows", "chat_id"), ("talon_wa_pending", "wa_pending", "id"),
                         ("talon_wa_sent", "wa_sent", "sid"), ("talon_wa_tokens", "wa_tokens", "token")],
    "jobs.sqlite3": [("talon_jobs", "jobs", "id")],
}
# Tables archived as files: the conversations (one JSONL file per thread, CURRENT, CHAT) and the
# attachments (one file each, by sha256).
FILE_TABLES = ("talon_threads", "talon_session_lines", "talon_attachments", "talon_attachment_chunks")
# Tables NOT archived, and why: each means something only to the running deployment it is in.
NOT_ARCHIVED = {
    # The schema version (the manifest carries it; the target database has its own) and the
    # deployment's id, which marks the shared directories of THIS database's workers.
    "talon_meta": "schema version and deployment id",
    # Which worker holds which chat right now: a lease lapses within seconds of its worker's end.
    "talon_leases": "live per-worker leases",
    # Links Twilio fetches media by, valid for minutes: expired long before any restore.
    "talon_media_links": "short-lived media links",
    # The web panel's sign-ins: browser sessions, one-time sign-in links, failed sign-ins (rate
    # limiting). A restored Talon asks to sign in again; a session ended since the backup cannot
    # come back with it.
    "talon_panel_sessions": "live panel sign-in sessions",
    "talon_panel_links": "one-time panel sign-in links",
    "talon_panel_failures": "failed panel sign-ins (rate limiting)",
    # Usage summed per day: derived, rebuilt by the trigger on talon_usage as its rows are restored.
    "talon_panel_usage_daily": "derived from talon_usage (rebuilt on restore)",
}
# Of those, the tables derived from archived ones while a restore fills them (emptied with them
# when a restore fails, so a second try does not count twice).
DERIVED_TABLES = ("talon_panel_usage_daily",)
# The same tables in the embedded store files: a backup of PostgreSQL does not make them and a
# restore into PostgreSQL does not copy them (the embedded snapshot clears the sign-ins, see
# talon.storage.backup; the embedded rollup is rebuilt by its trigger as the usage rows are written).
NOT_CARRIED = {"control.sqlite3": frozenset({"panel_sessions", "panel_links", "panel_failures", "panel_usage_daily"})}
# Columns of archived tables that are not in the archive: a worker's claim on delivering a chat's
# waiting WhatsApp messages (it lapses; the restored deployment's workers claim anew; ``talon
# migrate`` and the embedded snapshot leave it out too), and the database's own number for a
# pairing code (the embedded store keeps their order as rows written in that order).
SKIPPED_COLUMNS = {"talon_wa_windows": frozenset({"holder", "until"}), "talon_pairing_pending": frozenset({"id"})}
# Every table a backup of PostgreSQL reads, and a restore into PostgreSQL fills.
ARCHIVED_TABLES = tuple(pg for tables in TABLES.values() for pg, _, _ in tables) + FILE_TABLES


def _make_embedded(name: str, path: Path) -> None:
    """An empty SQLite store with the embedded store's own schema."""
    if name == "inbox.sqlite3":
        from talon.storage.embedded.inbox import SqliteInbox

        SqliteInbox(path).db.close()
    elif name == "access.sqlite3":
        from talon.storage.embedded.access import SqlitePairing

        SqlitePairing(path).db.close()
    elif name == "tasks.sqlite3":
        from talon.storage.embedded.tasks import SqliteTaskStore

        SqliteTaskStore(path)._db.close()
    elif name == "jobs.sqlite3":
        from talon.storage.embedded.jobs import SqliteJobs

        SqliteJobs(path)._db.close()
    elif name == "control.sqlite3":
        from talon.storage.embedded.control import open_control_db
        from talon.storage.embedded.panel import setup_panel

        runner = open_control_db(path)
        try:
            runner.run_blocking(setup_panel)  # the panel's tables, and the usage rollup's trigger
        finally:
            runner.close()
    elif name == "whatsapp.sqlite3":
        from talon.storage.embedded.whatsapp import setup_schema

        conn = sqlite3.connect(str(path))
        try:
            setup_schema(conn)
        finally:
            conn.close()
    else:
        raise ValueError(f"no embedded store is named {name}")


def _pg_columns(conn: "psycopg.Connection[Any]", table: str) -> dict[str, str]:
    rows = conn.execute("SELECT column_name, udt_name FROM information_schema.columns "
                        "WHERE table_schema = current_schema() AND table_name = %s", (table,)).fetchall()
    return {str(name): str(udt) for name, udt in rows}


def _copy_rows(conn: "psycopg.Connection[Any]", select: str, types: list[str]) -> Any:
    with conn.cursor().copy(f"COPY ({select}) TO STDOUT (FORMAT BINARY)") as copy:
        copy.set_types(types)
        yield from copy.rows()


def _scratch_add(writer: "_Writer", name: str, path: Path) -> None:
    writer.add_file(name, path)
    path.unlink()


def export_postgres(url: str, writer: "_Writer", scratch: Path) -> None:
    import psycopg

    with psycopg.connect(url, connect_timeout=10) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        with conn.transaction():
            for file, tables in TABLES.items():
                path = scratch / file
                _make_embedded(file, path)
                lite = sqlite3.connect(str(path), isolation_level=None)
                try:
                    lite.execute("BEGIN")
                    for pg_table, lite_table, order in tables:
                        have = _pg_columns(conn, pg_table)
                        wanted = [str(r[1]) for r in lite.execute(f"PRAGMA table_info({lite_table})")]
                        skipped = SKIPPED_COLUMNS.get(pg_table, frozenset())
                        columns = [c for c in wanted if c in have and c not in skipped]
                        insert = (f"INSERT INTO {lite_table} ({', '.join(columns)}) "
                                  f"VALUES ({', '.join('?' * len(columns))})")
                        rows = _copy_rows(conn, f"SELECT {', '.join(columns)} FROM {pg_table} ORDER BY {order}",
                                          [have[c] for c in columns])
                        batch: list[tuple[Any, ...]] = []
                        for row in rows:
                            batch.append(tuple(row))
                            if len(batch) >= 1000:
                                lite.executemany(insert, batch)
                                batch = []
                        if batch:
                            lite.executemany(insert, batch)
                    lite.execute("COMMIT")
                finally:
                    lite.close()
                _scratch_add(writer, f"data/{file}", path)
            _sessions(conn, writer, scratch)
            _attachments(conn, writer, scratch)


def _sessions(conn: "psycopg.Connection[Any]", writer: "_Writer", scratch: Path) -> None:
    chats: set[ChatKey] = set()
    for channel, chat_id, current in _copy_rows(conn, "SELECT channel, chat_id, current FROM talon_threads",
                                                ["text", "text", "text"]):
        chat = ChatKey(str(channel), str(chat_id))
        chats.add(chat)
        _small(writer, scratch, f"data/{_chat_dir(chat)}/CURRENT", str(current))
    open_key: tuple[ChatKey, str] | None = None
    out: Any = None
    path = scratch / "thread.jsonl"

    def close() -> None:
        if open_key is not None and out is not None:
            out.close()
            chat, thread = open_key
            _scratch_add(writer, f"data/{_chat_dir(chat)}/{safe_path_part(thread)}.jsonl", path)
            chats.add(chat)

    for channel, chat_id, thread, body in _copy_rows(
            conn, "SELECT channel, chat_id, thread, body FROM talon_session_lines ORDER BY channel, chat_id, thread, n",
            ["text", "text", "text", "text"]):
        key = (ChatKey(str(channel), str(chat_id)), str(thread))
        if key != open_key:
            close()
            open_key = key
            out = open(path, "w", encoding="utf-8")
        out.write(str(body) + "\n")
    close()
    for chat in sorted(chats, key=str):  # each chat's real ids (its directory name is made safe)
        _small(writer, scratch, f"data/{_chat_dir(chat)}/CHAT", str(chat))


def _attachments(conn: "psycopg.Connection[Any]", writer: "_Writer", scratch: Path) -> None:
    path = scratch / "blob"
    shas = [str(r[0]) for r in conn.execute("SELECT sha256 FROM talon_attachments ORDER BY sha256").fetchall()]
    for sha in shas:
        check_sha(sha)
        with open(path, "wb") as out:
            for (data,) in _copy_rows(conn, "SELECT data FROM talon_attachment_chunks WHERE sha256 = "
                                      f"'{sha}' ORDER BY n", ["bytea"]):
                out.write(data)
        _scratch_add(writer, f"data/attachments/{sha[:2]}/{sha}", path)


def _small(writer: "_Writer", scratch: Path, name: str, text: str) -> None:
    path = scratch / "small"
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    _scratch_add(writer, name, path)


def _chat_dir(chat: ChatKey) -> str:
    return f"sessions/{safe_path_part(chat.channel)}/{safe_path_part(chat.chat_id)}"

