"""The chat index the panel lists conversations from: one row per conversation (title, people,
last activity, messages received), kept up to date from the bridge (``Bridge.observers``), and
the messages answered per UTC day the overview charts (``Bridge.answer_observers``: a message
counts once the agent's reply to it is delivered; a failed turn's apology, a command's reply or
a scheduled task's run does not).

Noting a message costs no I/O: it is added to a small map in memory, and the map is written once
a second in one transaction (``ChatIndexer.flush``), so a busy worker pays one statement batch per
second for the index, never a database connection per message (under load, that would starve
the turns of connections). A batch that cannot be written is kept for the next try; a worker that
dies loses at most its last second of counts (the index is a summary; the messages themselves are
in the session store).
"""

from __future__ import annotations

import asyncio
import logging
import time

from talon.envelope import InboundMessage
from talon.storage.panel import ChatNote, PanelStore

log = logging.getLogger(__name__)

FLUSH_S = 1.0
PENDING_MAX = 10_000  # conversations kept while the store does not answer; then the oldest go


def title_of(message: InboundMessage) -> str:
    if message.is_group:
        title = message.chat_title or message.chat_id
        return f"{title} / {message.thread_title}" if message.thread_title else title
    return message.sender_name or (f"@{message.sender_username}" if message.sender_username else message.chat_id)


def person_of(message: InboundMessage) -> str:
    name = message.sender_name or (f"@{message.sender_username}" if message.sender_username else "")
    return f"{name} ({message.sender_id})" if name else message.sender_id


class ChatIndexer:
    def __init__(self, store: PanelStore, flush_s: float = FLUSH_S) -> None:
        self.store = store
        self.flush_s = flush_s
        self.pending: dict[tuple[str, str], ChatNote] = {}
        self.answered: dict[str, int] = {}  # UTC day -> messages answered, not yet written
        self._task: asyncio.Task[None] | None = None

    async def observe(self, message: InboundMessage) -> None:
        """A bridge observer: the message is counted in memory (no I/O here)."""
        if message.scheduled is not None:  # a task's run is not a message from a person
            return
        key = (message.channel, message.conversation_id)
        note = self.pending.get(key)
        if note is None:
            note = self.pending[key] = ChatNote(key[0], key[1], "", [], 0.0, 0)
        note.title = title_of(message) or note.title
        person = person_of(message)
        if person not in note.people:
            note.people.append(person)
        note.last_at = max(note.last_at, message.received_at)
        note.messages += 1

    async def observe_answer(self, message: InboundMessage) -> None:
        """A bridge answer observer: one more message answered today (no I/O here)."""
        if message.scheduled is not None:
            return
        day = time.strftime("%Y-%m-%d", time.gmtime())
        self.answered[day] = self.answered.get(day, 0) + 1

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="chat-index")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.flush_s)
            await self.flush()

    async def flush(self) -> None:
        batch, self.pending = self.pending, {}
        answered, self.answered = self.answered, {}
        if not batch and not answered:
            return
        try:
            await self.store.note_messages(list(batch.values()), answered)
        except asyncio.CancelledError:
            self._merge(batch, answered)
            raise
        except Exception as exc:
            log.warning("chat index: %d conversation(s) not written (%s: %s); trying again", len(batch),
                        type(exc).__name__, exc)
            self._merge(batch, answered)

    def _merge(self, batch: dict[tuple[str, str], ChatNote], answered: dict[str, int] | None = None) -> None:
        for day, n in (answered or {}).items():
            self.answered[day] = self.answered.get(day, 0) + n
        for key, old in batch.items():
            new = self.pending.get(key)
            if new is None:
                self.pending[key] = old
                continue
            new.title = new.title or old.title
            new.people = old.people + [p for p in new.people if p not in old.people]
            new.last_at = max(new.last_at, old.last_at)
            new.messages += old.messages
        while len(self.pending) > PENDING_MAX:
            self.pending.pop(next(iter(self.pending)))

    async def stop(self) -> None:
        """The last counts written; called when Talon stops."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.flush()
