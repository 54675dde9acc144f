"""``talon run | chat | doctor``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from pydantic import ValidationError

from talon.config import Settings
from talon.errors import ConfigError

log = logging.getLogger("talon")


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # httpx logs every request URL, which for Telegram contains the bot token.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)


def _fail(message: str, missing: list[str] | None = None) -> int:
    print(f"talon: cannot start: {message}", file=sys.stderr)
    if missing:
        print(f"talon: missing settings: {', '.join(missing)} (see .env.example)", file=sys.stderr)
    return 2


def _load_settings() -> Settings:
    return Settings()


async def _run(settings: Settings) -> int:
    from talon.runtime import build_runtime, configured_channels, serve

    channels = configured_channels(settings)
    runtime = build_runtime(settings, channels)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await serve(runtime, stop)
    return 0


async def _chat(settings: Settings) -> int:
    from channels.console import ConsoleChannel
    from talon.runtime import build_runtime

    console = ConsoleChannel(media_root=settings.media_root)
    runtime = build_runtime(settings, [console])
    await runtime.start()
    try:
        await console.finished.wait()
    finally:
        await runtime.stop()
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    settings = _load_settings()
    _setup_logging(settings.log_level)
    missing: list[str] = []
    problems: list[str] = []
    try:
        settings.check_model()
    except ConfigError as exc:
        problems.append(str(exc))
        missing += exc.missing
    if not (settings.telegram_configured() or settings.whatsapp_configured()):
        problems.append("no channel configured: set TELEGRAM_BOT_TOKEN (Telegram) or "
                        "TWILIO_ACCOUNT_SID and TWILIO_WHATSAPP_FROM (WhatsApp)")
        missing += ["TELEGRAM_BOT_TOKEN", "TWILIO_ACCOUNT_SID", "TWILIO_WHATSAPP_FROM"]
    if problems:
        return _fail("; ".join(problems), missing)
    try:
        return asyncio.run(_run(settings))
    except ConfigError as exc:
        return _fail(str(exc), exc.missing)


def cmd_chat(args: argparse.Namespace) -> int:
    settings = _load_settings()
    _setup_logging(settings.log_level if args.verbose else "WARNING")
    try:
        settings.check_model()
        return asyncio.run(_chat(settings))
    except ConfigError as exc:
        return _fail(str(exc), exc.missing)


def cmd_doctor(args: argparse.Namespace) -> int:
    """What is configured and what is missing, without starting anything or printing secrets."""
    from talon.speech import Transcriber

    settings = _load_settings()
    rows: list[tuple[str, str]] = []
    try:
        settings.check_model()
        rows.append(("model", f"ok: {settings.model}"))
    except ConfigError as exc:
        rows.append(("model", f"MISSING: {exc}"))
    rows.append(("telegram", "configured" if settings.telegram_configured() else "not configured"))
    if settings.telegram_configured():
        rows.append(("telegram allowlist",
                     ", ".join(sorted(settings.telegram_allowlist)) or "EMPTY (nobody is allowed)"))
    rows.append(("whatsapp", "configured" if settings.whatsapp_configured() else "not configured"))
    if settings.whatsapp_configured():
        rows.append(("whatsapp allowlist",
                     ", ".join(sorted(settings.whatsapp_allowlist)) or "EMPTY (nobody is allowed)"))
        webhook = (settings.public_base_url.rstrip("/") + settings.whatsapp_webhook_path
                   if settings.public_base_url else "MISSING: set TALON_PUBLIC_BASE_URL")
        rows.append(("whatsapp webhook", webhook))
        rows.append(("http server", f"{settings.http_host}:{settings.http_port}"))
        if not settings.twilio_auth_token and not settings.whatsapp_insecure_no_signature:
            rows.append(("twilio auth token", "MISSING: webhooks cannot be verified; the channel will not start"))
    rows.append(("media root", str(settings.media_root.resolve())))
    rows.append(("data dir", str(settings.data_dir.resolve())))
    transcriber = Transcriber.from_settings(settings)
    rows.append(("transcriber", f"{settings.transcriber}: " + (
        f"ok ({transcriber.backend.name})" if transcriber.backend is not None
        else f"UNAVAILABLE: {transcriber.unavailable_reason}")))
    transcriber.close()
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="talon", description="Chat with your LLM agent on Telegram and WhatsApp.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="start every configured channel").set_defaults(func=cmd_run)
    chat = sub.add_parser("chat", help="talk to the agent in this terminal")
    chat.add_argument("-v", "--verbose", action="store_true", help="show logs")
    chat.set_defaults(func=cmd_chat)
    sub.add_parser("doctor", help="show what is configured").set_defaults(func=cmd_doctor)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        return _fail(f"invalid settings: {problems}")
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
