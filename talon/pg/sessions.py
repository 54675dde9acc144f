"""Sessions in PostgreSQL: the same append-only log per chat thread, one row per message.

The context files (archives of summarized turns, evicted tool outputs) stay files under
``TALON_DATA_DIR/sessions/<channel>/<chat>/context/``, at the paths the agent is shown; with many
workers that directory is on shared storage (checked at start, see ``talon.workspace_marker``).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from pathlib import Path

from talon.agent.session import ChatKey, SessionStore
from talon.content import Message
from talon.pg.db import Database

_CACHED_THREADS = 64


class PgSessionStore(SessionStore):
    def __init__(self, db: Database, data_dir: Path) -> None:
        super().__init__(data_dir)
        self.db = db
        # (channel, chat, thread) -> messages parsed so far; rows are append-only, so a later
        # load reads only the rows after the last one seen (whichever worker wrote them).
        self._rows: OrderedDict[tuple[str, str, str], list[Message]] = OrderedDict()

    def current_thread(self, chat: ChatKey) -> str:
        row = self.db.fetchone("SELECT current FROM talon_threads WHERE channel = %s AND chat_id = %s",
                               (chat.channel, chat.chat_id))
        return str(row[0]) if row and row[0] else "main"

    def new_thread(self, chat: ChatKey) -> str:
        name = time.strftime("t%Y%m%d-%H%M%S", time.gmtime())
        candidate, suffix = name, 0
        while self.db.fetchone("SELECT 1 FROM talon_session_lines WHERE channel = %s AND chat_id = %s "
                               "AND thread = %s LIMIT 1", (chat.channel, chat.chat_id, candidate)):
            suffix += 1
            candidate = f"{name}-{suffix}"
        self.db.execute("INSERT INTO talon_threads (channel, chat_id, current) VALUES (%s, %s, %s) "
                        "ON CONFLICT (channel, chat_id) DO UPDATE SET current = EXCLUDED.current",
                        (chat.channel, chat.chat_id, candidate))
        return candidate

    def load(self, chat: ChatKey, thread: str | None = None) -> list[Message]:
        name = thread or self.current_thread(chat)
        key = (chat.channel, chat.chat_id, name)
        cached = self._rows.get(key, [])
        rows = self.db.fetchall("SELECT body FROM talon_session_lines WHERE channel = %s AND chat_id = %s "
                                "AND thread = %s AND n > %s ORDER BY n",
                                (chat.channel, chat.chat_id, name, len(cached)))
        messages = cached + [Message.from_json(str(r[0])) for r in rows]
        self._rows[key] = messages
        self._rows.move_to_end(key)
        while len(self._rows) > _CACHED_THREADS:
            self._rows.popitem(last=False)
        return list(messages)

    def append(self, chat: ChatKey, *messages: Message, thread: str | None = None) -> None:
        if not messages:
            return
        name = thread or self.current_thread(chat)
        # One statement: numbered after the thread's last row, atomically.
        self.db.execute(
            "INSERT INTO talon_session_lines (channel, chat_id, thread, n, body) "
            "SELECT %s, %s, %s, base.m + b.ord, b.body FROM "
            "(SELECT coalesce(max(n), 0) AS m FROM talon_session_lines "
            " WHERE channel = %s AND chat_id = %s AND thread = %s) base, "
            "unnest(%s::text[]) WITH ORDINALITY AS b(body, ord)",
            (chat.channel, chat.chat_id, name, chat.channel, chat.chat_id, name,
             [m.to_json() for m in messages]))

    def size_bytes(self, chat: ChatKey) -> int:
        row = self.db.fetchone("SELECT coalesce(sum(octet_length(body) + 1), 0) FROM talon_session_lines "
                               "WHERE channel = %s AND chat_id = %s AND thread = %s",
                               (chat.channel, chat.chat_id, self.current_thread(chat)))
        return int(row[0]) if row else 0
