"""Telegram polling on many workers: exactly one polls, the others stand by.

Telegram lets one ``getUpdates`` run per bot, so the worker holding the ``telegram:poll`` lease
polls and renews it every third of the lease time; the others try to take it at the same pace and
start polling once it is free (the leader stopped, or died and its lease expired). A leader that
cannot renew (the database is away, or it was too slow) stops polling at once: two pollers would
make Telegram answer 409 to both. Updates fetched twice across a change of leader are dropped by
the shared inbox.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from talon.storage.leases import Leases

if TYPE_CHECKING:
    from channels.telegram.polling import Polling

log = logging.getLogger(__name__)

POLL_LEASE = "telegram:poll"


class PollLeader:
    def __init__(self, leases: Leases, name: str = POLL_LEASE) -> None:
        self.leases = leases
        self.name = name
        self.leading = False

    async def run(self, polling: Polling) -> None:
        watchdog: asyncio.Task[None] | None = None
        log.info("telegram: worker %s stands by for polling (lease %s, %gs)", self.leases.holder,
                 self.name, self.leases.ttl_s)
        try:
            while True:
                try:
                    have = await self.leases.acquire(self.name)  # also renews it while ours
                except Exception as exc:
                    log.error("telegram: cannot reach the database for the polling lease (%s)", exc)
                    have = False
                if have and not self.leading:
                    await polling.start()
                    self.leading = True
                    log.info("telegram: worker %s is the polling leader; polling as @%s",
                             self.leases.holder, polling.api.bot.username)
                    watchdog = asyncio.create_task(polling.watch(), name="telegram-watchdog")
                elif not have and self.leading:
                    log.error("telegram: worker %s lost the polling lease; stops polling", self.leases.holder)
                    await self._stop(polling, watchdog)
                    watchdog = None
                await asyncio.sleep(self.leases.ttl_s / 3)
        finally:
            await self._stop(polling, watchdog)

    async def _stop(self, polling: Polling, watchdog: asyncio.Task[None] | None) -> None:
        self.leading = False
        if watchdog is not None:
            watchdog.cancel()
            await asyncio.gather(watchdog, return_exceptions=True)
        updater = polling.api.app.updater
        if updater is not None and updater.running:
            await updater.stop()
