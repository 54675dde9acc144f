"""Approval prompts on Slack: a Block Kit message naming the call with three buttons (Approve,
Deny, Always in this conversation), answered by ``block_actions`` interactions (signed like every
request Slack sends: ``events.py`` checks them before they get here).

Each button's ``value`` is the approval's id in the store, so a press works after a restart and
on any worker. The person pressing is checked by the approvals (``talon.control``): only the
person who asked, or an approver, may decide ("always" in a channel: a workspace admin too);
anyone else is told so in the thread and nothing is decided. The prompt is then updated to say
what was decided and by whom, and its buttons go away (``chat.update`` with no blocks).

A call longer than a Block Kit section shows (3,000 characters) goes first whole as a file
(``approval-<id>.txt``), then the prompt with its beginning; if the file cannot be sent, no
buttons are shown and the call is refused (``ApprovalNotShown``): nothing is approved unseen.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from talon.errors import ApprovalNotShown, DeliveryError
from talon.render.slack import escape

from channels.base import BridgeHandle
from channels.slack.api import CHANNEL, SlackApi
from channels.slack.delivery import Delivery

if TYPE_CHECKING:
    from talon.control.approvals import Choice
    from talon.storage.approvals import Approval

log = logging.getLogger(__name__)

ACTION_PREFIX = "talon_approval_"
CHOICES: dict[str, "Choice"] = {"approve": "approve", "deny": "deny", "always": "always"}
SECTION_LIMIT = 3000
HEAD = 2500


def prompt_blocks(approval_id: str, text: str) -> list[dict[str, Any]]:
    def button(choice: str, label: str, style: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "button", "action_id": ACTION_PREFIX + choice, "value": approval_id,
                               "text": {"type": "plain_text", "text": label}}
        if style:
            out["style"] = style
        return out

    return [
        {"type": "section", "text": {"type": "mrkdwn", "text": escape(text)[:SECTION_LIMIT]}},
        {"type": "actions", "block_id": f"talon_approval:{approval_id}"[:255], "elements": [
            button("approve", "Approve", "primary"), button("deny", "Deny", "danger"),
            button("always", "Always in this conversation")]},
    ]


class ApprovalPrompts:
    def __init__(self, api: SlackApi, delivery: Delivery, people: Any) -> None:
        self.api = api
        self.delivery = delivery
        self.people = people  # the intake: a member's name and admin flag
        self._bridge: BridgeHandle | None = None

    def bind(self, bridge: BridgeHandle) -> None:
        self._bridge = bridge

    async def ask_approval(self, approval: Approval, text: str) -> str | None:
        channel, thread = approval.platform_chat, approval.thread_id
        if len(escape(text)) > SECTION_LIMIT:
            try:
                await self.delivery.upload(channel, text.encode(), f"approval-{approval.id}.txt", thread)
            except DeliveryError as exc:
                raise ApprovalNotShown(f"the call is too long for a Slack message and its file could not be "
                                       f"sent ({exc})") from exc
            text = f"{text[:HEAD]}\n… ({len(text)} characters in all: the whole call is in the file above)"
        answer = await self.api.call(channel, "approval prompt", lambda: self.api.client.chat_postMessage(
            channel=channel, text=escape(text)[:SECTION_LIMIT], blocks=prompt_blocks(approval.id, text),
            thread_ts=thread, mrkdwn=False))
        return str(answer.get("ts"))

    async def settle_approval(self, approval: Approval, text: str) -> None:
        channel, prompt = approval.platform_chat, approval.prompt_id
        if prompt is None:
            await self.delivery.notice(channel, text, thread_ts=approval.thread_id)
            return
        await self.api.call(channel, "settle approval", lambda: self.api.client.chat_update(
            channel=channel, ts=prompt, text=escape(text), blocks=[]))

    async def on_action(self, payload: dict[str, Any]) -> Callable[[], Awaitable[None]] | None:
        """A ``block_actions`` interaction (already verified as Slack's). The decision is made here,
        in the store, before Slack is answered (a worker that dies after its 200 has still decided);
        what is returned shows the outcome and runs after the answer. An error here (the store is
        away) propagates: the request is not acknowledged and Slack shows the person it failed."""
        user = payload.get("user") or {}
        person = user.get("id") if isinstance(user, dict) else None
        actions = payload.get("actions") or []
        channel = (payload.get("channel") or {}).get("id") or (payload.get("container") or {}).get("channel_id")
        if not isinstance(person, str) or not isinstance(channel, str) or self._bridge is None:
            return None
        control = self._bridge.control
        shows: list[Callable[[], Awaitable[None]]] = []
        for action in actions[:5] if isinstance(actions, list) else []:
            if not isinstance(action, dict):
                continue
            action_id = str(action.get("action_id", ""))
            choice = CHOICES.get(action_id.removeprefix(ACTION_PREFIX)) if action_id.startswith(ACTION_PREFIX) else None
            approval_id = action.get("value")
            if choice is None or not isinstance(approval_id, str) or control is None or len(approval_id) > 200:
                continue
            name, admin = await self.people.person(person)
            answer = await control.approvals.answer(approval_id, choice, CHANNEL, person, name,
                                                    admin=admin and not channel.startswith("D"))
            shows.append(self._show(answer, approval_id, person, name, channel))
        if not shows:
            return None

        async def show_all() -> None:
            for show in shows:
                await show()
        return show_all

    def _show(self, answer: Any, approval_id: str, person: str, name: str,
              channel: str) -> Callable[[], Awaitable[None]]:
        async def show() -> None:
            control = self._bridge.control if self._bridge is not None else None
            if control is None or answer.approval is None:
                return
            if answer.outcome == "decided" or (answer.outcome == "already" and answer.approval.status != "pending"):
                # "already": a press on a prompt whose outcome was never shown (its worker died
                # between deciding and showing it) shows it now.
                await control.approvals.settle(self, answer.approval)
            elif answer.outcome == "refused":
                log.info("slack: approval %s: %s may not answer it", approval_id, person)
                try:
                    await self.delivery.notice(channel, f"{name}: {answer.note}", thread_ts=answer.approval.thread_id)
                except DeliveryError as exc:
                    log.warning("slack: could not tell %s their press was refused: %s", person, exc)
        return show
