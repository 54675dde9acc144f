"""The sync loop: ``/sync`` long-polled from the homeserver, each batch's events handed in, then
its ``next_batch`` token saved: in ``TALON_DATA_DIR/matrix/`` on a single worker; with many workers
(``shared``) in the bot account's own account data on the homeserver (``org.talon.sync``), where
whichever worker takes the sync over next finds it.

Nothing is lost on a crash: the token is saved only after every event of the batch is in the
durable inbox (``bridge.submit``), so a worker that dies mid-batch is given the batch again at its
next start, and the inbox drops what it already has (keyed by room and event id). The very first
start (no token) skips the history: a bot added to a busy room does not answer last week. A
homeserver that fails or hangs is retried with backoff (capped at ``BACKOFF_MAX_S``); after
``SYNC_FAILURES_DOWN`` failures in a row ``health`` reports the channel down, with the reason.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from nio import InviteMemberEvent, SyncResponse

from channels.base import ChannelHealth
from channels.matrix.api import MatrixApi

log = logging.getLogger(__name__)

SYNC_TIMEOUT_MS = 30_000
SYNC_FAILURES_DOWN = 3
BACKOFF_MAX_S = 30.0
TOKEN_TYPE = "org.talon.sync"
# First sync: no history, only the rooms' state (members, power levels).
_FIRST_FILTER: dict[str, Any] = {"room": {"timeline": {"limit": 0}}, "presence": {"types": []}}
_FILTER: dict[str, Any] = {"presence": {"types": []}, "account_data": {"types": []}}

OnInvite = Callable[[str, "str | None"], Awaitable[None]]
OnEvent = Callable[[str, dict[str, Any]], Awaitable[None]]


class Sync:
    def __init__(self, api: MatrixApi, data_dir: Path, *, on_invite: OnInvite, on_event: OnEvent,
                 on_reaction: OnEvent) -> None:
        self.api = api
        digest = hashlib.sha256(f"{api.homeserver} {api.user_id}".encode()).hexdigest()[:16]
        self.token_file = data_dir / "matrix" / f"sync-{digest}.token"
        self.on_invite = on_invite
        self.on_event = on_event
        self.on_reaction = on_reaction
        self.failures = 0
        self.last_error = ""
        self.last_ok: float | None = None
        self.batches = 0
        self.shared = False  # many workers: the token lives in the account data (see the docstring)
        self._saved: str | None = None
        # Run after each batch is handed in (crypto.py: to-device messages, key upload/query/claim).
        self.after_batch: Callable[[], Awaitable[None]] | None = None

    def health(self) -> ChannelHealth:
        if self.failures >= SYNC_FAILURES_DOWN:
            return ChannelHealth(False, f"/sync failed {self.failures} times in a row at {self.api.homeserver} "
                                        f"({self.last_error})")
        if self.last_ok is None:
            return ChannelHealth(False, f"waiting for the first /sync from {self.api.homeserver}")
        return ChannelHealth(True, f"syncing as {self.api.user_id}")

    def _read_token(self) -> str | None:
        try:
            return self.token_file.read_text().strip() or None
        except FileNotFoundError:
            return None

    def _write_token(self, token: str) -> None:
        self.token_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.token_file.with_suffix(".tmp")
        tmp.write_text(token)
        tmp.replace(self.token_file)

    def _account_data_url(self) -> str:
        from urllib.parse import quote

        return (f"{self.api.homeserver}/_matrix/client/v3/user/{quote(self.api.user_id, safe='')}"
                f"/account_data/{TOKEN_TYPE}")

    async def load_token(self) -> str | None:
        if not self.shared:
            return await asyncio.to_thread(self._read_token)
        resp = await self.api.http.get(self._account_data_url(), headers=self.api.auth())
        if resp.status_code == 404:
            return None
        resp.raise_for_status()
        token = resp.json().get("next_batch")
        return token if isinstance(token, str) and token else None

    async def save_token(self, token: str) -> None:
        if token == self._saved:
            return
        if self.shared:
            resp = await self.api.http.put(self._account_data_url(), headers=self.api.auth(),
                                           json={"next_batch": token})
            resp.raise_for_status()
        else:
            await asyncio.to_thread(self._write_token, token)
        self._saved = token

    async def run(self) -> None:
        since = await self._load_with_retry()
        delay = 1.0
        while True:
            first = since is None
            try:
                answer = await self.api.client.sync(timeout=SYNC_TIMEOUT_MS, since=since,
                                                    sync_filter=_FIRST_FILTER if first else _FILTER,
                                                    full_state=first or None)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # aiohttp errors, timeouts: the homeserver is away or hangs
                answer = None
                self.last_error = f"{type(exc).__name__}: {exc}"[:200]
            if isinstance(answer, SyncResponse):
                try:
                    await self._handle(answer, first)
                except Exception as exc:  # the inbox could not take an event: the batch comes again
                    log.exception("matrix: a sync batch could not be handed in; fetching it again")
                    self.last_error = f"handing in a batch failed: {type(exc).__name__}: {exc}"[:200]
                    self.failures += 1
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, BACKOFF_MAX_S)
                    continue
                since = answer.next_batch
                if self.after_batch is not None:
                    await self.after_batch()
                try:
                    await self.save_token(since)
                except Exception as exc:  # kept in memory; the next batch saves it again
                    log.warning("matrix: could not save the sync token (%s: %s); the batch may come again "
                                "after a restart (the inbox drops the copies)", type(exc).__name__, exc)
                self.failures = 0
                self.last_ok = time.monotonic()
                self.batches += 1
                delay = 1.0
                continue
            if answer is not None:
                self.last_error = str(answer)[:200]
            self.failures += 1
            log.warning("matrix: /sync failed (%s); retrying in %.0fs", self.last_error, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX_S)

    async def _load_with_retry(self) -> str | None:
        delay = 1.0
        while True:
            try:
                return await self.load_token()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.last_error = f"reading the sync token: {type(exc).__name__}: {exc}"[:200]
                self.failures += 1
                log.warning("matrix: %s; retrying in %.0fs", self.last_error, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX_S)

    async def _handle(self, answer: SyncResponse, first: bool) -> None:
        for room_id, invite in answer.rooms.invite.items():
            inviter = next((e.sender for e in invite.invite_state
                            if isinstance(e, InviteMemberEvent) and e.state_key == self.api.user_id), None)
            await self.on_invite(room_id, inviter)
        if first:
            return
        for room_id, joined in answer.rooms.join.items():
            for event in joined.timeline.events:
                source = getattr(event, "source", None)
                if not isinstance(source, dict):
                    continue
                if source.get("type") == "m.reaction":
                    await self.on_reaction(room_id, source)
                else:
                    await self.on_event(room_id, source)
