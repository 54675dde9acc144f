"""Talon's durable stores: async interfaces (ports) with an embedded implementation (SQLite and
files, no server) and a PostgreSQL one (``TALON_DATABASE_URL``), plus in-memory ones for tests.

Rules every store here keeps:

- Its interface is an async ``Protocol``; nothing above the stores knows which implementation it has.
- The event loop never waits on disk or a database. Embedded stores run their SQLite work on a
  thread of their own (``SqliteRunner``: one connection, one thread, calls in submission order);
  PostgreSQL stores use an async pool (``talon.storage.postgres.db.AsyncDatabase``).
- PostgreSQL tables are created by the numbered scripts in ``talon.storage.postgres.schema``; a new
  store appends its script there. Embedded stores create their tables with ``IF NOT EXISTS`` when
  they open.

Besides the stores: ``search`` (full-text search over a chat's messages, kept by both session
stores), ``backup`` and ``pg_export`` (`talon backup | restore`), ``export`` (`talon export`) and
``migrate`` (`talon migrate --to`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from talon.storage.sqlite import SqliteRunner

__all__ = ["SqliteRunner"]


def __getattr__(name: str) -> Any:
    """``SqliteRunner`` on first use: `talon backup` and `talon restore` import this package
    without the stores' thread pool and asyncio."""
    if name == "SqliteRunner":
        from talon.storage.sqlite import SqliteRunner

        return SqliteRunner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
