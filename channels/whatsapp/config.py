"""What the WhatsApp channel needs from the settings, checked before anything starts (fail closed)."""

from __future__ import annotations

from urllib.parse import urlsplit

from talon.config import Settings, normalize_whatsapp_number
from talon.errors import ConfigError

from channels.whatsapp.templates import Templates


def check_whatsapp_settings(settings: Settings) -> None:
    """Raise ConfigError naming what the WhatsApp channel is missing (fail closed)."""
    missing = [name for name, value in (("TWILIO_ACCOUNT_SID", settings.twilio_account_sid),
                                        ("TWILIO_WHATSAPP_FROM", settings.twilio_whatsapp_from))
               if not value.strip()]
    if missing:
        raise ConfigError(f"the WhatsApp channel needs {' and '.join(missing)}", missing)
    if not normalize_whatsapp_number(settings.twilio_whatsapp_from):
        raise ConfigError(f"TWILIO_WHATSAPP_FROM={settings.twilio_whatsapp_from!r} is not a phone "
                          "number (e.g. whatsapp:+14155238886)", ["TWILIO_WHATSAPP_FROM"])
    if not settings.whatsapp_insecure_no_signature:
        unsigned = [name for name, value in (("TWILIO_AUTH_TOKEN", settings.twilio_auth_token),
                                             ("TALON_PUBLIC_BASE_URL", settings.public_base_url))
                    if not value.strip()]
        if unsigned:
            raise ConfigError(
                f"the WhatsApp channel needs {' and '.join(unsigned)} to check that webhooks really "
                "come from Twilio (X-Twilio-Signature); TALON_PUBLIC_BASE_URL is the public https URL "
                "Twilio calls. (TALON_WHATSAPP_INSECURE_NO_SIGNATURE=true turns the check off, for "
                "local experiments only.)", unsigned)
    if settings.public_base_url.strip():
        parts = urlsplit(settings.public_base_url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise ConfigError(f"TALON_PUBLIC_BASE_URL={settings.public_base_url!r} must be an http(s) "
                              "URL with a host and no query, e.g. https://talon.example.com",
                              ["TALON_PUBLIC_BASE_URL"])
    api = urlsplit(settings.twilio_api_base_url.strip())
    if api.scheme not in ("http", "https") or not api.hostname:
        raise ConfigError(f"TWILIO_API_BASE_URL={settings.twilio_api_base_url!r} is not an http(s) URL",
                          ["TWILIO_API_BASE_URL"])
    if not settings.whatsapp_webhook_path.startswith("/"):
        raise ConfigError("TALON_WHATSAPP_WEBHOOK_PATH must start with '/'", ["TALON_WHATSAPP_WEBHOOK_PATH"])
    Templates.from_settings(settings)  # each template setting well formed


def whatsapp_address(number: str) -> str:
    """``+1415...`` or ``whatsapp:+1 415...`` -> ``whatsapp:+1415...`` (Twilio's To/From form)."""
    return "whatsapp:" + normalize_whatsapp_number(number)
