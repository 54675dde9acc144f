"""The chat index the panel lists conversations from: one row per conversation, kept up to date
from the bridge as each message arrives (``Bridge.observers``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from talon.envelope import InboundMessage
from talon.storage.panel import PanelStore


def title_of(message: InboundMessage) -> str:
    if message.is_group:
        title = message.chat_title or message.chat_id
        return f"{title} / {message.thread_title}" if message.thread_title else title
    return message.sender_name or (f"@{message.sender_username}" if message.sender_username else message.chat_id)


def person_of(message: InboundMessage) -> str:
    name = message.sender_name or (f"@{message.sender_username}" if message.sender_username else "")
    return f"{name} ({message.sender_id})" if name else message.sender_id


def chat_indexer(store: PanelStore) -> Callable[[InboundMessage], Awaitable[None]]:
    async def note(message: InboundMessage) -> None:
        if message.scheduled is not None:  # a task's run is not a message from a person
            return
        await store.note_message(message.channel, message.conversation_id, title_of(message), person_of(message),
                                 message.received_at)

    return note
