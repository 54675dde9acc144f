"""Approved Twilio Content templates, by purpose, for when WhatsApp's 24-hour window is closed.

Each setting holds a Content SID (``HX`` and 32 hex digits, from Twilio's Content Template
Builder), optionally followed by a space and a JSON object of the template's fixed variables::

    TALON_WHATSAPP_TEMPLATE_REOPEN=HX0123...  {"1": "Talon"}
    TALON_WHATSAPP_TEMPLATE_REMINDER=HX4567...
    TALON_WHATSAPP_TEMPLATE_APPROVAL=HX89ab...

- reopen: "you have a new message from <bot>, reply to see it"; sent as configured.
- reminder: a scheduled task's text goes into variable ``"1"`` (or into the variable whose
  configured value is ``"{text}"``), when it fits one WhatsApp template variable (see ``fit_variable``);
  otherwise the reopen template goes instead.
- approval: a quick-reply template whose button ids are ``{{2}}`` and ``{{3}}``: Talon sends
  ``{"1": <what the agent wants to do>, "2": "approve:<token>", "3": "deny:<token>"}``.

``ContentVariables`` is at most ``MAX_VARIABLES`` pairs and every value at most ``VARIABLE_MAX``
characters, with no line breaks or tabs (WhatsApp refuses a template parameter with them).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from talon.config import Settings
from talon.errors import ConfigError

CONTENT_SID = re.compile(r"HX[0-9a-fA-F]{32}")
MAX_VARIABLES = 100  # Twilio: "up to 100 key-value pairs per request"
VARIABLE_MAX = 1024  # WhatsApp: a template's body, variables included, is at most 1,024 characters
TEXT_MARK = "{text}"

SETTINGS = {"reopen": "TALON_WHATSAPP_TEMPLATE_REOPEN", "reminder": "TALON_WHATSAPP_TEMPLATE_REMINDER",
            "approval": "TALON_WHATSAPP_TEMPLATE_APPROVAL"}


@dataclass(frozen=True)
class Template:
    purpose: str
    sid: str
    variables: dict[str, str] = field(default_factory=dict)

    def content(self, **filled: str) -> tuple[str, str]:
        """(ContentSid, ContentVariables JSON) with ``filled`` variables set over the fixed ones."""
        values = {**self.variables, **filled}
        return self.sid, json.dumps(values, ensure_ascii=False) if values else ""


def parse_template(purpose: str, value: str) -> Template | None:
    """The template a setting names, None for an empty setting; ConfigError says what is wrong."""
    name = SETTINGS[purpose]
    value = value.strip()
    if not value:
        return None
    sid, _, rest = value.partition(" ")
    sid, rest = sid.strip(), rest.strip()
    if not CONTENT_SID.fullmatch(sid):
        raise ConfigError(f"{name}: {sid[:40]!r} is not a Twilio Content SID (HX and 32 hex digits, from the "
                          "Content Template Builder)", [name])
    variables: dict[str, str] = {}
    if rest:
        try:
            loaded = json.loads(rest)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{name}: the variables after the SID are not JSON ({exc.msg}); write them like "
                              '{"1": "Talon"}', [name]) from None
        if not isinstance(loaded, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in loaded.items()):
            raise ConfigError(f"{name}: the variables must be a JSON object of strings, like "
                              '{"1": "Talon"}', [name])
        if len(loaded) > MAX_VARIABLES or any(len(v) > VARIABLE_MAX or "\n" in v or "\t" in v
                                              for v in loaded.values()):
            raise ConfigError(f"{name}: at most {MAX_VARIABLES} variables, each at most {VARIABLE_MAX} "
                              "characters on one line", [name])
        variables = loaded
    return Template(purpose, sid, variables)


def fit_variable(text: str, limit: int = VARIABLE_MAX) -> str | None:
    """``text`` as one template variable (line breaks and tabs become " / " and spaces, runs of
    spaces one), or None when it is empty or longer than ``limit``."""
    flat = re.sub(r"[ \t]+", " ", re.sub(r"\s*[\r\n]+\s*", " / ", text.strip())).strip(" /")
    return flat if flat and len(flat) <= limit else None


@dataclass(frozen=True)
class Templates:
    reopen: Template | None
    reminder: Template | None
    approval: Template | None

    @classmethod
    def from_settings(cls, settings: Settings) -> "Templates":
        return cls(parse_template("reopen", settings.whatsapp_template_reopen),
                   parse_template("reminder", settings.whatsapp_template_reminder),
                   parse_template("approval", settings.whatsapp_template_approval))

    def for_closed_window(self, reminder_text: str | None) -> tuple[Template, dict[str, str]] | None:
        """The template to send when a message must wait for the window, with its filled
        variables: the reminder (with the task's text) for a scheduled task when it fits, else the
        reopen template; None when neither is configured."""
        if reminder_text is not None and self.reminder is not None:
            text = fit_variable(reminder_text, VARIABLE_MAX - 100)
            if text is not None:
                key = next((k for k, v in self.reminder.variables.items() if v == TEXT_MARK), "1")
                return self.reminder, {key: text}
        if self.reopen is not None:
            return self.reopen, {}
        return None

    def missing_notice(self) -> str | None:
        if self.reopen is None:
            return ("no TALON_WHATSAPP_TEMPLATE_REOPEN is set: a message due outside WhatsApp's 24-hour window "
                    "waits until the person writes, and they are not told that it waits")
        return None
