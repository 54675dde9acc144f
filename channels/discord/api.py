"""How the Discord channel calls Discord: one discord.py ``AutoShardedClient`` (its REST client
and its gateway connection), the settings, the per-channel send budget, and the one way a REST
call is made.

- **Where.** ``DISCORD_API_BASE_URL`` is the REST address (discord.py's ``Route.BASE``: one Discord
  account per process); the gateway's address comes from the ``GET /gateway/bot`` answer, as on
  the real platform (the auto-sharded client asks it).
- **Rate limits.** discord.py keeps Discord's buckets (``X-RateLimit-Bucket``, ``-Remaining``,
  ``-Reset-After``) and waits out a 429's ``retry_after`` itself when it is short; a longer one
  (over ``MAX_RATELIMIT_S``) comes back as ``PlatformRateLimited``: the channel's budget is
  blocked for it (live edits stop) and the call is tried again then, up to ``MAX_RETRY_AFTER_S``.
- **Failures.** 4xx refusals (``Forbidden``, ``NotFound``, a 400) are permanent ``DeliveryError``s
  naming Discord's message; a 5xx or a network failure is tried ``SEND_TRIES`` times, then a
  transient one (the bridge resumes the reply later).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp
import discord
import discord.http

from talon.config import Settings
from talon.errors import DeliveryError, PlatformRateLimited

from channels.send_budget import SendBudget, Window

log = logging.getLogger(__name__)

CHANNEL = "discord"
SEND_TRIES = 3
MAX_RATELIMIT_S = 30.0  # discord.py's smallest allowed max_ratelimit_timeout
MAX_RETRY_AFTER_S = 120.0
CHANNEL_WINDOW = Window(limit=5, seconds=5.0)  # Discord: 5 messages per 5 s per channel
CHANNEL_COSMETIC = Window(limit=10, seconds=30.0)
UPLOAD_MAX_BYTES = 10 * 1024 * 1024  # a server without boosts; a boosted one says more (filesize_limit)

R = TypeVar("R")


def discord_budget() -> SendBudget:
    return SendBudget(lambda channel: CHANNEL_WINDOW, cosmetic_for=lambda channel: CHANNEL_COSMETIC)


def api_base(url: str) -> str:
    return (url.strip() or "https://discord.com/api/v10").rstrip("/")


def media_hosts(base_url: str) -> frozenset[str]:
    """Where attachments may be fetched from: Discord's CDN for discord.com, else the API's host."""
    netloc = urlsplit(base_url).netloc.lower()
    hosts = {netloc}
    if netloc in ("discord.com", "discordapp.com"):
        hosts |= {"cdn.discordapp.com", "media.discordapp.net"}
    return frozenset(hosts)


def intents() -> discord.Intents:
    wanted = discord.Intents.none()
    wanted.guilds = True
    wanted.guild_messages = True
    wanted.dm_messages = True
    wanted.message_content = True  # privileged: switch it on in the developer portal
    return wanted


def classify(exc: Exception, what: str) -> DeliveryError:
    if isinstance(exc, discord.RateLimited):
        return PlatformRateLimited(f"{what}: Discord answered 429", float(exc.retry_after))
    if isinstance(exc, discord.HTTPException):
        if exc.status >= 500:
            return DeliveryError(f"{what}: Discord answered HTTP {exc.status}")
        return DeliveryError(f"{what}: Discord refused it (HTTP {exc.status}, code {exc.code}: {exc.text[:200]})",
                             permanent=True)
    return DeliveryError(f"{what}: Discord did not answer ({type(exc).__name__})")


class DiscordApi:
    """The client every part of the channel is given (see the module docstring)."""

    def __init__(self, settings: Settings, budget: SendBudget, client: discord.Client) -> None:
        self.settings = settings
        self.budget = budget
        self.base_url = api_base(settings.discord_api_base_url)
        discord.http.Route.BASE = self.base_url
        self.client = client
        self.token = settings.discord_bot_token.strip()
        self.media_hosts = media_hosts(self.base_url)

    @property
    def bot_id(self) -> int:
        return self.client.user.id if self.client.user is not None else 0

    def messageable(self, channel_id: str) -> discord.PartialMessageable:
        return self.client.get_partial_messageable(int(channel_id))

    async def call(self, channel: str | None, what: str, call: Callable[[], Awaitable[R]], *,
                   paced: bool = True) -> R:
        failures = 0
        waited = 0.0
        while True:
            if channel is not None and paced:
                await self.budget.acquire(channel)
            try:
                return await call()
            except (discord.HTTPException, discord.RateLimited, aiohttp.ClientError, OSError,
                    asyncio.TimeoutError) as exc:
                error = classify(exc, what)
            if isinstance(error, PlatformRateLimited):
                if channel is not None:
                    self.budget.penalize(channel, error.seconds)
                if waited + error.seconds > MAX_RETRY_AFTER_S:
                    raise DeliveryError(f"{what}: Discord asked us to wait {error.seconds:.0f}s more") from error
                log.warning("discord: %s rate limited (429); retrying in %.1fs", what, error.seconds)
                waited += error.seconds
                if channel is None or not paced:
                    await asyncio.sleep(error.seconds)
                continue
            if error.permanent:
                raise error
            failures += 1
            if failures >= SEND_TRIES:
                raise error
            await asyncio.sleep(0.5 * 2 ** failures)

    async def once(self, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
        try:
            return await call()
        except (discord.HTTPException, discord.RateLimited, aiohttp.ClientError, OSError,
                asyncio.TimeoutError) as exc:
            raise classify(exc, what) from exc
