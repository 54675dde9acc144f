"""One connection per account across workers, for platforms that want one (Discord's gateway,
Matrix's ``/sync``): the worker holding the lease runs it, the others stand by and take over once
it is free (its holder stopped, or died and the lease expired).

The holder renews the lease every third of its time; a holder that cannot renew (the database is
away, or it was too slow) stops its connection at once, since two connections would receive every
event twice (the shared inbox would drop the copies, but replies to the platform's own questions,
like Discord's interactions, would race). Telegram's polling has its own (``telegram_leader.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from talon.storage.leases import Leases

log = logging.getLogger(__name__)

Step = Callable[[], Awaitable[None]]


class LeaseLeader:
    def __init__(self, leases: Leases, name: str, *, start: Step, stop: Step) -> None:
        self.leases = leases
        self.name = name
        self._start = start
        self._stop = stop
        self.leading = False

    async def run(self) -> None:
        log.info("%s: worker %s stands by (lease %s, %gs)", self.name, self.leases.holder, self.name,
                 self.leases.ttl_s)
        try:
            while True:
                try:
                    have = await self.leases.acquire(self.name)  # also renews it while ours
                except Exception as exc:
                    log.error("%s: cannot reach the database for the lease (%s)", self.name, exc)
                    have = False
                if have and not self.leading:
                    self.leading = True
                    log.info("%s: worker %s took the lease; connecting", self.name, self.leases.holder)
                    await self._start()
                elif not have and self.leading:
                    log.error("%s: worker %s lost the lease; disconnecting", self.name, self.leases.holder)
                    self.leading = False
                    await self._stop()
                await asyncio.sleep(self.leases.ttl_s / 3)
        finally:
            if self.leading:
                self.leading = False
                await self._stop()
                try:
                    await self.leases.release(self.name)
                except Exception as exc:  # it expires by itself
                    log.warning("%s: could not release the lease: %s", self.name, exc)
