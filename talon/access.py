"""Who may talk to the agent: static allowlists, plus pairing codes for newcomers.

Deny by default. A sender is allowed when one of their identities (Telegram: numeric id and
``@username``; WhatsApp: E.164 number) is in the channel's allowlist setting, or when the owner
approved them with ``talon pair CODE``.

With ``TALON_PAIRING=true`` an unknown sender gets a pairing code instead of silence; the owner
approves it on the host. Codes are random (``secrets``) from an alphabet without look-alike
characters, live ``CODE_TTL_S`` (1 hour), one per sender (asking again gives the same code), at
most ``MAX_PENDING`` at a time (the oldest is dropped), and a sender is sent a code at most once
per ``REPLY_INTERVAL_S`` (10 minutes), so a stranger cannot make the bot spam.

State lives in ``TALON_DATA_DIR/access.sqlite3`` and is read on every check, so an approval or a
revocation from the CLI takes effect at once in a running ``talon run`` (a process of its own).
Approvals are kept whatever ``TALON_PAIRING`` says: turning pairing off stops new codes, and
``talon pair --revoke`` removes an approval.
"""

from __future__ import annotations

import secrets
import sqlite3
import threading
import time
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from talon.config import Settings
from talon.errors import PairingError
from talon.permissions import create_private_file, private_dir

CODE_TTL_S = 3600.0
REPLY_INTERVAL_S = 600.0
MAX_PENDING = 50
# No 0/O, 1/I/L: a code read aloud or retyped from a phone screen comes out the same.
CODE_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"
CODE_LENGTH = 7  # shown as XXX-XXXX; 31**7 is about 2.7e10
NAME_MAX = 64

_SCHEMA = """
CREATE TABLE IF NOT EXISTS pending (
    channel TEXT NOT NULL,
    sender_id TEXT NOT NULL,
    name TEXT NOT NULL,
    code TEXT UNIQUE NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (channel, sender_id)
);
CREATE TABLE IF NOT EXISTS replied (
    channel TEXT NOT NULL,
    sender_id TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (channel, sender_id)
);
CREATE TABLE IF NOT EXISTS approved (
    channel TEXT NOT NULL,
    sender_id TEXT NOT NULL,
    name TEXT NOT NULL,
    approved_at REAL NOT NULL,
    PRIMARY KEY (channel, sender_id)
);
"""


@dataclass(frozen=True)
class Pairing:
    """An unknown sender's live code; ``reply`` is the text to send them, or None when they were
    sent a code less than ``REPLY_INTERVAL_S`` ago (say nothing)."""

    code: str
    reply: str | None


@dataclass(frozen=True)
class PendingRequest:
    channel: str
    sender_id: str
    name: str
    code: str
    created: float


@dataclass(frozen=True)
class Approval:
    channel: str
    sender_id: str
    name: str
    approved_at: float

    @property
    def who(self) -> str:
        return f"{self.channel}:{self.sender_id}" + (f" ({self.name})" if self.name else "")


def format_code(raw: str) -> str:
    return f"{raw[:3]}-{raw[3:]}"


def normalize_code(text: str) -> str:
    """``k7q4mx2``, ``K7Q-4MX2`` and `` k7q 4mx2 `` are the same code."""
    return "".join(c for c in text.upper() if c.isalnum())


def pairing_reply(code: str) -> str:
    return f"This is a private bot. To ask for access, give its owner this code: {code}"


def _clean_name(name: str) -> str:
    """Profile names are chosen by strangers: no control characters (terminal escapes) reach
    ``talon pair``'s output, and they stay short."""
    kept = "".join(" " if c.isspace() else c for c in name
                   if c.isspace() or unicodedata.category(c)[0] != "C")
    return " ".join(kept.split())[:NAME_MAX]


def _identity(value: str) -> str:
    value = value.strip()
    return value.lower() if value.startswith("@") else value


class AccessGate:
    def __init__(self, path: Path, allowlists: Mapping[str, Iterable[str]], *, pairing: bool = False,
                 clock: Callable[[], float] = time.time) -> None:
        private_dir(path.parent)
        create_private_file(path)  # SQLite gives its -wal and -shm files this file's mode
        self.path = path
        self.allowlists = {channel: frozenset(_identity(x) for x in ids) for channel, ids in allowlists.items()}
        self.pairing = pairing
        self._clock = clock
        # Autocommit, WAL and a busy timeout: `talon pair` writes while `talon run` reads.
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=5.0)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)

    @classmethod
    def from_settings(cls, settings: Settings, *, clock: Callable[[], float] = time.time) -> AccessGate:
        return cls(settings.data_dir / "access.sqlite3",
                   {"telegram": settings.telegram_allowlist, "whatsapp": settings.whatsapp_allowlist},
                   pairing=settings.pairing, clock=clock)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # --- the check ------------------------------------------------------------------------
    def allowed(self, channel: str, identities: Iterable[str]) -> bool:
        """Whether a sender known by ``identities`` may talk to the agent on ``channel``."""
        ids = {_identity(i) for i in identities if i.strip()}
        if not ids:
            return False
        if ids & self.allowlists.get(channel, frozenset()):
            return True
        marks = ",".join("?" * len(ids))
        with self._lock:
            row = self._db.execute(f"SELECT 1 FROM approved WHERE channel=? AND sender_id IN ({marks})",
                                   (channel, *sorted(ids))).fetchone()
        return row is not None

    def request_pairing(self, channel: str, sender_id: str, name: str = "") -> Pairing | None:
        """The code for an unknown sender (issued or reused); None when pairing is off."""
        if not self.pairing:
            return None
        now = self._clock()
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._prune(now)
            row = self._db.execute("SELECT code FROM pending WHERE channel=? AND sender_id=?",
                                   (channel, sender_id)).fetchone()
            if row is not None:
                code = str(row[0])
            else:
                code = self._new_code()
                self._db.execute("INSERT INTO pending(channel, sender_id, name, code, created) VALUES (?,?,?,?,?)",
                                 (channel, sender_id, _clean_name(name), code, now))
                # Oldest requests go first; rowid breaks ties between codes of the same instant.
                self._db.execute("DELETE FROM pending WHERE rowid NOT IN (SELECT rowid FROM pending "
                                 "ORDER BY created DESC, rowid DESC LIMIT ?)", (MAX_PENDING,))
            recent = self._db.execute("SELECT 1 FROM replied WHERE channel=? AND sender_id=?",
                                      (channel, sender_id)).fetchone()
            if recent is None:
                self._db.execute("INSERT INTO replied(channel, sender_id, at) VALUES (?,?,?)",
                                 (channel, sender_id, now))
        shown = format_code(code)
        return Pairing(code=shown, reply=None if recent else pairing_reply(shown))

    # --- the owner's side (talon pair) ------------------------------------------------------
    def pending(self) -> list[PendingRequest]:
        """Live requests, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT channel, sender_id, name, code, created FROM pending WHERE created > ? "
                "ORDER BY created, rowid", (self._clock() - CODE_TTL_S,)).fetchall()
        return [PendingRequest(r[0], r[1], r[2], format_code(r[3]), r[4]) for r in rows]

    def approvals(self) -> list[Approval]:
        with self._lock:
            rows = self._db.execute(
                "SELECT channel, sender_id, name, approved_at FROM approved ORDER BY approved_at").fetchall()
        return [Approval(*r) for r in rows]

    def approve(self, code: str) -> Approval:
        """Approve the sender a live code was given to; PairingError when there is none."""
        raw = normalize_code(code)
        now = self._clock()
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            row = self._db.execute("SELECT channel, sender_id, name FROM pending WHERE code=? AND created > ?",
                                   (raw, now - CODE_TTL_S)).fetchone()
            if row is None:
                raise PairingError(
                    f"no pending request has the code {code.strip()!r}: it is mistyped, or it expired "
                    f"(codes live {CODE_TTL_S / 3600:.0f} hour) or was replaced by newer requests. Ask "
                    "them to message the bot again for a new code; `talon pair` lists the live ones.")
            channel, sender_id, name = row
            self._db.execute("INSERT OR REPLACE INTO approved(channel, sender_id, name, approved_at) "
                             "VALUES (?,?,?,?)", (channel, sender_id, name, now))
            self._db.execute("DELETE FROM pending WHERE channel=? AND sender_id=?", (channel, sender_id))
            self._db.execute("DELETE FROM replied WHERE channel=? AND sender_id=?", (channel, sender_id))
        return Approval(channel, sender_id, name, now)

    def revoke(self, channel: str, sender_id: str) -> Approval | None:
        """Remove an approval; None when this sender was not approved through pairing."""
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            row = self._db.execute("SELECT channel, sender_id, name, approved_at FROM approved "
                                   "WHERE channel=? AND sender_id=?", (channel, sender_id)).fetchone()
            if row is not None:
                self._db.execute("DELETE FROM approved WHERE channel=? AND sender_id=?", (channel, sender_id))
        return Approval(*row) if row is not None else None

    def in_allowlist(self, channel: str, identity: str) -> bool:
        return _identity(identity) in self.allowlists.get(channel, frozenset())

    # --- internals --------------------------------------------------------------------------
    def _prune(self, now: float) -> None:
        self._db.execute("DELETE FROM pending WHERE created <= ?", (now - CODE_TTL_S,))
        self._db.execute("DELETE FROM replied WHERE at <= ?", (now - REPLY_INTERVAL_S,))

    def _new_code(self) -> str:
        while True:
            code = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))
            if self._db.execute("SELECT 1 FROM pending WHERE code=?", (code,)).fetchone() is None:
                return code
