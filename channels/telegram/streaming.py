"""The answer shown in Telegram while the model writes it (``TALON_TELEGRAM_STREAMING``).

What to show and when is ``channels/live_text.py``'s (platform neutral); this module shows it:

- **draft** (the default) in a private chat: ``sendMessageDraft``, an ephemeral preview that
  Telegram animates. The final reply is an ordinary ``sendMessage``, so the only message that
  stays is the answer and nothing is ever posted twice.
- **edit** (and **draft** in groups, where drafts do not exist): the first update is sent as a
  message (into the topic, as a reply to the question) and its id reported at once to the bridge,
  which records it in the inbox; later updates edit it in place. The final reply's first part is
  the last edit of that message (``TextPart.edit``), with the formatted HTML; only an answer that
  outgrows 4096 units adds messages. After a crash the recorded message is edited to the final
  text, so there is never a second copy.
- **off**: no live view; the typing indicator alone shows that the agent works.

Updates are cosmetic calls of the chat's send budget: dropped when it is short, and after a 429
(or any refusal) the view stops for the turn; the budget then makes the final message wait out
the retry_after. Interim updates are HTML of a prefix that leaves no markup open (so they always
parse); if Telegram refuses one anyway, the view goes on in plain text. Media references are
taken out of what is shown, and an update never exceeds one message: past 4096 units the view
keeps the first chunk and waits for the final reply.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from telegram import ReplyParameters
from telegram.constants import ParseMode
from telegram.error import BadRequest, RetryAfter, TelegramError

from talon.bounded import BoundedMap
from talon.envelope import InboundMessage, LiveReply, conversation_id
from talon.media import extract_markdown_media
from talon.render.telegram import markdown_to_telegram_html, plain_text_fallback, split_markdown_for_telegram

from channels.live_text import LiveText
from channels.telegram.api import TelegramApi, _int_or_none, _retry_seconds, is_group_chat
from talon.errors import StreamStopped

log = logging.getLogger(__name__)


def _not_modified(exc: TelegramError) -> bool:
    return "not modified" in exc.message.lower()


class TelegramLiveView:
    """One turn's live view in one chat: a draft, or a message edited in place."""

    def __init__(self, views: LiveViews, message: InboundMessage, *, mode: str,
                 placed: Callable[[str], Awaitable[None]] | None, resume_id: str | None) -> None:
        self.views = views
        self.api = views.api
        self.chat_id = message.chat_id
        self.conversation = message.conversation_id
        self.mode = mode  # "draft" or "edit"
        self.thread_id = _int_or_none(message.thread_id)
        self.reply_to = _int_or_none(message.message_id) if message.is_group else None
        self.draft_id = max(1, abs(int(message.message_id)) if message.message_id.isdigit() else 1)
        self.message_id = _int_or_none(resume_id)
        self._placed = placed
        self.html = True
        self.text = LiveText(self.show, interval_s=views.api.settings.telegram_stream_interval_s,
                             head_chars=4 * views.api.limits.telegram_text_max)

    @property
    def showing(self) -> bool:
        return self.text.shown is not None

    def _fitted(self, markdown: str) -> str:
        body, _ = extract_markdown_media(markdown)
        chunks = split_markdown_for_telegram(body, self.api.limits.telegram_text_max)
        return chunks[0] if chunks else ""

    async def show(self, markdown: str) -> bool:
        piece = self._fitted(markdown)
        if not plain_text_fallback(piece).strip():
            return True  # nothing a person could read yet (a bare heading mark, a lone image)
        if not self.api.budget.try_spend(self.chat_id):
            return False
        text = markdown_to_telegram_html(piece) if self.html else plain_text_fallback(piece)
        try:
            await self._call(text)
        except RetryAfter as exc:
            self.api.budget.penalize(self.chat_id, _retry_seconds(exc))
            raise StreamStopped(f"Telegram asked to wait {_retry_seconds(exc):.0f}s") from exc
        except BadRequest as exc:
            if _not_modified(exc):
                return True
            if self.html and ("parse" in exc.message.lower() or "entit" in exc.message.lower()):
                log.info("telegram: chat=%s: live HTML refused (%s); going on in plain text",
                         self.chat_id, exc.message)
                self.html = False
                return False
            raise StreamStopped(f"Telegram refused an update: {exc.message}") from exc
        except TelegramError as exc:
            raise StreamStopped(f"{type(exc).__name__}: {exc.message}") from exc
        return True

    async def _call(self, text: str) -> None:
        bot = self.api.bot
        mode = ParseMode.HTML if self.html else None
        where: dict[str, Any] = {}
        if self.thread_id is not None:
            where["message_thread_id"] = self.thread_id
        if self.mode == "draft":
            await bot.send_message_draft(chat_id=int(self.chat_id), draft_id=self.draft_id, text=text,
                                         parse_mode=mode, **where)
            return
        if self.message_id is not None:
            await bot.edit_message_text(chat_id=int(self.chat_id), message_id=self.message_id, text=text,
                                        parse_mode=mode, disable_web_page_preview=True)
            return
        reply: ReplyParameters | None = None
        if self.reply_to is not None:
            reply = ReplyParameters(message_id=self.reply_to, allow_sending_without_reply=True)
        sent = await bot.send_message(chat_id=int(self.chat_id), text=text, parse_mode=mode,
                                      disable_web_page_preview=True, reply_parameters=reply, **where)
        self.message_id = sent.message_id
        if self._placed is not None:
            await self._placed(str(sent.message_id))  # in the inbox before anything else can happen

    async def close(self) -> None:
        await self.text.close()
        self.views.closed(self)


def _writing(view: "TelegramLiveView") -> bool:
    return not view.text.stopped


class LiveViews:
    """The live view of each conversation whose answer is being written (see the module docstring)."""

    def __init__(self, api: TelegramApi) -> None:
        self.api = api
        # conversation -> the answer shown as it is written; a view is removed when its turn closes
        # it, and a stopped one left behind is dropped by the bound or when idle.
        self._views: BoundedMap[str, TelegramLiveView] = BoundedMap("telegram_live_views", in_use=_writing)

    def live_reply(self, message: InboundMessage, *, placed: Callable[[str], Awaitable[None]] | None = None,
                   resume_id: str | None = None) -> LiveReply | None:
        setting = self.api.settings.telegram_streaming
        if setting == "off":
            return None
        mode = "edit" if setting == "edit" or is_group_chat(message.chat_id) or message.is_group else "draft"
        if mode == "draft" and resume_id is not None:
            mode = "edit"  # a message from before a restart is edited, whatever the setting
        view = TelegramLiveView(self, message, mode=mode, placed=placed, resume_id=resume_id)
        self._views[message.conversation_id] = view
        return LiveReply(on_text=view.text.on_text, on_step=view.text.on_step, close=view.close)

    def closed(self, view: TelegramLiveView) -> None:
        """``view`` has ended (its turn closed it)."""
        self._views.pop(view.conversation, None)

    def showing(self, chat_id: str, thread_id: str | None = None) -> bool:
        """Is the answer of this chat (topic) being shown live right now? Then a typing
        indicator would only spend the chat's budget."""
        view = self._views.get(conversation_id(chat_id, thread_id))
        return view is not None and view.showing and not view.text.stopped
