"""Telegram channel on python-telegram-bot: long polling in, Bot API out.

Inbound: private messages from allowed users become ``InboundMessage``s (albums are gathered
into one), files are referenced by file_id and downloaded during the turn, streamed and capped.
Outbound: a reply is an ordered list of parts (text chunks, media, notices); each part is sent
with retries, and progress is reported so a restart never resends a delivered part.
A watchdog restarts polling when getUpdates has not succeeded for too long.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from telegram import Message as TgMessage
from telegram import Update
from telegram.constants import ChatAction, ParseMode
from telegram.error import BadRequest, Forbidden, InvalidToken, NetworkError, RetryAfter, TelegramError
from telegram.ext import Application, ApplicationBuilder, ContextTypes, MessageHandler, filters
from telegram.request import HTTPXRequest

from talon.attachments import AttachmentStore
from talon.config import Limits, Settings
from talon.content import InboundFile
from talon.envelope import InboundMessage, OutboundReply, RemoteFile
from talon.errors import ConfigError, DeliveryError, DownloadTooLarge, MediaError
from talon.render.telegram import markdown_to_telegram_html, plain_text_fallback, split_markdown_for_telegram

from channels.base import Channel, PartCallback

log = logging.getLogger(__name__)

T = TypeVar("T")

SEND_TRIES = 3
MAX_RETRY_AFTER_S = 120.0
ALBUM_WAIT_S = 1.2


class _PollingRequest(HTTPXRequest):
    """The getUpdates transport; remembers when the last poll came back, for the watchdog."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.last_ok = time.monotonic()

    async def do_request(self, *args: Any, **kwargs: Any) -> tuple[int, bytes]:
        result = await super().do_request(*args, **kwargs)
        self.last_ok = time.monotonic()
        return result


def _retry_seconds(exc: RetryAfter) -> float:
    value = exc.retry_after
    return value.total_seconds() if isinstance(value, dt.timedelta) else float(value)


def is_allowed(allowlist: set[str], user_id: int, username: str | None) -> bool:
    if str(user_id) in allowlist:
        return True
    return bool(username) and f"@{username.lower()}" in allowlist


@dataclass
class _Album:
    first: TgMessage
    files: list[RemoteFile] = field(default_factory=list)
    caption: str = ""
    timer: asyncio.TimerHandle | None = None


@dataclass
class TextPart:
    markdown: str


Part = TextPart


class TelegramChannel(Channel):
    name = "telegram"

    def __init__(self, settings: Settings, *, watchdog_interval_s: float = 15.0,
                 stall_after_s: float | None = None) -> None:
        if not settings.telegram_bot_token:
            raise ConfigError("TELEGRAM_BOT_TOKEN is not set", ["TELEGRAM_BOT_TOKEN"])
        self.settings = settings
        self.limits: Limits = settings.limits()
        self.allowlist = settings.telegram_allowlist
        base = settings.telegram_api_base_url.rstrip("/")
        self._poll_request = _PollingRequest(
            connection_pool_size=1, read_timeout=settings.telegram_poll_timeout_s + 10.0
        )
        self.app: Application = (
            ApplicationBuilder()
            .token(settings.telegram_bot_token)
            .base_url(f"{base}/bot")
            .base_file_url(f"{base}/file/bot")
            .request(HTTPXRequest(connection_pool_size=16, read_timeout=30.0, write_timeout=60.0,
                                  media_write_timeout=120.0))
            .get_updates_request(self._poll_request)
            .build()
        )
        self.app.add_handler(MessageHandler(filters.UpdateType.MESSAGE, self._on_message))
        self.app.add_error_handler(self._on_handler_error)
        self._bridge: Any = None
        self._albums: dict[str, _Album] = {}
        self._watchdog: asyncio.Task[None] | None = None
        self._watchdog_interval = watchdog_interval_s
        self._stall_after = stall_after_s or (settings.telegram_poll_timeout_s + 60.0)
        self.polling_restarts = 0
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=10.0), follow_redirects=False)

    @property
    def bot(self) -> Any:
        return self.app.bot

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self, bridge: Any) -> None:
        self._bridge = bridge
        try:
            await self.app.initialize()
        except InvalidToken as exc:
            # PTB's message repeats the token; ours must not.
            raise ConfigError("Telegram refused TELEGRAM_BOT_TOKEN (401 Unauthorized): check the token "
                              "from @BotFather", ["TELEGRAM_BOT_TOKEN"]) from None
        await self.app.start()
        await self._start_polling()
        log.info("telegram: polling as @%s", self.bot.username)
        self._watchdog = asyncio.create_task(self._watch_polling(), name="telegram-watchdog")

    async def _start_polling(self) -> None:
        assert self.app.updater is not None
        self._poll_request.last_ok = time.monotonic()
        await self.app.updater.start_polling(
            timeout=self.settings.telegram_poll_timeout_s,
            allowed_updates=["message"],
            error_callback=self._on_poll_error,
        )

    async def stop(self) -> None:
        if self._watchdog:
            self._watchdog.cancel()
            await asyncio.gather(self._watchdog, return_exceptions=True)
        for album in self._albums.values():
            if album.timer:
                album.timer.cancel()
        if self.app.updater and self.app.updater.running:
            await self.app.updater.stop()
        if self.app.running:
            await self.app.stop()
        await self.app.shutdown()
        await self._http.aclose()

    def _on_poll_error(self, exc: TelegramError) -> None:
        log.warning("telegram: getUpdates failed (%s); python-telegram-bot retries", exc)

    async def _on_handler_error(self, update: object, context: ContextTypes.DEFAULT_TYPE) -> None:
        log.error("telegram: handler error: %s", context.error, exc_info=context.error)

    async def _watch_polling(self) -> None:
        """Polling must never stop quietly: restart it when it died or has gone silent."""
        while True:
            await asyncio.sleep(self._watchdog_interval)
            updater = self.app.updater
            assert updater is not None
            silent = time.monotonic() - self._poll_request.last_ok
            if updater.running and silent < self._stall_after:
                continue
            reason = "stopped" if not updater.running else f"silent for {silent:.0f}s"
            log.error("telegram: polling %s; restarting it", reason)
            self.polling_restarts += 1
            try:
                if updater.running:
                    await updater.stop()
                await self._start_polling()
            except Exception:
                log.exception("telegram: could not restart polling; will try again")

    # --- inbound ------------------------------------------------------------------------------
    async def _on_message(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        msg = update.message
        if msg is None or msg.from_user is None:
            return
        user = msg.from_user
        if msg.chat.type != "private":
            log.info("telegram: ignoring message in %s chat %s (only private chats are served)",
                     msg.chat.type, msg.chat.id)
            return
        if not is_allowed(self.allowlist, user.id, user.username):
            handle = f" (@{user.username})" if user.username else ""
            log.warning(
                "telegram: message from user %s%s denied; to allow them add %s to "
                "TALON_TELEGRAM_ALLOWED_USERS", user.id, handle, user.id)
            return
        files = _remote_files(msg)
        if msg.media_group_id:
            self._collect_album(msg, files)
            return
        self._submit(msg, msg.text or msg.caption or "", files)

    def _collect_album(self, msg: TgMessage, files: list[RemoteFile]) -> None:
        """Telegram sends an album as one message per item; gather them into one turn."""
        key = f"{msg.chat.id}:{msg.media_group_id}"
        album = self._albums.get(key)
        if album is None:
            album = self._albums[key] = _Album(first=msg)
        elif album.timer:
            album.timer.cancel()
        album.files.extend(files)
        if msg.caption and not album.caption:
            album.caption = msg.caption
        loop = asyncio.get_running_loop()
        album.timer = loop.call_later(ALBUM_WAIT_S, self._flush_album, key)

    def _flush_album(self, key: str) -> None:
        album = self._albums.pop(key, None)
        if album is not None:
            self._submit(album.first, album.caption, album.files)

    def _submit(self, msg: TgMessage, text: str, files: list[RemoteFile]) -> None:
        reply = msg.reply_to_message
        quoted = (reply.text or reply.caption) if reply is not None else None
        user = msg.from_user
        assert user is not None
        self._bridge.submit(
            InboundMessage(
                channel=self.name,
                chat_id=str(msg.chat.id),
                sender_id=str(user.id),
                sender_name=user.username or user.full_name,
                message_id=str(msg.message_id),
                text=text,
                files=files,
                reply_to_text=quoted,
            )
        )

    async def download(self, remote: RemoteFile, store: AttachmentStore, limits: Limits) -> InboundFile:
        base = InboundFile(kind=remote.kind, name=remote.name, mime=remote.mime, size=remote.size,
                           emoji=remote.emoji, animated=remote.animated)
        name = remote.name or remote.kind
        if remote.kind == "sticker" and remote.animated:
            return base  # animated stickers are described by their emoji; nothing to fetch
        if remote.size is not None and remote.size > limits.download_max_bytes:
            return base.model_copy(update={"notice": str(DownloadTooLarge(name, remote.size, limits.download_max_bytes))})
        try:
            tg_file = await self._with_retries(lambda: self.bot.get_file(remote.source), "getFile")
        except DeliveryError as exc:
            text = str(exc)
            if "too big" in text.lower():
                return base.model_copy(update={"notice": str(DownloadTooLarge(name, remote.size, limits.download_max_bytes))})
            return base.model_copy(update={"notice": f"Telegram would not give us {name}: {text}"})
        url = tg_file.file_path
        try:
            ref = await self._stream(url, store, remote, limits)
        except MediaError as exc:
            return base.model_copy(update={"notice": str(exc)})
        return base.model_copy(update={"ref": ref, "size": ref.bytes})

    async def _stream(self, url: str, store: AttachmentStore, remote: RemoteFile, limits: Limits) -> Any:
        name = remote.name or remote.kind
        mime = remote.mime or "application/octet-stream"
        for attempt in range(1, SEND_TRIES + 1):
            try:
                async with self._http.stream("GET", url) as resp:
                    if resp.status_code != 200:
                        # The URL carries the bot token: never log or show it.
                        raise MediaError(f"download of {name} failed: HTTP {resp.status_code}")
                    declared = resp.headers.get("content-length")
                    if declared and declared.isdigit() and int(declared) > limits.download_max_bytes:
                        raise DownloadTooLarge(name, int(declared), limits.download_max_bytes)
                    try:
                        return await store.put_stream(resp.aiter_bytes(), mime=mime, name=remote.name,
                                                      limit=limits.download_max_bytes)
                    except DownloadTooLarge as exc:
                        raise DownloadTooLarge(name, remote.size, exc.limit) from None
            except httpx.HTTPError as exc:
                if attempt == SEND_TRIES:
                    raise MediaError(f"download of {name} failed: {type(exc).__name__}") from exc
                await asyncio.sleep(0.5 * 2 ** attempt)
        raise MediaError(f"download of {name} failed")

    # --- outbound -----------------------------------------------------------------------------
    async def send_typing(self, chat_id: str) -> None:
        await self.bot.send_chat_action(chat_id=int(chat_id), action=ChatAction.TYPING)

    def reply_parts(self, reply: OutboundReply) -> list[Part]:
        parts: list[Part] = [TextPart(chunk) for chunk in
                             split_markdown_for_telegram(reply.text, self.limits.telegram_text_max)
                             if chunk.strip()]
        parts.extend(TextPart(notice) for notice in reply.notices)
        return parts

    async def deliver(self, chat_id: str, reply: OutboundReply, *, skip_parts: int = 0,
                      on_part: PartCallback | None = None) -> None:
        parts = self.reply_parts(reply)
        for index, part in enumerate(parts):
            if index < skip_parts:
                continue
            await self._send_part(chat_id, part)
            if on_part is not None:
                await on_part(index + 1)

    async def _send_part(self, chat_id: str, part: Part) -> None:
        await self._send_text(chat_id, part.markdown)

    async def _send_text(self, chat_id: str, markdown: str) -> None:
        html = markdown_to_telegram_html(markdown)
        try:
            await self._with_retries(
                lambda: self.bot.send_message(chat_id=int(chat_id), text=html, parse_mode=ParseMode.HTML,
                                              disable_web_page_preview=True),
                "sendMessage")
        except DeliveryError as exc:
            refused_markup = exc.permanent and ("parse" in str(exc).lower() or "entit" in str(exc).lower())
            if not refused_markup:
                raise
            log.warning("telegram: chat %s refused our HTML (%s); resending as plain text", chat_id, exc)
            await self._with_retries(
                lambda: self.bot.send_message(chat_id=int(chat_id), text=plain_text_fallback(markdown)),
                "sendMessage")

    async def _with_retries(self, call: Callable[[], Awaitable[T]], what: str) -> T:
        """Honour 429 retry_after, retry network errors with backoff, never retry a refusal."""
        network_failures = 0
        waited = 0.0
        while True:
            try:
                return await call()
            except RetryAfter as exc:
                delay = _retry_seconds(exc)
                if waited + delay > MAX_RETRY_AFTER_S:
                    raise DeliveryError(f"{what}: Telegram asked us to wait {delay:.0f}s more") from exc
                log.warning("telegram: %s rate limited; retrying in %.1fs", what, delay)
                waited += delay
                await asyncio.sleep(delay)
            except (BadRequest, Forbidden, InvalidToken) as exc:
                raise DeliveryError(f"{what}: {exc.message}", permanent=True) from exc
            except NetworkError as exc:
                network_failures += 1
                if network_failures >= SEND_TRIES:
                    raise DeliveryError(f"{what}: network error after {SEND_TRIES} tries: {exc.message}") from exc
                delay = 0.5 * 2 ** network_failures
                log.warning("telegram: %s failed (%s); retry %d in %.1fs", what, exc.message,
                            network_failures, delay)
                await asyncio.sleep(delay)


def _remote_files(msg: TgMessage) -> list[RemoteFile]:
    files: list[RemoteFile] = []
    if msg.photo:
        best = msg.photo[-1]
        files.append(RemoteFile(kind="photo", source=best.file_id, name=f"photo_{msg.message_id}.jpg",
                                mime="image/jpeg", size=best.file_size))
    if msg.animation:
        a = msg.animation
        files.append(RemoteFile(kind="animation", source=a.file_id, name=a.file_name,
                                mime=a.mime_type, size=a.file_size))
    elif msg.document:
        d = msg.document
        kind = "image" if (d.mime_type or "").startswith("image/") else "document"
        files.append(RemoteFile(kind=kind, source=d.file_id, name=d.file_name, mime=d.mime_type,
                                size=d.file_size))
    if msg.voice:
        v = msg.voice
        files.append(RemoteFile(kind="voice", source=v.file_id, name=f"voice_{msg.message_id}.ogg",
                                mime=v.mime_type or "audio/ogg", size=v.file_size))
    if msg.audio:
        a = msg.audio
        files.append(RemoteFile(kind="audio", source=a.file_id, name=a.file_name or f"audio_{msg.message_id}",
                                mime=a.mime_type, size=a.file_size))
    if msg.video:
        v = msg.video
        files.append(RemoteFile(kind="video", source=v.file_id, name=v.file_name or f"video_{msg.message_id}.mp4",
                                mime=v.mime_type or "video/mp4", size=v.file_size))
    if msg.video_note:
        v = msg.video_note
        files.append(RemoteFile(kind="video_note", source=v.file_id, name=f"video_note_{msg.message_id}.mp4",
                                mime="video/mp4", size=v.file_size))
    if msg.sticker:
        s = msg.sticker
        animated = bool(s.is_animated or s.is_video)
        files.append(RemoteFile(kind="sticker", source=s.file_id, name=f"sticker_{msg.message_id}.webp",
                                mime="image/webp", size=s.file_size, emoji=s.emoji, animated=animated))
    return files
