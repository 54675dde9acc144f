"""The checks of the settings that ``talon run`` makes before it starts anything, in one place.

``talon run`` refuses to start when any of them fails, and ``talon doctor`` runs the very same
list and reports each failure as INVALID (exit 1): a setting doctor passes is one run accepts.
Each check is the function the running Talon itself uses to read the setting (the control
section is ``Control.from_settings``, which refuses a money cap for a model with no price; the
scheduler's zone is read as the scheduler reads it), so the two cannot drift apart. Nothing here
touches the network, a database or a file beyond reading the MCP config.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from talon.config import Settings
from talon.errors import ConfigError, ScheduleError

__all__ = ["NO_CHANNEL", "Problem", "start_problems"]

NO_CHANNEL = ConfigError("no channel configured: set TELEGRAM_BOT_TOKEN (Telegram), TWILIO_ACCOUNT_SID and "
                         "TWILIO_WHATSAPP_FROM (WhatsApp), SLACK_BOT_TOKEN (Slack), DISCORD_BOT_TOKEN (Discord) "
                         "or MATRIX_HOMESERVER and MATRIX_USER_ID (Matrix)",
                         ["TELEGRAM_BOT_TOKEN, or TWILIO_ACCOUNT_SID and TWILIO_WHATSAPP_FROM, or SLACK_BOT_TOKEN, "
                          "or DISCORD_BOT_TOKEN, or MATRIX_HOMESERVER and MATRIX_USER_ID"])


@dataclass(frozen=True)
class Problem:
    area: str  # what doctor's row is called: "model", "control settings"...
    error: ConfigError


def _channels(settings: Settings) -> None:
    if not (settings.telegram_configured() or settings.whatsapp_configured() or settings.slack_configured()
            or settings.matrix_configured() or settings.discord_configured()):
        raise NO_CHANNEL


def _telegram(settings: Settings) -> None:
    if settings.telegram_configured():
        settings.telegram_allowed_chat_ids  # noqa: B018 - reading it is the check (ConfigError)
        settings.check_telegram_webhook()


def _whatsapp(settings: Settings) -> None:
    if settings.whatsapp_configured():
        from channels.whatsapp import check_whatsapp_settings

        check_whatsapp_settings(settings)


def _slack(settings: Settings) -> None:
    if settings.slack_configured() and not (settings.slack_socket_mode or settings.slack_signing_secret.strip()):
        raise ConfigError("set SLACK_SIGNING_SECRET (Events API over HTTP) or SLACK_APP_TOKEN (Socket Mode) "
                          "for the Slack channel", ["SLACK_SIGNING_SECRET", "SLACK_APP_TOKEN"])


def _matrix(settings: Settings) -> None:
    if settings.matrix_configured():
        settings.matrix_allowed_room_ids  # noqa: B018 - reading it is the check (ConfigError)
        if not settings.matrix_access_token and not settings.matrix_password:
            raise ConfigError("set MATRIX_ACCESS_TOKEN (or MATRIX_PASSWORD) for the Matrix account",
                              ["MATRIX_ACCESS_TOKEN", "MATRIX_PASSWORD"])


def _discord(settings: Settings) -> None:
    if settings.discord_configured():
        settings.discord_allowed_channel_ids  # noqa: B018 - reading it is the check (ConfigError)


def _control(settings: Settings) -> None:
    from talon.control import Control

    Control.from_settings(settings)  # what build_runtime calls: caps, prices, approvals


def _time_zone(settings: Settings) -> None:
    from talon.scheduler import when

    try:
        when.zone_named(settings.timezone)  # what the scheduler reads it with (build_scheduler)
    except ScheduleError as exc:
        raise ConfigError(f"TALON_TIMEZONE: {exc}", ["TALON_TIMEZONE"]) from None


def _directories(settings: Settings) -> None:
    from talon.workspaces import check_dirs_apart

    check_dirs_apart(settings.media_root, settings.data_dir)


def _panel(settings: Settings) -> None:
    from talon.ui.security import check_ui_settings

    check_ui_settings(settings)


def _mcp(settings: Settings) -> None:
    settings.mcp_servers()


_CHECKS: tuple[tuple[str, Callable[[Settings], None]], ...] = (
    ("model", lambda s: s.check_model()),
    ("channels", _channels),
    ("telegram", _telegram),
    ("whatsapp", _whatsapp),
    ("slack", _slack),
    ("matrix", _matrix),
    ("discord", _discord),
    ("control settings", _control),
    ("time zone", _time_zone),
    ("directories", _directories),
    ("mcp config", _mcp),
    ("web panel", _panel),
)


def start_problems(settings: Settings) -> list[Problem]:
    """Every reason ``talon run`` would refuse these settings, in the order it meets them."""
    problems = []
    for area, check in _CHECKS:
        try:
            check(settings)
        except ConfigError as exc:
            problems.append(Problem(area, exc))
    return problems
