"""How a message is sent through Twilio's Messages API: the real ``twilio`` client on its aiohttp
transport, retries, and Twilio's refusals in words.

``TwilioApi.send`` creates one message (a body with at most one media URL, or a Content template
with its variables), with a ``StatusCallback`` on Talon's server whenever there is a public URL,
retrying 429, 5xx and network failures (``SEND_TRIES``, with backoff) and raising
``DeliveryError``; refusals raise ``TwilioRefused`` at once, with Twilio's code and words. Every
accepted message is recorded in the WhatsApp store (its MessageSid, its kind, and for an answer's
text what to send again), so its status callbacks can be matched.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from typing import Any

import aiohttp
from twilio.base.exceptions import TwilioRestException
from twilio.http.async_http_client import AsyncTwilioHttpClient
from twilio.rest import Client

from talon.config import Settings
from talon.errors import DeliveryError, TwilioRefused
from talon.storage.whatsapp import WhatsAppStore

from channels.whatsapp.config import whatsapp_address

log = logging.getLogger("channels.whatsapp")

SEND_TRIES = 3
SEND_TIMEOUT_S = 60.0
# Refusals that mean "outside WhatsApp's 24-hour window": the message waits for it instead.
WINDOW_CODES = frozenset({63016, 63032})

# Twilio error codes that concern the chat or the account rather than one message: after one of
# these, the rest of the reply cannot be delivered either.
EXPLANATIONS: dict[int, str] = {
    63016: ("the message is outside WhatsApp's 24-hour customer service window: this person has "
            "not messaged the number in the last 24 hours, so WhatsApp only accepts pre-approved "
            "template messages"),
    63032: ("WhatsApp did not deliver the message to this person (Meta limits messages to them now; "
            "error 63032)"),
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


# Codes Twilio reports on the status callback when a message did not reach the person (it sends
# the code alone; these are Twilio's meanings, in short).
DELIVERY_EXPLANATIONS: dict[int, str] = {
    30003: "the person's phone is unreachable",
    30005: "the number is unknown or no longer exists",
    30006: "the number cannot receive this message (a landline or unreachable carrier)",
    30007: "the message was filtered as spam",
    30008: "unknown delivery error",
    63003: "WhatsApp could not find the person's number",
    63018: "the WhatsApp sender's rate limit was exceeded",
    63024: "the recipient is not a valid WhatsApp user",
    63049: "Meta chose not to deliver this message",
}


def explain(code: int | None) -> str | None:
    return (EXPLANATIONS.get(code or 0) or MEDIA_EXPLANATIONS.get(code or 0)
            or DELIVERY_EXPLANATIONS.get(code or 0))


def _detail(exc: TwilioRestException) -> str:
    msg = str(exc.msg or "")
    return msg.split(": ", 1)[1] if msg.startswith("Unable to ") and ": " in msg else msg


def code_of(value: Any) -> int | None:
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


# The twilio client logs every request and response at INFO; keep that out of Talon's log.
_twilio_wire_log = logging.getLogger("talon.twilio.wire")
_twilio_wire_log.setLevel(logging.WARNING)


class TwilioApi:
    def __init__(self, settings: Settings, store: WhatsAppStore, *, status_url: str | None,
                 retry_base_s: float = 1.0) -> None:
        self.settings = settings
        self.store = store
        self.account_sid = settings.twilio_account_sid.strip()
        self.auth_token = settings.twilio_auth_token.strip()
        self.sender = whatsapp_address(settings.twilio_whatsapp_from)
        self.status_url = status_url
        self.retry_base_s = retry_base_s
        self._client: Client | None = None
        self._http: _TwilioHttp | None = None

    def start(self) -> None:
        self._http = _TwilioHttp(logger=_twilio_wire_log)
        # A non-empty environment keeps the client from reading TWILIO_EDGE/REGION and credentials
        # from os.environ: everything it uses comes from Settings.
        self._client = Client(self.account_sid, self.auth_token or None, http_client=self._http,
                              environment={"TALON": "1"})
        self._client.api.base_url = self.settings.twilio_api_base_url.strip().rstrip("/")

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def send(self, chat_id: str, *, body: str = "", media_url: str | None = None,
                   content: tuple[str, str] | None = None, what: str, kind: str = "answer",
                   payload: str = "") -> str:
        """Create one message, retrying 429/5xx/network failures; returns its MessageSid.
        ``content``: (ContentSid, ContentVariables JSON) of a template instead of a body."""
        assert self._client is not None, "the channel is not started"
        kwargs: dict[str, Any] = {"to": whatsapp_address(chat_id), "from_": self.sender}
        if content is not None:
            kwargs["content_sid"] = content[0]
            if content[1]:
                kwargs["content_variables"] = content[1]
        if body:
            kwargs["body"] = body
        if media_url:
            kwargs["media_url"] = [media_url]
        if self.status_url:
            kwargs["status_callback"] = self.status_url
        for attempt in range(1, SEND_TRIES + 1):
            try:
                message = await asyncio.wait_for(self._client.messages.create_async(**kwargs), SEND_TIMEOUT_S)
                log.info("whatsapp: chat=%s: sent %s as %s (%s)", chat_id, what, message.sid, message.status)
                await self._record(str(message.sid), chat_id, kind, payload)
                return str(message.sid)
            except TwilioRestException as exc:
                status, code, detail = int(exc.status), code_of(exc.code), _detail(exc)
                if status != 429 and status < 500:
                    explanation = EXPLANATIONS.get(code or 0)
                    if code in WINDOW_CODES:
                        log.info("whatsapp: chat=%s: Twilio error %s sending %s: %s (Twilio said: %s)",
                                 chat_id, code, what, explanation, detail)
                    elif explanation:
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

    async def _record(self, sid: str, chat_id: str, kind: str, payload: str) -> None:
        """Remember the message for its receipts; a store that does not answer costs only them."""
        try:
            await self.store.record_sent(sid, chat_id, kind, payload, time.time())
        except Exception as exc:  # noqa: BLE001 - the message went out; only its receipts are lost
            log.warning("whatsapp: chat=%s: %s sent, but not recorded for its receipts (%s)", chat_id, sid, exc)
