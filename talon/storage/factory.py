"""Which stores a process gets: the embedded ones in ``TALON_DATA_DIR`` (SQLite, JSONL, files; the
default), or the PostgreSQL ones named by ``TALON_DATABASE_URL``. Code above the stores sees the
same interfaces either way.

``open_stores`` builds them (embedded files are opened at once); ``await Stores.start()`` opens
what needs the event loop: the database pool, the schema upgrade, the shared-directory check.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from talon.config import Settings
from talon.storage.access import AccessGate, PairingStore
from talon.storage.attachments import AttachmentStore
from talon.storage.inbox import InboxStore
from talon.storage.leases import Leases
from talon.storage.media_links import MediaLinkStore, MemoryMediaLinks
from talon.storage.sessions import SessionStore
from talon.storage.approvals import ApprovalStore
from talon.storage.sqlite import SqliteRunner
from talon.storage.jobs import JobStore, MemoryJobs
from talon.storage.tasks import TaskStore
from talon.storage.usage import UsageStore
from talon.storage.whatsapp import WhatsAppStore

if TYPE_CHECKING:  # psycopg (11 MB) is imported only with TALON_DATABASE_URL
    from talon.storage.panel import PanelStore
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
    links: MediaLinkStore
    worker_id: str
    tasks: TaskStore  # scheduled tasks (talon.scheduler)
    # Control (talon.control): model usage and approvals; the embedded ones share ``control_db``.
    usage: UsageStore
    approvals: ApprovalStore
    # WhatsApp's window, waiting messages and receipts (channels.whatsapp); None: not opened yet.
    whatsapp: WhatsAppStore | None = None
    control_db: SqliteRunner | None = None
    panel: "PanelStore | None" = None  # the web panel's (talon.ui): sign-in, audit log, chat index
    adb: AsyncDatabase | None = None  # None: embedded
    leases: Leases | None = None
    deployment: str = ""
    # With a database: the directories every worker must share (checked at start).
    shared_dirs: dict[str, Path] | None = None
    started: bool = False
    # Background delegations (talon.jobs); the embedded store is TALON_DATA_DIR/jobs.sqlite3.
    jobs: JobStore = field(default_factory=MemoryJobs)

    @property
    def shared(self) -> bool:
        return self.adb is not None

    async def start(self) -> None:
        """Open the database pool, bring the schema up to date, check the shared directories.
        Once: ``talon run`` opens the stores before the rest of the runtime starts."""
        if self.adb is None or self.started:
            return
        from talon.storage.marker import check_shared_dirs
        from talon.storage.postgres.inbox import PgInbox
        from talon.storage.postgres.schema import migrate_schema

        await self.adb.open()
        await migrate_schema(self.adb)
        self.adb.start_monitor()
        if self.shared_dirs is not None:
            self.deployment = await check_shared_dirs(self.adb, self.shared_dirs)
        if isinstance(self.inbox, PgInbox):
            await self.inbox.prune()
        self.started = True

    async def aclose(self) -> None:
        try:
            await self.tasks.aclose()
        except Exception:
            log.exception("closing the task store failed")
        for store in (self.jobs, self.inbox, self.gate, self.sessions, self.attachments, self.whatsapp):
            if store is None:
                continue
            try:
                await store.close()
            except Exception:
                log.exception("closing a store failed")
        if self.control_db is not None:
            await self.control_db.aclose()
        if self.adb is not None:
            log.info("worker %s: %d database round trips", self.worker_id, self.adb.round_trips)
            await self.adb.close()


def _allowlists(settings: Settings) -> dict[str, set[str]]:
    return {"telegram": settings.telegram_allowlist, "whatsapp": settings.whatsapp_allowlist,
            "matrix": settings.matrix_allowlist, "slack": settings.slack_allowlist,
            "discord": settings.discord_allowlist}


def embedded_pairing(settings: Settings) -> PairingStore:
    from talon.storage.embedded.access import SqlitePairing

    return SqlitePairing(settings.data_dir / "access.sqlite3")


async def open_gate(settings: Settings) -> AccessGate:
    """The access gate alone (``talon pair``); close it when done."""
    if not settings.database_url:
        return AccessGate(embedded_pairing(settings), _allowlists(settings), pairing=settings.pairing)
    from talon.storage.postgres.access import PgPairing
    from talon.storage.postgres.db import AsyncDatabase
    from talon.storage.postgres.schema import migrate_schema

    db = AsyncDatabase(settings.database_url, max_size=2)
    await db.open()
    try:
        await migrate_schema(db)
    except BaseException:
        await db.close()
        raise
    return AccessGate(PgPairing(db, owns_db=True), _allowlists(settings), pairing=settings.pairing)


def open_stores(settings: Settings, *, check_dirs: bool = True) -> Stores:
    settings.ensure_dirs()
    worker = settings.worker_id or default_worker_id()
    if not settings.database_url:
        from talon.storage.embedded.attachments import FileAttachments
        from talon.storage.embedded.inbox import SqliteInbox
        from talon.storage.embedded.sessions import JsonlSessions
        from talon.storage.embedded.control import SqliteApprovalStore, SqliteUsageStore, open_control_db
        from talon.storage.embedded.jobs import SqliteJobs
        from talon.storage.embedded.tasks import SqliteTaskStore
        from talon.storage.embedded.whatsapp import SqliteWhatsAppStore
        from talon.storage.embedded.panel import SqlitePanelStore

        control = open_control_db(settings.data_dir / "control.sqlite3")
        return Stores(
            attachments=FileAttachments(settings.data_dir / "attachments"),
            sessions=JsonlSessions(settings.data_dir, index=settings.search_index),
            inbox=SqliteInbox(settings.data_dir / "inbox.sqlite3"),
            gate=AccessGate(embedded_pairing(settings), _allowlists(settings), pairing=settings.pairing),
            links=MemoryMediaLinks(),
            worker_id=worker,
            tasks=SqliteTaskStore(settings.data_dir / "tasks.sqlite3"),
            jobs=SqliteJobs(settings.data_dir / "jobs.sqlite3"),
            usage=SqliteUsageStore(control),
            approvals=SqliteApprovalStore(control),
            control_db=control,
            whatsapp=SqliteWhatsAppStore(settings.data_dir / "whatsapp.sqlite3")
            if settings.whatsapp_configured() else None,
            panel=SqlitePanelStore(control),
        )
    from talon.storage.postgres.access import PgPairing
    from talon.storage.postgres.attachments import PgAttachments
    from talon.storage.postgres.control import PgApprovalStore, PgUsageStore
    from talon.storage.postgres.db import AsyncDatabase
    from talon.storage.postgres.inbox import PgInbox
    from talon.storage.postgres.leases import PgLeases
    from talon.storage.postgres.media_links import PgMediaLinks
    from talon.storage.postgres.sessions import PgSessions
    from talon.storage.postgres.jobs import PgJobs
    from talon.storage.postgres.tasks import PgTaskStore
    from talon.storage.postgres.whatsapp import PgWhatsAppStore
    from talon.storage.postgres.panel import PgPanelStore

    db = AsyncDatabase(settings.database_url, max_size=settings.database_pool_size)
    attachments = PgAttachments(db, settings.data_dir / "attachments")
    return Stores(
        attachments=attachments,
        sessions=PgSessions(db, settings.data_dir, index=settings.search_index),
        inbox=PgInbox(db),
        gate=AccessGate(PgPairing(db), _allowlists(settings), pairing=settings.pairing),
        links=PgMediaLinks(db, attachments),
        worker_id=worker,
        tasks=PgTaskStore(db),
        jobs=PgJobs(db),
        usage=PgUsageStore(db),
        approvals=PgApprovalStore(db),
        whatsapp=PgWhatsAppStore(db),
        panel=PgPanelStore(db),
        adb=db,
        leases=PgLeases(db, worker, settings.lease_s),
        shared_dirs={"TALON_MEDIA_ROOT": settings.media_root, "TALON_DATA_DIR": settings.data_dir / "sessions"}
        if check_dirs else None,
    )
