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
import contextvars
import datetime as dt
import hmac
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from telegram import Update
from telegram.error import BadRequest, TelegramError

from talon.errors import ConfigError, MalformedWebhook, StoreUnavailable

from channels.http import HttpServer
from channels.telegram.api import ALLOWED_UPDATES, TelegramCore
from channels.telegram.update_shape import parse_update

log = logging.getLogger(__name__)

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
# How long a webhook request for an album item may wait for the album to reach the inbox.
WEBHOOK_ALBUM_WAIT_S = 30.0
# Set while a webhook update is processed; the error handler records handler failures in it.
_webhook_errors: contextvars.ContextVar[list[BaseException] | None] = contextvars.ContextVar(
    "telegram_webhook_errors", default=None)


class Webhook(TelegramCore):
    """Updates posted by Telegram to Talon's HTTP server, answered once they are in the inbox."""

    webhook_url: str
    webhook_path: str
    _webhook_secret: bytes
    _webhook_check_s: float
    _webhook_locks: dict[str, tuple[asyncio.Lock, list[int]]]
    _webhook_error_seen: dt.datetime | None
    _owns_http: bool
    http: HttpServer | None
    _watchdog: "asyncio.Task[None] | None"
    _down: str | None
    _retry_start: Callable[[str, Callable[[], Awaitable[object]]], Awaitable[None]]

    async def _start_webhook(self) -> None:
        """Listen (if the server is ours), then point Telegram at us; never poll in this mode."""
        assert self.http is not None
        if self._owns_http:
            await self.http.start()
        try:
            await self._retry_start("setWebhook", lambda: self.bot.set_webhook(
                url=self.webhook_url,
                secret_token=self._webhook_secret.decode(),
                allowed_updates=list(ALLOWED_UPDATES),
                drop_pending_updates=False,  # what arrived while we were away is still wanted
            ))
        except BadRequest as exc:
            raise ConfigError(f"Telegram refused the webhook TALON_TELEGRAM_WEBHOOK_URL="
                              f"{self.webhook_url!r}: {exc.message}", ["TALON_TELEGRAM_WEBHOOK_URL"]) from None
        log.info("telegram: webhook mode as @%s: Telegram posts to %s (route %s on %s:%s)",
                 self.bot.username, self.webhook_url, self.webhook_path, self.http.host,
                 self.http.port if self.http.running else self.http.requested_port)
        self._watchdog = asyncio.create_task(self._watch_webhook(), name="telegram-webhook-check")

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
                self._down = (f"the webhook is {info.url or '<none>'!r}, not {self.webhook_url}: another process "
                              "with this bot token changed it; restart Talon to set it again")
                log.error("telegram: the webhook is %r, not %s: another process with this bot token changed "
                          "it, and no updates reach Talon until it is set again (restart Talon)",
                          info.url or "<none>", self.webhook_url)
                continue
            self._down = None
            if info.last_error_date is not None and info.last_error_date != self._webhook_error_seen:
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
            data = parse_update(await request.read())
        except MalformedWebhook as exc:
            log.warning("telegram: webhook body refused (400): %s", exc)
            raise web.HTTPBadRequest(text="not an update") from None
        try:
            update = Update.de_json(data, self.bot)
        except Exception as exc:  # whatever PTB raises for a shape it cannot read
            log.warning("telegram: webhook update %s could not be read (%r); answered 400",
                        data["update_id"], exc)
            raise web.HTTPBadRequest(text="malformed update") from None
        errors: list[BaseException] = []
        token = _webhook_errors.set(errors)  # _on_handler_error records failures here
        try:
            chat = update.effective_chat
            key = str(chat.id) if chat is not None else ""
            lock, users = self._webhook_locks.setdefault(key, (asyncio.Lock(), [0]))
            users[0] += 1
            try:
                async with lock:
                    await self.app.process_update(update)
            finally:
                users[0] -= 1
                if not users[0]:
                    del self._webhook_locks[key]
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
