"""Outbound: a reply's parts (``channels/telegram/parts.py``), each sent with retries; progress is
reported after every part so a restart resumes at the first undelivered part and never resends one.

- If the captioned media cannot be delivered at all, the text is sent as a message, so no words
  are lost with the file.
- Kinds: image -> sendPhoto, animation (GIF) -> sendAnimation, video -> sendVideo, voice
  (OGG/Opus) -> sendVoice, audio -> sendAudio, anything else -> sendDocument. A photo over 10 MB
  goes as a document; when Telegram refuses any typed send (bad dimensions, failed processing...)
  the file is sent again as a document. When it refuses an album, its images go one by one.
- Limits: a file over 50 MB (the bot upload cap) or an empty file is not uploaded.
- Files are uploaded from the open file the containment check returned (never reopened by path),
  rewound before every try, under the name they have in the media root, and closed afterwards.
- Nothing is dropped silently: a reference that cannot be resolved, is over a limit or is refused
  by Telegram becomes a plain-text line "Could not attach NAME: reason" in the chat (NAME is the
  file's base name; no host path is shown) and a log entry with the detail. One bad file never
  stops the rest of the reply. Transient failures (network, long rate limits) after the retries
  stop the delivery instead, so the bridge can resume it from that part later. A part is the unit
  of resume: the rare part that needs several sends (an album refused and sent image by image, a
  failure line after a file) is sent whole again if it was interrupted half way.
- Markup Telegram cannot parse is resent as plain text, for messages and captions alike.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from telegram import InputFile, InputMediaPhoto
from telegram.constants import ChatAction, ParseMode
from telegram.error import BadRequest

from talon.config import MB
from talon.envelope import OutboundReply, conversation_id
from talon.errors import DeliveryError, MediaPathError, UploadTimedOut
from talon.media import MarkdownMediaRef, OutboundMedia, outbound_channel_media
from talon.media.failures import attach_failure_line, display_name, path_refusal_reason
from talon.render.long_reply import REPLY_DOCUMENT_NAME, reply_document
from talon.render.telegram import markdown_to_telegram_html, plain_text_fallback
from talon.speech.transcribe import probe_file_duration

from channels.base import PartCallback, deliver_parts
from channels.telegram.api import (
    CHANNEL,
    TelegramApi,
    _int_or_none,
    _refusal_reason,
    _refused_markup,
    _send_target,
    _SendTarget,
    _where,
    upload_timeouts,
)
from channels.telegram.parts import (
    MediaPart,
    NoticePart,
    Part,
    ReplyDocumentPart,
    RetirePart,
    TextPart,
    plan_parts,
)
from channels.telegram.streaming import LiveViews

log = logging.getLogger(__name__)

_SENDERS: dict[str, tuple[str, str]] = {  # kind -> (Bot method, the parameter carrying the file)
    "image": ("send_photo", "photo"),
    "animation": ("send_animation", "animation"),
    "video": ("send_video", "video"),
    "voice": ("send_voice", "voice"),
    "audio": ("send_audio", "audio"),
    "document": ("send_document", "document"),
}
_API_NAMES = {"image": "sendPhoto", "animation": "sendAnimation", "video": "sendVideo",
              "voice": "sendVoice", "audio": "sendAudio", "document": "sendDocument"}


class Delivery:
    """Replies out: the parts of a reply, each sent (text, files, albums) with its fallbacks; and
    the typing indicator, kept quiet while the answer is shown live (``live``)."""

    def __init__(self, api: TelegramApi, live: LiveViews) -> None:
        self.api = api
        self.live = live

    async def send_typing(self, chat_id: str, thread_id: str | None = None) -> None:
        # Cosmetic: not while the answer itself is on screen, nor when the chat's budget is short.
        if self.live.showing(chat_id, thread_id) or not self.api.budget.try_spend(chat_id):
            return
        where = {"message_thread_id": int(thread_id)} if thread_id is not None else {}
        await self.api.bot.send_chat_action(chat_id=int(chat_id), action=ChatAction.TYPING, **where)

    def reply_parts(self, reply: OutboundReply) -> list[Part]:
        return plan_parts(reply, self.api.limits)

    async def deliver(self, chat_id: str, reply: OutboundReply, *, skip_parts: int = 0,
                      on_part: PartCallback | None = None) -> None:
        thread_id = _int_or_none(reply.thread_id)
        reply_to = _int_or_none(reply.reply_to_message_id)

        async def send(index: int, part: Part) -> None:
            # The first part answers the message (a quote header on every part would be noise).
            token = _send_target.set(_SendTarget(thread_id, reply_to if index == 0 else None))
            try:
                await self._send_part(chat_id, part)
            finally:
                _send_target.reset(token)

        await deliver_parts(self.reply_parts(reply), send, skip_parts=skip_parts, on_part=on_part)

    async def _send_part(self, chat_id: str, part: Part) -> None:
        if isinstance(part, TextPart) and part.edit is not None:
            await self._edit_text(chat_id, part.edit, part.markdown)
        elif isinstance(part, TextPart):
            await self._send_text(chat_id, part.markdown)
        elif isinstance(part, RetirePart):
            await self._retire(chat_id, part.message_id)
        elif isinstance(part, NoticePart):
            await self.api.send_plain(chat_id, part.text)
        elif isinstance(part, ReplyDocumentPart):
            await self._send_reply_document(chat_id, part)
        else:
            await self._send_media_part(chat_id, part)

    async def _send_text(self, chat_id: str, markdown: str) -> None:
        if not plain_text_fallback(markdown).strip():
            # Markup with no words in it (a bare "#", an empty code block): Telegram refuses an
            # empty message, and that refusal would end the whole reply, files and all.
            log.info("telegram: chat=%s: a reply part renders to no text; skipped", chat_id)
            return
        html = markdown_to_telegram_html(markdown)
        try:
            await self.api.with_retries(self.api.paced(
                chat_id, lambda: self.api.bot.send_message(chat_id=int(chat_id), text=html, parse_mode=ParseMode.HTML,
                                                       disable_web_page_preview=True, **_where())),
                "sendMessage")
        except DeliveryError as exc:
            if not _refused_markup(exc):
                raise
            log.warning("telegram: chat %s refused our HTML (%s); resending as plain text", chat_id, exc)
            await self.api.send_plain(chat_id, plain_text_fallback(markdown))

    async def _edit_text(self, chat_id: str, message_id: int, markdown: str) -> None:
        """The last edit of a streamed message: the final text, formatted; plain if Telegram
        cannot parse it; sent as a new message if the old one is gone (deleted, too old)."""
        if not plain_text_fallback(markdown).strip():
            await self._retire(chat_id, message_id)
            return

        def edit(text: str, mode: str | None) -> Callable[[], Awaitable[object]]:
            return self.api.paced(chat_id, lambda: self.api.bot.edit_message_text(
                chat_id=int(chat_id), message_id=message_id, text=text, parse_mode=mode,
                disable_web_page_preview=True))

        try:
            try:
                await self.api.with_retries(edit(markdown_to_telegram_html(markdown), ParseMode.HTML), "editMessageText")
            except DeliveryError as exc:
                if not _refused_markup(exc):
                    raise
                log.warning("telegram: chat %s refused our HTML (%s); editing in plain text", chat_id, exc)
                await self.api.with_retries(edit(plain_text_fallback(markdown), None), "editMessageText")
        except DeliveryError as exc:
            if "not modified" in str(exc).lower():
                return  # the last update already showed exactly this
            if not exc.permanent:
                raise
            log.warning("telegram: chat=%s: cannot edit the streamed message %s (%s); sending the answer "
                        "as a new message", chat_id, message_id, exc)
            await self._send_text(chat_id, markdown)

    async def _retire(self, chat_id: str, message_id: int) -> None:
        try:
            await self.api.with_retries(self.api.paced(chat_id, lambda: self.api.bot.delete_message(
                chat_id=int(chat_id), message_id=message_id)), "deleteMessage")
        except DeliveryError as exc:
            log.warning("telegram: chat=%s: could not delete the streamed message %s: %s", chat_id,
                        message_id, exc)

    async def _send_reply_document(self, chat_id: str, part: ReplyDocumentPart) -> None:
        data = reply_document(part.text)

        def call() -> Awaitable[object]:
            return self.api.bot.send_document(
                chat_id=int(chat_id), caption=part.note,
                document=InputFile(data, filename=REPLY_DOCUMENT_NAME), **_where(),
                **upload_timeouts(len(data)))

        try:
            await self.api.with_retries(self.api.paced(chat_id, call), "sendDocument", upload=True)
        except DeliveryError as exc:
            if not exc.permanent:
                raise
            log.warning("telegram: chat=%s: the long reply as %s could not be sent: %s", chat_id,
                        REPLY_DOCUMENT_NAME, exc)
            await self.api.send_plain(chat_id, attach_failure_line(REPLY_DOCUMENT_NAME, _refusal_reason(exc)))

    async def _send_media_part(self, chat_id: str, part: MediaPart) -> None:
        failures: list[str] = []
        opened: list[OutboundMedia] = []
        caption = part.caption
        try:
            for ref in part.refs:
                media = self._open_media(chat_id, ref, failures)
                if media is not None:
                    opened.append(media)
            for unit in self._units(opened):
                if await self._send_unit(chat_id, unit, caption, failures):
                    caption = ""
        finally:
            for media in opened:
                media.close()
        if caption.strip():  # none of the files went out: the words still must
            await self._send_text(chat_id, caption)
        if failures:
            await self.api.send_plain(chat_id, "\n".join(failures))

    def _open_media(self, chat_id: str, ref: MarkdownMediaRef, failures: list[str]) -> OutboundMedia | None:
        """Resolve and open one reference, or record why it cannot be sent."""
        name = display_name(ref.path)
        try:
            target = _send_target.get()
            topic = str(target.thread_id) if target is not None and target.thread_id is not None else None
            # The conversation's own workspace: a forum topic has its own.
            root = self.api.settings.workspace_dir(CHANNEL, conversation_id(chat_id, topic))
            media = outbound_channel_media(ref, "", root)
        except MediaPathError as exc:
            log.warning("telegram: chat=%s: not attaching %r: %s", chat_id, ref.path, exc)
            failures.append(attach_failure_line(name, path_refusal_reason(exc)))
            return None
        except OSError as exc:
            log.warning("telegram: chat=%s: cannot read %r: %s", chat_id, ref.path, exc)
            failures.append(attach_failure_line(name, "it cannot be read"))
            return None
        limit = self.api.limits.telegram_upload_max_bytes
        reason = None
        if media.size > limit:
            reason = (f"it is {media.size / MB:.1f} MB, over Telegram's {limit / MB:.0f} MB "
                      "upload limit for bots")
        elif media.size == 0:
            reason = "the file is empty"
        if reason is not None:
            log.warning("telegram: chat=%s: not attaching %s (%d bytes): %s", chat_id, media.path,
                        media.size, reason)
            media.close()
            failures.append(attach_failure_line(name, reason))
            return None
        return media

    def _units(self, opened: list[OutboundMedia]) -> list[list[OutboundMedia]]:
        """What one part sends: an album of the images that can be photos, then the rest alone.

        A reference named like an image may turn out to be something else, or too big for a
        photo; those cannot share an album with photos and go after it, each on its own.
        """
        photos = [m for m in opened if self._as_photo(m)]
        if len(photos) < 2:
            return [[m] for m in opened]
        return [photos] + [[m] for m in opened if m not in photos]

    def _as_photo(self, media: OutboundMedia) -> bool:
        return media.kind == "image" and media.size <= self.api.limits.telegram_photo_max_bytes

    async def _send_unit(self, chat_id: str, unit: list[OutboundMedia], caption: str,
                         failures: list[str]) -> bool:
        if len(unit) == 1:
            return await self._send_single(chat_id, unit[0], caption, failures)
        try:
            await self._with_caption(caption, lambda text, mode: self._upload_album(chat_id, unit, text, mode))
            return True
        except UploadTimedOut as exc:
            # Sending them one by one could deliver every image twice.
            for media in unit:
                failures.append(attach_failure_line(media.name, _refusal_reason(exc)))
            return False
        except DeliveryError as exc:
            if not exc.permanent:
                raise
            log.warning("telegram: chat=%s: album of %d refused (%s); sending the images one by one",
                        chat_id, len(unit), exc)
        delivered = False
        for media in unit:
            if await self._send_single(chat_id, media, "" if delivered else caption, failures):
                delivered = True
        return delivered

    async def _send_single(self, chat_id: str, media: OutboundMedia, caption: str,
                           failures: list[str]) -> bool:
        """Send one file by its kind, falling back to a document; False when it was refused."""
        kind = media.kind
        if kind == "image" and not self._as_photo(media):
            kind = "document"  # Telegram takes photos up to 10 MB; the file itself can still go
        try:
            await self._with_caption(caption, lambda text, mode: self._upload(chat_id, media, kind, text, mode))
            return True
        except DeliveryError as exc:
            if not exc.permanent:
                raise
            refusal = exc
        if kind != "document" and isinstance(refusal.__cause__, BadRequest) and not isinstance(refusal, UploadTimedOut):
            log.warning("telegram: chat=%s: %s refused %s (%s); sending it as a document",
                        chat_id, _API_NAMES[kind], media.name, refusal)
            try:
                await self._with_caption(
                    caption, lambda text, mode: self._upload(chat_id, media, "document", text, mode))
                return True
            except DeliveryError as exc:
                if not exc.permanent:
                    raise
                refusal = exc
        log.warning("telegram: chat=%s: could not attach %s (%s, %d bytes): %s", chat_id, media.path,
                    media.kind, media.size, refusal)
        failures.append(attach_failure_line(media.name, _refusal_reason(refusal)))
        return False

    async def _with_caption(self, caption: str,
                            send: Callable[[str | None, str | None], Awaitable[object]]) -> None:
        """Send with the caption as HTML; if Telegram cannot parse it, once more as plain text."""
        if not caption.strip():
            await send(None, None)
            return
        try:
            await send(markdown_to_telegram_html(caption), ParseMode.HTML)
        except DeliveryError as exc:
            if not _refused_markup(exc):
                raise
            log.warning("telegram: caption HTML refused (%s); resending with a plain caption", exc)
            await send(plain_text_fallback(caption), None)

    async def _upload(self, chat_id: str, media: OutboundMedia, kind: str, caption: str | None,
                      parse_mode: str | None) -> None:
        method, field_name = _SENDERS[kind]
        send = getattr(self.api.bot, method)
        # Telegram shows a voice note's or audio's length from this, not from the file.
        duration = await asyncio.to_thread(media_seconds, media) if kind in ("voice", "audio") else None

        def call() -> Awaitable[object]:
            media.file.seek(0)  # a failed try may have read part of the file
            kwargs: dict[str, Any] = {"chat_id": int(chat_id), field_name: _input_file(media), **_where(),
                                      **upload_timeouts(media.size)}
            if duration is not None:
                kwargs["duration"] = duration
            if caption is not None:
                kwargs.update(caption=caption, parse_mode=parse_mode)
            return send(**kwargs)

        await self.api.with_retries(self.api.paced(chat_id, call), _API_NAMES[kind], upload=True)

    async def _upload_album(self, chat_id: str, members: list[OutboundMedia], caption: str | None,
                            parse_mode: str | None) -> None:
        def call() -> Awaitable[object]:
            items = []
            for index, media in enumerate(members):
                media.file.seek(0)
                first = index == 0 and caption is not None
                items.append(InputMediaPhoto(media=_input_file(media, attach=True),
                                             caption=caption if first else None,
                                             parse_mode=parse_mode if first else None))
            return self.api.bot.send_media_group(chat_id=int(chat_id), media=items, **_where(),
                                             **upload_timeouts(sum(m.size for m in members)))

        await self.api.with_retries(self.api.paced(chat_id, call, len(members)), "sendMediaGroup", upload=True)


def media_seconds(media: OutboundMedia) -> int | None:
    """Whole seconds of a voice note or audio file, read from its checked open file."""
    seconds = probe_file_duration(media.file)
    return max(1, round(seconds)) if seconds else None


def _input_file(media: OutboundMedia, *, attach: bool = False) -> InputFile:
    """An upload streamed from the checked open file, under the file's own name and type."""
    upload = InputFile(media.file, filename=media.name, attach=attach, read_file_handle=False)
    upload.mimetype = media.mime
    return upload
