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
from channels.telegram.api import ALLOWED_UPDATES, TelegramApi

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
        self.failing_since: float | None = None  # the first failure of the current run of them

    async def do_request(self, *args: Any, **kwargs: Any) -> tuple[int, bytes]:
        result = await super().do_request(*args, **kwargs)
        self.last_ok = time.monotonic()
        if 200 <= result[0] < 300:
            if self.failures:
                # The other half of the warnings logged while it failed: it works again.
                since = self.failing_since if self.failing_since is not None else self.last_ok
                log.info("telegram: getUpdates works again after %d failed attempt(s) over %.0fs",
                         self.failures, self.last_ok - since)
            self.failures = 0
            self.failing_since = None
        return result


class Polling:
    """getUpdates, and the watchdog that restarts it. ``request`` is the transport the
    application's getUpdates goes through (built with the application, before this)."""

    def __init__(self, api: TelegramApi, request: _PollingRequest, *, watchdog_interval_s: float,
                 stall_after_s: float) -> None:
        self.api = api
        self._poll_request = request
        self._watchdog_interval = watchdog_interval_s
        self._stall_after = stall_after_s
        self.restarts = 0  # by the watchdog

    async def start(self) -> None:
        assert self.api.app.updater is not None
        # start_polling calls deleteWebhook first (drop_pending_updates unset, so pending updates
        # stay), so a webhook left from webhook mode cannot make getUpdates fail with 409.
        self._poll_request.last_ok = time.monotonic()
        await self.api.app.updater.start_polling(
            timeout=self.api.settings.telegram_poll_timeout_s,
            allowed_updates=list(ALLOWED_UPDATES),
            error_callback=self._on_poll_error,
        )

    def _on_poll_error(self, exc: TelegramError) -> None:
        if not self._poll_request.failures:
            self._poll_request.failing_since = time.monotonic()
        self._poll_request.failures += 1
        self._poll_request.last_error = f"{type(exc).__name__}: {exc.message}"
        log.warning("telegram: getUpdates failed (%s); python-telegram-bot retries", exc)

    def health(self) -> ChannelHealth:
        """Up while getUpdates gets answers: not after several failures in a row, nor when no
        poll came back for longer than the watchdog allows (a hung connection)."""
        updater = self.api.app.updater
        if updater is None or not updater.running:
            return ChannelHealth(False, "polling is not running (the watchdog restarts it)")
        request = self._poll_request
        if request.failures >= POLL_FAILURES_DOWN:
            return ChannelHealth(False, f"getUpdates failed {request.failures} times in a row at "
                                        f"{self.api.settings.telegram_api_base_url} (last: {request.last_error}); "
                                        "python-telegram-bot retries")
        silent = time.monotonic() - request.last_ok
        if silent >= self._stall_after:
            return ChannelHealth(False, f"no answer to getUpdates for {silent:.0f}s (limit {self._stall_after:.0f}s); "
                                        "the watchdog restarts polling")
        return ChannelHealth(True, f"polling: last getUpdates answered {silent:.0f}s ago")

    async def watch(self) -> None:
        """Polling must never stop quietly: restart it when it died or has gone silent."""
        while True:
            await asyncio.sleep(self._watchdog_interval)
            updater = self.api.app.updater
            assert updater is not None
            silent = time.monotonic() - self._poll_request.last_ok
            if updater.running and silent < self._stall_after:
                continue
            reason = "stopped" if not updater.running else f"silent for {silent:.0f}s"
            log.error("telegram: polling %s; restarting it", reason)
            self.restarts += 1
            try:
                if updater.running:
                    await updater.stop()
                await self.start()
            except Exception:
                log.exception("telegram: could not restart polling; will try again")
