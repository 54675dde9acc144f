"""Headless Chromium from the distribution (``/usr/bin/chromium``), driven by Playwright for Python.

Playwright's sync API runs on a thread of its own (``BrowserThread``): the test's event loop stays
free to run Talon, whose pages the browser loads, while a test awaits a browser step
(``await browser.run(step)``). One browser per test module; each test opens its own context (its
own cookies). ``Tab`` records what a page must never do: a JavaScript error (a CSP violation is
one), a request to anything but Talon, and it keeps a screenshot of every page it visits.
``playwright install`` is never run: the executable is Debian's ``chromium`` package.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")
CHROMIUM = os.environ.get("TALON_TEST_CHROMIUM", "/usr/bin/chromium")
SHOTS_ENV = "TALON_UI_SCREENSHOTS"  # keep the screenshots here (default: a directory of the pytest run)


def chromium_or_skip() -> str:
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium; .ci/run does it)")
    return CHROMIUM if Path(CHROMIUM).exists() else str(shutil.which("chromium"))


class BrowserThread:
    def __init__(self, executable: str) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="playwright")
        self.pool.submit(self._start, executable).result()

    def _start(self, executable: str) -> None:
        from playwright.sync_api import sync_playwright

        self.playwright = sync_playwright().start()
        self.browser = self.playwright.chromium.launch(
            executable_path=executable, headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run"])

    async def run(self, step: Callable[..., T], *args: Any) -> T:
        return await asyncio.wrap_future(self.pool.submit(step, *args))

    def close(self) -> None:
        def stop() -> None:
            self.browser.close()
            self.playwright.stop()

        self.pool.submit(stop).result()
        self.pool.shutdown(wait=True)


class Tab:
    """A browser context and page on Talon at ``base`` (created on the browser thread)."""

    def __init__(self, browser: BrowserThread, base: str, shots: Path, secrets: list[str]) -> None:
        self.base = base.rstrip("/")
        self.shots = shots
        self.secrets = secrets
        self.errors: list[str] = []
        self.foreign: list[str] = []
        self.visited: list[str] = []
        self.context = browser.browser.new_context(base_url=self.base, viewport={"width": 1280, "height": 900})
        self.page = self.context.new_page()
        self.page.set_default_timeout(20000)
        self.page.on("pageerror", lambda exc: self.errors.append(f"page error: {exc}"))
        self.page.on("console", lambda m: self.errors.append(f"console {m.type}: {m.text}")
                     if m.type == "error" else None)
        self.page.on("request", self._request)
        self.blocked: list[str] = []  # foreign requests the browser refused before sending (the CSP)
        self.page.on("requestfailed", lambda r: self.blocked.append(r.url)
                     if str(r.failure or "").lower() in ("csp", "net::err_blocked_by_csp") else None)
        self.page.on("response", lambda r: self.errors.append(f"{r.status} for {r.url}") if r.status >= 400 else None)

    def _request(self, request: Any) -> None:
        url = request.url
        if not (url.startswith(self.base + "/") or url.startswith(("data:", "blob:", "about:"))):
            self.foreign.append(url)

    def shot(self, name: str) -> Path:
        path = self.shots / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def check(self, where: str) -> None:
        """No secret in the page as the browser has it."""
        html = self.page.content()
        for secret in self.secrets:
            assert secret not in html, f"a secret appears in {where}"
        self.visited.append(where)

    def visit(self, path: str, shot: str | None = None) -> None:
        self.page.goto(path)
        self.page.wait_for_load_state("load")
        self.check(path)
        self.shot(shot or path.strip("/").replace("/", "_") or "root")

    def clean(self) -> None:
        """Every page loaded without a JavaScript error and asked nothing of another origin."""
        assert self.errors == [], self.errors
        sent = [url for url in self.foreign if url not in self.blocked]
        assert sent == [], sent

    def close(self) -> None:
        self.context.close()


def shots_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    named = os.environ.get(SHOTS_ENV, "").strip()
    if named:
        path = Path(named)
        path.mkdir(parents=True, exist_ok=True)
        return path
    return tmp_path_factory.mktemp("ui-screenshots")
