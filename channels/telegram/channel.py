"""The Telegram channel: its clients, start and stop; the jobs live in the sibling modules."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import httpx
from telegram.error import BadRequest, InvalidToken, NetworkError, RetryAfter
from telegram.ext import Application, ApplicationBuilder, CallbackQueryHandler, MessageHandler, filters
from telegram.request import HTTPXRequest

from talon.config import Limits, Settings
from talon.errors import ConfigError

from channels.base import BridgeHandle, ChannelHealth
from channels.http import HttpServer
from channels.telegram.api import _retry_seconds, telegram_budget
from channels.telegram.approvals import ApprovalPrompts
from channels.telegram.delivery import Delivery
from channels.telegram.downloads import Downloads
from channels.telegram.groups import ChatterLog
from channels.telegram.intake import Intake, _Album
from channels.telegram.polling import Polling, _PollingRequest
from channels.telegram.reactions import Reactions, check_reaction
from channels.telegram.streaming import Streaming, TelegramLiveView
from channels.telegram.webhook import Webhook
from channels.telegram_leader import PollLeader

if TYPE_CHECKING:
    from talon.storage.leases import Leases

log = logging.getLogger(__name__)


class TelegramChannel(Intake, Webhook, Polling, Downloads, Streaming, Reactions, ApprovalPrompts, Delivery):
    name = "telegram"

    def __init__(self, settings: Settings, *, watchdog_interval_s: float = 15.0,
                 stall_after_s: float | None = None, http: HttpServer | None = None,
                 webhook_check_s: float = 300.0) -> None:
        if not settings.telegram_bot_token:
            raise ConfigError("TELEGRAM_BOT_TOKEN is not set", ["TELEGRAM_BOT_TOKEN"])
        settings.check_telegram_webhook()
        self.settings = settings
        self.limits: Limits = settings.limits()
        # Groups (channels/telegram/groups.py); a bad TALON_TELEGRAM_ALLOWED_CHATS fails here.
        self.allowed_chats = settings.telegram_allowed_chat_ids
        self.chatter = ChatterLog(settings.telegram_group_context)
        self.budget = telegram_budget(self.limits)  # every call into a chat counts (api.py)
        self.ack_reaction = check_reaction(settings.telegram_ack_reaction)
        self._acknowledged: set[str] = set()
        self._live: dict[str, TelegramLiveView] = {}  # conversation -> the answer shown as it is written
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
        self.app.add_handler(MessageHandler(filters.UpdateType.MESSAGE | filters.UpdateType.EDITED_MESSAGE,
                                            self._on_message))
        self.app.add_handler(CallbackQueryHandler(self._on_callback))
        self.app.add_error_handler(self._on_handler_error)
        self._bridge: BridgeHandle | None = None
        # Why the channel is not up (None: it is): set while starting and retrying, when stopped,
        # and when Telegram no longer posts to our webhook. ``health`` reports it.
        self._down: str | None = "not started"
        self._albums: dict[str, _Album] = {}
        self._album_tasks: set[asyncio.Task[None]] = set()  # albums being stored
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
        # One update of a chat at a time, in arrival order, as polling does; chats in parallel, so
        # one chat's write to the inbox never waits behind another's.
        self._webhook_locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}  # chat -> (lock, users)
        self._webhook_error_seen: dt.datetime | None = None
        self._owns_http = False
        self.http: HttpServer | None = None
        # Set by the runtime when workers share a database (channels.telegram_leader).
        self.poll_leader: PollLeader | None = None
        if self.webhook_url:
            self._owns_http = http is None
            self.http = http or HttpServer(settings.http_host, settings.http_port)
            self.http.add_route("POST", self.webhook_path, self._on_webhook)

    async def start(self, bridge: BridgeHandle) -> None:
        self._bridge = bridge
        self._down = "starting: getMe has not answered yet"
        await self._retry_start("getMe", self.app.initialize)
        await self.app.start()
        if self.http is not None:
            await self._start_webhook()
        elif self.poll_leader is not None:  # many workers: only the lease holder polls
            self._watchdog = asyncio.create_task(self.poll_leader.run(self), name="telegram-leader")
        else:
            await self._retry_start("deleteWebhook before polling", self._start_polling)
            log.info("telegram: polling as @%s", self.bot.username)
            self._watchdog = asyncio.create_task(self._watch_polling(), name="telegram-watchdog")
        self._down = None

    def share_updates(self, leases: Leases) -> None:
        self.poll_leader = PollLeader(leases)  # used in polling mode only: then one worker polls

    async def _retry_start(self, what: str, step: Callable[[], Awaitable[object]]) -> None:
        """A start-up call, waiting out a Bot API that cannot be reached or answers 5xx/429 (a
        server booting, a network not up yet) instead of dying; ``health`` says why meanwhile.
        A refusal (a wrong token, a bad request) is not waited out: it would never change."""
        delay = 1.0
        while True:
            try:
                await step()
                return
            except InvalidToken as exc:
                # PTB's message repeats the token; ours must not.
                raise ConfigError(f"Telegram refused TELEGRAM_BOT_TOKEN ({exc.message}) at "
                                  f"{self.settings.telegram_api_base_url}: check the token from @BotFather",
                                  ["TELEGRAM_BOT_TOKEN"]) from None
            except RetryAfter as exc:
                wait, cause = max(delay, _retry_seconds(exc)), f"RetryAfter: {exc.message}"
            except NetworkError as exc:
                if isinstance(exc, BadRequest):
                    raise
                wait, cause = delay, f"{type(exc).__name__}: {exc.message}"
            self._down = (f"{what} failed at the Bot API {self.settings.telegram_api_base_url} ({cause}); "
                          f"retrying in {wait:.0f}s")
            log.warning("telegram: %s", self._down)
            await asyncio.sleep(wait)
            delay = min(delay * 2, self.startup_retry_max_s)

    def health(self) -> ChannelHealth:
        if self._down is not None:  # not started, retrying its start, stopped, webhook lost
            return ChannelHealth(False, self._down)
        if self.http is not None:
            return ChannelHealth(True, f"webhook set: Telegram posts to {self.webhook_url}")
        if self.poll_leader is not None and self._watchdog is not None and self._watchdog.done():
            return ChannelHealth(False, "the polling-lease task ended; this worker neither polls nor stands by")
        if self.poll_leader is not None and not self.poll_leader.leading:
            return ChannelHealth(True, "standing by: another worker polls (or will, once it holds the lease)")
        return self._polling_health()

    async def stop(self) -> None:
        self._down = "stopped"
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
        await asyncio.gather(*self._album_tasks, return_exceptions=True)
        for key, album in list(self._albums.items()):
            if album.timer:
                album.timer.cancel()
            try:
                await self._flush_album(key)
            except Exception:
                log.exception("telegram: album %s could not be stored at stop", key)
        await self.app.shutdown()
        await self._http.aclose()
