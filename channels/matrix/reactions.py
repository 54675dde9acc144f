"""The acknowledgement reaction (``TALON_MATRIX_ACK_REACTION``, 👀 by default; empty for none):
set on a message when its turn takes it up, redacted once the reply is delivered. Both are
cosmetic calls of the room's budget (setting it pays for the redaction too)."""

from __future__ import annotations

from talon.bounded import BoundedMap
from talon.envelope import InboundMessage

from channels.matrix.api import MatrixApi, check


class Reactions:
    def __init__(self, api: MatrixApi, emoji: str) -> None:
        self.api = api
        self.emoji = emoji.strip()
        self._set: BoundedMap[str, str] = BoundedMap("matrix_reactions")  # message key -> reaction event

    async def acknowledge(self, message: InboundMessage) -> None:
        if not self.emoji or not message.message_id.startswith("$") or message.key in self._set:
            return
        if not self.api.budget.try_spend(message.chat_id, calls=2):
            return
        answer = check(await self.api.client.room_send(message.chat_id, "m.reaction", {"m.relates_to": {
            "rel_type": "m.annotation", "event_id": message.message_id, "key": self.emoji}}), "reaction")
        self._set[message.key] = str(answer.event_id)

    async def unacknowledge(self, message: InboundMessage) -> None:
        event_id = self._set.pop(message.key, None)
        if event_id is not None:
            check(await self.api.client.room_redact(message.chat_id, event_id), "redact reaction")
