"""Leases: a named right (serve this chat, poll Telegram) held by one worker until it expires.

A lease is one row. Taking it is one conditional upsert: it succeeds when the row is absent,
expired, or already ours. The holder renews the leases it uses in one statement; one it fails to
renew in time is free for others. Expiry is the database's clock, so workers' clocks do not matter.
"""

from __future__ import annotations

from talon.pg.db import Database


class Leases:
    def __init__(self, db: Database, holder: str, ttl_s: float) -> None:
        self.db = db
        self.holder = holder
        self.ttl_s = ttl_s

    def acquire(self, name: str) -> bool:
        row = self.db.fetchone(
            "INSERT INTO talon_leases (name, holder, expires) "
            "VALUES (%s, %s, clock_timestamp() + make_interval(secs => %s)) "
            "ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, expires = EXCLUDED.expires "
            "WHERE talon_leases.expires <= clock_timestamp() OR talon_leases.holder = EXCLUDED.holder "
            "RETURNING 1",
            (name, self.holder, self.ttl_s))
        return row is not None

    def renew(self, names: list[str]) -> set[str]:
        """Extend the named leases, where still ours and live; the names renewed."""
        rows = self.db.fetchall(
            "UPDATE talon_leases SET expires = clock_timestamp() + make_interval(secs => %s) "
            "WHERE holder = %s AND name = ANY(%s) AND expires > clock_timestamp() RETURNING name",
            (self.ttl_s, self.holder, names))
        return {str(r[0]) for r in rows}

    def release(self, name: str) -> None:
        self.db.execute("DELETE FROM talon_leases WHERE name = %s AND holder = %s", (name, self.holder))

    def release_all(self) -> None:
        self.db.execute("DELETE FROM talon_leases WHERE holder = %s", (self.holder,))

    def holder_of(self, name: str) -> str | None:
        row = self.db.fetchone("SELECT holder FROM talon_leases WHERE name = %s AND expires > clock_timestamp()",
                               (name,))
        return str(row[0]) if row else None

    def summary(self) -> tuple[int, int, int]:
        """(live leases, expired ones not yet taken over, distinct live holders), for doctor."""
        row = self.db.fetchone(
            "SELECT count(*) FILTER (WHERE expires > clock_timestamp()), "
            "count(*) FILTER (WHERE expires <= clock_timestamp()), "
            "count(DISTINCT holder) FILTER (WHERE expires > clock_timestamp()) FROM talon_leases")
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2])


def chat_lease(channel: str, chat_id: str) -> str:
    return f"chat:{channel}:{chat_id}"
