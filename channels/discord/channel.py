"""The Discord channel: its client, start and stop, and the parts it is made of.

``DiscordChannel`` builds a REST client (discord.py, on ``DISCORD_API_BASE_URL``) and one
``DiscordApi`` around it, and gives them to each part: intake, delivery, live views
(``channels/edited_view.py``), approval prompts and downloads. Start logs in (``GET /users/@me``):
a refused token is a ``ConfigError`` at once; a Discord that cannot be reached is waited for
(``health`` says why).

The gateway (events in) is a second client, an ``AutoShardedClient`` that finds its address with
``GET /gateway/bot`` and is kept up by discord.py (heartbeats, resume, reconnect). Discord sends
every event to every connection of a bot, so with many workers on one database only the holder of
the ``discord:gateway`` lease connects (``channels/leader.py``); the others send replies over REST
and take the gateway over when the holder dies (its lease expires).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import discord

from talon.bounded import BoundedMap
from talon.config import Settings
from talon.envelope import InboundMessage
from talon.errors import ConfigError, DeliveryError, PlatformRateLimited, StreamStopped
from talon.render.discord import DISCORD_TEXT_LIMIT, markdown_to_discord, split_for_discord

from channels.base import BridgeHandle, ChannelHealth, ForwardsTyping, PartsChannel
from channels.discord.api import CHANNEL, MAX_RATELIMIT_S, DiscordApi, discord_budget, intents
from channels.discord.approvals import ApprovalPrompts
from channels.discord.commands import SlashCommands
from channels.discord.delivery import NO_PINGS, Delivery, target
from channels.discord.downloads import Downloads
from channels.discord.intake import Intake
from channels.edited_view import EditedViews
from channels.lifecycle import LeaseLedUpdates
from channels.rooms import ChatterLog

log = logging.getLogger(__name__)

GATEWAY_LEASE = "discord:gateway"


class _Client(discord.AutoShardedClient):
    """discord.py's client with its events handed to the channel's parts."""

    def __init__(self, owner: DiscordChannel) -> None:
        super().__init__(intents=intents(), max_ratelimit_timeout=MAX_RATELIMIT_S, chunk_guilds_at_startup=False,
                         member_cache_flags=discord.MemberCacheFlags.none(), enable_debug_events=False)
        self.owner = owner

    async def on_ready(self) -> None:
        self.owner.ready.set()
        log.info("discord: connected to the gateway as %s (%s)", self.user, self.user.id if self.user else "?")

    async def on_message(self, message: discord.Message) -> None:
        await self.owner.intake.on_message(message)

    async def on_message_edit(self, before: discord.Message, after: discord.Message) -> None:
        if after.edited_at is not None and before.content != after.content:
            await self.owner.intake.on_message(after, edited_at=after.edited_at.isoformat())

    async def on_interaction(self, interaction: discord.Interaction[Any]) -> None:
        if interaction.type is discord.InteractionType.application_command:
            await self.owner.commands.on_interaction(interaction)  # slash commands (commands.py)
            return
        await self.owner.approvals.on_interaction(interaction)

    async def on_error(self, event_method: str, /, *args: Any, **kwargs: Any) -> None:
        log.exception("discord: handling %s failed", event_method)


class DiscordChannel(LeaseLedUpdates, ForwardsTyping, PartsChannel):
    name = CHANNEL
    typing_interval_s = 8.0
    lease_task_name = "discord-gateway-lease"

    intake: Intake
    approvals: ApprovalPrompts
    delivery: Delivery
    downloads: Downloads

    def __init__(self, settings: Settings) -> None:
        if not settings.discord_configured():
            raise ConfigError("DISCORD_BOT_TOKEN must be set for the Discord channel", ["DISCORD_BOT_TOKEN"])
        self.settings = settings
        self.ready = asyncio.Event()
        self.rest = discord.Client(intents=intents(), max_ratelimit_timeout=MAX_RATELIMIT_S)
        self.gateway: _Client | None = None
        self.api = DiscordApi(settings, discord_budget(), self.rest)
        self.intake = Intake(self.api, allowed_channels=settings.discord_allowed_channel_ids,
                             chatter=ChatterLog(settings.discord_channel_context, "discord_chatter"))
        self.live = EditedViews(CHANNEL, self.api.budget, post=self._live_post, edit=self._live_edit,
                                first_piece=_first_piece, interval_s=settings.discord_stream_interval_s,
                                head_chars=4 * DISCORD_TEXT_LIMIT,
                                enabled=settings.discord_streaming)
        self.delivery = Delivery(self.api, self.live, self.intake.sent)
        self.approvals = ApprovalPrompts(self.api, self.delivery)
        self.commands = SlashCommands(self.api, self.intake)
        self.downloads = Downloads(self.api)
        self.ack = settings.discord_ack_reaction.strip()
        self._reacted: BoundedMap[str, bool] = BoundedMap("discord_reactions")
        self._gateway: asyncio.Task[None] | None = None

    def serves(self, conversation: InboundMessage) -> str | None:
        if conversation.is_group and not self.intake.serves_channel(conversation.chat_id):
            return f"the channel {conversation.chat_id} is no longer served (not in TALON_DISCORD_ALLOWED_CHANNELS)"
        return None

    # --- start, health and stop (channels/lifecycle.py) -------------------------------------------
    def _platform(self) -> str:
        return f"Discord at {self.api.base_url}"

    def _lease_name(self) -> str:
        return GATEWAY_LEASE

    async def start(self, bridge: BridgeHandle) -> None:
        self.commands.bind(bridge)
        await super().start(bridge)

    async def _receive(self) -> None:
        await self.commands.register(self.rest)  # logged in: the slash commands, then the gateway
        await super()._receive()

    async def _log_in(self) -> None:
        try:
            await self.rest.login(self.api.token)
        except discord.LoginFailure as exc:
            raise ConfigError(f"Discord refused DISCORD_BOT_TOKEN ({exc}): check it", ["DISCORD_BOT_TOKEN"]) from exc
        log.info("discord: logged in as %s at %s", self.rest.user, self.api.base_url)

    async def _open_updates(self) -> None:
        self.gateway = _Client(self)
        self._gateway = asyncio.create_task(self._connect(self.gateway), name="discord-gateway")

    async def _close_updates(self) -> None:
        self.ready.clear()
        gateway, self.gateway = self.gateway, None
        if gateway is not None:
            await gateway.close()
        if self._gateway is not None:
            self._gateway.cancel()
            await asyncio.gather(self._gateway, return_exceptions=True)
            self._gateway = None

    async def _connect(self, gateway: _Client) -> None:
        try:
            await gateway.login(self.api.token)
            await gateway.connect(reconnect=True)
        except asyncio.CancelledError:
            raise
        except discord.PrivilegedIntentsRequired:
            self._down = ("Discord refused the gateway connection: switch on the Message Content intent "
                          "(Developer Portal, Bot, Privileged Gateway Intents)")
            log.error("discord: %s", self._down)
        except Exception as exc:
            self._down = f"the gateway connection ended: {type(exc).__name__}: {str(exc)[:200]}"
            log.error("discord: %s", self._down)

    def _health_up(self) -> ChannelHealth:
        if self._standing_by():
            return ChannelHealth(True, f"standing by: another worker holds the gateway (lease {GATEWAY_LEASE}); "
                                       f"replies go out from here as {self.rest.user}")
        gateway = self.gateway
        if gateway is None or not self.ready.is_set() or gateway.is_closed() or not gateway.is_ready():
            return ChannelHealth(False, "the gateway connection is not up yet (discord.py connects and resumes)")
        return ChannelHealth(True, f"gateway connected as {gateway.user} ({self.api.bot_id})")

    async def stop(self) -> None:
        self._down = "stopped"
        await self._stop_receiving()
        await self.rest.close()
        await self.downloads.close()

    # --- live views -------------------------------------------------------------------------------
    async def _live_post(self, message: InboundMessage, markdown: str) -> str:
        where = target(message.chat_id, message.thread_id)
        reference = (discord.MessageReference(message_id=int(message.message_id), channel_id=int(where),
                                              fail_if_not_exists=False) if message.is_group else None)
        sent = await self._live(message, lambda: self.api.messageable(where).send(
            markdown_to_discord(markdown), reference=reference, allowed_mentions=NO_PINGS))  # type: ignore[arg-type]
        self.intake.sent[str(sent.id)] = True
        return str(sent.id)

    async def _live_edit(self, message: InboundMessage, message_id: str, markdown: str) -> None:
        partial = self.api.messageable(target(message.chat_id, message.thread_id)).get_partial_message(int(message_id))
        await self._live(message, lambda: partial.edit(content=markdown_to_discord(markdown), allowed_mentions=NO_PINGS))

    async def _live(self, message: InboundMessage, call: Callable[[], Awaitable[Any]]) -> Any:
        try:
            return await self.api.once("live update", call)
        except PlatformRateLimited as exc:
            self.api.budget.penalize(target(message.chat_id, message.thread_id), exc.seconds)
            raise StreamStopped(f"Discord asked to wait {exc.seconds:.0f}s") from exc
        except DeliveryError as exc:
            raise StreamStopped(str(exc)) from exc

    # --- the Channel methods not forwarded to a part (channels/base.py) ----------------------------
    async def acknowledge(self, message: InboundMessage) -> None:
        where = target(message.chat_id, message.thread_id)
        if not self.ack or message.key in self._reacted or not self.api.budget.try_spend(where, calls=2):
            return
        partial = self.api.messageable(where).get_partial_message(int(message.message_id))
        await self.api.once("reaction", lambda: partial.add_reaction(self.ack))
        self._reacted[message.key] = True

    async def unacknowledge(self, message: InboundMessage) -> None:
        if self._reacted.pop(message.key, None):
            where = target(message.chat_id, message.thread_id)
            partial = self.api.messageable(where).get_partial_message(int(message.message_id))
            await self.api.once("reaction", lambda: partial.remove_reaction(self.ack, discord.Object(self.api.bot_id)))


def _first_piece(markdown: str) -> str:
    pieces = split_for_discord(markdown)
    return pieces[0] if pieces else ""
