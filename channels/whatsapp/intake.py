"""Twilio's incoming-message webhook form, read into an ``InboundMessage`` (pure), and the press of
an approval button (``ButtonPayload``) told apart from a message."""

from __future__ import annotations

import mimetypes
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from talon.config import normalize_whatsapp_number
from talon.content import InboundKind
from talon.envelope import InboundMessage, RemoteFile
from talon.errors import MalformedWebhook

MAX_NUM_MEDIA = 10  # Twilio's own maximum per inbound message
def inbound_kind(content_type: str) -> InboundKind:
    mime = content_type.split(";", 1)[0].strip().lower()
    if mime.startswith("image/"):
        return "photo"
    if mime in ("audio/ogg", "audio/opus"):
        return "voice"  # WhatsApp voice notes are OGG/Opus
    if mime.startswith("audio/"):
        return "audio"
    if mime.startswith("video/"):
        return "video"
    return "document"


_EXTENSIONS = {"image/jpeg": ".jpg", "audio/ogg": ".ogg", "audio/opus": ".ogg", "audio/mpeg": ".mp3",
               "audio/amr": ".amr", "audio/mp4": ".m4a", "video/mp4": ".mp4", "text/vcard": ".vcf",
               "text/plain": ".txt"}


def media_name(kind: str, message_sid: str, index: int, count: int, mime: str) -> str:
    """WhatsApp media arrive without a file name; make one that says what and where from."""
    base = mime.split(";", 1)[0].strip().lower()
    ext = _EXTENSIONS.get(base) or (mimetypes.guess_extension(base) if base else None) or ".bin"
    suffix = f"_{index + 1}" if count > 1 else ""
    return f"{kind}_{message_sid[-10:]}{suffix}{ext}"


_MESSAGE_SID = re.compile(r"(?:SM|MM)[0-9a-f]{32}")
_SID_FIELDS = ("MessageSid", "SmsMessageSid", "SmsSid")


def checked_message_sid(form: Mapping[str, str]) -> str:
    """The message's id, only if every id field is in Twilio's format and they all agree.

    Twilio's signature joins parameter names and values with no separator, so a captured request
    can be re-sent with a ``MessageSid`` that has swallowed the next parameter's name and value
    and still verify. A strict format (``SM``/``MM`` and 32 hex digits) and agreement between the
    three copies Twilio sends make such a shifted id fail instead of becoming a "new" message.
    """
    present = {name: form.get(name) for name in _SID_FIELDS if form.get(name) is not None}
    if not present:
        raise MalformedWebhook("no MessageSid")
    for name, value in present.items():
        if not _MESSAGE_SID.fullmatch(value or ""):
            raise MalformedWebhook(f"{name}={(value or '')[:48]!r} is not a Twilio message id "
                                   "(SM or MM and 32 hex digits)")
    if len(set(present.values())) > 1:
        raise MalformedWebhook("MessageSid, SmsMessageSid and SmsSid disagree")
    return next(iter(present.values())) or ""


def parse_inbound(form: Mapping[str, str]) -> InboundMessage:
    """The InboundMessage of a Twilio incoming-message webhook; MalformedWebhook says what is wrong."""
    sender = (form.get("From") or "").strip()
    if not sender:
        raise MalformedWebhook("no From")
    sid = checked_message_sid(form)
    number = normalize_whatsapp_number(sender)
    if not number:
        raise MalformedWebhook(f"From={sender!r} is not a phone number")
    raw_count = (form.get("NumMedia") or "0").strip()
    if not raw_count.isdigit() or int(raw_count) > MAX_NUM_MEDIA:
        raise MalformedWebhook(f"NumMedia={raw_count!r} is not a number from 0 to {MAX_NUM_MEDIA}")
    count = int(raw_count)
    files: list[RemoteFile] = []
    for i in range(count):
        url = (form.get(f"MediaUrl{i}") or "").strip()
        if not url:
            raise MalformedWebhook(f"NumMedia={count} but MediaUrl{i} is missing")
        if urlsplit(url).scheme not in ("http", "https"):
            raise MalformedWebhook(f"MediaUrl{i} is not an http(s) URL")
        mime = (form.get(f"MediaContentType{i}") or "").split(";", 1)[0].strip().lower()
        kind = inbound_kind(mime)
        files.append(RemoteFile(kind=kind, source=url, mime=mime or None,
                                name=media_name(kind, sid, i, count, mime)))
    text = form.get("Body") or ""
    lat, lon = form.get("Latitude"), form.get("Longitude")
    if lat and lon:
        place = ", ".join(p for p in (form.get("Label"), form.get("Address")) if p)
        location = f"[Shared a location: {lat}, {lon}{f' ({place})' if place else ''}]"
        text = f"{text}\n{location}" if text else location
    return InboundMessage(
        channel="whatsapp",
        chat_id=number,
        sender_id=number,
        sender_name=form.get("ProfileName") or None,
        message_id=sid,
        text=text,
        files=files,
    )


BUTTON_CHOICES = ("approve", "deny")
_TOKEN = re.compile(r"[A-Za-z0-9_-]{16,64}")


@dataclass(frozen=True)
class ButtonPress:
    choice: str  # "approve" or "deny"
    token: str


def button_press(form: Mapping[str, str]) -> ButtonPress | None:
    """The approval button pressed (``ButtonPayload`` "approve:<token>" or "deny:<token>"), or None
    when the message is not such a press. A payload that looks like one but is malformed raises
    MalformedWebhook (it is refused, never taken as a typed message)."""
    payload = (form.get("ButtonPayload") or "").strip()
    if not payload:
        return None
    choice, sep, token = payload.partition(":")
    if not sep or choice not in BUTTON_CHOICES:
        return None  # another template's button: an ordinary message
    if not _TOKEN.fullmatch(token):
        raise MalformedWebhook(f"ButtonPayload={payload[:48]!r} is not an approval button of Talon's")
    return ButtonPress(choice, token)
