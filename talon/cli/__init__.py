"""The `talon` command: ``run | chat | doctor | pair | migrate | usage | ui`` and the parser here; one
module per later command in this package: ``setup``, ``backup`` (backup, ``--verify`` and restore),
``export``, and ``reindex`` (`talon migrate` with no ``--to``: the search index)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from talon.errors import ConfigError, PairingError

# Neither pydantic (Settings) nor asyncio at import: `talon restore` needs neither, `talon backup`
# no asyncio; each command imports what it uses (docs/backup.md, the third pass).
if TYPE_CHECKING:
    from talon.config import Settings
    from talon.agent.providers.local import LocalModelServer
    from talon.storage.migrate import MigrationReport

log = logging.getLogger("talon")


_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_REDACTED = "[REDACTED]"


class _RedactingFormatter(logging.Formatter):
    """Formats as usual, then blanks out every secret: third-party libraries log what they like
    at DEBUG (python-telegram-bot logs its API URLs, which hold the bot token)."""

    def __init__(self, fmt: str, secrets: Iterable[str]) -> None:
        super().__init__(fmt)
        # Longest first, so that a secret containing another is blanked whole. Very short values
        # are skipped: they are not real credentials and would blank ordinary words.
        self._secrets = sorted({s for s in secrets if len(s) >= 8}, key=len, reverse=True)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        for secret in self._secrets:
            text = text.replace(secret, _REDACTED)
        return text


def _secrets(settings: Settings) -> list[str]:
    return [value.strip() for value in (settings.telegram_bot_token, settings.twilio_auth_token,
                                        settings.openai_api_key, settings.anthropic_api_key,
                                        settings.telegram_webhook_secret, settings.matrix_access_token,
                                        settings.matrix_password, settings.slack_bot_token,
                                        settings.slack_signing_secret, settings.slack_app_token,
                                        settings.discord_bot_token) if value.strip()]


def _setup_logging(level: str, secrets: Iterable[str] = ()) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format=_LOG_FORMAT,
    )
    formatter = _RedactingFormatter(_LOG_FORMAT, secrets)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)
    # httpx logs every request URL, which for Telegram contains the bot token.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)


def _fail(message: str, missing: list[str] | None = None, settings: Settings | None = None) -> int:
    """``missing`` names the settings the error is about; only those without a value are said to be
    missing (a busy TALON_HTTP_PORT is set: the message says what is wrong with it)."""
    from talon.settings_source import unset

    print(f"talon: cannot start: {message}", file=sys.stderr)
    if missing and settings is not None:
        missing = unset(settings, missing)
    if missing:
        # Point at .env.example only where there is one (a checkout); else at what writes them.
        where = ("see .env.example" if Path(".env.example").is_file()
                 else "`talon setup` writes them to .env; see the README's settings")
        print(f"talon: missing settings: {', '.join(missing)} ({where})", file=sys.stderr)
    return 2


def _load_settings() -> Settings:
    """From the environment and the .env file ``talon.settings_source`` finds."""
    from talon.settings_source import load_settings

    return load_settings()[0]


async def _run(settings: Settings) -> int:
    import asyncio

    from talon.runtime import (build_runtime, configured_channels, serve, shared_http_server,
                               until_stopped)
    from talon.settings_source import find_env_file
    from talon.storage.factory import open_stores

    # First of all: a signal must stop Talon in every phase, start-up waits included.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info("settings: %s", find_env_file().describe())
    http = shared_http_server(settings)  # one server for every channel's webhooks
    # Embedded, or PostgreSQL (TALON_DATABASE_URL), which may make us wait for a server.
    stores = open_stores(settings)

    async def opened() -> bool:
        await stores.start()
        return True

    if await until_stopped(stop, opened()) is None:
        log.info("stopped while opening the stores")
        await stores.aclose()
        return 0
    channels = configured_channels(settings, http, stores)
    runtime = build_runtime(settings, channels, http=http, stores=stores)
    await serve(runtime, stop)
    return 0


async def _chat(settings: Settings) -> int:
    import asyncio

    from channels.console import ConsoleChannel
    from talon.runtime import build_runtime, until_stopped

    # First of all, as for `talon run`: Ctrl-C or SIGTERM during the start (a local model that
    # loads, a database) ends it, cleanly, through the loop (exit code 130 or 143).
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals: list[int] = []

    def stop_starting(sig: int) -> None:
        signals.append(sig)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop_starting, sig)
    console = ConsoleChannel(media_root=settings.workspace_dir("console", "local"))
    # The console's acknowledgement is no courtesy to save calls on: it says at once which earlier
    # message a resumed answer is for (TALON_ACK_DELAY is for the platforms' Bot API calls).
    runtime = build_runtime(settings.model_copy(update={"ack_delay_s": 0.0}), [console])

    async def started() -> bool:
        await runtime.start()
        return True

    try:
        if await until_stopped(stop, started()) is None:
            return 128 + signals[0]
        # From here Ctrl-C is the console's: the first one during an answer stops it.
        loop.add_signal_handler(signal.SIGINT, console.interrupt)
        loop.add_signal_handler(signal.SIGTERM, console.quit, 128 + signal.SIGTERM)
        await console.finished.wait()
    finally:
        await runtime.stop()  # also a local model server that started before start failed
    return console.exit_code


def cmd_run(args: argparse.Namespace) -> int:
    import asyncio

    from talon.preflight import start_problems

    settings = _load_settings()
    _setup_logging(settings.log_level, _secrets(settings))
    # The checks `talon doctor` runs too (talon.preflight): what one passes, the other accepts.
    problems = start_problems(settings)
    if problems:
        return _fail("; ".join(str(p.error) for p in problems),
                     [name for p in problems for name in p.error.missing], settings)
    try:
        return asyncio.run(_run(settings))
    except ConfigError as exc:
        return _fail(str(exc), exc.missing, settings)


def cmd_chat(args: argparse.Namespace) -> int:
    import asyncio

    from talon.agent.providers.local import BUNDLED_NOTE

    settings = _load_settings()
    _setup_logging(settings.log_level if args.verbose else "WARNING", _secrets(settings))
    if not settings.model.strip():
        # A first try needs no account and no server: the tiny model Talon runs itself.
        settings = settings.model_copy(update={"model": "local:bundled"})
        print(f"talon: {BUNDLED_NOTE}", flush=True)
    try:
        settings.check_model()
        return asyncio.run(_chat(settings))
    except ConfigError as exc:
        return _fail(str(exc), exc.missing, settings)


async def _check_model_server(settings: Settings) -> list[tuple[str, str]]:
    """Discovery, then one cheap live request (a one-token reply): what a chat would meet. A
    ``local:`` model's server is started for that, and stopped again."""
    from talon.agent.providers.local import local_model_server
    from talon.errors import LocalModelError

    rows: list[tuple[str, str]] = []
    local = local_model_server(settings)
    if local is not None:
        try:
            await local.start()
        except LocalModelError as exc:
            return [("local model", f"FAILED: {exc}")]
        rows.append(("local model", f"ok: {local.describe()}, ready in {local.started_in_s or 0:.1f} s"))
    try:
        return rows + await _ask_model_server(settings, local)
    finally:
        if local is not None:
            await local.stop()


async def _ask_model_server(settings: Settings, local: "LocalModelServer | None") -> list[tuple[str, str]]:
    from talon.agent.providers.base import ModelRequest
    from talon.content import Message
    from talon.storage.attachments import MemoryAttachments
    from talon.runtime import build_provider, model_discoverer

    rows: list[tuple[str, str]] = []
    facts = await model_discoverer(settings, local).discover() if settings.model_discovery else None
    profile = None
    if facts is not None:
        rows.append(("model server", ("UNREACHABLE: " if not facts.reachable else "") + facts.describe()
                     + f" [{facts.elapsed_s:.2f} s]"))
    try:
        from talon.agent.providers.profiles import settings_profile

        profile = settings_profile(settings, facts=facts if facts is not None and facts.reachable else None)
        rows.append(("model profile", profile.describe(with_sources=True)))
    except ConfigError as exc:
        rows.append(("model profile", f"INVALID: {exc}"))
    with tempfile.TemporaryDirectory() as scratch:
        provider = build_provider(settings, MemoryAttachments(Path(scratch)), local=local)
        started = time.monotonic()
        try:
            reply = await provider.complete(ModelRequest(system="", messages=[Message.user("Say OK.")],
                                                         max_output_tokens=16 if getattr(provider, "reasoning", False)
                                                         else 1))
            rows.append(("live request", f"ok: answered in {time.monotonic() - started:.1f} s"
                         + (f" ({reply.usage.input_tokens} tokens in)" if reply.usage else "")))
        except Exception as exc:  # every failure is the finding here
            rows.append(("live request", f"FAILED: {exc}"))
        finally:
            await provider.aclose()
    return rows


def cmd_doctor(args: argparse.Namespace) -> int:
    """What is configured, what the model server says, whether it answers; no secrets printed.
    Exits 1 when a required setting is missing or invalid, or the model server cannot be used."""
    import asyncio

    from talon.doctor_checks import (
        discord_bot_row,
        matrix_account_row,
        model_url_row,
        settings_row,
        slack_bot_row,
        telegram_bot_row,
        twilio_account_row,
        whatsapp_templates_row,
    )
    from talon.speech.transcribe import Transcriber

    rows: list[tuple[str, str]] = [settings_row()]
    try:
        settings = _load_settings()
    except ConfigError as exc:  # TALON_ENV_FILE names no file
        print(f"settings  INVALID: {exc}")
        print("\ntalon doctor: problems with settings", file=sys.stderr)
        return 1
    model_ok = False
    try:
        settings.check_model()
        rows.append(("model", f"ok: {settings.model}"))
        model_ok = True
    except ConfigError as exc:
        rows.append(("model", f"MISSING: {exc}"))
    if model_ok:
        rows += model_url_row(settings)
        rows += asyncio.run(_check_model_server(settings))
    empty_allowlist = ("EMPTY (only senders approved with `talon pair`)" if settings.pairing
                       else "EMPTY (nobody is allowed)")
    rows.append(("telegram", "configured" if settings.telegram_configured() else "not configured"))
    if settings.telegram_configured():
        rows.append(asyncio.run(telegram_bot_row(settings)))
        try:
            settings.check_telegram_webhook()
            mode = (f"webhook {settings.telegram_webhook_url.strip()} -> {settings.telegram_webhook_path} on "
                    f"{settings.http_host}:{settings.http_port}" if settings.telegram_webhook_mode
                    else "long polling")
        except ConfigError as exc:
            mode = f"INVALID: {exc}"
        rows.append(("telegram mode", mode))
        rows.append(("telegram allowlist",
                     ", ".join(sorted(settings.telegram_allowlist)) or empty_allowlist))
    rows.append(("whatsapp", "configured" if settings.whatsapp_configured() else "not configured"))
    if settings.whatsapp_configured():
        rows.append(("whatsapp allowlist",
                     ", ".join(sorted(settings.whatsapp_allowlist)) or empty_allowlist))
        webhook = (settings.public_base_url.rstrip("/") + settings.whatsapp_webhook_path
                   if settings.public_base_url else "MISSING: set TALON_PUBLIC_BASE_URL")
        rows.append(("whatsapp webhook", webhook))
        rows.append(("http server", f"{settings.http_host}:{settings.http_port}"))
        if not settings.twilio_auth_token and not settings.whatsapp_insecure_no_signature:
            rows.append(("twilio auth token", "MISSING: webhooks cannot be verified; the channel will not start"))
        account = twilio_account_row(settings)
        if account is not None:
            rows.append(account)
        rows.append(whatsapp_templates_row(settings))
    rows.append(("matrix", "configured" if settings.matrix_configured() else "not configured"))
    if settings.matrix_configured():
        rows.append(asyncio.run(matrix_account_row(settings)))
        rows.append(("matrix allowlist", ", ".join(sorted(settings.matrix_allowlist)) or empty_allowlist))
        try:
            rooms = ", ".join(sorted(settings.matrix_allowed_room_ids)) or "none (direct messages only)"
        except ConfigError as exc:
            rooms = f"INVALID: {exc}"
        rows.append(("matrix rooms", rooms))
    rows.append(("slack", ("configured (Socket Mode)" if settings.slack_socket_mode else
                           f"configured (Events API at {settings.slack_events_path})")
                  if settings.slack_configured() else "not configured"))
    if settings.slack_configured():
        rows.append(asyncio.run(slack_bot_row(settings)))
        rows.append(("slack allowlist", ", ".join(sorted(settings.slack_allowlist)) or empty_allowlist))
        rows.append(("slack channels", ", ".join(sorted(settings.slack_allowed_channel_ids))
                     or "none (direct messages only)"))
    rows.append(("discord", "configured" if settings.discord_configured() else "not configured"))
    if settings.discord_configured():
        rows.append(asyncio.run(discord_bot_row(settings)))
        rows.append(("discord allowlist", ", ".join(sorted(settings.discord_allowlist)) or empty_allowlist))
        try:
            served = ", ".join(sorted(settings.discord_allowed_channel_ids)) or "none (direct messages only)"
        except ConfigError as exc:
            served = f"INVALID: {exc}"
        rows.append(("discord channels", served))
    rows.append(("pairing", "on: unknown senders get a code for `talon pair`" if settings.pairing
                 else "off (TALON_PAIRING=false)"))
    from talon.control.doctor import control_rows

    rows += control_rows(settings)
    from talon.ui.security import panel_row

    rows.append(panel_row(settings))
    # Every check `talon run` makes before it starts (talon.preflight): a refusal there is a
    # problem here, named by its area, whether or not a row above showed it already.
    from talon.preflight import NO_CHANNEL, start_problems

    shown = {value for _, value in rows}
    for problem in start_problems(settings):
        if problem.error is NO_CHANNEL:  # `talon chat` needs none; the rows above say which is set
            rows.append((problem.area, "none: `talon run` needs Telegram or WhatsApp; `talon chat` works "
                                       "without"))
            continue
        value = f"INVALID: {problem.error}"
        if value not in shown and f"MISSING: {problem.error}" not in shown:
            rows.append((problem.area, value))
    rows.append(("media root", str(settings.media_root.resolve())))
    rows.append(("data dir", str(settings.data_dir.resolve())))
    if settings.database_url:  # many workers: the shared stores
        from talon.health import database_rows

        rows += asyncio.run(database_rows(settings.database_url))
    rows += _outside_tool_rows(settings)
    transcriber = Transcriber.from_settings(settings)
    rows.append(("transcriber", f"{settings.transcriber}: " + (
        f"ok ({transcriber.backend.name})" if transcriber.backend is not None
        else f"UNAVAILABLE: {transcriber.unavailable_reason}")))
    transcriber.close()
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}")
    problems = [key for key, value in rows if value.startswith(_PROBLEMS)]
    if problems:
        print(f"\ntalon doctor: problems with {', '.join(problems)}", file=sys.stderr)
        return 1
    return 0


def _outside_tool_rows(settings: Settings) -> list[tuple[str, str]]:
    """The web fetch's setting, and each MCP server started once (state and tool count)."""
    import asyncio

    from talon.agent.tools.mcp import doctor_rows

    allowed = ", ".join(settings.web_allowlist) or "none"
    rows = [("web fetch", f"on (private hosts allowed: {allowed})" if settings.web_fetch
             else "off (TALON_WEB_FETCH=false)")]
    try:
        servers = settings.mcp_servers()
    except ConfigError as exc:
        return rows + [("mcp config", f"INVALID: {exc}")]
    path = settings.mcp_config_path
    rows.append(("mcp config", str(path.resolve()) if path.exists() else f"none ({path} not found)"))
    if servers:
        from talon.agent.tools.sandbox import SandboxLimits

        limits = SandboxLimits(settings.shell_max_procs, settings.shell_max_memory, settings.shell_cpu_seconds,
                               settings.shell_max_file_size)
        rows += asyncio.run(doctor_rows(servers, start_timeout_s=settings.mcp_start_timeout_s,
                                        sandbox_limits=limits))
    return rows


# Row values that mean Talon cannot work as configured (doctor exits 1).
_PROBLEMS = ("MISSING", "INVALID", "UNREACHABLE", "FAILED")


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f}s ago"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 36 * 3600:
        return f"{seconds / 3600:.0f} h ago"
    return f"{seconds / 86400:.0f} days ago"


def _table(rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())


def cmd_pair(args: argparse.Namespace) -> int:
    """List pairing requests and approvals, approve a code, or revoke an approval."""
    import asyncio

    settings = _load_settings()
    try:
        return asyncio.run(_pair(settings, args))
    except ConfigError as exc:
        return _fail(str(exc), exc.missing)


async def _pair(settings: Settings, args: argparse.Namespace) -> int:
    from talon.config import normalize_whatsapp_number
    from talon.storage.access import CODE_TTL_S
    from talon.storage.factory import open_gate

    gate = await open_gate(settings)
    try:
        if args.revoke:
            channel, _, sender = args.revoke.partition(":")
            channel = channel.strip().lower()
            sender = normalize_whatsapp_number(sender) if channel == "whatsapp" else sender.strip()
            if channel not in gate.allowlists or not sender:
                print(f"talon: --revoke takes CHANNEL:ID, e.g. telegram:123456789 or whatsapp:+14155550123 "
                      f"(got {args.revoke!r})", file=sys.stderr)
                return 2
            revoked = await gate.revoke(channel, sender)
            if revoked is None:
                print(f"talon: {channel}:{sender} was not approved through pairing (`talon pair` lists "
                      "approvals)", file=sys.stderr)
                return 1
            print(f"revoked {revoked.who}: their next message is denied")
            if gate.in_allowlist(channel, sender):
                print(f"note: {channel}:{sender} is still allowed by the {channel} allowlist setting")
            return 0
        if args.code:
            try:
                approved = await gate.approve(args.code)
            except PairingError as exc:
                print(f"talon: {exc}", file=sys.stderr)
                return 1
            print(f"approved {approved.who}: they can chat with the agent now")
            return 0
        now = time.time()
        if not settings.pairing:
            print("pairing is off (TALON_PAIRING=false): unknown senders get no code")
        pending = await gate.pending()
        if pending:
            print(f"pending requests (codes expire {CODE_TTL_S / 3600:.0f} hour after they are given; "
                  "approve one with `talon pair CODE`):")
            _table([("channel", "who", "code", "asked")] + [
                (p.channel, p.sender_id + (f" ({p.name})" if p.name else ""), p.code, _age(now - p.created))
                for p in pending])
        else:
            print("no pending requests")
        approvals = await gate.approvals()
        if approvals:
            print("approved through pairing (remove with `talon pair --revoke CHANNEL:ID`):")
            _table([("who", "approved")] + [(a.who, _age(now - a.approved_at)) for a in approvals])
        return 0
    finally:
        await gate.close()


def cmd_migrate(args: argparse.Namespace) -> int:
    """Copy the embedded stores of TALON_DATA_DIR into PostgreSQL and check the copy; with no
    ``--to``, bring the configured stores up to date in place (schema, search index)."""
    import asyncio

    from talon.storage.postgres.db import redact

    settings = _load_settings()
    _setup_logging("WARNING", _secrets(settings))
    url = (args.to or "").strip()
    if not url:
        from talon.cli.reindex import run as reindex

        return reindex(settings, rebuild=args.rebuild_index)
    if not settings.data_dir.is_dir():
        return _fail(f"TALON_DATA_DIR={settings.data_dir} does not exist: nothing to migrate", ["TALON_DATA_DIR"],
                     settings)
    try:
        report = asyncio.run(_migrate(settings, url))
    except ConfigError as exc:
        return _fail(str(exc))  # about the --to URL: nothing is missing
    print(f"from {settings.data_dir.resolve()} to {redact(url)}")
    rows = [("store", "found", "copied now", "verified")]
    rows += [(s.name, str(s.found), str(s.copied), str(s.verified)) for s in report.stores]
    _table(rows)
    for store in report.stores:
        for problem in store.problems:
            print(f"PROBLEM: {problem}")
    print("ok: every item is in the database and checked" if report.ok else "NOT OK: see the problems above")
    return 0 if report.ok else 1


async def _migrate(settings: Settings, url: str) -> "MigrationReport":
    from talon.storage.migrate import migrate_embedded
    from talon.storage.postgres.db import AsyncDatabase

    db = AsyncDatabase(url, max_size=2)
    await db.open()
    try:
        return await migrate_embedded(settings.data_dir, db)
    finally:
        await db.close()


def cmd_usage(args: argparse.Namespace) -> int:
    """The bot's model use; ``--grant CHANNEL:ID AMOUNT`` lifts a person's cap (talon.control.cli)."""
    from talon.control.cli import cmd_usage as run

    return run(args, _load_settings())


def cmd_ui(args: argparse.Namespace) -> int:
    """``talon ui password`` / ``talon ui link`` (talon.ui.cli)."""
    from talon.ui import cli as ui_cli

    if args.what == "password":
        return ui_cli.cmd_password(args)
    return ui_cli.cmd_link(args, _load_settings())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="talon", description="Chat with your LLM agent on Telegram and WhatsApp.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "run", help="start every configured channel",
        description="Start Talon: every configured channel (Telegram, WhatsApp), the agent, scheduled tasks "
                    "and, when a port is set or a webhook needs one, the HTTP server (/healthz, /metrics). "
                    "Settings come from the environment and .env (`talon setup` writes it; `talon doctor` "
                    "checks it). Stops cleanly on Ctrl-C or SIGTERM.").set_defaults(func=cmd_run)
    chat = sub.add_parser("chat", help="talk to the agent in this terminal",
                          description="Talk to the agent in this terminal, with no platform account; without "
                                      "TALON_MODEL the small bundled model answers. Ctrl-C stops an answer, "
                                      "Ctrl-D leaves.")
    chat.add_argument("-v", "--verbose", action="store_true", help="show logs")
    chat.set_defaults(func=cmd_chat)
    sub.add_parser(
        "doctor", help="show what is configured",
        description="Show where the settings come from and what they configure, and check each live: the "
                    "bot token (getMe), the Twilio account, the model server (one short request), the database, "
                    "MCP servers, the transcriber. No secret is printed. Exits 1 when something cannot work, "
                    "naming the setting.").set_defaults(func=cmd_doctor)
    migrate = sub.add_parser(
        "migrate", help="bring the stores up to date (schema, search index), or copy an embedded deployment "
                        "(TALON_DATA_DIR) into PostgreSQL with --to",
        description="Without --to: upgrade the configured stores in place and index every stored message "
                    "for search (safe to repeat, also while Talon runs). With --to URL: copy the embedded "
                    "stores of TALON_DATA_DIR into that PostgreSQL database and check the copy.")
    migrate.add_argument("--to", metavar="URL", help="the PostgreSQL URL (TALON_DATABASE_URL of the workers)")
    migrate.add_argument("--rebuild-index", action="store_true",
                         help="embedded: forget the search index and index every message again")
    migrate.set_defaults(func=cmd_migrate)
    pair = sub.add_parser("pair", help="list pairing requests, approve a code, or revoke an approval")
    which = pair.add_mutually_exclusive_group()
    which.add_argument("code", nargs="?", help="the code the newcomer was sent, e.g. K7Q-4MX2")
    which.add_argument("--revoke", metavar="CHANNEL:ID", help="remove an approval, e.g. telegram:123456789")
    pair.set_defaults(func=cmd_pair)
    usage = sub.add_parser("usage", help="show the model use, or lift a person's cap with --grant")
    usage.add_argument("--grant", nargs=2, metavar=("CHANNEL:ID", "AMOUNT"),
                       help="give a person more on top of TALON_LIMIT_PER_PERSON: 50000 (tokens) or $5")
    usage.set_defaults(func=cmd_usage)
    from talon.cli.backup import add_commands as backup_commands

    backup_commands(sub)
    from talon.cli.export import add_command as export_command

    export_command(sub)
    from talon.cli.setup import add_command as setup_command

    setup_command(sub)
    ui = sub.add_parser("ui", help="the web panel: make a password hash, or a one-time sign-in link")
    ui.add_argument("what", choices=["password", "link"],
                    help="password: print an argon2 hash for TALON_UI_PASSWORD_HASH; link: print a sign-in "
                         "link good for 10 minutes, once")
    ui.set_defaults(func=cmd_ui)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:  # TALON_ENV_FILE names no file
        return _fail(str(exc), exc.missing)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        # Settings that pydantic refused (only a command that loaded the settings imported it).
        core = sys.modules.get("pydantic_core")
        if core is None or not isinstance(exc, core.ValidationError):
            raise
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}={e.get('input')!r}: {e['msg']}"
                             for e in exc.errors())
        return _fail(f"invalid settings: {problems}")


if __name__ == "__main__":
    sys.exit(main())
