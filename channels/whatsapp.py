"""WhatsApp channel through Twilio: signed webhooks in, the Messages REST API out.

Inbound: Twilio POSTs each WhatsApp message to ``TALON_WHATSAPP_WEBHOOK_PATH`` on Talon's own HTTP
server. The request must carry a valid ``X-Twilio-Signature`` (HMAC of ``TALON_PUBLIC_BASE_URL`` +
path + query and the form fields, keyed with ``TWILIO_AUTH_TOKEN``) and our ``AccountSid``;
otherwise it is refused with 403 and never reaches the agent. Without the auth token and public URL
the channel refuses to start, unless ``TALON_WHATSAPP_INSECURE_NO_SIGNATURE=true`` (local
experiments only; logged as a warning at start). A malformed webhook gets 400. A valid one is
answered at once with empty TwiML and the turn runs in the background: Twilio gives up after 15 s.
The durable inbox dedups by MessageSid, so a Twilio retry is answered once, also across restarts.
Senders not in ``TALON_WHATSAPP_ALLOWED_NUMBERS`` (nor approved with ``talon pair``) are ignored
(deny by default); with ``TALON_PAIRING=true`` they get one message with a pairing code instead.

Media are named by URL in the webhook and downloaded during the turn (after the message is safe in
the inbox): HTTP basic auth, streamed into the attachment store under the download cap, only from
the allowed media hosts. Redirects are followed by hand, each hop's host checked again, and the
credentials go only to the URL Twilio named on its API host (never to the CDN it redirects to).

Outbound: a reply is an ordered list of parts, derived from the reply alone so that ``skip_parts``
means the same thing after a restart; progress is reported after every part.

- Parts: the text rendered to WhatsApp formatting and cut into bodies of at most 1600 characters
  (code blocks never broken open); then one part per media reference (WhatsApp carries one media
  item per message); then the reply's notices.
- Caption: with exactly one media reference named like an image or video and text that fits one
  caption (1024 characters), the text rides as that message's body. If the file turns out to be a
  document or audio (which carry no caption) the text goes as its own message first, and if the
  file cannot be sent at all the text still goes.
- Files go out as ``MediaUrl`` links to Talon's HTTP server (see ``channels.media_links``), after the
  media-root checks; ``channels.whatsapp_media`` fits them to WhatsApp's types and sizes.
- A reference that cannot be sent becomes "Could not attach NAME: reason" in the chat, and a log
  line with the detail.
- Errors: 429, 5xx and network failures are retried with backoff (3 tries) and then stop the
  delivery, so the bridge can resume it later from that part. Refusals are not retried. Refusals
  that concern the chat itself (error 63016, outside WhatsApp's 24-hour window, and the like) are
  logged with an explanation and end the delivery of this reply with a permanent DeliveryError
  (the bridge then closes the message); other refusals skip the one part.
  Delivery failures Twilio reports later arrive on the status callback and are logged the same way.

Approval prompts (``ask_approval``) go as plain text, never reformatted, so what is shown is the
call exactly as ``talon.control.approvals`` wrote it: in parts of at most 1600 characters marked
"(part i of n)" up to ``TALON_WHATSAPP_REPLY_MAX_MESSAGES`` parts; longer, the first part and the
whole prompt as ``approval-<id>.txt`` (a media link). When neither can be sent (no public URL for
files, or Twilio refused a part) the channel raises ``ApprovalNotShown`` and the call is refused.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import mimetypes
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

import aiohttp
import httpx
from aiohttp import web
from twilio.base.exceptions import TwilioRestException
from twilio.http.async_http_client import AsyncTwilioHttpClient
from twilio.request_validator import RequestValidator
from twilio.rest import Client

from talon.storage.approvals import Approval
from talon.storage.attachments import AttachmentStore
from talon.storage.media_links import MediaLinkStore, MemoryMediaLinks
from talon.config import Limits, Settings, normalize_whatsapp_number
from talon.content import AttachmentRef, InboundFile, InboundKind
from talon.envelope import InboundMessage, OutboundReply, RemoteFile
from talon.errors import (
    ApprovalNotShown,
    ConfigError,
    DeliveryError,
    DownloadError,
    MalformedWebhook,
    MediaError,
    MediaPathError,
    StoreUnavailable,
    TwilioRefused,
)
from talon.media import MarkdownMediaRef, OutboundMedia, outbound_channel_media
from talon.media.failures import attach_failure_line, display_name, path_refusal_reason
from talon.render.long_reply import REPLY_DOCUMENT_MIME, REPLY_DOCUMENT_NAME, long_reply_note, reply_document
from talon.render.whatsapp import markdown_to_whatsapp, split_for_whatsapp

from channels.base import BridgeHandle, Channel, ChannelHealth, PartCallback, deliver_parts, store_response
from channels.http import HttpServer
from channels.media_links import MediaLinks
from channels.whatsapp_media import CAPTIONED_KINDS, WhatsAppMedia, fit_for_whatsapp, meant_as_voice

log = logging.getLogger(__name__)

SEND_TRIES = 3
DOWNLOAD_TRIES = 3
MAX_REDIRECTS = 5
SEND_TIMEOUT_S = 60.0
# At stop, how long to keep serving files Twilio has not fetched yet (it does so within seconds).
MEDIA_DRAIN_S = 10.0
CAPTION_MAX = 1024  # WhatsApp shows at most this much under a photo or video
MAX_NUM_MEDIA = 10  # Twilio's own maximum per inbound message
# Twilio's media URLs are on api.twilio.com and redirect to a short-lived URL on mms.twiliocdn.com
# (accounts with media authentication, now the rule) or s3-external-1.amazonaws.com (older ones).
TWILIO_API_HOST = "api.twilio.com"
DEFAULT_MEDIA_HOSTS = (TWILIO_API_HOST, "media.twiliocdn.com", "mms.twiliocdn.com",
                       "s3-external-1.amazonaws.com")
EMPTY_TWIML = '<?xml version="1.0" encoding="UTF-8"?>\n<Response/>'

# Twilio error codes that concern the chat or the account rather than one message: after one of
# these, the rest of the reply cannot be delivered either.
EXPLANATIONS: dict[int, str] = {
    63016: ("the message is outside WhatsApp's 24-hour customer service window: this person has "
            "not messaged the number in the last 24 hours, so WhatsApp only accepts pre-approved "
            "template messages. The reply was not delivered; the person has to message first (or "
            "send them an approved template through Twilio)"),
    63015: ("the Twilio WhatsApp Sandbox only delivers to numbers that joined it: the person must "
            "send the sandbox's 'join <code>' message first"),
    63007: ("Twilio has no WhatsApp sender for TWILIO_WHATSAPP_FROM; check the number and that it "
            "is enabled for WhatsApp"),
    21211: "the 'To' number is not a valid phone number",
    21606: "TWILIO_WHATSAPP_FROM is not a number this Twilio account can send from",
    21608: "a trial account can only send to verified numbers",
    21610: "the person has opted out of messages from this number (STOP)",
    20003: "Twilio refused our credentials: check TWILIO_ACCOUNT_SID and TWILIO_AUTH_TOKEN",
}
# Codes Twilio reports on the status callback when it could not fetch or use our media.
MEDIA_EXPLANATIONS: dict[int, str] = {
    11200: ("Twilio could not fetch a media URL from Talon: check that TALON_PUBLIC_BASE_URL reaches "
            "this server and that TALON_MEDIA_URL_TTL is long enough"),
    63019: "WhatsApp could not download or process the media file",
    63021: "WhatsApp found the message invalid (unsupported media type or content)",
}


# --- settings --------------------------------------------------------------------------------
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


def whatsapp_address(number: str) -> str:
    """``+1415...`` or ``whatsapp:+1 415...`` -> ``whatsapp:+1415...`` (Twilio's To/From form)."""
    return "whatsapp:" + normalize_whatsapp_number(number)


class MediaHosts:
    """Where inbound media may be downloaded from: exact host names or ``*.domain`` patterns.

    https only, except for the scheme and host of ``TWILIO_API_BASE_URL`` itself (a proxy, or the
    loopback fake in tests), which is always allowed. The account's credentials are only ever
    sent to Twilio's API host (or that of ``TWILIO_API_BASE_URL``), never to a CDN or storage host.
    """

    def __init__(self, configured: str, api_base_url: str) -> None:
        entries = [e.strip().lower() for e in configured.replace(";", ",").split(",") if e.strip()]
        self.entries = tuple(entries) if entries else DEFAULT_MEDIA_HOSTS
        api = urlsplit(api_base_url)
        self.api_scheme = api.scheme
        self.api_host = (api.hostname or "").lower()

    def allows(self, url: str) -> bool:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        if not host:
            return False
        if host == self.api_host and parts.scheme == self.api_scheme:
            return True
        if parts.scheme != "https":
            return False
        return any(host == e or (e.startswith("*.") and host.endswith(e[1:])) for e in self.entries)

    def takes_credentials(self, url: str) -> bool:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        return (host == self.api_host and parts.scheme == self.api_scheme) or \
            (host == TWILIO_API_HOST and parts.scheme == "https")


# --- inbound parsing (pure) ----------------------------------------------------------------
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


# --- outbound planning (pure) ----------------------------------------------------------------
@dataclass(frozen=True)
class TextPart:
    """One message body, already in WhatsApp formatting, at most 1600 characters."""

    body: str


@dataclass(frozen=True)
class NoticePart:
    text: str


@dataclass(frozen=True)
class MediaPart:
    """One file; ``caption`` is a WhatsApp-formatted body ("" for none)."""

    ref: MarkdownMediaRef
    caption: str = ""


@dataclass(frozen=True)
class ReplyDocumentPart:
    """The whole of a very long reply, sent as ``reply.md`` (``talon.render.long_reply``)."""

    text: str
    note: str


Part = TextPart | NoticePart | MediaPart | ReplyDocumentPart

_CAPTIONED_NAMES = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".mp4", ".3gp", ".mov", ".m4v"}


def plan_parts(reply: OutboundReply, limits: Limits, *, can_attach: bool = True) -> list[Part]:
    """The ordered parts of a reply; a function of the reply alone (see the module docstring).

    Past ``whatsapp_reply_max_messages`` messages the head goes as text and the whole reply as
    ``reply.md`` (only where files can be sent: without a public URL every message goes).
    """
    rendered = markdown_to_whatsapp(reply.text) if reply.text.strip() else ""
    chunks = [c for c in split_for_whatsapp(rendered, limits.whatsapp_body_max) if c.strip()]
    document: ReplyDocumentPart | None = None
    if can_attach and len(chunks) > limits.whatsapp_reply_max_messages:
        document = ReplyDocumentPart(reply.text, long_reply_note(len(reply.text), len(chunks)))
        chunks = chunks[:1]
    caption = ""
    if (len(reply.media) == 1 and len(chunks) == 1 and len(chunks[0]) <= CAPTION_MAX
            and PurePosixPath(unquote(reply.media[0].path)).suffix.lower() in _CAPTIONED_NAMES):
        caption, chunks = chunks[0], []
    parts: list[Part] = [TextPart(chunk) for chunk in chunks]
    if document is not None:
        parts += [NoticePart(document.note), document]
    parts.extend(MediaPart(ref, caption if i == 0 else "") for i, ref in enumerate(reply.media))
    for notice in reply.notices:
        parts.extend(NoticePart(c) for c in split_for_whatsapp(notice, limits.whatsapp_body_max) if c.strip())
    return parts


# --- errors (TwilioRefused is in talon.errors) ------------------------------------------------
def _detail(exc: TwilioRestException) -> str:
    msg = str(exc.msg or "")
    return msg.split(": ", 1)[1] if msg.startswith("Unable to ") and ": " in msg else msg


def _code(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class _TwilioHttp(AsyncTwilioHttpClient):
    """The twilio package's aiohttp transport, sending credentials as a plain Authorization header.

    (Its own use of aiohttp's ``auth=BasicAuth(...)`` is deprecated by aiohttp.) The twilio client
    never logs Authorization headers.
    """

    async def request(self, method: str, url: str, params: dict[str, object] | None = None,
                      data: dict[str, object] | None = None, headers: dict[str, str] | None = None,
                      auth: tuple[str, str] | None = None, timeout: float | None = None,
                      allow_redirects: bool = False) -> Any:
        if auth is not None:
            token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode("ascii")
            headers = {**(headers or {}), "Authorization": f"Basic {token}"}
        return await super().request(method, url, params=params, data=data, headers=headers, auth=None,
                                     timeout=timeout, allow_redirects=allow_redirects)


# --- the channel -----------------------------------------------------------------------------
class WhatsAppChannel(Channel):
    name = "whatsapp"

    def __init__(self, settings: Settings, *, http: HttpServer | None = None,
                 retry_base_s: float = 1.0, media_drain_s: float = MEDIA_DRAIN_S,
                 links: MediaLinkStore | None = None) -> None:
        # ``links`` holds the table of media links (in PostgreSQL with many workers; default in memory).
        check_whatsapp_settings(settings)
        self.settings = settings
        self.limits: Limits = settings.limits()
        self.allowlist = settings.whatsapp_allowlist
        self.account_sid = settings.twilio_account_sid.strip()
        self.auth_token = settings.twilio_auth_token.strip()
        self.sender = whatsapp_address(settings.twilio_whatsapp_from)
        self.public_base_url = settings.public_base_url.strip().rstrip("/")
        self.webhook_path = settings.whatsapp_webhook_path.rstrip("/") or "/"
        self.status_path = self.webhook_path.rstrip("/") + "/status"
        self.insecure = settings.whatsapp_insecure_no_signature
        self.media_hosts = MediaHosts(settings.twilio_media_hosts, settings.twilio_api_base_url)
        self.retry_base_s = retry_base_s
        self.media_drain_s = media_drain_s
        self._validator = RequestValidator(self.auth_token) if self.auth_token else None
        self._owns_http = http is None
        self.http = http or HttpServer(settings.http_host, settings.http_port)
        self.links: MediaLinks | None = (
            MediaLinks(links or MemoryMediaLinks(), settings.media_root, self.public_base_url,
                       settings.media_url_ttl_s)
            if self.public_base_url else None
        )
        self.http.add_route("POST", self.webhook_path, self._on_webhook)
        self.http.add_route("POST", self.status_path, self._on_status)
        if self.links is not None:
            self.http.add_route("GET", MediaLinks.route, self.links.handle)
        self._bridge: BridgeHandle | None = None
        self._client: Client | None = None
        self._twilio_http: _TwilioHttp | None = None
        self._download: httpx.AsyncClient | None = None
        self._pairing_sends: set[asyncio.Task[None]] = set()
        self._state = "not started"  # "up" between start and stop (health)

    def serves(self, conversation: InboundMessage) -> str | None:
        """Every WhatsApp conversation here is one person's (Twilio's WhatsApp has no groups); who
        may use the bot is the access gate's question (TALON_WHATSAPP_ALLOWED_NUMBERS, pairing)."""
        if conversation.is_group:
            return "WhatsApp group chats are not served"
        return None

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self, bridge: BridgeHandle) -> None:
        self._bridge = bridge
        if self.insecure:
            log.warning(
                "whatsapp: TALON_WHATSAPP_INSECURE_NO_SIGNATURE=true: webhooks are accepted WITHOUT "
                "checking X-Twilio-Signature, so anyone who can reach %s can talk to the agent as any "
                "allowed number. Use this only for local experiments.", self.webhook_path)
            if not self.auth_token:
                log.warning("whatsapp: TWILIO_AUTH_TOKEN is not set: Twilio will refuse to send replies")
        if not self.allowlist and not self.settings.pairing:
            log.warning("whatsapp: TALON_WHATSAPP_ALLOWED_NUMBERS is empty: nobody can chat yet "
                        "(deny by default); add E.164 numbers such as +14155550123")
        if self.links is None:
            log.warning("whatsapp: TALON_PUBLIC_BASE_URL is not set: replies cannot carry files "
                        "(Twilio fetches them from Talon's public URL)")
        self._twilio_http = _TwilioHttp(logger=_twilio_wire_log)
        # A non-empty environment keeps the client from reading TWILIO_EDGE/REGION and credentials
        # from os.environ: everything it uses comes from Settings.
        self._client = Client(self.account_sid, self.auth_token or None, http_client=self._twilio_http,
                              environment={"TALON": "1"})
        self._client.api.base_url = self.settings.twilio_api_base_url.strip().rstrip("/")
        self._download = httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=10.0), follow_redirects=False)
        if self._owns_http:
            await self.http.start()
        log.info("whatsapp: webhook at %s%s (listening on %s:%s), sending as %s",
                 self.public_base_url or "<no public URL>", self.webhook_path, self.http.host,
                 self.http.port if self.http.running else self.http.requested_port, self.sender)
        self._state = "up"

    def health(self) -> ChannelHealth:
        if self._state != "up":
            return ChannelHealth(False, self._state)
        if not self.http.running:
            return ChannelHealth(False, "Talon's HTTP server is not listening: Twilio's webhooks cannot arrive")
        return ChannelHealth(True, f"ready: webhook {self.public_base_url or '<no public URL>'}{self.webhook_path}, "
                                   f"sending as {self.sender}")

    async def drain(self) -> None:
        if self.links is None or self.media_drain_s <= 0:
            return
        waiting = await self.links.wait_fetched(self.media_drain_s)
        if waiting:
            log.warning("whatsapp: stopping although Twilio has not fetched %d file(s) sent in the last "
                        "%gs; those will not arrive (Twilio reports error 11200)", waiting,
                        self.settings.media_url_ttl_s)

    async def stop(self) -> None:
        self._state = "stopped"
        if self._owns_http:
            await self.http.stop()
        for task in self._pairing_sends:
            task.cancel()
        await asyncio.gather(*self._pairing_sends, return_exceptions=True)
        if self._twilio_http is not None:
            await self._twilio_http.close()
            self._twilio_http = None
        if self._download is not None:
            await self._download.aclose()
            self._download = None

    # --- webhooks -----------------------------------------------------------------------------
    def _signed(self, request: web.Request, form: Mapping[str, str], path: str) -> bool:
        if self.insecure:
            return True
        signature = request.headers.get("X-Twilio-Signature", "")
        if not signature or self._validator is None:
            return False
        query = request.rel_url.raw_query_string
        url = f"{self.public_base_url}{path}" + (f"?{query}" if query else "")
        return bool(self._validator.validate(url, form, signature))

    async def _read_form(self, request: web.Request) -> Any:
        try:
            form = await request.post()
        except (ValueError, UnicodeDecodeError) as exc:
            log.warning("whatsapp: webhook body could not be read (%s); 400", exc)
            raise web.HTTPBadRequest(text="unreadable form body") from None
        if any(not isinstance(value, str) for value in form.values()):
            log.warning("whatsapp: webhook with file uploads refused (400); Twilio posts plain forms")
            raise web.HTTPBadRequest(text="unexpected file upload")
        return form

    def _authentic(self, request: web.Request, form: Any, path: str, what: str) -> None:
        sid = form.get("MessageSid") or form.get("SmsMessageSid") or "-"
        if not self._signed(request, form, path):
            log.warning("whatsapp: %s with a missing or invalid X-Twilio-Signature refused (403; "
                        "MessageSid=%s, peer=%s). If this was Twilio, TALON_PUBLIC_BASE_URL must be "
                        "exactly the URL configured in the Twilio console, without the path.",
                        what, sid, request.remote)
            raise web.HTTPForbidden(text="invalid signature")
        account = form.get("AccountSid", "")
        if account != self.account_sid:
            log.warning("whatsapp: %s for another account (AccountSid=%s) refused (403; MessageSid=%s)",
                        what, account or "<none>", sid)
            raise web.HTTPForbidden(text="wrong account")

    async def _on_webhook(self, request: web.Request) -> web.StreamResponse:
        if self._bridge is None:
            raise web.HTTPServiceUnavailable(text="not ready")  # Twilio retries
        form = await self._read_form(request)
        self._authentic(request, form, self.webhook_path, "webhook")
        if "MessageStatus" in form and "NumMedia" not in form:
            return self._status(form)  # a status callback configured on the messaging URL
        try:
            message = parse_inbound(form)
        except MalformedWebhook as exc:
            log.warning("whatsapp: malformed webhook refused (400): %s (MessageSid=%s)", exc,
                        form.get("MessageSid") or "-")
            raise web.HTTPBadRequest(text=f"malformed webhook: {exc}") from None
        sender = form.get("From", "")
        if not sender.lower().startswith("whatsapp:"):
            log.warning("whatsapp: ignoring a non-WhatsApp message from %s (MessageSid=%s); point only "
                        "the WhatsApp sender's webhook at Talon", message.chat_id, message.message_id)
            return _twiml()
        if not await self._bridge.gate.allowed(self.name, [message.chat_id]):
            pairing = await self._bridge.gate.request_pairing(self.name, message.chat_id, message.sender_name or "")
            if pairing is None:
                log.warning("whatsapp: message from %s denied (MessageSid=%s); to allow them add %s to "
                            "TALON_WHATSAPP_ALLOWED_NUMBERS", message.chat_id, message.message_id, message.chat_id)
                return _twiml()
            log.warning("whatsapp: message from %s denied (MessageSid=%s); to allow them run `talon pair %s` "
                        "(or add %s to TALON_WHATSAPP_ALLOWED_NUMBERS)", message.chat_id, message.message_id,
                        pairing.code, message.chat_id)
            if pairing.reply is not None:
                self._send_pairing_code(message.chat_id, pairing.reply)
            return _twiml()
        if not message.text.strip() and not message.files:
            log.info("whatsapp: chat=%s: message %s has no text or media (MessageType=%s); nothing to do",
                     message.chat_id, message.message_id, form.get("MessageType", "?"))
            return _twiml()
        try:
            fresh = await self._bridge.submit(message)
        except StoreUnavailable as exc:
            log.warning("whatsapp: chat=%s: message %s not stored (%s); answered 503 so that Twilio tries again",
                        message.chat_id, message.message_id, exc)
            raise web.HTTPServiceUnavailable(text="the database is unavailable; try again",
                                             headers={"Retry-After": "5"}) from None
        if fresh:
            log.info("whatsapp: chat=%s: message %s accepted (%d media)", message.chat_id,
                     message.message_id, len(message.files))
        else:
            log.info("whatsapp: chat=%s: message %s already received (Twilio retry); not answered again",
                     message.chat_id, message.message_id)
        return _twiml()

    def _send_pairing_code(self, chat_id: str, text: str) -> None:
        """Send in the background: Twilio must have its answer to the webhook at once."""

        async def send() -> None:
            try:
                await self._send(chat_id, body=text, what="pairing code")
            except DeliveryError as exc:
                log.warning("whatsapp: could not send the pairing code to %s: %s", chat_id, exc)

        task = asyncio.create_task(send(), name=f"whatsapp-pairing-{chat_id}")
        self._pairing_sends.add(task)
        task.add_done_callback(self._pairing_sends.discard)

    async def _on_status(self, request: web.Request) -> web.StreamResponse:
        form = await self._read_form(request)
        self._authentic(request, form, self.status_path, "status callback")
        return self._status(form)

    def _status(self, form: Any) -> web.StreamResponse:
        status = form.get("MessageStatus") or form.get("SmsStatus") or "?"
        sid = form.get("MessageSid") or form.get("SmsMessageSid") or "-"
        chat = normalize_whatsapp_number(form.get("To", "")) or "-"
        if status in ("failed", "undelivered"):
            code = _code(form.get("ErrorCode"))
            explanation = EXPLANATIONS.get(code or 0) or MEDIA_EXPLANATIONS.get(code or 0) or \
                form.get("ErrorMessage") or "no explanation given"
            log.error("whatsapp: chat=%s: message %s %s (Twilio error %s): %s", chat, sid, status,
                      code if code is not None else "?", explanation)
        else:
            log.debug("whatsapp: chat=%s: message %s is %s", chat, sid, status)
        return _twiml()

    # --- inbound media ------------------------------------------------------------------------
    async def download(self, remote: RemoteFile, store: AttachmentStore, limits: Limits) -> InboundFile:
        base = InboundFile(kind=remote.kind, name=remote.name, mime=remote.mime, size=remote.size)
        try:
            ref = await self._fetch(remote, store, limits)
        except MediaError as exc:
            return base.model_copy(update={"notice": str(exc)})
        return base.model_copy(update={"ref": ref, "size": ref.bytes})

    async def _fetch(self, remote: RemoteFile, store: AttachmentStore, limits: Limits) -> AttachmentRef:
        assert self._download is not None, "the channel is not started"
        name = remote.name or remote.kind
        url = remote.source
        for hop in range(MAX_REDIRECTS + 1):
            if not self.media_hosts.allows(url):
                host = urlsplit(url).hostname or "?"
                log.warning("whatsapp: not downloading %s from %s: the host is not an allowed media host "
                            "(allowed: %s and the host of TWILIO_API_BASE_URL; set TALON_TWILIO_MEDIA_HOSTS "
                            "to change this)", name, host, ", ".join(self.media_hosts.entries))
                raise DownloadError(f"{name} was not downloaded: it is hosted on {host}, which is not an "
                                    "allowed media host")
            # Credentials go only to the URL Twilio named, on Twilio's API host; where it redirects
            # to (a short-lived CDN URL) needs none and must never see the auth token.
            auth = (self.account_sid, self.auth_token) \
                if hop == 0 and self.auth_token and self.media_hosts.takes_credentials(url) else None
            result = await self._get(url, auth, store, remote, limits)
            if isinstance(result, AttachmentRef):
                return result
            url = result
        raise DownloadError(f"{name} was not downloaded: too many redirects")

    async def _get(self, url: str, auth: tuple[str, str] | None, store: AttachmentStore,
                   remote: RemoteFile, limits: Limits) -> AttachmentRef | str:
        """One hop: the stored file, or the URL a redirect points to."""
        assert self._download is not None
        name = remote.name or remote.kind
        for attempt in range(1, DOWNLOAD_TRIES + 1):
            try:
                async with self._download.stream("GET", url, auth=auth) as resp:
                    status = resp.status_code
                    if status in (301, 302, 303, 307, 308):
                        location = resp.headers.get("location")
                        if not location:
                            raise DownloadError(f"{name} was not downloaded: a redirect without a location")
                        return urljoin(url, location)
                    if status == 200:
                        mime = remote.mime or resp.headers.get("content-type", "").split(";")[0].strip() \
                            or "application/octet-stream"
                        return await store_response(resp, store, remote, mime=mime,
                                                    limit=limits.download_max_bytes)
                    if (status == 429 or status >= 500) and attempt < DOWNLOAD_TRIES:
                        log.warning("whatsapp: download of %s got HTTP %d; retry %d", name, status, attempt)
                    else:
                        log.warning("whatsapp: download of %s from %s failed: HTTP %d", name,
                                    urlsplit(url).hostname, status)
                        raise DownloadError(f"Twilio would not give us {name} (HTTP {status})")
            except httpx.HTTPError as exc:
                if attempt == DOWNLOAD_TRIES:
                    raise DownloadError(f"download of {name} failed: {type(exc).__name__}") from exc
                log.warning("whatsapp: download of %s failed (%s); retry %d", name, type(exc).__name__, attempt)
            await asyncio.sleep(self.retry_base_s * 2 ** (attempt - 1))
        raise DownloadError(f"download of {name} failed")

    # --- outbound -----------------------------------------------------------------------------
    async def ask_approval(self, approval: Approval, text: str) -> str | None:
        """The whole prompt as plain text (see the module docstring); ``ApprovalNotShown`` when it
        cannot all be shown."""
        text = f"{text}\nReply yes to allow it or no to refuse (or /approve, /deny)."
        chat = approval.platform_chat
        room = self.limits.whatsapp_body_max - 24  # "(part 12 of 12)\n"
        chunks = [text[i:i + room] for i in range(0, len(text), room)] or [""]
        try:
            if len(chunks) == 1:
                await self._send(chat, body=text, what="an approval prompt")
            elif len(chunks) <= self.limits.whatsapp_reply_max_messages:
                for n, chunk in enumerate(chunks, 1):
                    await self._send(chat, body=f"(part {n} of {len(chunks)})\n{chunk}",
                                     what=f"approval prompt part {n}")
            else:
                name = f"approval-{approval.id}.txt"
                if self.links is None:
                    raise ApprovalNotShown(f"it is {len(text):,} characters, more than "
                                           f"{len(chunks) - 1} WhatsApp messages, and files cannot be sent "
                                           "here (no TALON_PUBLIC_BASE_URL)")
                url = await self.links.add_bytes(text.encode("utf-8"), name, "text/plain")
                await self._send(chat, body="", media_url=url, what=name)
                note = (f"…\n\n[This call is too long for WhatsApp messages ({len(text):,} characters): ALL of "
                        f"it is in the file {name} just sent. Read it before you answer: yes covers exactly what "
                        "is in it. Reply yes or no.]")
                head = text[:self.limits.whatsapp_body_max - len(note)]
                await self._send(chat, body=head + note, what="an approval prompt")
        except TwilioRefused as exc:
            raise ApprovalNotShown(f"WhatsApp refused a part of the prompt: {exc}") from exc
        return None

    def reply_parts(self, reply: OutboundReply) -> list[Part]:
        return plan_parts(reply, self.limits, can_attach=self.links is not None)

    async def deliver(self, chat_id: str, reply: OutboundReply, *, skip_parts: int = 0,
                      on_part: PartCallback | None = None) -> None:
        parts = self.reply_parts(reply)

        async def send(index: int, part: Part) -> None:
            try:
                await self._send_part(chat_id, part)
            except TwilioRefused as exc:
                if exc.chat_level:
                    # Nothing more can reach this chat now. The bridge logs the refusal with the
                    # MessageSid it answers and closes the message: retrying cannot succeed.
                    log.error("whatsapp: chat=%s: %d of %d reply part(s) not delivered (Twilio error %s)",
                              chat_id, len(parts) - index, len(parts), exc.code or exc.status)
                    raise
                log.error("whatsapp: chat=%s: reply part %d of %d skipped: %s", chat_id, index + 1,
                          len(parts), exc)

        await deliver_parts(parts, send, skip_parts=skip_parts, on_part=on_part)

    async def _send_part(self, chat_id: str, part: Part) -> None:
        if isinstance(part, MediaPart):
            await self._send_media(chat_id, part)
            return
        if isinstance(part, ReplyDocumentPart):
            assert self.links is not None  # planned only when files can be sent
            url = await self.links.add_bytes(reply_document(part.text), REPLY_DOCUMENT_NAME, REPLY_DOCUMENT_MIME)
            try:
                await self._send(chat_id, body="", media_url=url, what=REPLY_DOCUMENT_NAME)
            except BaseException:
                await self.links.forget(url)
                raise
            return
        body = part.body if isinstance(part, TextPart) else part.text
        await self._send(chat_id, body=body, what=f"a {len(body)}-character message")

    async def _send_media(self, chat_id: str, part: MediaPart) -> None:
        failures: list[str] = []
        caption = part.caption
        prepared = await self._prepare_media(chat_id, part.ref, failures)
        if prepared is not None:
            fitted, url = prepared
            body = caption if fitted.kind in CAPTIONED_KINDS else ""
            if caption and not body:  # documents and audio carry no caption on WhatsApp
                await self._send(chat_id, body=caption, what="caption")
                caption = ""
            sent = False
            try:
                await self._send(chat_id, body=body, media_url=url, what=f"{fitted.kind} {fitted.name}")
                sent = True
                caption = ""
            except TwilioRefused as exc:
                if exc.chat_level:
                    raise
                failures.append(attach_failure_line(fitted.name, exc.reason))
            finally:
                if not sent and self.links is not None:
                    await self.links.forget(url)  # nobody will fetch it: stop need not wait for it
        if caption:  # the file did not go out: the words still must
            await self._send(chat_id, body=caption, what="caption")
        if failures:
            await self._send(chat_id, body="\n".join(failures)[: self.limits.whatsapp_body_max],
                             what="attach failures")

    async def _prepare_media(self, chat_id: str, ref: MarkdownMediaRef,
                             failures: list[str]) -> tuple[WhatsAppMedia, str] | None:
        """Resolve, check, fit and link one reference, or record why it cannot be sent."""
        name = display_name(ref.path)
        try:
            media: OutboundMedia = await asyncio.to_thread(
                outbound_channel_media, ref, "", self.settings.workspace_dir(self.name, chat_id))
        except MediaPathError as exc:
            log.warning("whatsapp: chat=%s: not attaching %r: %s", chat_id, ref.path, exc)
            failures.append(attach_failure_line(name, path_refusal_reason(exc)))
            return None
        except OSError as exc:
            log.warning("whatsapp: chat=%s: cannot read %r: %s", chat_id, ref.path, exc)
            failures.append(attach_failure_line(name, "it cannot be read"))
            return None
        try:
            if self.links is None:
                log.warning("whatsapp: chat=%s: cannot send %s: TALON_PUBLIC_BASE_URL is not set, so "
                            "Twilio cannot fetch files from Talon", chat_id, media.name)
                failures.append(attach_failure_line(media.name, "this server cannot send files "
                                                                "(it has no public URL)"))
                return None
            voice = meant_as_voice(media.name, ref.alt)
            fitted = await asyncio.to_thread(fit_for_whatsapp, media, self.limits, voice=voice)
            if fitted.note:
                log.info("whatsapp: chat=%s: %s %s", chat_id, media.name, fitted.note)
            if fitted.data is not None:
                url = await self.links.add_bytes(fitted.data, fitted.name, fitted.mime)
            else:
                url = await self.links.add_file(media.path, media.file, fitted.name, fitted.mime,
                                          root=self.settings.workspace_dir(self.name, chat_id))
            return fitted, url
        except MediaError as exc:
            log.warning("whatsapp: chat=%s: not attaching %s (%s, %d bytes): %s", chat_id, media.path,
                        media.kind, media.size, exc)
            failures.append(attach_failure_line(media.name, str(exc)))
            return None
        finally:
            media.close()

    async def _send(self, chat_id: str, *, body: str, media_url: str | None = None, what: str) -> str:
        """Create one message, retrying 429/5xx/network failures; returns its MessageSid."""
        assert self._client is not None, "the channel is not started"
        to = whatsapp_address(chat_id)
        kwargs: dict[str, Any] = {"to": to, "from_": self.sender}
        if body:
            kwargs["body"] = body
        if media_url:
            kwargs["media_url"] = [media_url]
        if self.public_base_url:
            kwargs["status_callback"] = self.public_base_url + self.status_path
        for attempt in range(1, SEND_TRIES + 1):
            try:
                message = await asyncio.wait_for(self._client.messages.create_async(**kwargs), SEND_TIMEOUT_S)
                log.info("whatsapp: chat=%s: sent %s as %s (%s)", chat_id, what, message.sid, message.status)
                return str(message.sid)
            except TwilioRestException as exc:
                status, code, detail = int(exc.status), _code(exc.code), _detail(exc)
                if status != 429 and status < 500:
                    explanation = EXPLANATIONS.get(code or 0)
                    if explanation:
                        log.error("whatsapp: chat=%s: Twilio error %s sending %s: %s (Twilio said: %s)",
                                  chat_id, code, what, explanation, detail)
                    else:
                        log.error("whatsapp: chat=%s: Twilio refused %s (HTTP %d, error %s): %s",
                                  chat_id, what, status, code, detail)
                    raise TwilioRefused(f"Twilio refused {what} (HTTP {status}, error {code}): {detail}",
                                        status=status, code=code, detail=detail,
                                        chat_level=code in EXPLANATIONS or status in (401, 403)) from None
                failure = f"HTTP {status} (error {code}): {detail}"
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                failure = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if attempt == SEND_TRIES:
                log.error("whatsapp: chat=%s: sending %s failed after %d tries: %s", chat_id, what,
                          SEND_TRIES, failure)
                raise DeliveryError(f"sending {what} to WhatsApp failed after {SEND_TRIES} tries: {failure}")
            delay = self.retry_base_s * 2 ** (attempt - 1)
            log.warning("whatsapp: chat=%s: sending %s failed (%s); retry %d in %.1fs", chat_id, what,
                        failure, attempt, delay)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")


def _twiml() -> web.Response:
    return web.Response(text=EMPTY_TWIML, content_type="text/xml")


# The twilio client logs every request and response at INFO; keep that out of Talon's log.
_twilio_wire_log = logging.getLogger("talon.twilio.wire")
_twilio_wire_log.setLevel(logging.WARNING)
