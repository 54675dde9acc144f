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
from typing import TYPE_CHECKING, Any

import discord

from talon.bounded import BoundedMap
from talon.config import Limits, Settings
from talon.content import InboundFile
from talon.envelope import InboundMessage, LiveReply, OutboundReply, RemoteFile
from talon.errors import ConfigError, DeliveryError, PlatformRateLimited, StreamStopped
from talon.render.discord import markdown_to_discord, split_for_discord
from talon.storage.attachments import AttachmentStore

from channels.base import BridgeHandle, Channel, ChannelHealth, PartCallback
from channels.discord.api import CHANNEL, MAX_RATELIMIT_S, DiscordApi, discord_budget, intents
from channels.discord.approvals import ApprovalPrompts
from channels.discord.commands import SlashCommands
from channels.discord.delivery import NO_PINGS, Delivery, target
from channels.discord.downloads import Downloads
from channels.discord.intake import Intake
from channels.edited_view import EditedViews
from channels.leader import LeaseLeader
from channels.reply_parts import Part
from channels.rooms import ChatterLog

if TYPE_CHECKING:
    from talon.storage.approvals import Approval
    from talon.storage.leases import Leases

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


class DiscordChannel(Channel):
    name = CHANNEL
    typing_interval_s = 8.0

    def __init__(self, settings: Settings) -> None:
        if not settings.discord_configured():
            raise ConfigError("DISCORD_BOT_TOKEN must be set for the Discord channel", ["DISCORD_BOT_TOKEN"])
        self.settings = settings
        self.ready = asyncio.Event()
        self.rest = discord.Client(intents=intents(), max_ratelimit_timeout=MAX_RATELIMIT_S)
        self.gateway: _Client | None = None
        self.leader: LeaseLeader | None = None
        self.api = DiscordApi(settings, discord_budget(), self.rest)
        self.intake = Intake(self.api, allowed_channels=settings.discord_allowed_channel_ids,
                             chatter=ChatterLog(settings.discord_channel_context, "discord_chatter"))
        self.live = EditedViews(CHANNEL, self.api.budget, post=self._live_post, edit=self._live_edit,
                                first_piece=_first_piece, interval_s=settings.discord_stream_interval_s,
                                enabled=settings.discord_streaming)
        self.delivery = Delivery(self.api, self.live, self.intake.sent)
        self.approvals = ApprovalPrompts(self.api, self.delivery)
        self.commands = SlashCommands(self.api, self.intake)
        self.downloads = Downloads(self.api)
        self.ack = settings.discord_ack_reaction.strip()
        self._reacted: BoundedMap[str, bool] = BoundedMap("discord_reactions")
        self._gateway: asyncio.Task[None] | None = None
        self._leading: asyncio.Task[None] | None = None
        self._down: str | None = "not started"
        self.startup_retry_max_s = 30.0

    def serves(self, conversation: InboundMessage) -> str | None:
        if conversation.is_group and not self.intake.serves_channel(conversation.chat_id):
            return f"the channel {conversation.chat_id} is no longer served (not in TALON_DISCORD_ALLOWED_CHANNELS)"
        return None

    def share_updates(self, leases: Leases) -> None:
        self.leader = LeaseLeader(leases, GATEWAY_LEASE, start=self._open_gateway, stop=self._close_gateway)

    async def start(self, bridge: BridgeHandle) -> None:
        self.intake.bind(bridge)
        self.approvals.bind(bridge)
        self.commands.bind(bridge)
        await self._retry_start(self._log_in)
        await self.commands.register(self.rest)
        if self.leader is not None:
            self._leading = asyncio.create_task(self.leader.run(), name="discord-gateway-lease")
        else:
            await self._open_gateway()
        self._down = None

    async def _log_in(self) -> None:
        try:
            await self.rest.login(self.api.token)
        except discord.LoginFailure as exc:
            raise ConfigError(f"Discord refused DISCORD_BOT_TOKEN ({exc}): check it", ["DISCORD_BOT_TOKEN"]) from exc
        log.info("discord: logged in as %s at %s", self.rest.user, self.api.base_url)

    async def _open_gateway(self) -> None:
        self.gateway = _Client(self)
        self._gateway = asyncio.create_task(self._connect(self.gateway), name="discord-gateway")

    async def _close_gateway(self) -> None:
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

    async def _retry_start(self, step: Callable[[], Awaitable[None]]) -> None:
        delay = 1.0
        while True:
            try:
                await step()
                return
            except ConfigError:
                raise
            except Exception as exc:
                self._down = (f"cannot reach Discord at {self.api.base_url} ({type(exc).__name__}: "
                              f"{str(exc)[:120]}); retrying in {delay:.0f}s")
                log.warning("discord: %s", self._down)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.startup_retry_max_s)

    def health(self) -> ChannelHealth:
        if self._down is not None:
            return ChannelHealth(False, self._down)
        if self.leader is not None and not self.leader.leading:
            return ChannelHealth(True, f"standing by: another worker holds the gateway (lease {GATEWAY_LEASE}); "
                                       f"replies go out from here as {self.rest.user}")
        gateway = self.gateway
        if gateway is None or not self.ready.is_set() or gateway.is_closed() or not gateway.is_ready():
            return ChannelHealth(False, "the gateway connection is not up yet (discord.py connects and resumes)")
        return ChannelHealth(True, f"gateway connected as {gateway.user} ({self.api.bot_id})")

    async def stop(self) -> None:
        self._down = "stopped"
        if self._leading is not None:
            self._leading.cancel()
            await asyncio.gather(self._leading, return_exceptions=True)
        await self._close_gateway()
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

    # --- the Channel methods ---------------------------------------------------------------------
    def live_reply(self, message: InboundMessage, *, placed: Callable[[str], Awaitable[None]] | None = None,
                   resume_id: str | None = None) -> LiveReply | None:
        return self.live.live_reply(message, placed=placed, resume_id=resume_id)

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

    async def ask_approval(self, approval: Approval, text: str) -> str | None:
        return await self.approvals.ask_approval(approval, text)

    async def settle_approval(self, approval: Approval, text: str) -> None:
        await self.approvals.settle_approval(approval, text)

    def reply_parts(self, reply: OutboundReply) -> list[Part]:
        return self.delivery.reply_parts(reply)

    async def deliver(self, chat_id: str, reply: OutboundReply, *, skip_parts: int = 0,
                      on_part: PartCallback | None = None) -> None:
        await self.delivery.deliver(chat_id, reply, skip_parts=skip_parts, on_part=on_part)

    async def download(self, remote: RemoteFile, store: AttachmentStore, limits: Limits) -> InboundFile:
        return await self.downloads.download(remote, store, limits)

    async def send_typing(self, chat_id: str, thread_id: str | None = None) -> None:
        await self.delivery.send_typing(chat_id, thread_id)


def _first_piece(markdown: str) -> str:
    pieces = split_for_discord(markdown)
    return pieces[0] if pieces else ""
