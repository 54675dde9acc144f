"""Access and pairing in PostgreSQL: the same rules as ``talon.access.AccessGate`` (which holds
the constants and the code format), shared by every worker and by ``talon pair`` on any host."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterable, Mapping

from talon.access import (CODE_ALPHABET, CODE_LENGTH, CODE_TTL_S, MAX_PENDING, REPLY_INTERVAL_S, AccessGate,
                          Approval, Pairing, PendingRequest, _clean_name, _identity, format_code,
                          normalize_code, pairing_reply)
from talon.errors import PairingError
from talon.pg.db import Database

# Serializes pairing writes across workers (pg_advisory_xact_lock key, "talonpai").
_PAIRING_LOCK = 0x74616C6F6E706169 & 0x7FFFFFFFFFFFFFFF


class PgAccessGate(AccessGate):
    def __init__(self, db: Database, allowlists: Mapping[str, Iterable[str]], *, pairing: bool = False,
                 clock: Callable[[], float] = time.time) -> None:
        # Not the SQLite constructor: nothing of this gate lives in the data dir.
        self.db = db
        self.allowlists = {channel: frozenset(_identity(x) for x in ids) for channel, ids in allowlists.items()}
        self.pairing = pairing
        self._clock = clock

    def close(self) -> None:
        """The database is closed by its owner."""

    def allowed(self, channel: str, identities: Iterable[str]) -> bool:
        ids = {_identity(i) for i in identities if i.strip()}
        if not ids:
            return False
        if ids & self.allowlists.get(channel, frozenset()):
            return True
        return self.db.fetchone("SELECT 1 FROM talon_approved WHERE channel = %s AND sender_id = ANY(%s)",
                                (channel, sorted(ids))) is not None

    def request_pairing(self, channel: str, sender_id: str, name: str = "") -> Pairing | None:
        if not self.pairing:
            return None
        now = self._clock()
        with self.db.transaction() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_PAIRING_LOCK,))
            conn.execute("DELETE FROM talon_pairing_pending WHERE created <= %s", (now - CODE_TTL_S,))
            conn.execute("DELETE FROM talon_pairing_replied WHERE at <= %s", (now - REPLY_INTERVAL_S,))
            row = conn.execute("SELECT code FROM talon_pairing_pending WHERE channel = %s AND sender_id = %s",
                               (channel, sender_id)).fetchone()
            if row is not None:
                code = str(row[0])
            else:
                while True:
                    code = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))
                    if conn.execute("SELECT 1 FROM talon_pairing_pending WHERE code = %s", (code,)).fetchone() is None:
                        break
                conn.execute("INSERT INTO talon_pairing_pending (channel, sender_id, name, code, created) "
                             "VALUES (%s, %s, %s, %s, %s)", (channel, sender_id, _clean_name(name), code, now))
                conn.execute("DELETE FROM talon_pairing_pending WHERE id NOT IN (SELECT id FROM "
                             "talon_pairing_pending ORDER BY created DESC, id DESC LIMIT %s)", (MAX_PENDING,))
            recent = conn.execute("SELECT 1 FROM talon_pairing_replied WHERE channel = %s AND sender_id = %s",
                                  (channel, sender_id)).fetchone()
            if recent is None:
                conn.execute("INSERT INTO talon_pairing_replied (channel, sender_id, at) VALUES (%s, %s, %s)",
                             (channel, sender_id, now))
        self.db.count(8)
        shown = format_code(code)
        return Pairing(code=shown, reply=None if recent else pairing_reply(shown))

    def pending(self) -> list[PendingRequest]:
        rows = self.db.fetchall("SELECT channel, sender_id, name, code, created FROM talon_pairing_pending "
                                "WHERE created > %s ORDER BY created, id", (self._clock() - CODE_TTL_S,))
        return [PendingRequest(r[0], r[1], r[2], format_code(r[3]), r[4]) for r in rows]

    def approvals(self) -> list[Approval]:
        rows = self.db.fetchall("SELECT channel, sender_id, name, approved_at FROM talon_approved "
                                "ORDER BY approved_at")
        return [Approval(*r) for r in rows]

    def approve(self, code: str) -> Approval:
        raw = normalize_code(code)
        now = self._clock()
        with self.db.transaction() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_PAIRING_LOCK,))
            row = conn.execute("SELECT channel, sender_id, name FROM talon_pairing_pending "
                               "WHERE code = %s AND created > %s", (raw, now - CODE_TTL_S)).fetchone()
            if row is None:
                raise PairingError(
                    f"no pending request has the code {code.strip()!r}: it is mistyped, or it expired "
                    f"(codes live {CODE_TTL_S / 3600:.0f} hour) or was replaced by newer requests. Ask "
                    "them to message the bot again for a new code; `talon pair` lists the live ones.")
            channel, sender_id, name = row
            conn.execute("INSERT INTO talon_approved (channel, sender_id, name, approved_at) VALUES (%s, %s, %s, %s) "
                         "ON CONFLICT (channel, sender_id) DO UPDATE SET name = EXCLUDED.name, "
                         "approved_at = EXCLUDED.approved_at", (channel, sender_id, name, now))
            conn.execute("DELETE FROM talon_pairing_pending WHERE channel = %s AND sender_id = %s", (channel, sender_id))
            conn.execute("DELETE FROM talon_pairing_replied WHERE channel = %s AND sender_id = %s", (channel, sender_id))
        self.db.count(5)
        return Approval(channel, sender_id, name, now)

    def revoke(self, channel: str, sender_id: str) -> Approval | None:
        row = self.db.fetchone("DELETE FROM talon_approved WHERE channel = %s AND sender_id = %s "
                               "RETURNING channel, sender_id, name, approved_at", (channel, sender_id))
        return Approval(*row) if row is not None else None
