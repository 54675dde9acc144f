"""Talon: a chat-channel bridge for an LLM agent (Telegram, WhatsApp, Slack, Discord, Matrix, console)."""

import sys as _sys
import types as _types

__version__ = "0.1.0"


def _without_httpx_cli() -> None:
    """httpx imports its command-line tool (click, and rich and pygments where installed) as it is
    imported, whenever click is installed, which it is (huggingface_hub and uvicorn need it):
    about 2 MB of a process that never runs it. Talon registers an empty ``httpx._main`` first,
    whose ``main`` says so, before anything imports httpx."""
    if "httpx" in _sys.modules or "httpx._main" in _sys.modules:
        return
    stub = _types.ModuleType("httpx._main")

    def main(*args: object, **kwargs: object) -> None:
        raise SystemExit("httpx's command-line tool is not loaded in Talon's process; run `httpx` itself")

    stub.main = main  # type: ignore[attr-defined]
    _sys.modules["httpx._main"] = stub


_without_httpx_cli()
