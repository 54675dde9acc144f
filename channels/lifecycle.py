"""Start, health and stop as the platform channels after Telegram have them (Discord, Matrix,
Slack): what is the same in each is written once here, what differs stays with the channel.

- ``PlatformLifecycle``: ``start`` binds the intake and the approval prompts to the bridge, signs
  in (``_log_in``) and begins receiving (``_receive``). A platform that cannot be reached is
  waited for, doubling the pause up to ``startup_retry_max_s``, with ``health`` saying why
  meanwhile; a refusal (``ConfigError``: a wrong token) is raised at once. ``health`` reports why
  the channel is down (not started, retrying, stopped) before asking the channel (``_health_up``).
- ``LeaseLedUpdates``: for platforms that want one connection per account (Discord's gateway,
  Matrix's ``/sync``): with workers sharing a database (``share_updates``) only the holder of the
  lease (``channels/leader.py``) keeps it open, the others send replies and stand by; alone, the
  connection is opened at start. The channel says how to open and close it.

Telegram keeps its own (its start-up errors, polling or webhook, ``telegram_leader.py``).
"""

from __future__ import annotations

import abc
import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from talon.errors import ConfigError

from channels.base import ApprovalPart, BridgeHandle, Channel, ChannelHealth
from channels.leader import LeaseLeader

if TYPE_CHECKING:
    from talon.storage.leases import Leases

log = logging.getLogger(__name__)


class IntakePart(Protocol):
    def bind(self, bridge: BridgeHandle) -> None: ...


class PlatformLifecycle(Channel):
    intake: IntakePart
    approvals: ApprovalPart
    # Why the channel is not up (None: it is): set while starting and retrying, and when stopped.
    _down: str | None = "not started"
    startup_retry_max_s: float = 30.0

    async def start(self, bridge: BridgeHandle) -> None:
        self.intake.bind(bridge)
        self.approvals.bind(bridge)
        await self._retry_start(self._log_in)
        await self._receive()
        self._down = None

    @abc.abstractmethod
    def _platform(self) -> str:
        """The platform as the start-up message names it: "Slack at URL", "the homeserver URL"."""

    @abc.abstractmethod
    async def _log_in(self) -> None:
        """Check the credentials; a refusal is a ``ConfigError``, anything else is waited out."""

    @abc.abstractmethod
    async def _receive(self) -> None:
        """Begin receiving events, once logged in."""

    async def _retry_start(self, step: Callable[[], Awaitable[None]]) -> None:
        delay = 1.0
        while True:
            try:
                await step()
                return
            except ConfigError:
                raise
            except Exception as exc:  # unreachable, hanging, 5xx: wait for it
                self._down = (f"cannot reach {self._platform()} ({type(exc).__name__}: "
                              f"{str(exc)[:120]}); retrying in {delay:.0f}s")
                log.warning("%s: %s", self.name, self._down)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.startup_retry_max_s)

    def health(self) -> ChannelHealth:
        if self._down is not None:
            return ChannelHealth(False, self._down)
        return self._health_up()

    @abc.abstractmethod
    def _health_up(self) -> ChannelHealth:
        """Health once started: the connection's own state."""


class LeaseLedUpdates(PlatformLifecycle):
    leader: LeaseLeader | None = None
    _leading: asyncio.Task[None] | None = None
    lease_task_name: str  # the asyncio task that runs the leader

    @abc.abstractmethod
    def _lease_name(self) -> str: ...

    @abc.abstractmethod
    async def _open_updates(self) -> None:
        """Open the account's one connection (the gateway, the sync loop)."""

    @abc.abstractmethod
    async def _close_updates(self) -> None:
        """Close it again (the lease lost, or stopping); safe when it is not open."""

    def share_updates(self, leases: Leases) -> None:
        self.leader = LeaseLeader(leases, self._lease_name(), start=self._open_updates, stop=self._close_updates)

    async def _receive(self) -> None:
        if self.leader is not None:
            self._leading = asyncio.create_task(self.leader.run(), name=self.lease_task_name)
        else:
            await self._open_updates()

    def _standing_by(self) -> bool:
        """Another worker holds the lease: this one sends replies only."""
        return self.leader is not None and not self.leader.leading

    async def _stop_receiving(self) -> None:
        if self._leading is not None:
            self._leading.cancel()
            await asyncio.gather(self._leading, return_exceptions=True)
        await self._close_updates()
