"""Telegram channel on python-telegram-bot: long polling (or a webhook) in, Bot API out.

Inbound: private messages from allowed users, and group messages that address the bot in listed
groups (see ``channels/telegram_groups.py``), become ``InboundMessage``s (albums are gathered
into one), files are referenced by file_id and downloaded during the turn, streamed and capped.
A watchdog restarts polling when getUpdates has not succeeded for too long.

Webhook mode (``TALON_TELEGRAM_WEBHOOK_URL`` set): no polling. At start Talon calls setWebhook
with that URL and the secret token, and Telegram POSTs each update to
``TALON_TELEGRAM_WEBHOOK_PATH`` on Talon's own HTTP server. A request without the exact
``X-Telegram-Bot-Api-Secret-Token`` gets 403 and is not looked at; a body that is not an update
gets 400. An update is answered 200 only after its message is in the durable inbox (an album:
after the album was gathered and submitted), so a crash before that makes Telegram retry, and the
inbox drops the duplicate a retry may bring. Starting in polling mode again deletes the webhook
(python-telegram-bot's start_polling does, keeping pending updates), else getUpdates would get 409.

Outbound: a reply becomes an ordered list of parts, each sent with retries; progress is reported
after every part so a restart resumes at the first undelivered part and never resends one.

- The list is derived from the reply alone (its text and the *names* of its media references),
  never from the disk, so the same reply always gives the same list and ``skip_parts`` means the
  same thing after a crash. Files are resolved, contained and opened only when their part is sent.
- Parts, in order: the text as rendered HTML chunks (each <= 4096 UTF-16 units, code blocks never
  split open); then the media, one part per file, except that 2-10 consecutive references whose
  names look like images form one album part (sendMediaGroup; a longer run is cut into balanced
  albums of at most 10); then the reply's notices as plain text.
- Caption: when the media form exactly one part (one file or one album) and the whole text renders
  to at most 1024 UTF-16 units, the text becomes that part's caption (on the album's first item)
  instead of a message of its own. Otherwise the text goes first and the media follow without
  captions, so a caption never has to be cut. If the captioned media cannot be delivered at all,
  the text is sent as a message, so no words are lost with the file.
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
- Groups: every send of a reply goes to its forum topic (``message_thread_id``), the first
  part's sends reply to the message that asked, and sends into a group are paced (``SendPacer``,
  about 20 messages a minute).
- Retries: a 429 waits the retry_after Telegram asks for; network errors are retried with backoff
  (3 tries); refusals (400/403) are never retried. Markup Telegram cannot parse is resent as plain
  text, for messages and captions alike.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import functools
import hmac
import json
import logging
import time
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, TypeVar
from urllib.parse import unquote

import httpx
from aiohttp import web
from telegram import InputFile, InputMediaPhoto, ReplyParameters, Update
from telegram import Message as TgMessage
from telegram.constants import ChatAction, ParseMode
from telegram.error import BadRequest, Forbidden, InvalidToken, NetworkError, RetryAfter, TelegramError, TimedOut
from telegram.ext import Application, ApplicationBuilder, ContextTypes, MessageHandler, filters
from telegram.request import HTTPXRequest
from telegram.warnings import PTBDeprecationWarning

from talon.attachments import AttachmentStore
from talon.config import MB, Limits, Settings
from talon.content import AttachmentRef, InboundFile, InboundKind
from talon.envelope import InboundMessage, OutboundReply, RemoteFile, conversation_id
from talon.errors import ConfigError, DeliveryError, DownloadError, DownloadTooLarge, MediaError, MediaPathError
from talon.media import MarkdownMediaRef, OutboundMedia, outbound_channel_media
from talon.media.failures import attach_failure_line, display_name, path_refusal_reason
from talon.render.long_reply import REPLY_DOCUMENT_NAME, long_reply_note, reply_document
from talon.render.chunking import split_markdown
from talon.render.telegram import (
    markdown_to_telegram_html,
    plain_text_fallback,
    split_markdown_for_telegram,
    utf16_len,
)
from talon.speech import probe_file_duration

from channels.base import Channel, PartCallback, deliver_parts, store_response
from channels.http import HttpServer
from channels.send_pace import SendPacer
from channels.telegram_groups import (
    ADMIN_STATUSES,
    GROUP_TYPES,
    ChatterLog,
    addressed,
    anonymous_admin,
    command_word,
    conversation_of,
    describe_unaddressed,
    for_another_bot,
    from_bot,
    is_real_reply,
    label,
    sender_of,
    thread_of,
    topic_title,
)
from channels.telegram_leader import PollLeader

log = logging.getLogger(__name__)

T = TypeVar("T")

SEND_TRIES = 3
# Uploads get time by their size: 30 s plus a second per 100 KB to send it (write) and to have
# Telegram process and answer (read). A timeout after the bytes went out may well have
# succeeded, so an upload that timed out is tried once more, never more (see _with_retries).
UPLOAD_BASE_TIMEOUT_S = 30.0
UPLOAD_BYTES_PER_S = 100_000
MAX_RETRY_AFTER_S = 120.0
ALBUM_WAIT_S = 1.2

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
# How long a webhook request for an album item may wait for the album to reach the inbox.
WEBHOOK_ALBUM_WAIT_S = 30.0
# Set while a webhook update is processed; the error handler records handler failures in it.
_webhook_errors: contextvars.ContextVar[list[BaseException] | None] = contextvars.ContextVar(
    "telegram_webhook_errors", default=None)


@dataclass(frozen=True)
class _SendTarget:
    """Where in a chat the sends of the part being delivered go: a forum topic, and the message
    they answer (groups). Set around each part, so every send of it lands in the same place."""

    thread_id: int | None = None
    reply_to: int | None = None


_send_target: contextvars.ContextVar[_SendTarget | None] = contextvars.ContextVar(
    "telegram_send_target", default=None)


def _where() -> dict[str, Any]:
    """The Bot API parameters that put a send in the current target's topic, as its reply."""
    target = _send_target.get()
    kwargs: dict[str, Any] = {}
    if target is not None and target.thread_id is not None:
        kwargs["message_thread_id"] = target.thread_id
    if target is not None and target.reply_to is not None:
        # A deleted question must not cost the answer.
        kwargs["reply_parameters"] = ReplyParameters(message_id=target.reply_to,
                                                     allow_sending_without_reply=True)
    return kwargs


def _int_or_none(value: str | None) -> int | None:
    return int(value) if value is not None else None


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
    with warnings.catch_warnings():
        # PTB 22 warns that retry_after will become a timedelta; both forms are handled here.
        warnings.simplefilter("ignore", PTBDeprecationWarning)
        value = exc.retry_after
    return value.total_seconds() if isinstance(value, dt.timedelta) else float(value)


@dataclass
class _Album:
    first: TgMessage
    files: list[RemoteFile] = field(default_factory=list)
    caption: str = ""
    timer: asyncio.TimerHandle | None = None
    submitted: asyncio.Event = field(default_factory=asyncio.Event)  # set when flushed
    addressed: bool = True  # in a group: whether any item speaks to the bot
    error: BaseException | None = None  # why submitting it failed


@dataclass(frozen=True)
class TextPart:
    """One chunk of the reply's markdown, sent as an HTML message."""

    markdown: str


@dataclass(frozen=True)
class NoticePart:
    """A line for the person (a notice), sent as plain text."""

    text: str


@dataclass(frozen=True)
class MediaPart:
    """One file, or 2-10 images sent as one album; ``caption`` is markdown ("" for none)."""

    refs: tuple[MarkdownMediaRef, ...]
    caption: str = ""


@dataclass(frozen=True)
class ReplyDocumentPart:
    """The whole of a very long reply, sent as a document (``talon.render.long_reply``)."""

    text: str
    note: str


Part = TextPart | NoticePart | MediaPart | ReplyDocumentPart

_IMAGE_NAME = frozenset({".png", ".jpg", ".jpeg", ".webp", ".bmp"})
ALBUM_MAX = 10

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


class TelegramChannel(Channel):
    name = "telegram"

    def __init__(self, settings: Settings, *, watchdog_interval_s: float = 15.0,
                 stall_after_s: float | None = None, http: HttpServer | None = None,
                 webhook_check_s: float = 300.0) -> None:
        if not settings.telegram_bot_token:
            raise ConfigError("TELEGRAM_BOT_TOKEN is not set", ["TELEGRAM_BOT_TOKEN"])
        settings.check_telegram_webhook()
        self.settings = settings
        self.limits: Limits = settings.limits()
        # Groups (channels/telegram_groups.py); a bad TALON_TELEGRAM_ALLOWED_CHATS fails here.
        self.allowed_chats = settings.telegram_allowed_chat_ids
        self.chatter = ChatterLog(settings.telegram_group_context)
        self.pacer = SendPacer(self.limits.telegram_group_messages_per_minute, 60.0)
        self._unlisted_logged: set[int] = set()
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
        self.startup_retry_max_s = 60.0
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=10.0), follow_redirects=False)
        # Webhook mode: Telegram posts updates to a route on Talon's shared HTTP server.
        self.webhook_url = settings.telegram_webhook_url.strip()
        self.webhook_path = settings.telegram_webhook_path.rstrip("/") or "/"
        self._webhook_secret = settings.telegram_webhook_secret.encode()
        self._webhook_check_s = webhook_check_s
        self._webhook_lock = asyncio.Lock()  # one update at a time, in arrival order, as polling does
        self._webhook_error_seen: dt.datetime | None = None
        self._owns_http = False
        self.http: HttpServer | None = None
        # Set by the runtime when workers share a database (channels.telegram_leader).
        self.poll_leader: PollLeader | None = None
        if self.webhook_url:
            self._owns_http = http is None
            self.http = http or HttpServer(settings.http_host, settings.http_port)
            self.http.add_route("POST", self.webhook_path, self._on_webhook)

    @property
    def bot(self) -> Any:
        return self.app.bot

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self, bridge: Any) -> None:
        self._bridge = bridge
        await self._initialize()
        await self.app.start()
        if self.http is not None:
            await self._start_webhook()
            return
        if self.poll_leader is not None:  # many workers: only the lease holder polls
            self._watchdog = asyncio.create_task(self.poll_leader.run(self), name="telegram-leader")
            return
        await self._start_polling()
        log.info("telegram: polling as @%s", self.bot.username)
        self._watchdog = asyncio.create_task(self._watch_polling(), name="telegram-watchdog")

    async def _initialize(self) -> None:
        """getMe, waiting out a network that is not up yet (a server booting) instead of dying."""
        delay = 1.0
        while True:
            try:
                await self.app.initialize()
                return
            except InvalidToken:
                # PTB's message repeats the token; ours must not.
                raise ConfigError("Telegram refused TELEGRAM_BOT_TOKEN (401 Unauthorized): check the "
                                  "token from @BotFather", ["TELEGRAM_BOT_TOKEN"]) from None
            except NetworkError as exc:
                if isinstance(exc, BadRequest):
                    raise
                log.warning("telegram: cannot reach the Bot API at %s (%s); retrying in %.0fs",
                            self.settings.telegram_api_base_url, type(exc).__name__, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.startup_retry_max_s)

    async def _start_webhook(self) -> None:
        """Listen (if the server is ours), then point Telegram at us; never poll in this mode."""
        assert self.http is not None
        if self._owns_http:
            await self.http.start()
        try:
            await self.bot.set_webhook(
                url=self.webhook_url,
                secret_token=self._webhook_secret.decode(),
                allowed_updates=["message"],
                drop_pending_updates=False,  # what arrived while we were away is still wanted
            )
        except BadRequest as exc:
            raise ConfigError(f"Telegram refused the webhook TALON_TELEGRAM_WEBHOOK_URL="
                              f"{self.webhook_url!r}: {exc.message}", ["TALON_TELEGRAM_WEBHOOK_URL"]) from None
        log.info("telegram: webhook mode as @%s: Telegram posts to %s (route %s on %s:%s)",
                 self.bot.username, self.webhook_url, self.webhook_path, self.http.host,
                 self.http.port if self.http.running else self.http.requested_port)
        self._watchdog = asyncio.create_task(self._watch_webhook(), name="telegram-webhook-check")

    async def _start_polling(self) -> None:
        assert self.app.updater is not None
        # start_polling calls deleteWebhook first (drop_pending_updates unset, so pending updates
        # stay), so a webhook left from webhook mode cannot make getUpdates fail with 409.
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
        if self._owns_http and self.http is not None:
            # Before the application: requests in flight finish (an album may still be flushed).
            # The webhook stays set, so Telegram keeps new updates until we are back.
            await self.http.stop()
        if self.app.updater and self.app.updater.running:
            await self.app.updater.stop()
        if self.app.running:
            await self.app.stop()  # handles the updates already fetched first
        # Polling confirmed every update it fetched, so Telegram will not send an album that is
        # still being gathered again: submit what arrived of it (the inbox keeps it for the next
        # start) rather than dropping it.
        for key, album in list(self._albums.items()):
            if album.timer:
                album.timer.cancel()
            try:
                self._flush_album(key)
            except Exception:
                log.exception("telegram: album %s could not be stored at stop", key)
        await self.app.shutdown()
        await self._http.aclose()

    def _on_poll_error(self, exc: TelegramError) -> None:
        log.warning("telegram: getUpdates failed (%s); python-telegram-bot retries", exc)

    async def _on_handler_error(self, update: object, context: ContextTypes.DEFAULT_TYPE) -> None:
        log.error("telegram: handler error: %s", context.error, exc_info=context.error)
        failures = _webhook_errors.get()
        if failures is not None and context.error is not None:
            failures.append(context.error)  # the webhook answers 500, so Telegram retries

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

    async def _watch_webhook(self) -> None:
        """Telegram reports failed webhook deliveries only through getWebhookInfo: log them."""
        while True:
            await asyncio.sleep(self._webhook_check_s)
            try:
                info = await self.bot.get_webhook_info()
            except TelegramError as exc:
                log.warning("telegram: getWebhookInfo failed (%s)", exc)
                continue
            if info.url != self.webhook_url:
                log.error("telegram: the webhook is %r, not %s: another process with this bot token changed "
                          "it, and no updates reach Talon until it is set again (restart Talon)",
                          info.url or "<none>", self.webhook_url)
            elif info.last_error_date is not None and info.last_error_date != self._webhook_error_seen:
                self._webhook_error_seen = info.last_error_date
                log.warning("telegram: Telegram could not deliver updates to %s (last error at %s: %s); "
                            "%d update(s) waiting", self.webhook_url, info.last_error_date,
                            info.last_error_message or "no message", info.pending_update_count)

    async def _on_webhook(self, request: web.Request) -> web.StreamResponse:
        """One update from Telegram, answered 200 only after its message is in the inbox."""
        given = request.headers.get(SECRET_HEADER, "").encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(given, self._webhook_secret):
            log.warning("telegram: webhook request with a missing or wrong %s refused (403, peer=%s)",
                        SECRET_HEADER, request.remote)
            raise web.HTTPForbidden(text="wrong secret token")
        if self._bridge is None or not self.app.running:
            raise web.HTTPServiceUnavailable(text="not ready")  # Telegram tries again later
        try:
            data = json.loads(await request.read())
        except ValueError as exc:  # includes JSONDecodeError and UnicodeDecodeError
            log.warning("telegram: webhook body is not JSON (%s); answered 400", exc)
            raise web.HTTPBadRequest(text="body is not JSON") from None
        if not isinstance(data, dict) or not isinstance(data.get("update_id"), int):
            log.warning("telegram: webhook body is not an update (no update_id); answered 400")
            raise web.HTTPBadRequest(text="not an update")
        try:
            update = Update.de_json(data, self.bot)
        except Exception as exc:  # whatever PTB raises for a shape it cannot read
            log.warning("telegram: webhook update %s could not be read (%r); answered 400",
                        data["update_id"], exc)
            raise web.HTTPBadRequest(text="malformed update") from None
        errors: list[BaseException] = []
        token = _webhook_errors.set(errors)  # _on_handler_error records failures here
        try:
            async with self._webhook_lock:
                await self.app.process_update(update)
        except RuntimeError as exc:  # the application stopped under us
            log.warning("telegram: update %s arrived while stopping (%s); answered 503",
                        update.update_id, exc)
            raise web.HTTPServiceUnavailable(text="stopping") from None
        finally:
            _webhook_errors.reset(token)
        msg = update.message
        if not errors and msg is not None and msg.media_group_id:
            # Outside the lock: the album's other items must be able to arrive meanwhile.
            album = self._albums.get(f"{msg.chat.id}:{msg.media_group_id}")  # _collect_album's key
            if album is not None:
                try:
                    await asyncio.wait_for(album.submitted.wait(), WEBHOOK_ALBUM_WAIT_S)
                except TimeoutError:
                    errors.append(TimeoutError(f"album {msg.media_group_id} was not submitted"))
                if album.error is not None:
                    errors.append(album.error)
        if errors:
            log.error("telegram: update %s was not stored (%s); answered 500 so that Telegram sends it "
                      "again", update.update_id, errors[0])
            raise web.HTTPInternalServerError(text="not stored; send again")
        return web.Response(text="ok")

    # --- inbound ------------------------------------------------------------------------------
    async def _on_message(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        msg = update.message
        if msg is None or msg.from_user is None:
            return
        user = msg.from_user
        if msg.chat.type in GROUP_TYPES:
            await self._on_group_message(msg)
            return
        if msg.chat.type != "private":
            log.info("telegram: ignoring message in %s chat %s (only private chats and groups are served)",
                     msg.chat.type, msg.chat.id)
            return
        if user.is_bot:
            return  # bots do not talk to bots
        identities = [str(user.id)] + ([f"@{user.username}"] if user.username else [])
        if not self._bridge.gate.allowed(self.name, identities):
            handle = f" (@{user.username})" if user.username else ""
            pairing = self._bridge.gate.request_pairing(
                self.name, str(user.id), f"@{user.username}" if user.username else user.full_name)
            if pairing is None:
                log.warning(
                    "telegram: message from user %s%s denied; to allow them add %s to "
                    "TALON_TELEGRAM_ALLOWED_USERS", user.id, handle, user.id)
                return
            log.warning("telegram: message from user %s%s denied; to allow them run `talon pair %s` "
                        "(or add %s to TALON_TELEGRAM_ALLOWED_USERS)", user.id, handle, pairing.code, user.id)
            if pairing.reply is not None:
                try:
                    await self.bot.send_message(chat_id=msg.chat.id, text=pairing.reply)
                except TelegramError as exc:
                    log.warning("telegram: could not send the pairing code to user %s: %s", user.id, exc)
            return
        files = _remote_files(msg)
        if msg.media_group_id:
            self._collect_album(msg, files)
            return
        text = msg.text or msg.caption or ""
        if not text and not files:
            described = _described_content(msg)
            if described is None:
                # A service message (a pin, a timer change...): nobody said anything to answer.
                log.info("telegram: chat=%s: message %s has no text or media; nothing to answer",
                         msg.chat.id, msg.message_id)
                return
            text = described
        self._submit(msg, text, files)

    async def _on_group_message(self, msg: TgMessage) -> None:
        """A group message: a turn when the group is listed and the message addresses the bot,
        chatter when it is listed but does not, nothing otherwise (channels/telegram_groups.py)."""
        chat = msg.chat
        if from_bot(msg):
            log.debug("telegram: chat=%s: message %s is from a bot; not a turn", chat.id, msg.message_id)
            return
        if chat.id not in self.allowed_chats:
            if msg.migrate_to_chat_id:
                log.warning("telegram: group %s (%r) became supergroup %s; to serve it add %s to "
                            "TALON_TELEGRAM_ALLOWED_CHATS", chat.id, chat.title, msg.migrate_to_chat_id,
                            msg.migrate_to_chat_id)
            elif chat.id not in self._unlisted_logged:
                self._unlisted_logged.add(chat.id)
                log.warning("telegram: message in %s %s (%r) ignored: the group is not listed; to serve it "
                            "add %s to TALON_TELEGRAM_ALLOWED_CHATS", chat.type, chat.id, chat.title, chat.id)
            else:
                log.debug("telegram: message in unlisted %s %s ignored", chat.type, chat.id)
            return
        files = _remote_files(msg)
        spoken_to = ((self.settings.telegram_group_trigger == "all"
                      and not for_another_bot(msg.text or msg.caption or "", self.bot.username))
                     or addressed(msg, self.bot.id, self.bot.username))
        if msg.media_group_id:
            self._collect_album(msg, files, addressed=spoken_to)
            return
        text = msg.text or msg.caption or ""
        if not text and not files:
            described = _described_content(msg)
            if described is None:
                return  # a service message (someone joined, a pin...)
            text = described
        if not spoken_to:
            self.chatter.add(conversation_of(msg), label(msg), describe_unaddressed(text, len(files)))
            return
        if not files and not await self._group_command_allowed(msg, text):
            return
        self._submit(msg, text, files)

    async def _group_command_allowed(self, msg: TgMessage, text: str) -> bool:
        """``/new`` in a group wipes the context of everyone in it: only an administrator, or
        someone allowed in TALON_TELEGRAM_ALLOWED_USERS (or approved by pairing), may."""
        if command_word(text, self.bot.username) != "/new" or anonymous_admin(msg):
            return True
        user = msg.from_user
        assert user is not None
        identities = [str(user.id)] + ([f"@{user.username}"] if user.username else [])
        if self._bridge.gate.allowed(self.name, identities):
            return True
        try:
            member = await self._with_retries(
                lambda: self.bot.get_chat_member(chat_id=msg.chat.id, user_id=user.id), "getChatMember")
        except DeliveryError as exc:
            log.warning("telegram: chat=%s: cannot tell whether user %s is an administrator (%s); /new refused",
                        msg.chat.id, user.id, exc)
            refusal = ("I could not check whether you are an administrator of this group, so I did not "
                       "start a new conversation. Please try again.")
        else:
            if member.status in ADMIN_STATUSES:
                return True
            log.info("telegram: chat=%s: /new from user %s (%s, not an administrator) refused",
                     msg.chat.id, user.id, member.status)
            refusal = "Only an administrator of this group can start a new conversation here."
        token = _send_target.set(_SendTarget(thread_id=_int_or_none(thread_of(msg)), reply_to=msg.message_id))
        try:
            await self._send_plain(str(msg.chat.id), refusal)
        except DeliveryError as exc:
            log.warning("telegram: chat=%s: could not send the /new refusal: %s", msg.chat.id, exc)
        finally:
            _send_target.reset(token)
        return False

    def _collect_album(self, msg: TgMessage, files: list[RemoteFile], *, addressed: bool = True) -> None:
        """Telegram sends an album as one message per item; gather them into one turn."""
        key = f"{msg.chat.id}:{msg.media_group_id}"
        album = self._albums.get(key)
        if album is None:
            album = self._albums[key] = _Album(first=msg, addressed=addressed)
        else:
            album.addressed = album.addressed or addressed
            if album.timer:
                album.timer.cancel()
        album.files.extend(files)
        if msg.caption and not album.caption:
            album.caption = msg.caption
        loop = asyncio.get_running_loop()
        album.timer = loop.call_later(ALBUM_WAIT_S, self._flush_album, key)

    def _flush_album(self, key: str) -> None:
        album = self._albums.pop(key, None)
        if album is not None:
            try:
                if not album.addressed:  # a group album nobody asked the bot about
                    self.chatter.add(conversation_of(album.first), label(album.first),
                                     describe_unaddressed(album.caption, len(album.files)))
                    return
                self._submit(album.first, album.caption, album.files)
            except Exception as exc:
                album.error = exc  # a webhook request waiting for the album answers 500
                raise
            finally:
                album.submitted.set()

    def _submit(self, msg: TgMessage, text: str, files: list[RemoteFile]) -> None:
        reply = msg.reply_to_message
        quoted = (reply.text or reply.caption) if reply is not None else None
        user = msg.from_user
        assert user is not None
        name, username = sender_of(msg)
        group = msg.chat.type in GROUP_TYPES
        # A command (/status, /new) is answered without the model: the chatter waits for a turn.
        command = not files and bool(command_word(text, self.bot.username))
        self._bridge.submit(
            InboundMessage(
                channel=self.name,
                chat_id=str(msg.chat.id),
                sender_id=str(msg.sender_chat.id if anonymous_admin(msg) and msg.sender_chat else user.id),
                sender_name=name,
                sender_username=username,
                message_id=str(msg.message_id),
                text=text,
                files=files,
                reply_to_text=quoted,
                chat_type=msg.chat.type,
                chat_title=msg.chat.title,
                thread_id=thread_of(msg) if group else None,
                thread_title=topic_title(msg) if group else None,
                chatter=self.chatter.take(conversation_of(msg)) if group and not command else [],
                reply_to_sender=self._replied_to(msg) if group else None,
            )
        )

    def _replied_to(self, msg: TgMessage) -> str | None:
        """Who wrote the message a group message replies to, as the model is told it."""
        root = msg.reply_to_message
        if root is None or not is_real_reply(msg):
            return None
        if root.from_user is not None and root.from_user.id == self.bot.id:
            return "you"
        return label(root)

    async def download(self, remote: RemoteFile, store: AttachmentStore, limits: Limits) -> InboundFile:
        base = InboundFile(kind=remote.kind, name=remote.name, mime=remote.mime, size=remote.size,
                           emoji=remote.emoji, animated=remote.animated)
        name = remote.name or remote.kind
        if remote.kind == "sticker" and remote.animated:
            return base  # animated stickers are described by their emoji; nothing to fetch
        too_large = base.model_copy(
            update={"notice": str(DownloadTooLarge(name, remote.size, limits.download_max_bytes))})
        if remote.size is not None and remote.size > limits.download_max_bytes:
            return too_large
        try:
            tg_file = await self._with_retries(lambda: self.bot.get_file(remote.source), "getFile")
        except DeliveryError as exc:
            text = str(exc)
            if "too big" in text.lower():
                return too_large
            return base.model_copy(update={"notice": f"Telegram would not give us {name}: {text}"})
        url = tg_file.file_path
        try:
            ref = await self._stream(url, store, remote, limits)
        except MediaError as exc:
            return base.model_copy(update={"notice": str(exc)})
        return base.model_copy(update={"ref": ref, "size": ref.bytes})

    async def _stream(self, url: str, store: AttachmentStore, remote: RemoteFile,
                      limits: Limits) -> AttachmentRef:
        name = remote.name or remote.kind
        for attempt in range(1, SEND_TRIES + 1):
            try:
                async with self._http.stream("GET", url) as resp:
                    if resp.status_code != 200:
                        # The URL carries the bot token: never log or show it.
                        raise DownloadError(f"download of {name} failed: HTTP {resp.status_code}")
                    return await store_response(resp, store, remote, limit=limits.download_max_bytes,
                                                mime=remote.mime or "application/octet-stream")
            except httpx.HTTPError as exc:
                if attempt == SEND_TRIES:
                    raise DownloadError(f"download of {name} failed: {type(exc).__name__}") from exc
                await asyncio.sleep(0.5 * 2 ** attempt)
        raise DownloadError(f"download of {name} failed")

    # --- outbound -----------------------------------------------------------------------------
    async def send_typing(self, chat_id: str, thread_id: str | None = None) -> None:
        where = {"message_thread_id": int(thread_id)} if thread_id is not None else {}
        await self.bot.send_chat_action(chat_id=int(chat_id), action=ChatAction.TYPING, **where)

    def reply_parts(self, reply: OutboundReply) -> list[Part]:
        return plan_parts(reply, self.limits)

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
        if isinstance(part, TextPart):
            await self._send_text(chat_id, part.markdown)
        elif isinstance(part, NoticePart):
            await self._send_plain(chat_id, part.text)
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
            await self._with_retries(self._paced(
                chat_id, lambda: self.bot.send_message(chat_id=int(chat_id), text=html, parse_mode=ParseMode.HTML,
                                                       disable_web_page_preview=True, **_where())),
                "sendMessage")
        except DeliveryError as exc:
            if not _refused_markup(exc):
                raise
            log.warning("telegram: chat %s refused our HTML (%s); resending as plain text", chat_id, exc)
            await self._send_plain(chat_id, plain_text_fallback(markdown))

    async def _send_reply_document(self, chat_id: str, part: ReplyDocumentPart) -> None:
        data = reply_document(part.text)

        def call() -> Awaitable[Any]:
            return self.bot.send_document(
                chat_id=int(chat_id), caption=part.note,
                document=InputFile(data, filename=REPLY_DOCUMENT_NAME),
                **upload_timeouts(len(data)))

        try:
            await self._with_retries(call, "sendDocument", upload=True)
        except DeliveryError as exc:
            if not exc.permanent:
                raise
            log.warning("telegram: chat=%s: the long reply as %s could not be sent: %s", chat_id,
                        REPLY_DOCUMENT_NAME, exc)
            await self._send_plain(chat_id, attach_failure_line(REPLY_DOCUMENT_NAME, _refusal_reason(exc)))

    async def _send_plain(self, chat_id: str, text: str) -> None:
        for chunk in split_markdown(text, self.limits.telegram_text_max, utf16_len):
            await self._with_retries(self._paced(
                chat_id, functools.partial(self.bot.send_message, chat_id=int(chat_id), text=chunk,
                                           disable_web_page_preview=True, **_where())),
                "sendMessage")

    # --- outbound media -----------------------------------------------------------------------
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
            await self._send_plain(chat_id, "\n".join(failures))

    def _open_media(self, chat_id: str, ref: MarkdownMediaRef, failures: list[str]) -> OutboundMedia | None:
        """Resolve and open one reference, or record why it cannot be sent."""
        name = display_name(ref.path)
        try:
            target = _send_target.get()
            topic = str(target.thread_id) if target is not None and target.thread_id is not None else None
            # The conversation's own workspace: a forum topic has its own.
            media = outbound_channel_media(ref, "", self.settings.workspace_dir(self.name, conversation_id(chat_id, topic)))
        except MediaPathError as exc:
            log.warning("telegram: chat=%s: not attaching %r: %s", chat_id, ref.path, exc)
            failures.append(attach_failure_line(name, path_refusal_reason(exc)))
            return None
        except OSError as exc:
            log.warning("telegram: chat=%s: cannot read %r: %s", chat_id, ref.path, exc)
            failures.append(attach_failure_line(name, "it cannot be read"))
            return None
        limit = self.limits.telegram_upload_max_bytes
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
        return media.kind == "image" and media.size <= self.limits.telegram_photo_max_bytes

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
                            send: Callable[[str | None, str | None], Awaitable[Any]]) -> None:
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
        send = getattr(self.bot, method)
        # Telegram shows a voice note's or audio's length from this, not from the file.
        duration = await asyncio.to_thread(media_seconds, media) if kind in ("voice", "audio") else None

        def call() -> Awaitable[Any]:
            media.file.seek(0)  # a failed try may have read part of the file
            kwargs: dict[str, Any] = {"chat_id": int(chat_id), field_name: _input_file(media), **_where(),
                                      **upload_timeouts(media.size)}
            if duration is not None:
                kwargs["duration"] = duration
            if caption is not None:
                kwargs.update(caption=caption, parse_mode=parse_mode)
            return send(**kwargs)

        await self._with_retries(self._paced(chat_id, call), _API_NAMES[kind], upload=True)

    async def _upload_album(self, chat_id: str, members: list[OutboundMedia], caption: str | None,
                            parse_mode: str | None) -> None:
        def call() -> Awaitable[Any]:
            items = []
            for index, media in enumerate(members):
                media.file.seek(0)
                first = index == 0 and caption is not None
                items.append(InputMediaPhoto(media=_input_file(media, attach=True),
                                             caption=caption if first else None,
                                             parse_mode=parse_mode if first else None))
            return self.bot.send_media_group(chat_id=int(chat_id), media=items, **_where(),
                                             **upload_timeouts(sum(m.size for m in members)))

        await self._with_retries(self._paced(chat_id, call, len(members)), "sendMediaGroup", upload=True)

    def _paced(self, chat_id: str, call: Callable[[], Awaitable[T]], messages: int = 1) -> Callable[[], Awaitable[T]]:
        """``call``, waiting first for room in a group's send allowance (each try counts)."""
        if not chat_id.startswith("-"):  # users have positive ids; groups negative
            return call

        async def paced() -> T:
            waited = await self.pacer.acquire(chat_id, messages)
            if waited:
                log.info("telegram: chat=%s: paced %.1fs (about %d messages a minute into a group)",
                         chat_id, waited, self.pacer.limit)
            return await call()

        return paced

    async def _with_retries(self, call: Callable[[], Awaitable[T]], what: str, *, upload: bool = False) -> T:
        """Honour 429 retry_after, retry network errors with backoff, never retry a refusal.

        An upload whose answer timed out may have arrived: it is retried once, logged, and a
        second timeout is ``UploadTimedOut`` (the file gets a "Could not attach" line, the rest
        of the reply goes on) instead of uploading the same file again and again.
        """
        network_failures = 0
        waited = 0.0
        timeouts = 0
        while True:
            try:
                return await call()
            except TimedOut as exc:
                if not upload:
                    network_failures += 1
                    if network_failures >= SEND_TRIES:
                        raise DeliveryError(f"{what}: timed out after {SEND_TRIES} tries") from exc
                    await asyncio.sleep(0.5 * 2 ** network_failures)
                    continue
                timeouts += 1
                if timeouts > 1:
                    log.error("telegram: %s timed out again; not uploading a third time (the file may "
                              "have arrived)", what)
                    raise UploadTimedOut(f"{what}: the upload timed out twice") from exc
                log.warning("telegram: %s timed out waiting for Telegram's answer; the upload may have "
                            "arrived; retrying once", what)
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
        kind: InboundKind = "image" if (d.mime_type or "").startswith("image/") else "document"
        files.append(RemoteFile(kind=kind, source=d.file_id, name=d.file_name, mime=d.mime_type,
                                size=d.file_size))
    if msg.voice:
        v = msg.voice
        files.append(RemoteFile(kind="voice", source=v.file_id, name=f"voice_{msg.message_id}.ogg",
                                mime=v.mime_type or "audio/ogg", size=v.file_size))
    if msg.audio:
        au = msg.audio
        files.append(RemoteFile(kind="audio", source=au.file_id, name=au.file_name or f"audio_{msg.message_id}",
                                mime=au.mime_type, size=au.file_size))
    if msg.video:
        vi = msg.video
        files.append(RemoteFile(kind="video", source=vi.file_id, name=vi.file_name or f"video_{msg.message_id}.mp4",
                                mime=vi.mime_type or "video/mp4", size=vi.file_size))
    if msg.video_note:
        vn = msg.video_note
        files.append(RemoteFile(kind="video_note", source=vn.file_id, name=f"video_note_{msg.message_id}.mp4",
                                mime="video/mp4", size=vn.file_size))
    if msg.sticker:
        s = msg.sticker
        animated = bool(s.is_animated or s.is_video)
        files.append(RemoteFile(kind="sticker", source=s.file_id, name=f"sticker_{msg.message_id}.webp",
                                mime="image/webp", size=s.file_size, emoji=s.emoji, animated=animated))
    return files


def _described_content(msg: TgMessage) -> str | None:
    """Words for the agent about a message that carries neither text nor a file (a location, a
    contact...); None for a service message, which is not something a person said."""
    if msg.venue:
        v = msg.venue
        place = ", ".join(p for p in (v.title, v.address) if p)
        return f"[Shared a place: {v.location.latitude}, {v.location.longitude} ({place})]"
    if msg.location:
        return f"[Shared a location: {msg.location.latitude}, {msg.location.longitude}]"
    if msg.contact:
        c = msg.contact
        name = " ".join(p for p in (c.first_name, c.last_name) if p)
        return f"[Shared a contact: {name}, {c.phone_number}]"
    if msg.poll:
        options = "; ".join(o.text for o in msg.poll.options)
        return f"[Sent a poll: {msg.poll.question} (options: {options})]"
    if msg.dice:
        return f"[Rolled a {msg.dice.emoji}: {msg.dice.value}]"
    attachment = msg.effective_attachment
    if attachment:
        kind = type(attachment[0] if isinstance(attachment, tuple) else attachment).__name__
        return f"[Sent something Talon cannot show: a Telegram {kind}]"
    return None


# --- outbound planning (pure) -----------------------------------------------------------------
def plan_parts(reply: OutboundReply, limits: Limits) -> list[Part]:
    """The ordered parts of a reply; a function of the reply alone (see the module docstring)."""
    chunks = [chunk for chunk in split_markdown_for_telegram(reply.text, limits.telegram_text_max)
              if chunk.strip()]
    document: ReplyDocumentPart | None = None
    if len(chunks) > limits.telegram_reply_max_messages:
        document = ReplyDocumentPart(reply.text, long_reply_note(len(reply.text), len(chunks)))
        chunks = chunks[:1]
    groups = _media_groups(reply.media)
    caption = ""
    if (len(groups) == 1 and len(chunks) == 1
            and utf16_len(markdown_to_telegram_html(chunks[0])) <= limits.telegram_caption_max):
        caption, chunks = chunks[0], []
    parts: list[Part] = [TextPart(chunk) for chunk in chunks]
    if document is not None:
        parts.append(document)
    parts.extend(MediaPart(group, caption if i == 0 else "") for i, group in enumerate(groups))
    parts.extend(NoticePart(notice) for notice in reply.notices if notice.strip())
    return parts


def _looks_like_image(ref: MarkdownMediaRef) -> bool:
    return PurePosixPath(unquote(ref.path)).suffix.lower() in _IMAGE_NAME


def _media_groups(refs: list[MarkdownMediaRef]) -> list[tuple[MarkdownMediaRef, ...]]:
    """One group per file, except runs of image names, which become albums of 2-10."""
    groups: list[tuple[MarkdownMediaRef, ...]] = []
    run: list[MarkdownMediaRef] = []

    def flush() -> None:
        # Balanced albums: 11 images are 6 + 5, never 10 + a lone photo.
        count = -(-len(run) // ALBUM_MAX)
        for i in range(count):
            album = run[len(run) * i // count: len(run) * (i + 1) // count]
            groups.append(tuple(album))
        run.clear()

    for ref in refs:
        if _looks_like_image(ref):
            run.append(ref)
            continue
        flush()
        groups.append((ref,))
    flush()
    return groups


def media_seconds(media: OutboundMedia) -> int | None:
    """Whole seconds of a voice note or audio file, read from its checked open file."""
    seconds = probe_file_duration(media.file)
    return max(1, round(seconds)) if seconds else None


def _input_file(media: OutboundMedia, *, attach: bool = False) -> InputFile:
    """An upload streamed from the checked open file, under the file's own name and type."""
    upload = InputFile(media.file, filename=media.name, attach=attach, read_file_handle=False)
    upload.mimetype = media.mime
    return upload


def _refused_markup(exc: DeliveryError) -> bool:
    text = str(exc).lower()
    return exc.permanent and ("parse" in text or "entit" in text)


class UploadTimedOut(DeliveryError):
    """An upload that timed out twice: not tried a third time, since it may have arrived."""

    def __init__(self, message: str) -> None:
        super().__init__(message, permanent=True)


def upload_timeouts(size: int) -> dict[str, float]:
    """Write and read timeouts for uploading ``size`` bytes (python-telegram-bot's kwargs)."""
    extra = size / UPLOAD_BYTES_PER_S
    return {"write_timeout": UPLOAD_BASE_TIMEOUT_S + extra, "read_timeout": UPLOAD_BASE_TIMEOUT_S + extra}


def _refusal_reason(exc: DeliveryError) -> str:
    if isinstance(exc, UploadTimedOut):
        return "the upload timed out twice (it may still arrive)"
    cause = exc.__cause__
    detail = cause.message if isinstance(cause, TelegramError) else str(exc)
    return f"Telegram refused it ({detail})"
