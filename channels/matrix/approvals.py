"""Approval prompts on Matrix: a message naming the call, answered by a reaction on it
(👍 approve, 👎 deny, ♾️ always in this room) or by a reply "yes"/"no" (the bridge matches
replies to the approval waiting in the conversation).

The prompt carries its approval's id (``org.talon.approval``), so a reaction is matched to it by
reading the prompt back from the homeserver: it works after a restart and on any worker, and
only a prompt the bot itself sent counts. The person reacting is checked by the approvals
(``talon.control``): only the person who asked, or an approver, may decide; anyone else is told
so in the room, and nothing is decided. The prompt is then edited to say what was decided and by
whom.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from talon.errors import DeliveryError

from channels.base import BridgeHandle
from channels.matrix.api import CHANNEL, MatrixApi, check
from channels.matrix.delivery import Delivery
from channels.matrix.intake import relation

if TYPE_CHECKING:
    from talon.control.approvals import Choice
    from talon.storage.approvals import Approval

log = logging.getLogger(__name__)

APPROVAL_KEY = "org.talon.approval"
REACTIONS: dict[str, "Choice"] = {
    "\N{THUMBS UP SIGN}": "approve", "\N{THUMBS UP SIGN}\N{VARIATION SELECTOR-16}": "approve",
    "\N{WHITE HEAVY CHECK MARK}": "approve",
    "\N{THUMBS DOWN SIGN}": "deny", "\N{THUMBS DOWN SIGN}\N{VARIATION SELECTOR-16}": "deny",
    "\N{CROSS MARK}": "deny",
    "\N{PERMANENT PAPER SIGN}\N{VARIATION SELECTOR-16}": "always", "\N{PERMANENT PAPER SIGN}": "always",
}
HOW = ("React \N{THUMBS UP SIGN} to allow it, \N{THUMBS DOWN SIGN} to refuse it, "
       "\N{PERMANENT PAPER SIGN}\N{VARIATION SELECTOR-16} to always allow it in this room; or reply yes / no.")


class ApprovalPrompts:
    def __init__(self, api: MatrixApi, delivery: Delivery) -> None:
        self.api = api
        self.delivery = delivery
        self._bridge: BridgeHandle | None = None

    def bind(self, bridge: BridgeHandle) -> None:
        self._bridge = bridge

    async def ask_approval(self, approval: Approval, text: str) -> str | None:
        body = f"{text}\n\n{HOW}"
        content: dict[str, Any] = {"msgtype": "m.text", "body": body, APPROVAL_KEY: approval.id}
        if approval.thread_id:
            content["m.relates_to"] = {"rel_type": "m.thread", "event_id": approval.thread_id,
                                       "is_falling_back": True, "m.in_reply_to": {"event_id": approval.thread_id}}
        return await self.api.send(approval.platform_chat, content, "approval prompt")

    async def settle_approval(self, approval: Approval, text: str) -> None:
        room = approval.platform_chat
        if approval.prompt_id is None:
            await self.delivery.notice(room, text, thread_id=approval.thread_id)
            return
        new = {"msgtype": "m.text", "body": text}
        await self.api.send(room, {**new, "body": f"* {text}", "m.new_content": new,
                                   "m.relates_to": {"rel_type": "m.replace", "event_id": approval.prompt_id}},
                            "settle approval")

    async def on_reaction(self, room: str, event: dict[str, Any]) -> None:
        content = event.get("content")
        sender = str(event.get("sender", ""))
        if not isinstance(content, dict) or sender == self.api.user_id or self._bridge is None:
            return
        rel = relation(content)
        choice = REACTIONS.get(str(rel.get("key", "")))
        target = rel.get("event_id")
        control = self._bridge.control
        if rel.get("rel_type") != "m.annotation" or choice is None or not isinstance(target, str) or control is None:
            return
        try:
            prompt = check(await self.api.client.room_get_event(room, target), "read the prompt")
        except DeliveryError as exc:
            log.info("matrix: room=%s: reaction on %s: the event cannot be read (%s)", room, target, exc)
            return
        source = prompt.event.source
        approval_id = (source.get("content") or {}).get(APPROVAL_KEY)
        if source.get("sender") != self.api.user_id or not isinstance(approval_id, str):
            return  # a reaction on something that is not one of our prompts
        matrix_room = self.api.client.rooms.get(room)
        name = matrix_room.user_name(sender) if matrix_room is not None else None
        level = matrix_room.power_levels.get_user_level(sender) if matrix_room is not None else 0
        answer = await control.approvals.answer(approval_id, choice, CHANNEL, sender, name or sender,
                                                admin=level >= 50 and not self._direct(room))
        if answer.outcome == "decided" and answer.approval is not None:
            await control.approvals.settle(self, answer.approval)
        elif answer.outcome == "refused":
            thread = answer.approval.thread_id if answer.approval is not None else None
            await self.delivery.notice(room, f"{name or sender}: {answer.note}", thread_id=thread)

    def _direct(self, room: str) -> bool:
        matrix_room = self.api.client.rooms.get(room)
        return matrix_room is not None and int(matrix_room.joined_count or len(matrix_room.users)) <= 2
