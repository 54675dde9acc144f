"""Every HTTPS client Talon builds shares its library's one TLS context (talon/tls.py): a second
runtime, with its Telegram channel, model provider and download clients, loads no CA bundle
again (each client loaded one before: about 25 ms of CPU and a few hundred KB each)."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest

from talon import tls
from tests.conftest import make_settings


def test_a_second_runtime_loads_no_ca_bundle_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from channels.telegram import TelegramChannel
    from talon.runtime import build_runtime

    loads: list[str] = []
    real = ssl.SSLContext.load_verify_locations

    def counted(self: ssl.SSLContext, *args: Any, **kwargs: Any) -> None:
        loads.append(str(args[:1] or kwargs))
        real(self, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counted)
    tls.httpx_tls.cache_clear()
    tls.sdk_tls.cache_clear()
    built = []
    for n in range(2):
        settings = make_settings(tmp_path / str(n), "http://127.0.0.1:9", "http://127.0.0.1:9/v1")
        built.append(build_runtime(settings, [TelegramChannel(settings)]))
        if n == 0:
            first = len(loads)
    assert 1 <= first <= 2, loads  # one context per library (httpx; httpx2 for the model SDK)
    assert len(loads) == first, loads  # the second runtime made none
    assert tls.httpx_tls() is tls.httpx_tls() and tls.sdk_tls().verify_mode == ssl.CERT_REQUIRED
