"""``talon doctor``'s live checks of what the settings name: the platforms' own cheap calls that
prove a credential (Telegram ``getMe``, Twilio's account fetch), where the model server is, and
where the settings came from. Each returns (row name, value) pairs; a value starting with one of
``cli._PROBLEMS`` (MISSING, INVALID, UNREACHABLE, FAILED) makes doctor exit 1. No secret is ever
part of a row: a token shows only as whether it works.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit, urlunsplit

from talon.config import Settings
from talon.errors import ConfigError
from talon.settings_source import find_env_file
from talon.tls import httpx_tls

# The servers the SDKs talk to when no base URL is set.
OPENAI_DEFAULT_URL = "https://api.openai.com/v1"
ANTHROPIC_DEFAULT_URL = "https://api.anthropic.com"
CHECK_TIMEOUT_S = 10.0


def settings_row() -> tuple[str, str]:
    try:
        return "settings", find_env_file().describe()
    except ConfigError as exc:
        return "settings", f"INVALID: {exc}"


def without_credentials(url: str) -> str:
    """``url`` with any ``user:password@`` removed: a URL may carry a key, a row never does."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def model_url_row(settings: Settings) -> list[tuple[str, str]]:
    """The server TALON_MODEL is asked on (never a key), and which setting says so."""
    if settings.provider_name == "openai":
        url, name, default = settings.openai_base_url.strip(), "OPENAI_BASE_URL", OPENAI_DEFAULT_URL
    elif settings.provider_name == "anthropic":
        url, name, default = settings.anthropic_base_url.strip(), "ANTHROPIC_BASE_URL", ANTHROPIC_DEFAULT_URL
    else:
        return []
    shown = f"{without_credentials(url)} ({name})" if url else f"{default} ({name} unset: the provider's own)"
    return [("model server url", shown)]


async def telegram_bot_row(settings: Settings) -> tuple[str, str]:
    """``getMe`` with the configured token, on the configured Bot API server."""
    from telegram import Bot
    from telegram.error import InvalidToken, NetworkError, TelegramError
    from telegram.request import HTTPXRequest

    base = settings.telegram_api_base_url.rstrip("/")
    bot = Bot(settings.telegram_bot_token.strip(), base_url=f"{base}/bot", base_file_url=f"{base}/file/bot",
              request=HTTPXRequest(connect_timeout=CHECK_TIMEOUT_S, read_timeout=CHECK_TIMEOUT_S,
                                   httpx_kwargs={"verify": httpx_tls()}))
    try:
        me = await asyncio.wait_for(bot.get_me(), CHECK_TIMEOUT_S * 2)
    except InvalidToken as exc:
        return ("telegram bot", f"FAILED: Telegram refused TELEGRAM_BOT_TOKEN ({exc.message}) at {base}: copy the "
                                "token again from @BotFather (/mybots, your bot, API Token)")
    except (NetworkError, TimeoutError) as exc:
        detail = exc.message if isinstance(exc, TelegramError) else f"no answer in {CHECK_TIMEOUT_S * 2:g} s"
        return ("telegram bot", f"UNREACHABLE: cannot reach the Bot API at {base} ({detail}): check the "
                                "network, or TELEGRAM_API_BASE_URL")
    except TelegramError as exc:
        return "telegram bot", f"FAILED: getMe at {base} answered {type(exc).__name__}: {exc.message}"
    finally:
        await bot.shutdown()
    return "telegram bot", f"ok: @{me.username} (id {me.id}), getMe answered"


def twilio_account_row(settings: Settings) -> tuple[str, str] | None:
    """Twilio's account fetch with TWILIO_ACCOUNT_SID and TWILIO_AUTH_TOKEN; None without a token
    (another row already says it is missing)."""
    if not settings.twilio_auth_token.strip():
        return None
    from twilio.base.exceptions import TwilioRestException
    from twilio.http.http_client import TwilioHttpClient
    from twilio.rest import Client

    sid = settings.twilio_account_sid.strip()
    base = settings.twilio_api_base_url.strip().rstrip("/")
    # A non-empty environment keeps the client from reading credentials from os.environ.
    client = Client(sid, settings.twilio_auth_token.strip(), http_client=TwilioHttpClient(timeout=CHECK_TIMEOUT_S),
                    environment={"TALON": "1"})
    client.api.base_url = base
    try:
        account = client.api.v2010.accounts(sid).fetch()
    except TwilioRestException as exc:
        if exc.status in (401, 403, 404):
            return ("twilio account", f"FAILED: Twilio refused TWILIO_ACCOUNT_SID / TWILIO_AUTH_TOKEN "
                                      f"({exc.status}, error {exc.code}): copy both from the Twilio console")
        return "twilio account", f"FAILED: Twilio answered {exc.status} (error {exc.code}): {exc.msg}"
    except Exception as exc:  # requests' connection errors, timeouts
        return ("twilio account", f"UNREACHABLE: cannot reach Twilio at {base} ({type(exc).__name__}): "
                                  "check the network, or TWILIO_API_BASE_URL")
    status = account.status or "unknown"
    if status != "active":
        return "twilio account", f"FAILED: the account {sid} is {status}, not active: see the Twilio console"
    return "twilio account", f"ok: {account.friendly_name or sid} ({status})"


async def matrix_account_row(settings: Settings) -> tuple[str, str]:
    """``whoami`` with the configured token on ``MATRIX_HOMESERVER`` (with only a password: the
    homeserver's ``/versions``, since logging in would make a device)."""
    import httpx

    base = settings.matrix_homeserver.strip().rstrip("/")
    try:
        timeout = min(CHECK_TIMEOUT_S, settings.matrix_timeout_s)
        async with httpx.AsyncClient(verify=httpx_tls(), timeout=timeout, follow_redirects=False) as http:
            if not settings.matrix_access_token:
                resp = await http.get(f"{base}/_matrix/client/versions")
                if resp.status_code != 200:
                    return "matrix account", f"FAILED: {base} answered HTTP {resp.status_code} to /versions"
                return "matrix account", f"reachable: {base} (MATRIX_PASSWORD is checked at the first start)"
            resp = await http.get(f"{base}/_matrix/client/v3/account/whoami",
                                  headers={"Authorization": f"Bearer {settings.matrix_access_token}"})
    except httpx.HTTPError as exc:
        return "matrix account", (f"UNREACHABLE: cannot reach the homeserver at {base} ({type(exc).__name__}): "
                                  "check MATRIX_HOMESERVER")
    if resp.status_code in (401, 403):
        return "matrix account", f"FAILED: {base} refused MATRIX_ACCESS_TOKEN (HTTP {resp.status_code})"
    if resp.status_code != 200:
        return "matrix account", f"FAILED: whoami at {base} answered HTTP {resp.status_code}"
    user = resp.json().get("user_id", "?")
    if user != settings.matrix_user_id.strip():
        return "matrix account", f"FAILED: the token belongs to {user}, not MATRIX_USER_ID {settings.matrix_user_id}"
    return "matrix account", f"ok: {user} on {base}, whoami answered"


async def slack_bot_row(settings: Settings) -> tuple[str, str]:
    """``auth.test`` with SLACK_BOT_TOKEN on SLACK_API_BASE_URL (slack-sdk, as the channel calls it)."""
    from slack_sdk.errors import SlackApiError
    from slack_sdk.web.async_client import AsyncWebClient

    from channels.slack.api import api_base

    base = api_base(settings.slack_api_base_url)
    client = AsyncWebClient(token=settings.slack_bot_token.strip(), base_url=base,
                            timeout=int(min(CHECK_TIMEOUT_S, settings.slack_timeout_s)))
    try:
        answer = await client.auth_test()
    except SlackApiError as exc:
        data = exc.response.data if isinstance(exc.response.data, dict) else {}
        return "slack bot", f"FAILED: {base} refused SLACK_BOT_TOKEN ({data.get('error') or exc.response.status_code})"
    except Exception as exc:  # unreachable, timed out
        return "slack bot", f"UNREACHABLE: cannot reach Slack at {base} ({type(exc).__name__}): check SLACK_API_BASE_URL"
    return "slack bot", f"ok: {answer.get('user')} ({answer.get('user_id')}) in {answer.get('team')}, auth.test answered"


async def discord_bot_row(settings: Settings) -> tuple[str, str]:
    """``GET /users/@me`` with DISCORD_BOT_TOKEN on DISCORD_API_BASE_URL (the token's own check)."""
    import httpx

    from channels.discord.api import api_base

    base = api_base(settings.discord_api_base_url)
    try:
        async with httpx.AsyncClient(verify=httpx_tls(), timeout=CHECK_TIMEOUT_S, follow_redirects=False) as http:
            resp = await http.get(f"{base}/users/@me", headers={"Authorization": f"Bot {settings.discord_bot_token.strip()}"})
    except httpx.HTTPError as exc:
        return "discord bot", f"UNREACHABLE: cannot reach Discord at {base} ({type(exc).__name__}): check DISCORD_API_BASE_URL"
    if resp.status_code == 401:
        return "discord bot", f"FAILED: {base} refused DISCORD_BOT_TOKEN (HTTP 401)"
    if resp.status_code != 200:
        return "discord bot", f"FAILED: {base}/users/@me answered HTTP {resp.status_code}"
    me = resp.json()
    return "discord bot", f"ok: {me.get('username')} ({me.get('id')}), /users/@me answered"


def whatsapp_templates_row(settings: Settings) -> tuple[str, str]:
    """Which Content templates are set for WhatsApp's 24-hour window (channels/whatsapp/templates.py)."""
    from channels.whatsapp.templates import SETTINGS, parse_template

    named: list[str] = []
    for purpose in SETTINGS:
        try:
            template = parse_template(purpose, getattr(settings, f"whatsapp_template_{purpose}"))
        except ConfigError as exc:
            return "whatsapp templates", f"FAILED: {exc}"
        if template is not None:
            named.append(f"{purpose} {template.sid}")
    if not any(n.startswith("reopen ") for n in named):
        return ("whatsapp templates", "WARNING: no TALON_WHATSAPP_TEMPLATE_REOPEN: messages due outside WhatsApp's "
                "24-hour window wait for the person to write, who is not told (docs/channels.md)"
                + (f"; set: {', '.join(named)}" if named else ""))
    return "whatsapp templates", "ok: " + ", ".join(named)
