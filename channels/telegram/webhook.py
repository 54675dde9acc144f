"""Webhook mode (``TALON_TELEGRAM_WEBHOOK_URL`` set): no polling.

At start Talon calls setWebhook with that URL and the secret token, and Telegram POSTs each update
to ``TALON_TELEGRAM_WEBHOOK_PATH`` on Talon's own HTTP server. A request without the exact
``X-Telegram-Bot-Api-Secret-Token`` gets 403 and is not looked at; a body that is not an update
(``update_shape``: not JSON, too deep, lone surrogates, wrong types where Talon reads) gets 400
with one log line, never a 500. An update is answered 200 only after its message is in the durable inbox (an album:
after the album was gathered and submitted), so a crash before that makes Telegram retry, and the
inbox drops the duplicate a retry may bring. Starting in polling mode again deletes the webhook
(python-telegram-bot's start_polling does, keeping pending updates), else getUpdates would get 409.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hmac
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from telegram import Update
from telegram.error import BadRequest, TelegramError

from talon.errors import ConfigError, MalformedWebhook, StoreUnavailable

from channels.http import HttpServer
from channels.telegram.api import ALLOWED_UPDATES, TelegramApi
from channels.telegram.intake import Intake, _webhook_errors
from channels.telegram.update_shape import parse_update

log = logging.getLogger(__name__)

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
# How long a webhook request for an album item may wait for the album to reach the inbox.
WEBHOOK_ALBUM_WAIT_S = 30.0


class Webhook:
    """Updates posted by Telegram to Talon's HTTP server (``http``; started and stopped here when
    ``owns_http``), answered once ``intake`` has them in the inbox."""

    def __init__(self, api: TelegramApi, intake: Intake, http: HttpServer, *, owns_http: bool,
                 check_s: float) -> None:
        settings = api.settings
        self.api = api
        self.intake = intake
        self.http = http
        self.owns_http = owns_http
        self.url = settings.telegram_webhook_url.strip()
        self.path = settings.telegram_webhook_path.rstrip("/") or "/"
        self._secret = settings.telegram_webhook_secret.encode()
        self._check_s = check_s
        # One update of a chat at a time, in arrival order, as polling does; chats in parallel, so
        # one chat's write to the inbox never waits behind another's.
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}  # chat -> (lock, users)
        self._error_seen: dt.datetime | None = None
        # Why updates do not reach us although we started (None: they do): another process
        # changed the webhook. ``TelegramChannel.health`` reports it.
        self.lost: str | None = None
        http.add_route("POST", self.path, self.handle)

    async def start(self, retry_start: Callable[[str, Callable[[], Awaitable[object]]], Awaitable[None]]) -> None:
        """Listen (if the server is ours), then point Telegram at us (through ``retry_start``, which
        waits out a Bot API that cannot be reached); never poll in this mode."""
        if self.owns_http:
            await self.http.start()
        try:
            await retry_start("setWebhook", lambda: self.api.bot.set_webhook(
                url=self.url,
                secret_token=self._secret.decode(),
                allowed_updates=list(ALLOWED_UPDATES),
                drop_pending_updates=False,  # what arrived while we were away is still wanted
            ))
        except BadRequest as exc:
            raise ConfigError(f"Telegram refused the webhook TALON_TELEGRAM_WEBHOOK_URL="
                              f"{self.url!r}: {exc.message}", ["TALON_TELEGRAM_WEBHOOK_URL"]) from None
        log.info("telegram: webhook mode as @%s: Telegram posts to %s (route %s on %s:%s)",
                 self.api.bot.username, self.url, self.path, self.http.host,
                 self.http.port if self.http.running else self.http.requested_port)

    async def watch(self) -> None:
        """Telegram reports failed webhook deliveries only through getWebhookInfo: log them."""
        while True:
            await asyncio.sleep(self._check_s)
            try:
                info = await self.api.bot.get_webhook_info()
            except TelegramError as exc:
                log.warning("telegram: getWebhookInfo failed (%s)", exc)
                continue
            if info.url != self.url:
                self.lost = (f"the webhook is {info.url or '<none>'!r}, not {self.url}: another process "
                              "with this bot token changed it; restart Talon to set it again")
                log.error("telegram: the webhook is %r, not %s: another process with this bot token changed "
                          "it, and no updates reach Talon until it is set again (restart Talon)",
                          info.url or "<none>", self.url)
                continue
            self.lost = None
            if info.last_error_date is not None and info.last_error_date != self._error_seen:
                self._error_seen = info.last_error_date
                log.warning("telegram: Telegram could not deliver updates to %s (last error at %s: %s); "
                            "%d update(s) waiting", self.url, info.last_error_date,
                            info.last_error_message or "no message", info.pending_update_count)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """One update from Telegram, answered 200 only after its message is in the inbox."""
        given = request.headers.get(SECRET_HEADER, "").encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(given, self._secret):
            log.warning("telegram: webhook request with a missing or wrong %s refused (403, peer=%s)",
                        SECRET_HEADER, request.remote)
            raise web.HTTPForbidden(text="wrong secret token")
        if not self.intake.bound or not self.api.app.running:
            raise web.HTTPServiceUnavailable(text="not ready")  # Telegram tries again later
        try:
            data = parse_update(await request.read())
        except MalformedWebhook as exc:
            log.warning("telegram: webhook body refused (400): %s", exc)
            raise web.HTTPBadRequest(text="not an update") from None
        try:
            update = Update.de_json(data, self.api.bot)
        except Exception as exc:  # whatever PTB raises for a shape it cannot read
            log.warning("telegram: webhook update %s could not be read (%r); answered 400",
                        data["update_id"], exc)
            raise web.HTTPBadRequest(text="malformed update") from None
        errors: list[BaseException] = []
        token = _webhook_errors.set(errors)  # Intake.on_handler_error records failures here
        try:
            chat = update.effective_chat
            key = str(chat.id) if chat is not None else ""
            lock, users = self._locks.setdefault(key, (asyncio.Lock(), [0]))
            users[0] += 1
            try:
                async with lock:
                    await self.api.app.process_update(update)
            finally:
                users[0] -= 1
                if not users[0]:
                    del self._locks[key]
        except RuntimeError as exc:  # the application stopped under us
            log.warning("telegram: update %s arrived while stopping (%s); answered 503",
                        update.update_id, exc)
            raise web.HTTPServiceUnavailable(text="stopping") from None
        finally:
            _webhook_errors.reset(token)
        msg = update.message
        if not errors and msg is not None and msg.media_group_id:
            # Outside the lock: the album's other items must be able to arrive meanwhile.
            album = self.intake.album(msg.chat.id, msg.media_group_id)
            if album is not None:
                try:
                    await asyncio.wait_for(album.submitted.wait(), WEBHOOK_ALBUM_WAIT_S)
                except TimeoutError:
                    errors.append(TimeoutError(f"album {msg.media_group_id} was not submitted"))
                if album.error is not None:
                    errors.append(album.error)
        unavailable = next((e for e in errors if isinstance(e, StoreUnavailable)), None)
        if unavailable is not None:
            log.warning("telegram: update %s not stored: %s; answered 503 so that Telegram sends it again",
                        update.update_id, unavailable)
            raise web.HTTPServiceUnavailable(text="the database is unavailable; send again",
                                             headers={"Retry-After": "5"})
        if errors:
            log.error("telegram: update %s was not stored (%s); answered 500 so that Telegram sends it "
                      "again", update.update_id, errors[0])
            raise web.HTTPInternalServerError(text="not stored; send again")
        return web.Response(text="ok")
