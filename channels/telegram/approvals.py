"""Approval prompts on Telegram: a message with inline buttons (Approve / Deny / Always in this
chat), answered through callback queries. A press is acknowledged at once
(``answerCallbackQuery``, with a short note), then the prompt is edited to say what was decided
and by whom, and its buttons go away. The buttons name the approval by its id in the store, so
they still work after a restart or on another worker.

The prompt shows the whole call. When it is longer than a message (4,096 UTF-16 units), the
whole prompt is sent first as a file (``sendDocument``, ``approval-<id>.txt``), then a message with
its beginning, its length, and the buttons; if the file cannot be sent, no buttons are shown and
the call is refused (``ApprovalNotShown``): nothing is approved unseen.

"Always in this chat" in a group: the presser must be an administrator of the group (asked with
``getChatMember`` at the press) or one of TALON_APPROVERS; others are refused with an alert.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from telegram import InlineKeyboardButton, InlineKeyboardMarkup, InputFile, Update
from telegram.error import TelegramError
from telegram.ext import ContextTypes

from talon.errors import ApprovalNotShown, DeliveryError
from talon.render.telegram import utf16_len

from channels.base import BridgeHandle
from channels.telegram.api import CHANNEL, TelegramApi, _int_or_none, upload_timeouts
from channels.telegram.groups import ADMIN_STATUSES

if TYPE_CHECKING:
    from talon.control.approvals import Choice
    from talon.storage.approvals import Approval

log = logging.getLogger(__name__)

CALLBACK_PREFIX = "ap"
_CHOICES: dict[str, "Choice"] = {"y": "approve", "n": "deny", "a": "always"}
HEAD_UNITS = 3000  # of a prompt too long for a message: the beginning shown above the buttons


def prompt_document_name(approval_id: str) -> str:
    return f"approval-{approval_id}.txt"


def _head(text: str, units: int) -> str:
    """The longest beginning of ``text`` within ``units`` UTF-16 code units."""
    low, high = 0, len(text)
    while low < high:
        mid = (low + high + 1) // 2
        if utf16_len(text[:mid]) <= units:
            low = mid
        else:
            high = mid - 1
    return text[:low]


def approval_keyboard(approval_id: str) -> InlineKeyboardMarkup:
    def button(label: str, code: str) -> InlineKeyboardButton:
        return InlineKeyboardButton(label, callback_data=f"{CALLBACK_PREFIX}:{approval_id}:{code}")

    return InlineKeyboardMarkup([[button("Approve", "y"), button("Deny", "n")],
                                 [button("Always in this chat", "a")]])


class ApprovalPrompts:
    """Approval prompts with buttons, and the presses that answer them (see the module docstring).
    Presses reach the approvals through the bridge handle given at start (``bind``)."""

    def __init__(self, api: TelegramApi) -> None:
        self.api = api
        self._bridge: BridgeHandle | None = None

    def bind(self, bridge: BridgeHandle) -> None:
        self._bridge = bridge

    async def ask_approval(self, approval: Approval, text: str) -> str | None:
        chat = approval.platform_chat
        where = {"message_thread_id": int(approval.thread_id)} if approval.thread_id else {}
        limit = self.api.limits.telegram_text_max
        if utf16_len(text) > limit:
            name = prompt_document_name(approval.id)
            await self._send_whole(approval, text, name, where)
            text = (f"{_head(text, min(HEAD_UNITS, limit - 400))}…\n\n"
                    f"[This call is too long for one message ({len(text):,} characters): the beginning is "
                    f"above, ALL of it is in the file {name} sent just before this message. Read the file "
                    "before you approve: Approve covers exactly what is in it.]")
        sent = await self.api.with_retries(self.api.paced(chat, functools.partial(
            self.api.bot.send_message, chat_id=int(chat), text=text,
            reply_markup=approval_keyboard(approval.id), disable_web_page_preview=True, **where)),
            "sendMessage")
        return str(sent.message_id)

    async def _send_whole(self, approval: Approval, text: str, name: str, where: dict[str, int]) -> None:
        """The whole prompt as a file; ``ApprovalNotShown`` when it cannot be sent."""
        chat = approval.platform_chat
        data = text.encode("utf-8")

        def call() -> Awaitable[object]:
            return self.api.bot.send_document(
                chat_id=int(chat), document=InputFile(data, filename=name),
                caption=f"The whole call waiting for approval ({len(text):,} characters).", **where,
                **upload_timeouts(len(data)))

        try:
            await self.api.with_retries(self.api.paced(chat, call), "sendDocument", upload=True)
        except DeliveryError as exc:
            log.warning("telegram: chat=%s: approval %s: the whole call could not be sent as %s: %s", chat,
                        approval.id, name, exc)
            raise ApprovalNotShown(f"it is longer than a Telegram message and the file with all of it "
                                   f"could not be sent: {exc}") from exc

    async def settle_approval(self, approval: Approval, text: str) -> None:
        chat = approval.platform_chat
        message_id = _int_or_none(approval.prompt_id)
        if message_id is None:
            await self.api.send_plain(chat, text)
            return
        try:
            # An edit without reply_markup also takes the buttons away.
            await self.api.with_retries(self.api.paced(chat, functools.partial(
                self.api.bot.edit_message_text, chat_id=int(chat), message_id=message_id,
                text=text[: self.api.limits.telegram_text_max], disable_web_page_preview=True)),
                "editMessageText")
        except DeliveryError as exc:
            if "not modified" in str(exc):
                return
            raise

    async def on_callback(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        query = update.callback_query
        if query is None:
            return
        parts = (query.data or "").split(":")
        control = self._bridge.control if self._bridge is not None else None
        if len(parts) != 3 or parts[0] != CALLBACK_PREFIX or parts[2] not in _CHOICES or control is None:
            await self._answer_query(query, "This button is not one of mine (any more).")
            return
        user = query.from_user
        name = user.full_name or (f"@{user.username}" if user.username else str(user.id))
        choice = _CHOICES[parts[2]]
        # "Always" in a group is an administrator's (or an approver's) to give: asked only then.
        message = getattr(query, "message", None)
        group_chat = getattr(getattr(message, "chat", None), "type", "private") != "private"
        admin = choice == "always" and group_chat and await self._is_admin(message.chat.id, user.id)  # type: ignore[union-attr]
        answer = await control.approvals.answer(parts[1], choice, CHANNEL, str(user.id), name, user.username,
                                                admin=admin)
        await self._answer_query(query, answer.note, alert=answer.outcome == "refused")
        if answer.outcome == "decided" and answer.approval is not None:
            await control.approvals.settle(self, answer.approval)

    async def _is_admin(self, chat_id: int, user_id: int) -> bool:
        """Whether the presser administers the group; False when it cannot be told."""
        try:
            member = await self.api.with_retries(
                lambda: self.api.bot.get_chat_member(chat_id=chat_id, user_id=user_id), "getChatMember")
        except DeliveryError as exc:
            log.warning("telegram: chat=%s: cannot tell whether user %s is an administrator (%s); "
                        "'always' refused", chat_id, user_id, exc)
            return False
        return member.status in ADMIN_STATUSES

    async def _answer_query(self, query: object, note: str, *, alert: bool = False) -> None:
        try:
            await query.answer(text=note[:200], show_alert=alert)  # type: ignore[attr-defined]
        except TelegramError as exc:  # too old to answer (Telegram allows about 15 min): the decision holds
            log.info("telegram: could not answer a button press: %s", exc)
