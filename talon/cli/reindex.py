"""``talon migrate`` with no ``--to``: bring the configured stores up to date in place.

Embedded (``TALON_DATA_DIR``): every session log line not yet in the full-text index
(``search.sqlite3``) is indexed; ``--rebuild-index`` starts the index over. PostgreSQL
(``TALON_DATABASE_URL``): the schema is upgraded and the lines stored before the index existed are
indexed. Both are safe to run again and while Talon runs (each line is keyed).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a restore calls index_embedded without pydantic's import (docs/backup.md)
    from talon.config import Settings


def index_embedded(data_dir: Path, *, rebuild: bool = False) -> tuple[int, int]:
    """(lines read, lines newly indexed) for the logs under ``data_dir``. Blocking."""
    from talon.storage.embedded.search import INDEX_FILE, SearchIndex, index_files

    index = SearchIndex(data_dir / INDEX_FILE)
    try:
        if rebuild:
            index.rebuild()
        return index_files(index, data_dir / "sessions")
    finally:
        index.close()


async def index_postgres(url: str) -> tuple[int, int]:
    """(schema version before, lines newly indexed)."""
    from talon.storage.postgres.db import AsyncDatabase
    from talon.storage.postgres.schema import migrate_schema
    from talon.storage.postgres.sessions import index_unindexed

    db = AsyncDatabase(url, max_size=2)
    await db.open()
    try:
        before, _ = await migrate_schema(db)
        return before, await index_unindexed(db)
    finally:
        await db.close()


def run(settings: Settings, *, rebuild: bool = False) -> int:
    if settings.database_url:
        import asyncio

        from talon.storage.postgres.db import redact
        from talon.storage.postgres.schema import SCHEMA_VERSION

        before, indexed = asyncio.run(index_postgres(settings.database_url))
        print(f"database {redact(settings.database_url)}: schema version {before} -> {SCHEMA_VERSION}; "
              f"{indexed} message line(s) newly indexed for search")
        return 0
    if not settings.data_dir.is_dir():
        print(f"talon: TALON_DATA_DIR={settings.data_dir} does not exist: nothing to index")
        return 0
    read, added = index_embedded(settings.data_dir, rebuild=rebuild)
    print(f"data dir {settings.data_dir.resolve()}: {read} message line(s) read, {added} newly indexed for search")
    return 0
