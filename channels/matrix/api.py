"""How the Matrix channel calls its homeserver: one ``nio.AsyncClient`` (matrix-nio), the
settings, the per-room send budget, and the one way a call is made.

- **Rate limits.** nio's own retry loop is off (``max_limit_exceeded=0``): an ``M_LIMIT_EXCEEDED``
  (or an HTTP 429) comes back to us, blocks the room's budget for the ``retry_after_ms`` the
  homeserver names (so live edits stop and the next send waits it out), and the call is tried
  again then, up to ``MAX_RETRY_AFTER_S`` of waiting in all.
- **Failures.** A refusal (``M_FORBIDDEN``, ``M_TOO_LARGE``...) is a permanent ``DeliveryError``;
  a homeserver that cannot be reached or does not answer within ``TALON_MATRIX_TIMEOUT`` is tried
  ``SEND_TRIES`` times with backoff, then a transient one (the bridge resumes the reply later).
- **Budget.** Answers wait for their room's window (``ROOM_WINDOW``); edits of a live answer,
  typing and reactions spend a cosmetic share and are dropped when it is spent.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import httpx
from nio import AsyncClientConfig, ErrorResponse
from nio.store import SqliteStore

from talon.config import Limits, Settings
from talon.errors import DeliveryError, PlatformRateLimited

from channels.matrix.crypto import TalonClient
from channels.send_budget import SendBudget, Window
from talon.tls import httpx_tls

log = logging.getLogger(__name__)

CHANNEL = "matrix"
SEND_TRIES = 3
MAX_RETRY_AFTER_S = 120.0
ROOM_WINDOW = Window(limit=20, seconds=20.0)
ROOM_COSMETIC = Window(limit=20, seconds=60.0)
RATE_LIMITED = frozenset({"M_LIMIT_EXCEEDED", "429"})

R = TypeVar("R")


def matrix_budget() -> SendBudget:
    return SendBudget(lambda room: ROOM_WINDOW, cosmetic_for=lambda room: ROOM_COSMETIC)


def check(answer: R, what: str) -> R:
    """``answer`` unless it is nio's ``ErrorResponse``: then ``PlatformRateLimited`` for a rate limit,
    else a permanent ``DeliveryError`` naming the homeserver's error code."""
    if isinstance(answer, ErrorResponse):
        code = str(answer.status_code or "")
        if code in RATE_LIMITED:
            return _raise(PlatformRateLimited(f"{what}: {code}", (answer.retry_after_ms or 5000) / 1000))
        return _raise(DeliveryError(f"{what}: the homeserver refused it ({code or 'error'}: {answer.message})",
                                    permanent=True))
    return answer


def _raise(exc: Exception) -> Any:
    raise exc


class MatrixApi:
    """The homeserver client every part of the channel is given (see the module docstring)."""

    def __init__(self, settings: Settings, limits: Limits, budget: SendBudget) -> None:
        self.settings = settings
        self.limits = limits
        self.budget = budget
        self.homeserver = settings.matrix_homeserver.strip().rstrip("/")
        self.user_id = settings.matrix_user_id.strip()
        e2ee = settings.matrix_e2ee != "off"  # the key store is opened later (crypto.py)
        config = AsyncClientConfig(max_limit_exceeded=0, max_timeouts=0,
                                   request_timeout=settings.matrix_timeout_s, store_sync_tokens=False,
                                   encryption_enabled=e2ee, store=SqliteStore if e2ee else None)
        self.client = TalonClient(self.homeserver, self.user_id, config=config)
        if settings.matrix_access_token:
            self.client.access_token = settings.matrix_access_token
            self.client.user_id = self.user_id
        # Media and a few calls nio does not stream go over httpx with the same token.
        self.http = httpx.AsyncClient(verify=httpx_tls(),
                                      timeout=httpx.Timeout(settings.matrix_timeout_s, connect=10.0),
                                      follow_redirects=False)
        self.upload_max_bytes = 50 * 1024 * 1024  # until the homeserver says (media/config at start)
        self.display_name = ""

    @property
    def token(self) -> str:
        return self.client.access_token

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.client.access_token}"}

    async def call(self, room: str | None, what: str, call: Callable[[], Awaitable[R]], *,
                   paced: bool = True) -> R:
        """One homeserver call into ``room`` (paced by its budget when ``paced``), with the
        retries of the module docstring; the answer with nio's errors raised."""
        failures = 0
        waited = 0.0
        while True:
            if room is not None and paced:
                await self.budget.acquire(room)
            try:
                return check(await call(), what)
            except PlatformRateLimited as exc:
                if room is not None:
                    self.budget.penalize(room, exc.seconds)
                if waited + exc.seconds > MAX_RETRY_AFTER_S:
                    raise DeliveryError(f"{what}: the homeserver asked us to wait {exc.seconds:.0f}s more") from exc
                log.warning("matrix: %s rate limited (M_LIMIT_EXCEEDED); retrying in %.1fs", what, exc.seconds)
                waited += exc.seconds
                if room is None or not paced:
                    await asyncio.sleep(exc.seconds)
            except (OSError, TimeoutError, asyncio.TimeoutError, aiohttp.ClientError) as exc:
                failures += 1
                if failures >= SEND_TRIES:
                    raise DeliveryError(f"{what}: the homeserver did not answer after {SEND_TRIES} tries "
                                        f"({type(exc).__name__})") from exc
                await asyncio.sleep(0.5 * 2 ** failures)

    async def send(self, room: str, content: dict[str, Any], what: str = "send", *,
                   event_type: str = "m.room.message", paced: bool = True) -> str:
        # One transaction id for every try: a send whose answer was lost is not posted twice
        # (the homeserver answers a repeated transaction with the event it already made).
        txn = uuid.uuid4().hex
        answer = await self.call(room, what, lambda: self.client.room_send(room, event_type, content, tx_id=txn),
                                 paced=paced)
        return str(answer.event_id)

    async def close(self) -> None:
        await self.client.close()
        await self.http.aclose()
