"""How the Slack channel calls Slack's Web API: one ``AsyncWebClient`` (slack-sdk) pointed at
``SLACK_API_BASE_URL``, the per-channel send budget, and the one way a call is made.

- **Rate limits.** A 429 names its wait in ``Retry-After``: the channel's budget is blocked for
  that long (live edits stop, the next send waits it out) and the call is tried again, up to
  ``MAX_RETRY_AFTER_S`` of waiting in all.
- **Failures.** An answer with ``ok: false`` (``channel_not_found``, ``not_in_channel``,
  ``msg_too_long``...) is a permanent ``DeliveryError`` naming Slack's error; a Slack that cannot
  be reached, times out or answers 5xx is tried ``SEND_TRIES`` times with backoff, then a
  transient one (the bridge resumes the reply later).
- **Budget.** ``chat.postMessage`` allows about one message a second into a channel (bursts
  allowed): answers wait for their window; edits of a live answer and reactions spend a cosmetic
  share (``chat.update`` is Tier 3, about 50 a minute) and are dropped when it is spent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from talon.config import Settings
from talon.errors import DeliveryError, PlatformRateLimited

from channels.send_budget import SendBudget, Window

log = logging.getLogger(__name__)

CHANNEL = "slack"
SEND_TRIES = 3
MAX_RETRY_AFTER_S = 120.0
CHANNEL_WINDOW = Window(limit=3, seconds=3.0)
CHANNEL_COSMETIC = Window(limit=20, seconds=60.0)
# Slack takes files up to 1 GB; a smaller cap keeps a worker's memory sane.
UPLOAD_MAX_BYTES = 1024 * 1024 * 1024

Call = Callable[[], Awaitable[AsyncSlackResponse]]


def slack_budget() -> SendBudget:
    return SendBudget(lambda channel: CHANNEL_WINDOW, cosmetic_for=lambda channel: CHANNEL_COSMETIC)


def api_base(url: str) -> str:
    url = url.strip() or "https://slack.com/api/"
    return url if url.endswith("/") else url + "/"


def file_hosts(base_url: str) -> frozenset[str]:
    """Where a person's files may be fetched from with the bot token: the API's host and its
    ``files.`` neighbour (``slack.com`` -> ``files.slack.com``), never anywhere else."""
    parts = urlsplit(base_url)
    host = (parts.hostname or "").lower()
    netloc = parts.netloc.lower()
    hosts = {netloc}
    if host and not host.replace(".", "").isdigit() and host != "localhost":
        hosts.add(netloc.replace(host, "files." + host, 1))
    return frozenset(hosts)


def classify(exc: SlackApiError, what: str) -> DeliveryError:
    """``PlatformRateLimited`` for a 429 (its ``Retry-After``), else a ``DeliveryError``: permanent for
    Slack's ``ok: false`` refusals, transient for a 5xx."""
    status = exc.response.status_code
    if status == 429:
        raw = exc.response.headers.get("Retry-After") or exc.response.headers.get("retry-after") or "1"
        try:
            seconds = max(0.0, float(raw))
        except ValueError:
            seconds = 1.0
        return PlatformRateLimited(f"{what}: Slack answered 429 (ratelimited)", seconds)
    if status >= 500:
        return DeliveryError(f"{what}: Slack answered HTTP {status}")
    data = exc.response.data if isinstance(exc.response.data, dict) else {}
    return DeliveryError(f"{what}: Slack refused it ({data.get('error') or f'HTTP {status}'})", permanent=True)


def error_code(exc: DeliveryError) -> str:
    text = str(exc)
    return text[text.rfind("(") + 1:-1] if text.endswith(")") else ""


class SlackApi:
    """The Web API client every part of the channel is given (see the module docstring)."""

    def __init__(self, settings: Settings, budget: SendBudget) -> None:
        self.settings = settings
        self.budget = budget
        self.base_url = api_base(settings.slack_api_base_url)
        self.token = settings.slack_bot_token.strip()
        self.client = AsyncWebClient(token=self.token, base_url=self.base_url, timeout=int(settings.slack_timeout_s))
        self.file_hosts = file_hosts(self.base_url)
        self.bot_user_id = ""  # from auth.test at start
        self.bot_id = ""
        self.team = ""

    async def call(self, channel: str | None, what: str, call: Call, *, paced: bool = True) -> AsyncSlackResponse:
        """One Web API call about ``channel`` (paced by its budget when ``paced``), with the
        retries of the module docstring."""
        failures = 0
        waited = 0.0
        while True:
            if channel is not None and paced:
                await self.budget.acquire(channel)
            try:
                return await call()
            except SlackApiError as exc:
                error = classify(exc, what)
                if isinstance(error, PlatformRateLimited):
                    if channel is not None:
                        self.budget.penalize(channel, error.seconds)
                    if waited + error.seconds > MAX_RETRY_AFTER_S:
                        raise DeliveryError(f"{what}: Slack asked us to wait {error.seconds:.0f}s more") from exc
                    log.warning("slack: %s rate limited (429); retrying in %.1fs", what, error.seconds)
                    waited += error.seconds
                    if channel is None or not paced:
                        await asyncio.sleep(error.seconds)
                    continue
                if error.permanent:
                    raise error from exc
                failures += 1
                if failures >= SEND_TRIES:
                    raise error from exc
            except (OSError, TimeoutError, asyncio.TimeoutError, aiohttp.ClientError) as exc:
                failures += 1
                if failures >= SEND_TRIES:
                    raise DeliveryError(f"{what}: Slack did not answer after {SEND_TRIES} tries "
                                        f"({type(exc).__name__})") from exc
            await asyncio.sleep(0.5 * 2 ** failures)

    async def once(self, what: str, call: Call) -> AsyncSlackResponse:
        """A cosmetic call: tried once, Slack's refusal raised as a ``DeliveryError``."""
        try:
            return await call()
        except SlackApiError as exc:
            raise classify(exc, what) from exc

    async def close(self) -> None:
        session: Any = getattr(self.client, "session", None)
        if session is not None and not session.closed:
            await session.close()
