"""Which stores a process gets: the embedded ones in ``TALON_DATA_DIR`` (SQLite, JSONL, files; the
default), or the PostgreSQL ones named by ``TALON_DATABASE_URL``. Code above the stores sees the
same interfaces either way (``talon.inbox.InboxStore``, ``SessionStore``, ``AttachmentStore``,
``AccessGate``, ``MediaLinks``).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from talon.access import AccessGate
from talon.agent.session import SessionStore
from talon.attachments import AttachmentStore
from talon.config import Settings
from talon.inbox import Inbox, InboxStore

if TYPE_CHECKING:
    from channels.media_links import MediaLinks
    from talon.storage.approvals import ApprovalStore
    from talon.storage.sqlite import SqliteRunner
    from talon.storage.usage import UsageStore
    from talon.pg.db import Database
    from talon.pg.leases import Leases
    from talon.storage.postgres.db import AsyncDatabase


log = logging.getLogger(__name__)


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass
class Stores:
    attachments: AttachmentStore
    sessions: SessionStore
    inbox: InboxStore
    gate: AccessGate
    worker_id: str
    db: "Database | None" = None  # None: embedded
    leases: "Leases | None" = None
    deployment: str = ""
    # The async pool the async stores use (opened by ``start``); the sync ``db`` goes as the
    # existing stores move onto it.
    adb: "AsyncDatabase | None" = None
    # Control (talon.control): model usage and approvals; embedded ones share ``control_db``.
    usage: "UsageStore | None" = None
    approvals: "ApprovalStore | None" = None
    control_db: "SqliteRunner | None" = None

    @property
    def shared(self) -> bool:
        return self.db is not None

    def media_links(self) -> "Callable[[Path, str, float], MediaLinks] | None":
        """The media-link table factory for the WhatsApp channel; None means its own default."""
        if self.db is None:
            return None
        from channels.shared_media_links import SharedMediaLinks
        from talon.pg.attachments import PgAttachmentStore

        db, store = self.db, self.attachments
        assert isinstance(store, PgAttachmentStore)
        return lambda root, base, ttl: SharedMediaLinks(db, store, root, base, ttl)

    async def start(self) -> None:
        """Open what needs the event loop (the async pool)."""
        if self.adb is not None:
            await self.adb.open()

    async def aclose(self) -> None:
        if self.adb is not None:
            await self.adb.close()
        self.close()

    def close(self) -> None:
        if self.control_db is not None:
            self.control_db.close()
        self.inbox.close()
        self.gate.close()
        if self.db is not None:
            log.info("worker %s: %d database round trips", self.worker_id, self.db.round_trips)
            self.db.close()


def open_gate(settings: Settings) -> AccessGate:
    """The access gate alone (``talon pair``)."""
    if not settings.database_url:
        return AccessGate.from_settings(settings)
    from talon.pg.access import PgAccessGate
    from talon.pg.db import Database, migrate_schema

    db = Database(settings.database_url, max_size=2)
    migrate_schema(db)
    gate = PgAccessGate(db, _allowlists(settings), pairing=settings.pairing)
    gate.close = db.close  # type: ignore[method-assign]  # this gate owns its database
    return gate


def _allowlists(settings: Settings) -> dict[str, set[str]]:
    return {"telegram": settings.telegram_allowlist, "whatsapp": settings.whatsapp_allowlist}


def open_stores(settings: Settings, *, check_dirs: bool = True) -> Stores:
    settings.ensure_dirs()
    worker = settings.worker_id or default_worker_id()
    if not settings.database_url:
        from talon.storage.embedded.control import SqliteApprovalStore, SqliteUsageStore, open_control_db

        control = open_control_db(settings.data_dir / "control.sqlite3")
        return Stores(
            attachments=AttachmentStore(settings.data_dir / "attachments"),
            sessions=SessionStore(settings.data_dir),
            inbox=Inbox(settings.data_dir / "inbox.sqlite3"),
            gate=AccessGate.from_settings(settings),
            worker_id=worker,
            usage=SqliteUsageStore(control),
            approvals=SqliteApprovalStore(control),
            control_db=control,
        )
    from talon.pg.access import PgAccessGate
    from talon.pg.attachments import PgAttachmentStore
    from talon.pg.db import Database, migrate_schema
    from talon.pg.inbox import PgInbox
    from talon.pg.leases import Leases
    from talon.pg.sessions import PgSessionStore
    from talon.storage.postgres.control import PgApprovalStore, PgUsageStore
    from talon.storage.postgres.db import AsyncDatabase
    from talon.workspace_marker import check_shared_dirs

    db = Database(settings.database_url, max_size=settings.database_pool_size)
    try:
        migrate_schema(db)
        deployment = ""
        if check_dirs:
            deployment = check_shared_dirs(db, {"TALON_MEDIA_ROOT": settings.media_root,
                                                "TALON_DATA_DIR": settings.data_dir / "sessions"})
        adb = AsyncDatabase(settings.database_url, max_size=settings.database_pool_size)
        return Stores(
            attachments=PgAttachmentStore(db, settings.data_dir / "attachments"),
            sessions=PgSessionStore(db, settings.data_dir),
            inbox=PgInbox(db),
            gate=PgAccessGate(db, _allowlists(settings), pairing=settings.pairing),
            worker_id=worker,
            db=db,
            leases=Leases(db, worker, settings.lease_s),
            deployment=deployment,
            adb=adb,
            usage=PgUsageStore(adb),
            approvals=PgApprovalStore(adb),
        )
    except BaseException:
        db.close()
        raise
