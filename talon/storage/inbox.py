"""The durable inbox: every incoming message is stored before its turn starts.

It gives three things at once: durability across a crash, dedup by the platform's message key
(Telegram redelivery, Twilio webhook retries), and a global order (``seq``) so a restart replays
each chat's pending messages in the order they arrived. Finished rows are kept for a while so a
late retry of an old message is still recognised.

Implementations: ``MemoryInbox`` (tests), ``talon.storage.embedded.inbox.SqliteInbox`` and
``talon.storage.postgres.inbox.PgInbox`` (shared by many workers: ``SharedInbox``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from talon.envelope import InboundMessage


@dataclass(frozen=True)
class InboxItem:
    seq: int
    message: InboundMessage
    attempts: int
    delivered_parts: int
    # The platform message that shows this message's answer while it is written (a streamed
    # message that is edited); the final reply edits it, also after a restart.
    live_message: str | None = None


# The columns the durable inboxes (SQLite, PostgreSQL) read an item from, in ``item_from_row``'s order.
INBOX_COLUMNS = "seq, payload, attempts, delivered_parts, live_message_id"


def item_from_row(row: tuple[object, ...]) -> InboxItem:
    seq, payload, attempts, delivered, live = row
    return InboxItem(seq=int(seq),  # type: ignore[call-overload]
                     message=InboundMessage.model_validate_json(str(payload)),
                     attempts=int(attempts), delivered_parts=int(delivered),  # type: ignore[call-overload]
                     live_message=str(live) if live is not None else None)


class InboxStore(Protocol):
    """What the bridge needs of an inbox."""

    async def add(self, message: InboundMessage) -> InboxItem | None:
        """Store a new message; None when this message was seen before (a duplicate)."""

    async def seen(self, key: str) -> bool: ...

    async def pending(self) -> list[InboxItem]:
        """Every pending message, oldest first."""

    async def begin_attempt(self, key: str) -> InboxItem | None:
        """Count one more attempt at the message; its state after that (None: unknown key)."""

    async def give_back_attempt(self, key: str) -> None:
        """The attempt in progress was cut short for a reason that is not the message's (the
        worker stopped, or lost the chat's lease): it does not count toward the limit. The
        count never drops below one, so a resumed message is still seen as resumed."""

    async def set_delivered_parts(self, key: str, parts: int) -> None: ...

    async def set_live_message(self, key: str, message_id: str) -> None: ...

    async def replace_pending(self, message: InboundMessage) -> bool:
        """Store an edited version of a message whose turn has not started; False otherwise."""

    async def mark_done(self, key: str, *, delivered_parts: int | None = None) -> None:
        """The message is answered (with ``delivered_parts`` recorded in the same write)."""

    async def status(self, key: str) -> str | None: ...

    async def close(self) -> None: ...


def inbox_lane(message: InboundMessage) -> str:
    """The ordering key of a message in the shared inbox (``SharedInbox``): its chat, whose pending
    messages are served one at a time, oldest first, by the worker holding the chat's lease. A
    background job's run (``talon.jobs``) has a lane of its own, so a running job never holds the
    chat's lease; the message delivering its answer (``BackgroundJobRun.answer``) is in the chat's."""
    if message.job is not None and not message.job.answer:
        return f"{message.chat_id}/job:{message.job.job_id}"
    return message.chat_id


@runtime_checkable
class SharedInbox(InboxStore, Protocol):
    """An inbox many workers share; a chat is served by the worker holding its lease."""

    async def next_pending(self, channel: str, chat_id: str) -> InboxItem | None:
        """The chat's oldest pending message."""

    async def add_and_lease(self, message: InboundMessage, lease: str, holder: str,
                            ttl_s: float) -> tuple[InboxItem | None, bool]:
        """``add``, and take the lease ``lease`` for ``holder`` (as ``Leases.acquire``) in the
        same write: the item (None for a duplicate) and whether the lease is now ``holder``'s."""

    async def claim_next(self, channel: str, chat_id: str, tried: list[int]) -> InboxItem | None:
        """The chat's oldest pending message with one more attempt counted, unless its ``seq`` is
        in ``tried`` (returned as it is); None when the chat has none."""

    async def finish(self, key: str, delivered_parts: int, lease: str, holder: str) -> bool:
        """``mark_done``, and give the lease back when the chat has nothing else pending, in one
        write; True when the lease was given back."""

    async def pending_chats(self, channels: list[str], limit: int) -> list[tuple[str, str]]:
        """Chats with pending messages whose lease is free or expired, oldest message first."""


@dataclass
class _Row:
    item: InboxItem
    channel: str
    chat_id: str
    status: str = "pending"


class MemoryInbox:
    """An inbox in a dict, for tests: the same answers as the durable ones, no durability."""

    def __init__(self) -> None:
        self._rows: dict[str, _Row] = {}
        self._seq = itertools.count(1)
        self.closed = False

    async def add(self, message: InboundMessage) -> InboxItem | None:
        if message.key in self._rows:
            return None
        item = InboxItem(seq=next(self._seq), message=message, attempts=0, delivered_parts=0)
        self._rows[message.key] = _Row(item, message.channel, message.chat_id)
        return item

    async def seen(self, key: str) -> bool:
        return key in self._rows

    async def pending(self) -> list[InboxItem]:
        return sorted((r.item for r in self._rows.values() if r.status == "pending"), key=lambda i: i.seq)

    async def begin_attempt(self, key: str) -> InboxItem | None:
        row = self._rows.get(key)
        if row is None:
            return None
        row.item = replace(row.item, attempts=row.item.attempts + 1)
        return row.item

    async def give_back_attempt(self, key: str) -> None:
        row = self._rows.get(key)
        if row is not None and row.item.attempts > 1:
            row.item = replace(row.item, attempts=row.item.attempts - 1)

    async def set_delivered_parts(self, key: str, parts: int) -> None:
        if key in self._rows:
            self._rows[key].item = replace(self._rows[key].item, delivered_parts=parts)

    async def set_live_message(self, key: str, message_id: str) -> None:
        if key in self._rows:
            self._rows[key].item = replace(self._rows[key].item, live_message=message_id)

    async def replace_pending(self, message: InboundMessage) -> bool:
        row = self._rows.get(message.key)
        if row is None or row.status != "pending" or row.item.attempts != 0:
            return False
        row.item = replace(row.item, message=message)
        return True

    async def mark_done(self, key: str, *, delivered_parts: int | None = None) -> None:
        row = self._rows.get(key)
        if row is not None:
            row.status = "done"
            if delivered_parts is not None:
                row.item = replace(row.item, delivered_parts=delivered_parts)

    async def status(self, key: str) -> str | None:
        row = self._rows.get(key)
        return row.status if row is not None else None

    async def close(self) -> None:
        self.closed = True

