"""Approval prompts on Telegram: a message with inline buttons (Approve / Deny / Always in this
chat), answered through callback queries. A press is acknowledged at once
(``answerCallbackQuery``, with a short note), then the prompt is edited to say what was decided
and by whom, and its buttons go away. The buttons name the approval by its id in the store, so
they still work after a restart or on another worker.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

from telegram import InlineKeyboardButton, InlineKeyboardMarkup, Update
from telegram.error import TelegramError
from telegram.ext import ContextTypes

from talon.errors import DeliveryError

from channels.base import BridgeHandle
from channels.telegram.api import CHANNEL, TelegramApi, _int_or_none

if TYPE_CHECKING:
    from talon.control.approvals import Choice
    from talon.storage.approvals import Approval

log = logging.getLogger(__name__)

CALLBACK_PREFIX = "ap"
_CHOICES: dict[str, "Choice"] = {"y": "approve", "n": "deny", "a": "always"}


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
        sent = await self.api.with_retries(self.api.paced(chat, functools.partial(
            self.api.bot.send_message, chat_id=int(chat), text=text[: self.api.limits.telegram_text_max],
            reply_markup=approval_keyboard(approval.id), disable_web_page_preview=True, **where)),
            "sendMessage")
        return str(sent.message_id)

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
        answer = await control.approvals.answer(parts[1], _CHOICES[parts[2]], CHANNEL, str(user.id), name,
                                                user.username)
        await self._answer_query(query, answer.note, alert=answer.outcome == "refused")
        if answer.outcome == "decided" and answer.approval is not None:
            await control.approvals.settle(self, answer.approval)

    async def _answer_query(self, query: object, note: str, *, alert: bool = False) -> None:
        try:
            await query.answer(text=note[:200], show_alert=alert)  # type: ignore[attr-defined]
        except TelegramError as exc:  # too old to answer (Telegram allows about 15 min): the decision holds
            log.info("telegram: could not answer a button press: %s", exc)
