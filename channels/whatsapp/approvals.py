"""Approval prompts on WhatsApp: the whole call as plain text, then (with
``TALON_WHATSAPP_TEMPLATE_APPROVAL``) a quick-reply template with Approve / Deny buttons; typed
``yes`` / ``no`` stays the fallback.

The prompt goes as plain text, never reformatted, so what is shown is the call exactly as
``talon.control.approvals`` wrote it: in parts of at most 1600 characters marked "(part i of n)" up
to ``TALON_WHATSAPP_REPLY_MAX_MESSAGES`` parts; longer, the first part and the whole prompt as
``approval-<id>.txt`` (a media link). When neither can be sent the channel raises
``ApprovalNotShown`` and the call is refused.

Buttons: the template is sent with ``ContentVariables`` ``{"1": <what the agent wants to do>, "2":
"approve:<token>", "3": "deny:<token>"}``. The two tokens are random (192 bits), stored bound to
the approval's id, the digest of its exact call and the chat, and used once: the press that comes
back as ``ButtonPayload`` consumes both. A press is refused when its token is unknown, used,
expired, of another chat, or no longer matches the approval's call; the approvals then check that
the presser may decide (``ApprovalPolicy.may_decide``).

Outside the 24-hour window the prompt waits (``window.py``) and goes, followed by its buttons, once
the person writes; with the approval template configured and a prompt short enough for one
template variable, the template itself carries the whole prompt and its buttons at once.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import TYPE_CHECKING

from talon.config import Limits
from talon.errors import ApprovalNotShown, TwilioRefused
from talon.storage.whatsapp import ButtonToken, WhatsAppStore

from channels.base import BridgeHandle
from channels.media_links import MediaLinks
from channels.whatsapp.api import WINDOW_CODES, TwilioApi
from channels.whatsapp.intake import ButtonPress
from channels.whatsapp.parts import ApprovalPart
from channels.whatsapp.templates import VARIABLE_MAX, Templates, fit_variable
from channels.whatsapp.window import Window

if TYPE_CHECKING:
    from talon.control.approvals import Choice
    from talon.storage.approvals import Approval

log = logging.getLogger("channels.whatsapp")

CHANNEL = "whatsapp"
TYPED = "Reply yes to allow it or no to refuse (or /approve, /deny)."
SUMMARY_CHARS = 300  # of the call, in the buttons' message (the whole call was just shown above it)


class ApprovalPrompts:
    def __init__(self, api: TwilioApi, window: Window, store: WhatsAppStore, templates: Templates,
                 links: MediaLinks | None, limits: Limits) -> None:
        self.api = api
        self.window = window
        self.store = store
        self.templates = templates
        self.links = links
        self.limits = limits
        self._bridge: BridgeHandle | None = None
        window.send_approval = self._send_waiting

    def bind(self, bridge: BridgeHandle) -> None:
        self._bridge = bridge

    async def ask_approval(self, approval: Approval, text: str) -> str | None:
        chat = approval.platform_chat
        async with self.window.lock(chat):
            clear = await self.window.flush(chat)
            state = await self.window.state(chat)
            if clear and state == "closed" and self.templates.approval is not None:
                whole = fit_variable(text, VARIABLE_MAX - 100)
                if whole is not None:  # the template carries the whole call and its buttons
                    await self._buttons(chat, approval, whole)
                    return None
            if not clear or state == "closed":
                await self.window.hold(chat, [ApprovalPart(approval.id, text)], why="an approval prompt")
                return None
            try:
                await self._prompt(chat, approval, text)
            except TwilioRefused as exc:
                if exc.code in WINDOW_CODES:
                    await self.window.refused(chat)
                    await self.window.hold(chat, [ApprovalPart(approval.id, text)], why="an approval prompt")
                    return None
                raise ApprovalNotShown(f"WhatsApp refused a part of the prompt: {exc}") from exc
        return None

    async def _send_waiting(self, chat: str, part: ApprovalPart) -> None:
        """A prompt that waited for the window, if its approval still waits."""
        control = self._bridge.control if self._bridge is not None else None
        approval = await control.approvals.get(part.approval_id) if control is not None else None
        if approval is None or approval.status != "pending":
            log.info("whatsapp: chat=%s: approval %s no longer waits; its prompt is not sent", chat, part.approval_id)
            return
        try:
            await self._prompt(chat, approval, part.text)
        except ApprovalNotShown as exc:
            log.error("whatsapp: chat=%s: approval %s: the waiting prompt cannot be shown: %s", chat, approval.id, exc)

    async def _prompt(self, chat: str, approval: Approval, text: str) -> None:
        """The whole prompt as text, then the buttons (or the typed-answer line)."""
        buttons = self.templates.approval is not None
        text = f"{text}\n{TYPED}" if not buttons else text
        room = self.limits.whatsapp_body_max - 24  # "(part 12 of 12)\n"
        chunks = [text[i:i + room] for i in range(0, len(text), room)] or [""]
        if len(chunks) == 1:
            await self.api.send(chat, body=text, what="an approval prompt", kind="approval")
        elif len(chunks) <= self.limits.whatsapp_reply_max_messages:
            for n, chunk in enumerate(chunks, 1):
                await self.api.send(chat, body=f"(part {n} of {len(chunks)})\n{chunk}",
                                    what=f"approval prompt part {n}", kind="approval")
        else:
            name = f"approval-{approval.id}.txt"
            if self.links is None:
                raise ApprovalNotShown(f"it is {len(text):,} characters, more than "
                                       f"{len(chunks) - 1} WhatsApp messages, and files cannot be sent "
                                       "here (no TALON_PUBLIC_BASE_URL)")
            url = await self.links.add_bytes(text.encode("utf-8"), name, "text/plain")
            await self.api.send(chat, media_url=url, what=name, kind="approval")
            note = (f"…\n\n[This call is too long for WhatsApp messages ({len(text):,} characters): ALL of "
                    f"it is in the file {name} just sent. Read it before you answer: "
                    + ("Approve covers exactly what is in it.]" if buttons else
                       "yes covers exactly what is in it. Reply yes or no.]"))
            head = text[:self.limits.whatsapp_body_max - len(note)]
            await self.api.send(chat, body=head + note, what="an approval prompt", kind="approval")
        if buttons:
            summary = fit_variable(approval.summary[:SUMMARY_CHARS]) or approval.tool
            try:
                await self._buttons(chat, approval, summary)
            except TwilioRefused as exc:  # the prompt is shown: typed yes / no still answers it
                log.error("whatsapp: chat=%s: approval %s: the buttons were refused (%s); asking for yes/no",
                          chat, approval.id, exc)
                await self.api.send(chat, body=TYPED, what="the typed-answer line", kind="approval")

    async def _buttons(self, chat: str, approval: Approval, what: str) -> None:
        template = self.templates.approval
        assert template is not None
        yes, no = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        await self.store.add_tokens([ButtonToken(yes, "approve", approval.id, approval.digest, chat, approval.expires),
                                     ButtonToken(no, "deny", approval.id, approval.digest, chat, approval.expires)])
        await self.api.send(chat, content=template.content(**{"1": what, "2": f"approve:{yes}", "3": f"deny:{no}"}),
                            what="the approval buttons", kind="approval")

    async def on_press(self, chat: str, person: str, name: str, press: ButtonPress) -> str:
        """A button pressed by ``person`` in ``chat``: decide the approval it names, once; the
        outcome in words (also sent to the chat)."""
        control = self._bridge.control if self._bridge is not None else None
        token = await self.store.take_token(press.token, chat, time.time())
        approval = await control.approvals.get(token.approval_id) if token is not None and control else None
        if token is None or token.choice != press.choice or approval is None or approval.digest != token.digest:
            log.warning("whatsapp: chat=%s: an approval button press refused (unknown, used, expired or forged "
                        "token, or a call that changed)", chat)
            note = "This button is not valid (any more). Reply yes or no to the prompt that is waiting, if any."
            await self.api.send(chat, body=note, what="a refused button note", kind="notice")
            return "refused"
        choice: Choice = "approve" if token.choice == "approve" else "deny"
        assert control is not None
        answer = await control.approvals.answer(approval.id, choice, CHANNEL, person, name)
        if answer.outcome == "decided" and answer.approval is not None:
            await control.approvals.settle(self, answer.approval)
        else:
            await self.api.send(chat, body=answer.note, what="an approval note", kind="notice")
        return answer.outcome

    async def settle_approval(self, approval: Approval, text: str) -> None:
        await self.api.send(approval.platform_chat, body=text[: self.limits.whatsapp_body_max],
                            what="an approval outcome", kind="notice")
