"""What every channel adapter provides to the bridge."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from talon.attachments import AttachmentStore
from talon.config import Limits
from talon.content import InboundFile
from talon.envelope import OutboundReply, RemoteFile

if TYPE_CHECKING:
    from talon.bridge import Bridge

log = logging.getLogger(__name__)

PartCallback = Callable[[int], Awaitable[None]]
"""Called with the number of reply parts delivered so far, after each part."""


class Channel(abc.ABC):
    name: str
    typing_interval_s: float = 4.0

    @abc.abstractmethod
    async def start(self, bridge: "Bridge") -> None:
        """Begin receiving messages and hand each to ``bridge.submit``."""

    @abc.abstractmethod
    async def stop(self) -> None: ...

    @abc.abstractmethod
    async def deliver(
        self, chat_id: str, reply: OutboundReply, *, skip_parts: int = 0, on_part: PartCallback | None = None
    ) -> None:
        """Send a reply as an ordered list of parts, skipping the first ``skip_parts``
        (already delivered before a crash), reporting progress after each part."""

    async def download(self, remote: RemoteFile, store: AttachmentStore, limits: Limits) -> InboundFile:
        """Fetch a file into the store. Failures come back as an InboundFile with a notice."""
        return InboundFile(
            kind=remote.kind, name=remote.name, mime=remote.mime, size=remote.size,
            notice=f"the {self.name} channel cannot download files",
        )

    async def send_typing(self, chat_id: str) -> None:  # noqa: B027 - optional
        """Show that the agent is working (no-op where the platform has no such thing)."""

    @contextlib.asynccontextmanager
    async def typing(self, chat_id: str) -> AsyncIterator[None]:
        """Keep the typing indicator alive for as long as the block runs."""

        async def keep_alive() -> None:
            while True:
                try:
                    await self.send_typing(chat_id)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # a lost typing ping is cosmetic
                    log.debug("typing indicator for %s failed: %s", chat_id, exc)
                await asyncio.sleep(self.typing_interval_s)

        task = asyncio.create_task(keep_alive())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
