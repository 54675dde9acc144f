"""Workers of one deployment must see the same files: the check made at start.

The agents' workspaces (``TALON_MEDIA_ROOT``) and the context files they read back (under
``TALON_DATA_DIR/sessions``) are files, so with many workers they must be on storage every worker
mounts (NFS or similar). The first worker to start against an empty database draws a deployment
id, writes it into a marker file in each of those directories and records it in the database;
every later worker must find the same id in its own directories, or it refuses to start: a worker
with a local, empty media root would otherwise answer from a workspace the others never see.
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

from talon.errors import ConfigError
from talon.storage.postgres.db import AsyncDatabase

MARKER = ".talon-deployment"
_MARKER_LOCK = 0x74616C6F6E6D6B72 & 0x7FFFFFFFFFFFFFFF


def _read(directory: Path) -> str | None:
    try:
        return (directory / MARKER).read_text("utf-8").strip() or None
    except FileNotFoundError:
        return None


def _write(dirs: dict[str, Path], deployment: str) -> None:
    for directory in dirs.values():
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / (MARKER + ".tmp")
        tmp.write_text(deployment + "\n", "utf-8")
        tmp.replace(directory / MARKER)


async def check_shared_dirs(db: AsyncDatabase, dirs: dict[str, Path]) -> str:
    """The deployment id; ConfigError naming the setting whose directory is not the shared one.

    ``dirs`` maps each setting (``TALON_MEDIA_ROOT``...) to its directory.
    """
    async with db.transaction() as conn:
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MARKER_LOCK,))
        cur = await conn.execute("SELECT value FROM talon_meta WHERE key = 'deployment'")
        row = await cur.fetchone()
        db.count(2)
        if row is None:
            deployment = secrets.token_hex(16)
            await asyncio.to_thread(_write, dirs, deployment)
            await conn.execute("INSERT INTO talon_meta (key, value) VALUES ('deployment', %s)", (deployment,))
            db.count()
            return deployment
        deployment = str(row[0])
    for setting, directory in dirs.items():
        found = await asyncio.to_thread(_read, directory)
        if found != deployment:
            what = "has no marker file" if found is None else "has the marker of another deployment"
            raise ConfigError(
                f"{setting}={directory} {what} ({MARKER}): the workers of this database keep their "
                f"workspaces on shared storage, and this worker does not see it. Mount the same shared "
                f"directory (NFS or similar) here at {directory}, or point {setting} at it.", [setting])
    return deployment
