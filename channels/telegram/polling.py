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

from channels.base import ChannelHealth
from channels.telegram.api import ALLOWED_UPDATES, TelegramCore

log = logging.getLogger(__name__)


# getUpdates failures in a row (python-telegram-bot retries after 1, 1.5, 2.25... s) after
# which the channel reports itself down: one failure is a blip, three are an outage.
POLL_FAILURES_DOWN = 3


class _PollingRequest(HTTPXRequest):
    """The getUpdates transport; remembers when the last poll came back (for the watchdog) and
    how many polls in a row failed since the last that succeeded (for ``health``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.last_ok = time.monotonic()
        self.failures = 0
        self.last_error = ""

    async def do_request(self, *args: Any, **kwargs: Any) -> tuple[int, bytes]:
        result = await super().do_request(*args, **kwargs)
        self.last_ok = time.monotonic()
        if 200 <= result[0] < 300:
            self.failures = 0
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
        self._poll_request.failures += 1
        self._poll_request.last_error = f"{type(exc).__name__}: {exc.message}"
        log.warning("telegram: getUpdates failed (%s); python-telegram-bot retries", exc)

    def _polling_health(self) -> ChannelHealth:
        """Up while getUpdates gets answers: not after several failures in a row, nor when no
        poll came back for longer than the watchdog allows (a hung connection)."""
        updater = self.app.updater
        if updater is None or not updater.running:
            return ChannelHealth(False, "polling is not running (the watchdog restarts it)")
        request = self._poll_request
        if request.failures >= POLL_FAILURES_DOWN:
            return ChannelHealth(False, f"getUpdates failed {request.failures} times in a row at "
                                        f"{self.settings.telegram_api_base_url} (last: {request.last_error}); "
                                        "python-telegram-bot retries")
        silent = time.monotonic() - request.last_ok
        if silent >= self._stall_after:
            return ChannelHealth(False, f"no answer to getUpdates for {silent:.0f}s (limit {self._stall_after:.0f}s); "
                                        "the watchdog restarts polling")
        return ChannelHealth(True, f"polling: last getUpdates answered {silent:.0f}s ago")

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
