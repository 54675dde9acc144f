"""Long polling (getUpdates), and a watchdog that restarts polling when getUpdates has not
succeeded for too long, so the bot never looks alive while deaf.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from telegram.error import TelegramError
from telegram.request import HTTPXRequest

from channels.telegram.api import ALLOWED_UPDATES, TelegramCore

log = logging.getLogger(__name__)


class _PollingRequest(HTTPXRequest):
    """The getUpdates transport; remembers when the last poll came back, for the watchdog."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.last_ok = time.monotonic()

    async def do_request(self, *args: Any, **kwargs: Any) -> tuple[int, bytes]:
        result = await super().do_request(*args, **kwargs)
        self.last_ok = time.monotonic()
        return result


class Polling(TelegramCore):
    """getUpdates, and the watchdog that restarts it."""

    _poll_request: _PollingRequest
    _watchdog: "asyncio.Task[None] | None"
    _watchdog_interval: float
    _stall_after: float
    polling_restarts: int

    async def _start_polling(self) -> None:
        assert self.app.updater is not None
        # start_polling calls deleteWebhook first (drop_pending_updates unset, so pending updates
        # stay), so a webhook left from webhook mode cannot make getUpdates fail with 409.
        self._poll_request.last_ok = time.monotonic()
        await self.app.updater.start_polling(
            timeout=self.settings.telegram_poll_timeout_s,
            allowed_updates=list(ALLOWED_UPDATES),
            error_callback=self._on_poll_error,
        )

    def _on_poll_error(self, exc: TelegramError) -> None:
        log.warning("telegram: getUpdates failed (%s); python-telegram-bot retries", exc)

    async def _watch_polling(self) -> None:
        """Polling must never stop quietly: restart it when it died or has gone silent."""
        while True:
            await asyncio.sleep(self._watchdog_interval)
            updater = self.app.updater
            assert updater is not None
            silent = time.monotonic() - self._poll_request.last_ok
            if updater.running and silent < self._stall_after:
                continue
            reason = "stopped" if not updater.running else f"silent for {silent:.0f}s"
            log.error("telegram: polling %s; restarting it", reason)
            self.polling_restarts += 1
            try:
                if updater.running:
                    await updater.stop()
                await self._start_polling()
            except Exception:
                log.exception("telegram: could not restart polling; will try again")
