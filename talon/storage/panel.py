"""The web panel's store (``talon.ui``): its sign-in state, its audit log, a chat index, and the
read-only queries its pages make over the control tables (usage, approvals).

Everything the panel keeps is here, not in a worker's memory, so any worker serves any request:
sessions (by the sha256 of their cookie, never the cookie itself), one-time sign-in links (by the
sha256 of their token), failed sign-ins per address (rate limiting), the audit log of what was done
in the panel, and one row per conversation (title, people, last activity, messages received)
that ``talon.ui.index.ChatIndexer`` writes from what the bridge receives, in batches: listing
1,000 chats reads 1,000 rows, not 100,000 messages. Usage is read from a daily rollup that a
trigger on the usage table keeps.

Implementations: ``talon.storage.embedded.panel.SqlitePanelStore`` (tables in the embedded
``control.sqlite3``, beside usage and approvals, so one query can join them) and
``talon.storage.postgres.panel.PgPanelStore`` (schema script 10). Both share the SQL below
(``SqlPanelQueries``); only the placeholders and table names differ.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from talon.storage.approvals import Approval

PEOPLE_CHARS = 300  # the people of a chat: names added while the list is shorter than this
TITLE_MAX = 200


@dataclass(frozen=True)
class PanelSession:
    token_hash: str
    csrf: str
    who: str  # "password" or "link"
    address: str
    created: float
    last_seen: float


@dataclass(frozen=True)
class ChatRow:
    channel: str
    chat_id: str
    title: str
    people: str  # comma-separated names, latest last
    last_at: float
    messages: int  # messages received from the chat
    tokens: int = 0  # model tokens spent for it (the usage store)

    @property
    def key(self) -> str:
        return f"{self.channel}:{self.chat_id}"


@dataclass
class ChatNote:
    """What arrived in one conversation since the chat index was last written (``talon.ui.index``)."""

    channel: str
    chat_id: str
    title: str
    people: list[str]
    last_at: float
    messages: int


@dataclass(frozen=True)
class SentFile:
    """A file the agent sent in a conversation, kept in the attachment store (the web chat's):
    the reference its reply wrote (``path``) and the stored object it became."""

    sha: str
    mime: str
    name: str
    path: str
    at: float


@dataclass(frozen=True)
class AuditEntry:
    at: float
    who: str
    action: str
    detail: str
    address: str


@dataclass(frozen=True)
class UsageRow:
    key: str  # the person, chat, model or day
    calls: int
    input_tokens: int
    output_tokens: int
    cost: float

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


Dimension = Literal["person", "chat", "model", "day"]


class PanelStore(Protocol):
    # --- sign-in ---------------------------------------------------------------------------
    async def add_session(self, session: PanelSession) -> None: ...

    async def session(self, token_hash: str) -> PanelSession | None: ...

    async def touch_session(self, token_hash: str, now: float) -> None: ...

    async def end_session(self, token_hash: str) -> None: ...

    async def prune_sessions(self, idle_before: float) -> int: ...

    async def add_link(self, token_hash: str, expires: float) -> None: ...

    async def use_link(self, token_hash: str, now: float) -> bool:
        """True once for a live link (it is gone after); False for an unknown, used or expired one."""
        ...

    async def add_failure(self, address: str, at: float) -> None: ...

    async def failures(self, address: str, since: float) -> int: ...

    # --- the audit log and the chat index --------------------------------------------------
    async def audit(self, entry: AuditEntry) -> None: ...

    async def audit_log(self, limit: int = 200) -> list[AuditEntry]: ...

    async def note_messages(self, notes: list[ChatNote], answered: dict[str, int] | None = None) -> None:
        """Add what arrived to the chat index, and ``answered`` (UTC day -> messages answered) to
        the day counts, in one transaction (one connection)."""
        ...

    async def note_message(self, channel: str, chat_id: str, title: str, person: str, at: float) -> None: ...

    async def chats(self, query: str = "", limit: int = 200) -> list[ChatRow]:
        """Conversations, latest activity first; ``query`` narrows to those whose channel, id,
        title or people contain it (case-insensitive)."""
        ...

    async def chat(self, channel: str, chat_id: str) -> ChatRow | None: ...

    async def chat_count(self) -> int: ...

    async def note_sent(self, channel: str, chat_id: str, sent: SentFile) -> None:
        """Remember a file the agent sent in a conversation (once per object and reference)."""
        ...

    async def sent_files(self, channel: str, chat_id: str, limit: int = 5000) -> list[SentFile]:
        """The files the agent sent in a conversation, newest first."""
        ...

    async def per_day(self, since: float) -> list[tuple[str, int]]:
        """Messages answered per UTC day (``YYYY-MM-DD``) from ``since`` on."""
        ...

    # --- read-only views of the control tables ---------------------------------------------
    async def pending_approvals(self, limit: int = 200) -> list[Approval]: ...

    async def decided_approvals(self, limit: int = 200) -> list[Approval]: ...

    async def usage_by(self, dimension: Dimension, since: float, limit: int = 200) -> list[UsageRow]: ...

    async def close(self) -> None: ...


_DAY = "day"


class SqlPanelQueries(abc.ABC):
    """The SQL of both implementations, written with ``%s`` placeholders."""

    T: dict[str, str]  # logical table name -> real one
    APPROVAL_COLUMNS: str
    FIND: str  # the SQL function giving the position of a substring (0: not found)
    LIKE: str = "LIKE"

    @abc.abstractmethod
    async def _all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    @abc.abstractmethod
    async def _run(self, sql: str, params: Sequence[Any] = ()) -> int: ...

    @abc.abstractmethod
    async def _run_many(self, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        """The statements in order, in one transaction."""

    @abc.abstractmethod
    def _approval(self, row: tuple[Any, ...]) -> Approval: ...

    def _sql(self, sql: str) -> str:
        return sql.format(**self.T)

    async def add_session(self, session: PanelSession) -> None:
        await self._run(self._sql("INSERT INTO {sessions} (token_hash, csrf, who, address, created, last_seen) "
                                  "VALUES (%s, %s, %s, %s, %s, %s)"),
                        (session.token_hash, session.csrf, session.who, session.address, session.created,
                         session.last_seen))

    async def session(self, token_hash: str) -> PanelSession | None:
        rows = await self._all(self._sql("SELECT token_hash, csrf, who, address, created, last_seen FROM {sessions} "
                                         "WHERE token_hash = %s"), (token_hash,))
        return PanelSession(*rows[0]) if rows else None

    async def touch_session(self, token_hash: str, now: float) -> None:
        await self._run(self._sql("UPDATE {sessions} SET last_seen = %s WHERE token_hash = %s AND last_seen < %s"),
                        (now, token_hash, now))

    async def end_session(self, token_hash: str) -> None:
        await self._run(self._sql("DELETE FROM {sessions} WHERE token_hash = %s"), (token_hash,))

    async def prune_sessions(self, idle_before: float) -> int:
        return await self._run(self._sql("DELETE FROM {sessions} WHERE last_seen < %s"), (idle_before,))

    async def add_link(self, token_hash: str, expires: float) -> None:
        await self._run(self._sql("INSERT INTO {links} (token_hash, expires) VALUES (%s, %s)"), (token_hash, expires))

    async def use_link(self, token_hash: str, now: float) -> bool:
        # One statement: of two workers given the same link at once, one deletes the row.
        used = await self._run(self._sql("DELETE FROM {links} WHERE token_hash = %s AND expires > %s"),
                               (token_hash, now))
        await self._run(self._sql("DELETE FROM {links} WHERE expires <= %s"), (now,))
        return used == 1

    async def add_failure(self, address: str, at: float) -> None:
        await self._run(self._sql("INSERT INTO {failures} (address, at) VALUES (%s, %s)"), (address, at))
        await self._run(self._sql("DELETE FROM {failures} WHERE at < %s"), (at - 86400.0,))

    async def failures(self, address: str, since: float) -> int:
        rows = await self._all(self._sql("SELECT count(*) FROM {failures} WHERE address = %s AND at >= %s"),
                               (address, since))
        return int(rows[0][0]) if rows else 0

    async def audit(self, entry: AuditEntry) -> None:
        await self._run(self._sql("INSERT INTO {audit} (at, who, action, detail, address) VALUES (%s, %s, %s, %s, %s)"),
                        (entry.at, entry.who, entry.action, entry.detail, entry.address))

    async def audit_log(self, limit: int = 200) -> list[AuditEntry]:
        rows = await self._all(self._sql("SELECT at, who, action, detail, address FROM {audit} "
                                         "ORDER BY at DESC, id DESC LIMIT %s"), (limit,))
        return [AuditEntry(*r) for r in rows]

    async def note_message(self, channel: str, chat_id: str, title: str, person: str, at: float) -> None:
        await self.note_messages([ChatNote(channel, chat_id, title, [person] if person else [], at, 1)])

    async def note_messages(self, notes: list[ChatNote], answered: dict[str, int] | None = None) -> None:
        statements: list[tuple[str, tuple[Any, ...]]] = []
        days: dict[str, int] = {}
        upsert = self._sql(
            "INSERT INTO {chats} (channel, chat_id, title, people, last_at, messages) VALUES (%s, %s, %s, '', %s, %s) "
            "ON CONFLICT (channel, chat_id) DO UPDATE SET title = CASE WHEN EXCLUDED.title = '' THEN {chats}.title "
            "ELSE EXCLUDED.title END, last_at = EXCLUDED.last_at, messages = {chats}.messages + EXCLUDED.messages")
        # A person is added to the chat's list once, while the list is short (the first few who spoke).
        person = self._sql(
            f"UPDATE {{chats}} SET people = CASE WHEN people = '' THEN %s ELSE people || ', ' || %s END "
            f"WHERE channel = %s AND chat_id = %s AND {self.FIND}(', ' || people || ', ', %s) = 0 "
            f"AND length(people) < {PEOPLE_CHARS}")
        for note in notes:
            statements.append((upsert, (note.channel, note.chat_id, note.title[:TITLE_MAX], note.last_at, note.messages)))
            for name in note.people:
                statements.append((person, (name, name, note.channel, note.chat_id, f", {name}, ")))
            day = time.strftime("%Y-%m-%d", time.gmtime(note.last_at))
            days[day] = days.get(day, 0) + note.messages
        day_upsert = self._sql("INSERT INTO {days} (day, messages) VALUES (%s, %s) ON CONFLICT (day) DO UPDATE "
                               "SET messages = {days}.messages + EXCLUDED.messages")
        statements += [(day_upsert, (day, n)) for day, n in sorted(days.items())]
        answer_upsert = self._sql("INSERT INTO {days} (day, messages, answered) VALUES (%s, 0, %s) ON CONFLICT (day) "
                                  "DO UPDATE SET answered = {days}.answered + EXCLUDED.answered")
        statements += [(answer_upsert, (day, n)) for day, n in sorted((answered or {}).items()) if n]
        if not statements:
            return
        await self._run_many(statements)

    def _chat_select(self) -> str:
        return self._sql(
            "SELECT c.channel, c.chat_id, c.title, c.people, c.last_at, c.messages, "
            "coalesce((SELECT sum(u.input_tokens + u.output_tokens) FROM {usage} u WHERE u.channel = c.channel "
            "AND u.chat_id = c.chat_id), 0) FROM {chats} c")

    async def chats(self, query: str = "", limit: int = 200) -> list[ChatRow]:
        where, params = "", []
        if query.strip():
            pattern = "%" + query.strip().lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            where = (" WHERE lower(c.channel || ':' || c.chat_id || ' ' || c.title || ' ' || c.people) "
                     f"{self.LIKE} %s ESCAPE '\\'")
            params.append(pattern)
        rows = await self._all(self._chat_select() + where + " ORDER BY c.last_at DESC LIMIT %s", (*params, limit))
        return [ChatRow(r[0], r[1], r[2], r[3], float(r[4]), int(r[5]), int(r[6])) for r in rows]

    async def chat(self, channel: str, chat_id: str) -> ChatRow | None:
        rows = await self._all(self._chat_select() + " WHERE c.channel = %s AND c.chat_id = %s", (channel, chat_id))
        if not rows:
            return None
        r = rows[0]
        return ChatRow(r[0], r[1], r[2], r[3], float(r[4]), int(r[5]), int(r[6]))

    async def note_sent(self, channel: str, chat_id: str, sent: SentFile) -> None:
        await self._run(self._sql("INSERT INTO {sent} (channel, chat_id, sha, mime, name, path, at) "
                                  "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (channel, chat_id, sha, path) "
                                  "DO NOTHING"),
                        (channel, chat_id, sent.sha, sent.mime, sent.name[:300], sent.path[:1000], sent.at))

    async def sent_files(self, channel: str, chat_id: str, limit: int = 5000) -> list[SentFile]:
        rows = await self._all(self._sql("SELECT sha, mime, name, path, at FROM {sent} WHERE channel = %s AND "
                                         "chat_id = %s ORDER BY at DESC LIMIT %s"), (channel, chat_id, limit))
        return [SentFile(str(r[0]), str(r[1]), str(r[2]), str(r[3]), float(r[4])) for r in rows]

    async def chat_count(self) -> int:
        rows = await self._all(self._sql("SELECT count(*) FROM {chats}"))
        return int(rows[0][0]) if rows else 0

    async def per_day(self, since: float) -> list[tuple[str, int]]:
        first = time.strftime("%Y-%m-%d", time.gmtime(since))
        rows = await self._all(self._sql("SELECT day, answered FROM {days} WHERE day >= %s ORDER BY day"), (first,))
        return [(str(r[0]), int(r[1])) for r in rows]

    async def pending_approvals(self, limit: int = 200) -> list[Approval]:
        rows = await self._all(self._sql(f"SELECT {self.APPROVAL_COLUMNS} FROM {{approvals}} WHERE status = 'pending' "
                                         "ORDER BY created LIMIT %s"), (limit,))
        return [self._approval(r) for r in rows]

    async def decided_approvals(self, limit: int = 200) -> list[Approval]:
        rows = await self._all(self._sql(f"SELECT {self.APPROVAL_COLUMNS} FROM {{approvals}} WHERE status <> 'pending' "
                                         "ORDER BY decided_at DESC LIMIT %s"), (limit,))
        return [self._approval(r) for r in rows]

    async def usage_by(self, dimension: Dimension, since: float, limit: int = 200) -> list[UsageRow]:
        """Sums per person, chat, model or day over the UTC days from ``since``'s on (the daily
        rollup the usage table's trigger keeps)."""
        key = {"person": "channel || ':' || person", "chat": "channel || ':' || chat_id", "model": "model",
               "day": "day"}[dimension]
        # A further share of a shared call is the same call: counted once, except per person.
        calls = "sum(person_calls)" if dimension == "person" else "sum(calls)"
        order = "k DESC" if dimension == "day" else "sum(input_tokens + output_tokens) DESC"
        first = time.strftime("%Y-%m-%d", time.gmtime(since))
        rows = await self._all(self._sql(
            f"SELECT {key} AS k, {calls}, sum(input_tokens), sum(output_tokens), coalesce(sum(cost), 0) "
            f"FROM {{usage}} WHERE day >= %s GROUP BY k ORDER BY {order} LIMIT %s"), (first, limit))
        return [UsageRow(str(r[0]), int(r[1] or 0), int(r[2] or 0), int(r[3] or 0), float(r[4] or 0.0)) for r in rows]
