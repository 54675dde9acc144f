"""Sessions in PostgreSQL: the same append-only log per chat thread, one row per message.

The context files (archives of summarized turns, evicted tool outputs) stay files under
``TALON_DATA_DIR/sessions/<channel>/<chat>/context/``, at the paths the agent is shown; with many
workers that directory is on shared storage (checked at start, see ``talon.storage.marker``).

Each row also holds when the message was stored, who wrote it and its full-text ``tsvector``
(``'simple'`` configuration, with the chat's token; ``talon.storage.search``) under a GIN index,
written by the same statement that stores the line. ``index_unindexed`` indexes rows stored before
the index existed (``talon migrate``).

Every call is one statement: the current thread is looked up inside the statement that needs it.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

from talon.content import Message
from talon.storage.postgres.db import AsyncDatabase
from talon.storage.search import (SearchHit, chat_token, clamp_limit, index_words, query_words,
                                  searchable_text)
from talon.storage.sessions import ChatKey, SessionFiles, new_thread_name, stamped

_CACHED_CHATS = 64
# The chat's current thread, inside a statement whose first two parameters are channel, chat id.
_CURRENT = "coalesce((SELECT current FROM talon_threads WHERE channel = %s AND chat_id = %s), 'main')"


class PgSessions(SessionFiles):
    def __init__(self, db: AsyncDatabase, data_dir: Path, *, index: bool = True) -> None:
        super().__init__(data_dir)
        self.db = db
        self.index = index  # False (TALON_SEARCH_INDEX=false): no tsvector is written
        # chat -> (thread, messages read so far); rows are append-only, so a later load reads only
        # the rows after the last one seen (whichever worker wrote them).
        self._rows: OrderedDict[ChatKey, tuple[str, list[Message]]] = OrderedDict()

    async def current_thread(self, chat: ChatKey) -> str:
        row = await self.db.fetchone(f"SELECT {_CURRENT}", (chat.channel, chat.chat_id))
        return str(row[0]) if row else "main"

    async def new_thread(self, chat: ChatKey) -> str:
        rows = await self.db.fetchall("SELECT DISTINCT thread FROM talon_session_lines "
                                      "WHERE channel = %s AND chat_id = %s", (chat.channel, chat.chat_id))
        candidate = new_thread_name({str(r[0]) for r in rows})
        await self.db.execute("INSERT INTO talon_threads (channel, chat_id, current) VALUES (%s, %s, %s) "
                              "ON CONFLICT (channel, chat_id) DO UPDATE SET current = EXCLUDED.current",
                              (chat.channel, chat.chat_id, candidate))
        return candidate

    async def load(self, chat: ChatKey, thread: str | None = None) -> list[Message]:
        if thread is None:
            return (await self.load_current(chat))[1]
        return await self._load(chat, thread)

    async def load_current(self, chat: ChatKey) -> tuple[str, list[Message]]:
        cached_thread, cached = self._rows.get(chat, ("", []))
        # One statement: which thread is current, and its rows after those already read (all of
        # them when the current thread is not the cached one).
        rows = await self.db.fetchall(
            f"WITH t AS (SELECT {_CURRENT} AS name) "
            "SELECT t.name, l.body FROM t LEFT JOIN talon_session_lines l ON l.channel = %s "
            "AND l.chat_id = %s AND l.thread = t.name AND l.n > CASE WHEN t.name = %s THEN %s ELSE 0 END "
            "ORDER BY l.n",
            (chat.channel, chat.chat_id, chat.channel, chat.chat_id, cached_thread, len(cached)))
        thread = str(rows[0][0]) if rows else "main"
        base = cached if thread == cached_thread else []
        messages = base + [Message.from_json(str(r[1])) for r in rows if r[1] is not None]
        self._remember(chat, thread, messages)
        return thread, list(messages)

    async def _load(self, chat: ChatKey, thread: str) -> list[Message]:
        cached_thread, cached = self._rows.get(chat, ("", []))
        base = cached if cached_thread == thread else []
        rows = await self.db.fetchall(
            "SELECT body FROM talon_session_lines WHERE channel = %s AND chat_id = %s AND thread = %s "
            "AND n > %s ORDER BY n", (chat.channel, chat.chat_id, thread, len(base)))
        messages = base + [Message.from_json(str(r[0])) for r in rows]
        if cached_thread in ("", thread):
            self._remember(chat, thread, messages)
        return list(messages)

    def _remember(self, chat: ChatKey, thread: str, messages: list[Message]) -> None:
        self._rows[chat] = (thread, messages)
        self._rows.move_to_end(chat)
        while len(self._rows) > _CACHED_CHATS:
            self._rows.popitem(last=False)

    async def append(self, chat: ChatKey, *messages: Message, thread: str | None = None) -> None:
        if not messages:
            return
        ready = stamped(messages)
        bodies = [m.to_json() for m in ready]
        texts = [_indexed_text(chat, m) if self.index else None for m in ready]
        # One statement: numbered after the thread's last row, atomically, indexed as stored.
        if thread is None:
            name, params = _CURRENT, [chat.channel, chat.chat_id]
        else:
            name, params = "%s", [thread]
        await self.db.execute(
            "INSERT INTO talon_session_lines (channel, chat_id, thread, n, body, at, role, sender, search, indexed) "
            f"SELECT %s, %s, t.name, base.m + b.ord, b.body, b.at, b.role, b.sender, "
            "CASE WHEN b.txt IS NULL THEN NULL ELSE to_tsvector('simple', b.txt) END, "
            f"{'true' if self.index else 'false'} "
            f"FROM (SELECT {name} AS name) t, "
            "LATERAL (SELECT coalesce(max(n), 0) AS m FROM talon_session_lines "
            " WHERE channel = %s AND chat_id = %s AND thread = t.name) base, "
            "unnest(%s::text[], %s::float8[], %s::text[], %s::text[], %s::text[]) "
            "WITH ORDINALITY AS b(body, at, role, sender, txt, ord)",
            (chat.channel, chat.chat_id, *params, chat.channel, chat.chat_id, bodies,
             [m.at for m in ready], [m.role for m in ready],
             [str(m.meta.get("sender") or "") for m in ready], texts))

    async def threads(self, chat: ChatKey | None = None) -> list[tuple[ChatKey, str]]:
        if chat is None:
            rows = await self.db.fetchall("SELECT DISTINCT channel, chat_id, thread FROM talon_session_lines")
        else:
            rows = await self.db.fetchall("SELECT DISTINCT channel, chat_id, thread FROM talon_session_lines "
                                          "WHERE channel = %s AND chat_id = %s", (chat.channel, chat.chat_id))
        return sorted(((ChatKey(str(c), str(i)), str(t)) for c, i, t in rows), key=lambda k: (str(k[0]), k[1]))

    async def search(self, chat: ChatKey, query: str, limit: int = 10) -> list[SearchHit]:
        words = query_words(query)
        if not words or not self.index:
            return []
        # Plain words and the chat's token, ANDed by plainto_tsquery (never tsquery syntax); the
        # chat is also matched by equality on its columns.
        rows = await self.db.fetchall(
            "SELECT thread, at, role, coalesce(sender, ''), body FROM talon_session_lines "
            "WHERE search @@ plainto_tsquery('simple', %s) AND channel = %s AND chat_id = %s "
            "ORDER BY at DESC NULLS LAST, thread DESC, n DESC LIMIT %s",
            (" ".join([*words, chat_token(chat)]), chat.channel, chat.chat_id, clamp_limit(limit)))
        hits = []
        for thread, at, role, sender, body in rows:
            message = Message.from_json(str(body))
            hits.append(SearchHit(str(thread), at, str(role), str(sender), searchable_text(message) or ""))
        return hits

    async def search_all(self, query: str, limit: int = 10) -> list[SearchHit]:
        words = query_words(query)
        if not words or not self.index:
            return []
        rows = await self.db.fetchall(
            "SELECT channel, chat_id, thread, at, role, coalesce(sender, ''), body FROM talon_session_lines "
            "WHERE search @@ plainto_tsquery('simple', %s) ORDER BY at DESC NULLS LAST LIMIT %s",
            (" ".join(words), clamp_limit(limit)))
        hits = []
        for channel, chat_id, thread, at, role, sender, body in rows:
            message = Message.from_json(str(body))
            hits.append(SearchHit(str(thread), at, str(role), str(sender), searchable_text(message) or "",
                                  ChatKey(str(channel), str(chat_id))))
        return hits

    @property
    def search_enabled(self) -> bool:
        return self.index

    async def index_unindexed(self, batch: int = 500) -> int:
        return await index_unindexed(self.db, batch)
    async def size_bytes(self, chat: ChatKey) -> int:
        row = await self.db.fetchone(
            "SELECT coalesce(sum(octet_length(body) + 1), 0) FROM talon_session_lines "
            f"WHERE channel = %s AND chat_id = %s AND thread = {_CURRENT}",
            (chat.channel, chat.chat_id, chat.channel, chat.chat_id))
        return int(row[0]) if row else 0

    async def close(self) -> None:
        """The database is closed by its owner."""


def _indexed_text(chat: ChatKey, message: Message) -> str | None:
    """The words PostgreSQL indexes: the same runs of letters and digits a query is read as (its
    parser would keep ``invoice-march.pdf`` or an e-mail address as one token), and the chat's."""
    text = searchable_text(message)
    return None if text is None else " ".join([*index_words(text), chat_token(chat)])


async def index_unindexed(db: AsyncDatabase, batch: int = 500) -> int:
    """Index the session lines stored before the index existed (schema 10), ``batch`` rows per
    statement; the number indexed (``talon migrate``)."""
    done = 0
    while True:
        rows = await db.fetchall(
            "SELECT channel, chat_id, thread, n, body FROM talon_session_lines WHERE NOT indexed LIMIT %s",
            (batch,))
        if not rows:
            return done
        keys: list[list[object]] = [[], [], [], []]
        ats: list[float | None] = []
        roles: list[str] = []
        senders: list[str] = []
        texts: list[str | None] = []
        for channel, chat_id, thread, n, body in rows:
            message = Message.from_json(str(body))
            for column, value in zip(keys, (channel, chat_id, thread, n)):
                column.append(value)
            ats.append(message.at)
            roles.append(message.role)
            senders.append(str(message.meta.get("sender") or ""))
            texts.append(_indexed_text(ChatKey(str(channel), str(chat_id)), message))
        await db.execute(
            "UPDATE talon_session_lines l SET at = u.at, role = u.role, sender = u.sender, indexed = true, "
            "search = CASE WHEN u.txt IS NULL THEN NULL ELSE to_tsvector('simple', u.txt) END "
            "FROM unnest(%s::text[], %s::text[], %s::text[], %s::int[], %s::float8[], %s::text[], %s::text[], "
            "%s::text[]) AS u(channel, chat_id, thread, n, at, role, sender, txt) "
            "WHERE l.channel = u.channel AND l.chat_id = u.chat_id AND l.thread = u.thread AND l.n = u.n",
            (*keys, ats, roles, senders, texts))
        done += len(rows)
