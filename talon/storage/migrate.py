"""``talon migrate --to URL``: copy an embedded deployment into PostgreSQL, then check the copy.

What is copied from ``TALON_DATA_DIR``: the inbox (every row, done or pending, so dedup and
pending work carry over), the sessions (every thread of every chat, checkpoints included, and
which thread is current), access (approvals, live pairing codes, the code-reply log), scheduled
tasks (with their runs and each chat's time zone), control (model usage, grants, tool-call
approvals), WhatsApp's state (each chat's window, the messages waiting for it in order, the sent
messages' receipts and live approval-button tokens), the web panel's audit log and chat index, and
the attachments (streamed in chunks). Everything is keyed, so running it again copies only what is
missing: the inbox by message key, session lines by (chat, thread, line number), attachments by
sha256. Afterwards every item is checked on the database side: the inbox keys, a sha256 over each
thread's lines, the access rows, and each attachment's bytes hashed again as read back.

The context files (summary archives, evicted tool outputs) stay files in
``TALON_DATA_DIR/sessions/*/*/context/``: with many workers that directory is on shared storage.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from talon.content import Message
from talon.storage.embedded.attachments import FileBlobs
from talon.storage.postgres.attachments import PgAttachments
from talon.storage.postgres.db import AsyncDatabase
from talon.storage.embedded.search import chat_of
from talon.storage.postgres.schema import migrate_schema
from talon.storage.postgres.sessions import index_unindexed
from talon.storage.tasks import TASK_COLUMNS
from talon.storage.whatsapp import SENT_COLUMNS

log = logging.getLogger(__name__)

_HEX = set("0123456789abcdef")


@dataclass
class StoreReport:
    name: str
    found: int = 0
    copied: int = 0
    verified: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and self.verified == self.found


@dataclass
class MigrationReport:
    stores: list[StoreReport]

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.stores)


def _read_sqlite(path: Path, *queries: str) -> list[list[tuple[Any, ...]]] | None:
    """Rows of each query from the SQLite file at ``path`` (read-only); None when it is absent."""
    if not path.is_file():
        return None
    src = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [src.execute(q).fetchall() for q in queries]
    finally:
        src.close()


def _has_table(path: Path, table: str) -> bool:
    rows = _read_sqlite(path, "SELECT name FROM sqlite_master WHERE type = 'table'")
    return rows is not None and (table,) in rows[0]


def _has_column(path: Path, table: str, column: str) -> bool:
    rows = _read_sqlite(path, f"PRAGMA table_info({table})")
    return rows is not None and any(str(r[1]) == column for r in rows[0])


# The embedded SQLite stores this copies (besides the session logs and the attachments); the
# search index (search.sqlite3) is not copied: the database indexes the lines itself.
EMBEDDED_FILES = ("inbox.sqlite3", "access.sqlite3", "tasks.sqlite3", "control.sqlite3", "whatsapp.sqlite3",
                  "jobs.sqlite3")


async def migrate_embedded(data_dir: Path, db: AsyncDatabase) -> MigrationReport:
    await migrate_schema(db)
    return MigrationReport([
        await _inbox(data_dir / "inbox.sqlite3", db),
        await _sessions(data_dir / "sessions", db),
        await _access(data_dir / "access.sqlite3", db),
        await _tasks(data_dir / "tasks.sqlite3", db),
        await _jobs(data_dir / "jobs.sqlite3", db),
        await _attachments(data_dir / "attachments", db, data_dir),
        await _control(data_dir / "control.sqlite3", db),
        await _whatsapp(data_dir / "whatsapp.sqlite3", db),
        await _panel(data_dir / "control.sqlite3", db),
    ])


async def _insert_all(db: AsyncDatabase, sql: str, rows: list[tuple[Any, ...]]) -> int:
    """Insert ``rows`` in one transaction; how many were new."""
    copied = 0
    async with db.transaction() as conn:
        async with conn.cursor() as cur:
            for row in rows:
                await cur.execute(sql, row)
                copied += max(cur.rowcount, 0)
    db.count(len(rows))
    return copied


async def _verify(db: AsyncDatabase, report: StoreReport,
                  checks: list[tuple[str, str, list[tuple[object, ...]]]]) -> None:
    """Count each copied row found in the database by its key; name the ones missing."""
    for table, where, keys in checks:
        for key in keys:
            if await db.fetchone(f"SELECT 1 FROM {table} WHERE {where}", key) is not None:
                report.verified += 1
            else:
                report.problems.append(f"{table} row {key} is missing in the database")


async def _inbox(path: Path, db: AsyncDatabase) -> StoreReport:
    report = StoreReport("inbox")
    read = await asyncio.to_thread(_read_sqlite, path, "SELECT key, channel, chat_id, payload, status, attempts, "
                                   "delivered_parts, created, finished FROM inbox ORDER BY seq")
    if read is None:
        return report
    rows = read[0]
    report.found = len(rows)
    # In arrival order, so the new sequence keeps it.
    report.copied = await _insert_all(
        db, "INSERT INTO talon_inbox (key, channel, chat_id, payload, status, attempts, delivered_parts, created, "
            "finished) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (key) DO NOTHING", rows)
    copied = {str(r[0]): (str(r[1]), str(r[2]), str(r[3])) for r in await db.fetchall(
        "SELECT key, channel, chat_id, payload FROM talon_inbox WHERE key = ANY(%s)", ([r[0] for r in rows],))}
    for key, channel, chat_id, payload, *_ in rows:
        if copied.get(key) == (channel, chat_id, payload):
            report.verified += 1
        else:
            report.problems.append(f"inbox message {key} differs in the database")
    return report


def _thread_lines(path: Path) -> list[str]:
    """A thread's complete, readable lines, as the embedded store would load them."""
    lines = []
    for number, line in enumerate(path.read_bytes().decode("utf-8", "replace").split("\n"), 1):
        if not line.strip():
            continue
        try:
            Message.from_json(line)
        except ValueError:
            log.warning("session %s line %d is unreadable (torn write?); not copied", path, number)
            continue
        lines.append(line)
    return lines


def _digest(lines: list[str]) -> str:
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line.encode("utf-8") + b"\n")
    return digest.hexdigest()


async def _sessions(root: Path, db: AsyncDatabase) -> StoreReport:
    report = StoreReport("sessions (threads)")
    if not root.is_dir():
        return report
    for channel_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for chat_dir in sorted(p for p in channel_dir.iterdir() if p.is_dir()):
            chat = chat_of(chat_dir)  # the real ids (the directory names are made safe)
            channel, chat_id = chat.channel, chat.chat_id
            current = chat_dir / "CURRENT"
            if current.is_file() and current.read_text("utf-8").strip():
                await db.execute("INSERT INTO talon_threads (channel, chat_id, current) VALUES (%s, %s, %s) "
                           "ON CONFLICT (channel, chat_id) DO UPDATE SET current = EXCLUDED.current",
                           (channel, chat_id, current.read_text("utf-8").strip()))
            for thread_file in sorted(chat_dir.glob("*.jsonl")):
                thread = thread_file.stem
                lines = await asyncio.to_thread(_thread_lines, thread_file)
                report.found += 1
                report.copied += await _insert_all(
                    db, "INSERT INTO talon_session_lines (channel, chat_id, thread, n, body) "
                        "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    [(channel, chat_id, thread, n, line) for n, line in enumerate(lines, 1)])
                stored = [str(r[0]) for r in await db.fetchall(
                    "SELECT body FROM talon_session_lines WHERE channel = %s AND chat_id = %s AND thread = %s "
                    "AND n <= %s ORDER BY n", (channel, chat_id, thread, len(lines)))]
                if _digest(stored) == _digest(lines):
                    report.verified += 1
                else:
                    report.problems.append(f"session {channel}/{chat_id}/{thread}: the database holds other "
                                           "lines than the file (sha256 differs)")
    await index_unindexed(db)  # the copied lines join the full-text index
    return report


async def _access(path: Path, db: AsyncDatabase) -> StoreReport:
    report = StoreReport("access (approvals, codes)")
    read = await asyncio.to_thread(
        _read_sqlite, path, "SELECT channel, sender_id, name, approved_at FROM approved",
        "SELECT channel, sender_id, name, code, created FROM pending ORDER BY rowid",
        "SELECT channel, sender_id, at FROM replied")
    if read is None:
        return report
    approved, pending, replied = read
    report.found = len(approved) + len(pending) + len(replied)
    report.copied += await _insert_all(
        db, "INSERT INTO talon_approved (channel, sender_id, name, approved_at) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT DO NOTHING", approved)
    report.copied += await _insert_all(
        db, "INSERT INTO talon_pairing_pending (channel, sender_id, name, code, created) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING", pending)
    report.copied += await _insert_all(
        db, "INSERT INTO talon_pairing_replied (channel, sender_id, at) VALUES (%s, %s, %s) "
            "ON CONFLICT DO NOTHING", replied)
    checks: list[tuple[str, str, list[tuple[object, ...]]]] = [
        ("talon_approved", "channel = %s AND sender_id = %s", [(r[0], r[1]) for r in approved]),
        ("talon_pairing_pending", "code = %s", [(r[3],) for r in pending]),
        ("talon_pairing_replied", "channel = %s AND sender_id = %s", [(r[0], r[1]) for r in replied])]
    await _verify(db, report, checks)
    return report


# Usage rows and grants have no key of their own: a row is the same row when every column but
# the local id is the same (two calls of one chat at the same microsecond with the same counts
# would be one; the clock makes that unlikely, and the check below would say so).
_USAGE = ("at, channel, chat_id, person, model, purpose, input_tokens, output_tokens, cached_tokens, cost, "
          "estimated, extra_share",
          "%s::float8, %s::text, %s::text, %s::text, %s::text, %s::text, %s::bigint, %s::bigint, %s::bigint, "
          "%s::float8, %s::boolean, %s::boolean",
          "at = %s AND channel = %s AND chat_id = %s AND person = %s AND model = %s AND purpose = %s AND "
          "input_tokens = %s AND output_tokens = %s AND cached_tokens = %s AND cost IS NOT DISTINCT FROM %s::float8 "
          "AND estimated = %s::boolean AND extra_share = %s::boolean")
# A control file from before estimated usage has neither column: its calls were reported, each its own.
_OLD_USAGE = _USAGE[0].replace("estimated, extra_share", "0, 0")
_GRANTS = ("channel, person, unit, amount, at", "%s::text, %s::text, %s::text, %s::float8, %s::float8",
           "channel = %s AND person = %s AND unit = %s AND amount = %s AND at = %s")


async def _control(path: Path, db: AsyncDatabase) -> StoreReport:
    """Usage records, grants, approvals (with their decisions) and "always" approvals."""
    from talon.storage.embedded.control import APPROVAL_COLUMNS, APPROVAL_MARKS, approval_of, approval_row, open_control_db

    report = StoreReport("control (usage, approvals)")
    if path.is_file():  # a database of an older Talon gets the current columns first (as at Talon's start)
        await asyncio.to_thread(lambda: open_control_db(path).close())
    names = await asyncio.to_thread(_read_sqlite, path, "SELECT name FROM pragma_table_info('usage')")
    old = names is not None and ("estimated",) not in names[0]
    read = await asyncio.to_thread(
        _read_sqlite, path, f"SELECT {_OLD_USAGE if old else _USAGE[0]} FROM usage ORDER BY id",
        f"SELECT {_GRANTS[0]} FROM usage_grants ORDER BY id", f"SELECT {APPROVAL_COLUMNS} FROM approvals",
        "SELECT channel, chat_id, tool, decided_by, at FROM approval_always")
    if read is None:
        return report
    usage, grants, approvals, always = read
    usage = [(*row[:10], bool(row[10]), bool(row[11])) for row in usage]  # SQLite keeps flags as 0/1
    report.found = len(usage) + len(grants) + len(approvals) + len(always)
    async with db.transaction() as conn, conn.cursor() as cur:
        for table, (columns, marks, same), rows in (("talon_usage", _USAGE, usage),
                                                    ("talon_usage_grants", _GRANTS, grants)):
            for row in rows:
                await cur.execute(f"INSERT INTO {table} ({columns}) SELECT {marks} WHERE NOT EXISTS "
                                  f"(SELECT 1 FROM {table} WHERE {same})", (*row, *row))
                report.copied += max(cur.rowcount, 0)
        for row in approvals:
            await cur.execute(f"INSERT INTO talon_approvals ({APPROVAL_COLUMNS}) VALUES "
                              f"({', '.join(['%s'] * APPROVAL_MARKS)}) ON CONFLICT DO NOTHING",
                              approval_row(approval_of(row)))
            report.copied += max(cur.rowcount, 0)
        for row in always:
            await cur.execute("INSERT INTO talon_approval_always (channel, chat_id, tool, decided_by, at) "
                              "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING", row)
            report.copied += max(cur.rowcount, 0)
    db.count(report.found)
    checks: list[tuple[str, str, list[tuple[object, ...]]]] = [
        ("talon_usage", _USAGE[2], list(usage)), ("talon_usage_grants", _GRANTS[2], list(grants)),
        ("talon_approvals", "id = %s AND status = %s", [(r[0], r[13]) for r in approvals]),
        ("talon_approval_always", "channel = %s AND chat_id = %s AND tool = %s", [r[:3] for r in always])]
    await _verify(db, report, checks)
    return report


async def _jobs(path: Path, db: AsyncDatabase) -> StoreReport:
    from talon.storage.jobs import JOB_COLUMNS

    report = StoreReport("background jobs")
    read = await asyncio.to_thread(_read_sqlite, path, f"SELECT {JOB_COLUMNS} FROM jobs ORDER BY created, id")
    if read is None:
        return report
    (jobs,) = read
    report.found = len(jobs)
    marks = ", ".join(["%s"] * len(JOB_COLUMNS.split(",")))
    report.copied += await _insert_all(
        db, f"INSERT INTO talon_jobs ({JOB_COLUMNS}) VALUES ({marks}) ON CONFLICT DO NOTHING", jobs)
    await _verify(db, report, [("talon_jobs", "id = %s", [(r[0],) for r in jobs])])
    return report


async def _tasks(path: Path, db: AsyncDatabase) -> StoreReport:
    report = StoreReport("scheduled tasks (runs, zones)")
    read = await asyncio.to_thread(
        _read_sqlite, path, f"SELECT {TASK_COLUMNS} FROM tasks ORDER BY created, id",
        "SELECT task_id, due_ms, due, status, reason, updated FROM task_runs",
        "SELECT channel, chat_id, zone FROM chat_zones")
    if read is None:
        return report
    tasks, runs, zones = read
    report.found = len(tasks) + len(runs) + len(zones)
    marks = ", ".join(["%s"] * len(TASK_COLUMNS.split(",")))
    report.copied += await _insert_all(
        db, f"INSERT INTO talon_tasks ({TASK_COLUMNS}) VALUES ({marks}) ON CONFLICT DO NOTHING", tasks)
    report.copied += await _insert_all(
        db, "INSERT INTO talon_task_runs (task_id, due_ms, due, status, reason, updated) "
            "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING", runs)
    report.copied += await _insert_all(
        db, "INSERT INTO talon_chat_zones (channel, chat_id, zone) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
        zones)
    checks: list[tuple[str, str, list[tuple[object, ...]]]] = [
        ("talon_tasks", "id = %s", [(r[0],) for r in tasks]),
        ("talon_task_runs", "task_id = %s AND due_ms = %s", [(r[0], r[1]) for r in runs]),
        ("talon_chat_zones", "channel = %s AND chat_id = %s", [(r[0], r[1]) for r in zones])]
    await _verify(db, report, checks)
    return report


async def _whatsapp(path: Path, db: AsyncDatabase) -> StoreReport:
    report = StoreReport("whatsapp (window, waiting messages, receipts)")
    read = await asyncio.to_thread(
        _read_sqlite, path, "SELECT chat_id, last_inbound, last_read, last_refused FROM wa_windows",
        "SELECT chat_id, created, payload FROM wa_pending ORDER BY id",
        f"SELECT {SENT_COLUMNS} FROM wa_sent", "SELECT token, choice, approval_id, digest, chat_id, expires FROM wa_tokens")
    if read is None:
        return report
    windows, pending, sent, tokens = read
    report.found = len(windows) + len(pending) + len(sent) + len(tokens)
    report.copied += await _insert_all(
        db, "INSERT INTO talon_wa_windows (chat_id, last_inbound, last_read, last_refused) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT DO NOTHING", windows)
    # No key of their own: a part already copied (same chat, time and payload) is not copied again;
    # in their order, so the new ids keep it.
    report.copied += await _insert_all(
        db, "INSERT INTO talon_wa_pending (chat_id, created, payload) SELECT %s, %s, %s WHERE NOT EXISTS "
            "(SELECT 1 FROM talon_wa_pending WHERE chat_id = %s AND created = %s AND payload = %s)",
        [(c, t, p, c, t, p) for c, t, p in pending])
    report.copied += await _insert_all(
        db, f"INSERT INTO talon_wa_sent ({SENT_COLUMNS}) VALUES ({', '.join(['%s'] * 10)}) ON CONFLICT DO NOTHING",
        [(*r[:9], bool(r[9])) for r in sent])
    report.copied += await _insert_all(
        db, "INSERT INTO talon_wa_tokens (token, choice, approval_id, digest, chat_id, expires) "
            "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING", tokens)
    await _verify(db, report, [
        ("talon_wa_windows", "chat_id = %s", [(r[0],) for r in windows]),
        ("talon_wa_pending", "chat_id = %s AND created = %s AND payload = %s", [tuple(r) for r in pending]),
        ("talon_wa_sent", "sid = %s", [(r[0],) for r in sent]),
        ("talon_wa_tokens", "token = %s", [(r[0],) for r in tokens])])
    return report


async def _panel(path: Path, db: AsyncDatabase) -> StoreReport:
    """The web panel's audit log and chat index (in control.sqlite3 once the panel has run). Its
    sign-ins are not copied (a moved Talon asks to sign in again); its usage rollup is rebuilt by
    the database's trigger as the usage rows are copied."""
    report = StoreReport("web panel (audit log, chat index)")
    names = await asyncio.to_thread(_read_sqlite, path, "SELECT name FROM sqlite_master WHERE type = 'table'")
    if names is None or ("panel_audit",) not in names[0]:
        return report
    read = await asyncio.to_thread(
        _read_sqlite, path, "SELECT at, who, action, detail, address FROM panel_audit ORDER BY id",
        "SELECT channel, chat_id, title, people, last_at, messages FROM panel_chats",
        "SELECT day, messages, answered FROM panel_days"
        if _has_column(path, "panel_days", "answered") else "SELECT day, messages, 0 FROM panel_days")
    assert read is not None
    audit, chats, days = read
    sent_read = await asyncio.to_thread(
        _read_sqlite, path, "SELECT channel, chat_id, sha, mime, name, path, at FROM panel_sent") \
        if _has_table(path, "panel_sent") else None
    sent = sent_read[0] if sent_read else []
    report.found = len(audit) + len(chats) + len(days) + len(sent)
    same = "at = %s AND who = %s AND action = %s AND detail = %s AND address = %s"
    # No key of their own: an entry already copied (every column the same) is not copied again.
    report.copied += await _insert_all(
        db, "INSERT INTO talon_panel_audit (at, who, action, detail, address) SELECT %s::float8, %s::text, "
            f"%s::text, %s::text, %s::text WHERE NOT EXISTS (SELECT 1 FROM talon_panel_audit WHERE {same})",
        [(*r, *r) for r in audit])
    report.copied += await _insert_all(
        db, "INSERT INTO talon_panel_chats (channel, chat_id, title, people, last_at, messages) "
            "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING", chats)
    report.copied += await _insert_all(
        db, "INSERT INTO talon_panel_days (day, messages, answered) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING", days)
    report.copied += await _insert_all(
        db, "INSERT INTO talon_panel_sent (channel, chat_id, sha, mime, name, path, at) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING", sent)
    await _verify(db, report, [("talon_panel_audit", same, [tuple(r) for r in audit]),
                               ("talon_panel_sent", "channel = %s AND chat_id = %s AND sha = %s AND path = %s",
                                [(r[0], r[1], r[2], r[5]) for r in sent]),
                               ("talon_panel_chats", "channel = %s AND chat_id = %s", [r[:2] for r in chats]),
                               ("talon_panel_days", "day = %s", [r[:1] for r in days])])
    return report


async def _attachments(root: Path, db: AsyncDatabase, data_dir: Path) -> StoreReport:
    report = StoreReport("attachments")
    if not root.is_dir():
        return report
    source = FileBlobs(root)
    # Read back into a scratch cache, so the check reads the database, never the source files.
    check_dir = data_dir / "migrate-check"
    target = PgAttachments(db, check_dir)
    try:
        await _copy_attachments(root, source, target, report)
    finally:
        await target.close()
    await asyncio.to_thread(_remove_tree, check_dir)
    return report


def _sha_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


async def _copy_attachments(root: Path, source: FileBlobs, target: PgAttachments, report: StoreReport) -> None:
    for shard in sorted(p for p in root.iterdir() if p.is_dir() and len(p.name) == 2):
        for blob in sorted(shard.iterdir()):
            sha = blob.name
            if len(sha) != 64 or not set(sha) <= _HEX:
                continue
            report.found += 1
            if await asyncio.to_thread(_sha_file, blob) != sha:
                report.problems.append(f"attachment {sha[:12]} on disk does not match its name: not copied")
                continue
            if await target.upload(source.path_for(sha), sha):
                report.copied += 1
            try:
                copy = await target.file_path(sha)  # streamed back from the database and hashed again
            except Exception as exc:
                report.problems.append(f"attachment {sha[:12]}: {exc}")
                continue
            copy.unlink()
            report.verified += 1


def _remove_tree(path: Path) -> None:
    for child in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        child.rmdir() if child.is_dir() else child.unlink()
    if path.exists():
        path.rmdir()
