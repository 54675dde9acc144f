"""The panel's walls, as plain functions: passwords, tokens, which hosts it answers to, when it may
run at all, and which settings are secrets.

- Passwords are argon2id hashes (``argon2-cffi``); verifying one costs ~50 ms of CPU, so callers
  run it in a thread.
- Session cookies and one-time links are random tokens; the store keeps only their sha256, so a
  copy of the database signs nobody in.
- The ``Host`` header must name this Talon (loopback, ``TALON_HTTP_HOST``, the host of
  ``TALON_PUBLIC_BASE_URL``, ``TALON_UI_HOSTS``): a page on another site whose name was rebound to
  127.0.0.1 (DNS rebinding) reaches nothing.
"""

from __future__ import annotations

import hashlib
import ipaddress
import secrets
from urllib.parse import urlsplit

from talon.config import Settings
from talon.errors import ConfigError

PASSWORD_COMMAND = "talon ui password"
LINK_TTL_S = 600.0  # a sign-in link from `talon ui link` is good for 10 minutes, once

# Settings whose values are never shown (the panel says "set" / "not set"), whatever their name.
SECRET_FIELDS = frozenset({
    "telegram_bot_token", "openai_api_key", "anthropic_api_key", "twilio_auth_token",
    "telegram_webhook_secret", "ui_password_hash", "database_url",
})
_SECRET_WORDS = ("token", "secret", "password", "api_key", "auth", "hash")


def is_secret_field(name: str) -> bool:
    return name in SECRET_FIELDS or any(word in name for word in _SECRET_WORDS)


def secret_values(settings: Settings) -> list[str]:
    """Every secret's value (and the password in a database URL), for scrubbing what is served."""
    values = []
    for name in type(settings).model_fields:
        if is_secret_field(name):
            value = getattr(settings, name)
            if isinstance(value, str) and value.strip():
                values.append(value.strip())
    if settings.database_url:
        password = urlsplit(settings.database_url).password
        if password:
            values.append(password)
    return sorted({v for v in values if len(v) >= 6}, key=len, reverse=True)


def scrub(text: str, secrets_: list[str]) -> str:
    for secret in secrets_:
        if secret in text:
            text = text.replace(secret, "[secret]")
    return text


def hash_password(password: str) -> str:
    from argon2 import PasswordHasher

    return PasswordHasher().hash(password)


def verify_password(hashed: str, password: str) -> bool:
    """Blocking (argon2 is made to be slow): run it in a thread."""
    from argon2 import PasswordHasher
    from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

    try:
        return PasswordHasher().verify(hashed, password)
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


def new_token() -> str:
    return secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def is_loopback(host: str) -> bool:
    host = host.strip().strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ui_enabled(settings: Settings, http_runs: bool) -> bool:
    """Whether the panel is served. ``TALON_UI`` unset: when the HTTP server runs anyway and either
    a password is set or the server listens on loopback only (sign-in is then by a link)."""
    if settings.ui is not None:
        return settings.ui
    return http_runs and (bool(settings.ui_password_hash) or is_loopback(settings.http_host))


def check_ui_settings(settings: Settings) -> None:
    """Refuse a panel reachable beyond loopback without a password (``talon run`` and doctor)."""
    if settings.ui and not settings.ui_password_hash.strip() and not is_loopback(settings.http_host):
        raise ConfigError(
            f"TALON_UI=true with TALON_HTTP_HOST={settings.http_host} (not a loopback address) and no "
            f"TALON_UI_PASSWORD_HASH: the panel would be reachable from the network without a password. Run "
            f"`{PASSWORD_COMMAND}` and set TALON_UI_PASSWORD_HASH to the hash it prints, or listen on 127.0.0.1",
            ["TALON_UI_PASSWORD_HASH"])
    if settings.ui_password_hash.strip() and not settings.ui_password_hash.startswith("$argon2"):
        raise ConfigError(f"TALON_UI_PASSWORD_HASH is not an argon2 hash; make one with `{PASSWORD_COMMAND}`",
                          ["TALON_UI_PASSWORD_HASH"])


def panel_row(settings: Settings) -> tuple[str, str]:
    """``talon doctor``'s line about the web panel (whether it is served, how one signs in)."""
    from talon.runtime import shared_http_server

    runs = settings.ui is True or shared_http_server(settings) is not None
    if not ui_enabled(settings, http_runs=runs):
        why = "TALON_UI=false" if settings.ui is False else (
            "no password and the HTTP server is not on loopback only" if runs else "the HTTP server does not run")
        return "web panel", f"off ({why})"
    how = "password (TALON_UI_PASSWORD_HASH)" if settings.ui_password_hash else "`talon ui link` (no password set)"
    return "web panel", f"/ui/ on {settings.http_host}:{settings.http_port}; sign-in by {how}"


def allowed_hosts(settings: Settings) -> frozenset[str]:
    """Host names (without port, lower case) the panel answers to."""
    hosts = {"127.0.0.1", "localhost", "::1"}
    bind = settings.http_host.strip().strip("[]").lower()
    if bind and bind not in ("0.0.0.0", "::"):
        hosts.add(bind)
    if settings.public_base_url:
        name = urlsplit(settings.public_base_url).hostname
        if name:
            hosts.add(name.lower())
    hosts.update(h.strip().lower().strip("[]") for h in settings.ui_hosts.split(",") if h.strip())
    return frozenset(hosts)


def host_name(host_header: str) -> str:
    """``example.org:8080`` -> ``example.org``; ``[::1]:80`` -> ``::1``; "" when unparsable."""
    value = host_header.strip().lower()
    if not value:
        return ""
    try:
        return (urlsplit(f"//{value}").hostname or "").strip("[]")
    except ValueError:
        return ""


def panel_link(settings: Settings, token: str, port: int | None = None) -> str:
    base = settings.public_base_url.rstrip("/")
    if not base:
        host = settings.http_host if settings.http_host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        base = f"http://{host}:{port or settings.http_port}"
    return f"{base}/ui/signin/link?token={token}"
