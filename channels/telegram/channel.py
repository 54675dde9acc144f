"""The Telegram channel: its clients, start and stop, and the parts it is made of.

``TelegramChannel`` builds one ``TelegramApi`` (the python-telegram-bot application, the settings,
the per-chat send budget, how a call is made) and gives it to each part: intake, delivery, live
views, reactions, approval prompts, downloads, and polling or the webhook. It holds them as
attributes and answers the ``Channel`` methods by asking the part whose job it is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import httpx
from telegram.error import BadRequest, InvalidToken, NetworkError, RetryAfter
from telegram.ext import Application, ApplicationBuilder, CallbackQueryHandler, MessageHandler, filters
from telegram.request import HTTPXRequest

from talon.config import Limits, Settings
from talon.envelope import InboundMessage
from talon.errors import ConfigError

from channels.base import BridgeHandle, ChannelHealth, ForwardsReactions, ForwardsTyping, PartsChannel
from channels.http import HttpServer
from channels.send_budget import SendBudget
from channels.telegram.api import CHANNEL, TelegramApi, _retry_seconds, telegram_budget
from channels.telegram.approvals import ApprovalPrompts
from channels.telegram.delivery import Delivery
from channels.telegram.downloads import Downloads
from channels.telegram.groups import ChatterLog
from channels.telegram.intake import Intake
from channels.telegram.polling import Polling, _PollingRequest
from channels.telegram.reactions import Reactions
from channels.telegram.streaming import LiveViews
from channels.telegram.webhook import Webhook
from channels.telegram_leader import PollLeader
from talon.tls import httpx_tls

if TYPE_CHECKING:
    from talon.storage.leases import Leases

log = logging.getLogger(__name__)


class TelegramChannel(ForwardsReactions, ForwardsTyping, PartsChannel):
    name = CHANNEL

    approvals: ApprovalPrompts
    delivery: Delivery
    downloads: Downloads

    def __init__(self, settings: Settings, *, watchdog_interval_s: float = 15.0,
                 stall_after_s: float | None = None, http: HttpServer | None = None,
                 webhook_check_s: float = 300.0) -> None:
        if not settings.telegram_bot_token:
            raise ConfigError("TELEGRAM_BOT_TOKEN is not set", ["TELEGRAM_BOT_TOKEN"])
        settings.check_telegram_webhook()
        self.settings = settings
        limits: Limits = settings.limits()
        # Groups (channels/telegram/groups.py); a bad TALON_TELEGRAM_ALLOWED_CHATS fails here.
        allowed_chats = settings.telegram_allowed_chat_ids
        base = settings.telegram_api_base_url.rstrip("/")
        poll_request = _PollingRequest(
            connection_pool_size=1, read_timeout=settings.telegram_poll_timeout_s + 10.0,
            httpx_kwargs={"verify": httpx_tls()},
        )
        self.app: Application = (
            ApplicationBuilder()
            .token(settings.telegram_bot_token)
            .base_url(f"{base}/bot")
            .base_file_url(f"{base}/file/bot")
            .request(HTTPXRequest(connection_pool_size=16, read_timeout=30.0, write_timeout=60.0,
                                  media_write_timeout=120.0, httpx_kwargs={"verify": httpx_tls()}))
            .get_updates_request(poll_request)
            .build()
        )
        # Every call into a chat counts against its budget (api.py).
        self.api = TelegramApi(self.app, settings, limits, telegram_budget(limits))
        self.intake = Intake(self.api, allowed_chats=allowed_chats,
                             chatter=ChatterLog(settings.telegram_group_context, "telegram_chatter"))
        self.live = LiveViews(self.api)
        self.delivery = Delivery(self.api, self.live)
        self.reactions = Reactions(self.api, settings.telegram_ack_reaction)
        self.approvals = ApprovalPrompts(self.api)
        self._http = httpx.AsyncClient(verify=httpx_tls(), timeout=httpx.Timeout(30.0, connect=10.0),
                                       follow_redirects=False)
        self.downloads = Downloads(self.api, self._http)
        self.polling = Polling(self.api, poll_request, watchdog_interval_s=watchdog_interval_s,
                               stall_after_s=stall_after_s or (settings.telegram_poll_timeout_s + 60.0))
        self.app.add_handler(MessageHandler(filters.UpdateType.MESSAGE | filters.UpdateType.EDITED_MESSAGE,
                                            self.intake.on_message))
        self.app.add_handler(CallbackQueryHandler(self.approvals.on_callback))
        self.app.add_error_handler(self.intake.on_handler_error)
        # Why the channel is not up (None: it is): set while starting and retrying, and when
        # stopped. ``health`` reports it.
        self._down: str | None = "not started"
        self._watchdog: asyncio.Task[None] | None = None
        self.startup_retry_max_s = 60.0
        # Webhook mode: Telegram posts updates to a route on Talon's shared HTTP server.
        self.webhook: Webhook | None = None
        self.http: HttpServer | None = None
        # Set by ``share_updates`` when workers share a database (channels.telegram_leader).
        self.poll_leader: PollLeader | None = None
        if settings.telegram_webhook_url.strip():
            self.http = http or HttpServer(settings.http_host, settings.http_port)
            self.webhook = Webhook(self.api, self.intake, self.http, owns_http=http is None,
                                   check_s=webhook_check_s)

    def serves(self, conversation: InboundMessage) -> str | None:
        """A group (or a topic of one) is served while it is in TALON_TELEGRAM_ALLOWED_CHATS, as
        the intake has it now; a private chat always (the person passes the access gate)."""
        if conversation.is_group and not self.intake.serves_group(conversation.chat_id):
            return (f"the group {conversation.chat_id} is no longer served (not in "
                    "TALON_TELEGRAM_ALLOWED_CHATS)")
        return None

    @property
    def budget(self) -> SendBudget:
        """The per-chat send budget every part spends (replaceable before ``start``)."""
        return self.api.budget

    @budget.setter
    def budget(self, budget: SendBudget) -> None:
        self.api.budget = budget

    @property
    def polling_restarts(self) -> int:
        """How often the watchdog restarted polling."""
        return self.polling.restarts

    def share_updates(self, leases: Leases) -> None:
        self.poll_leader = PollLeader(leases)  # used in polling mode only: then one worker polls

    async def start(self, bridge: BridgeHandle) -> None:
        self.intake.bind(bridge)
        self.approvals.bind(bridge)
        self._down = "starting: getMe has not answered yet"
        await self._retry_start("getMe", self.app.initialize)
        await self.app.start()
        if self.webhook is not None:
            await self.webhook.start(self._retry_start)
            self._watchdog = asyncio.create_task(self.webhook.watch(), name="telegram-webhook-check")
        elif self.poll_leader is not None:  # many workers: only the lease holder polls
            self._watchdog = asyncio.create_task(self.poll_leader.run(self.polling), name="telegram-leader")
        else:
            await self._retry_start("deleteWebhook before polling", self.polling.start)
            log.info("telegram: polling as @%s", self.api.bot.username)
            self._watchdog = asyncio.create_task(self.polling.watch(), name="telegram-watchdog")
        self._down = None

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
        if self._down is not None:  # not started, retrying its start, stopped
            return ChannelHealth(False, self._down)
        if self.webhook is not None:
            if self.webhook.lost is not None:  # another process took the webhook
                return ChannelHealth(False, self.webhook.lost)
            return ChannelHealth(True, f"webhook set: Telegram posts to {self.webhook.url}")
        if self.poll_leader is not None and self._watchdog is not None and self._watchdog.done():
            return ChannelHealth(False, "the polling-lease task ended; this worker neither polls nor stands by")
        if self.poll_leader is not None and not self.poll_leader.leading:
            return ChannelHealth(True, "standing by: another worker polls (or will, once it holds the lease)")
        return self.polling.health()

    async def stop(self) -> None:
        self._down = "stopped"
        if self._watchdog:
            self._watchdog.cancel()
            await asyncio.gather(self._watchdog, return_exceptions=True)
        if self.webhook is not None and self.webhook.owns_http:
            # Before the application: requests in flight finish (an album may still be flushed).
            # The webhook stays set, so Telegram keeps new updates until we are back.
            await self.webhook.http.stop()
        if self.app.updater and self.app.updater.running:
            await self.app.updater.stop()
        if self.app.running:
            await self.app.stop()  # handles the updates already fetched first
        # Polling confirmed every update it fetched, so Telegram will not send an album that is
        # still being gathered again: submit what arrived of it rather than dropping it.
        await self.intake.flush_albums()
        await self.app.shutdown()
        await self._http.aclose()
