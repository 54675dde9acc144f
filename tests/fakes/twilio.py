"""A loopback fake of Twilio's Messages API and media host, for driving the real twilio package.

Point the client at it with ``TWILIO_API_BASE_URL=fake.base_url``. What it imitates:

- ``POST /2010-04-01/Accounts/{AccountSid}/Messages.json``: HTTP basic auth (account sid, auth
  token; 401 with error 20003 otherwise), form fields To, From, Body, MediaUrl (repeated) and
  StatusCallback; answers 201 with a message resource shaped like Twilio's. It rejects what Twilio
  rejects and a sender can easily get wrong: no To (21604) or From (21603), neither Body nor
  MediaUrl (21602), a Body over 1600 characters (21617), a From that is not the account's WhatsApp
  sender (63007), mixed channels in To/From (21910), and media URLs that are not absolute http(s)
  (21620). It also refuses more than one MediaUrl on a WhatsApp message, which WhatsApp itself
  does not deliver (the fake's own rule, reported as 21620).
- ``GET /2010-04-01/Accounts/{AccountSid}.json``: the account, behind the same basic auth.
- Twilio's error body: ``{"code", "message", "more_info", "status"}``.
- Media of inbound messages: ``add_media`` registers bytes under a Twilio-style media URL
  (``/2010-04-01/Accounts/{sid}/Messages/{MM}/Media/{ME}``) that requires basic auth, like an
  account with media authentication on. It can answer with a redirect to a CDN-style path on the
  fake (no auth needed there, like a pre-signed URL) or to any URL, to test redirect checks.

- WhatsApp's 24-hour window: ``close_window(number)`` makes the fake refuse free-form messages to
  that number with 63016, as Twilio does outside the window; a message from the person
  (``inbound_params``) opens it again. Content templates (``ContentSid``, ``HX`` and 32 hex digits,
  with ``ContentVariables``, a JSON object of at most 100 string values) go through whatever the
  window; ``ContentVariables`` without ``ContentSid`` is 21654, malformed ones 21656.
- Status callbacks: with ``callbacks_to(public_base, local_base)`` every accepted message that names
  a ``StatusCallback`` under ``public_base`` gets signed callbacks (X-Twilio-Signature over the public
  URL, with MessageSid, MessageStatus, ErrorCode, To, From, AccountSid; like Twilio, none for the
  initial ``queued``) posted to the same path on
  ``local_base``: ``sent`` then ``delivered`` unless ``statuses_next`` scripts others (``failed``
  with an error code). ``callbacks`` records what was posted and answered.

Everything received is recorded (``messages``, ``media_fetches``); failures are scripted with
``fail_next``. ``inbound_params`` and ``sign`` build signed incoming-message webhooks.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import itertools
import json
import re
import secrets
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
import aiohttp
from aiohttp import web
from twilio.request_validator import RequestValidator

from tests.fakes import LoopbackServer

__all__ = ["Callback", "FakeTwilio", "MediaFetch", "SentMessage"]

API_VERSION = "2010-04-01"
BODY_LIMIT = 1600
_DEFAULT_MESSAGES = {
    400: (21000, "Bad Request"),
    401: (20003, "Authenticate"),
    404: (20404, "The requested resource was not found"),
    429: (20429, "Too Many Requests"),
    500: (20500, "Internal Server Error"),
    503: (20503, "Service Unavailable"),
}


def _sid(prefix: str) -> str:
    return prefix + secrets.token_hex(16)


def _rfc2822(ts: float) -> str:
    return email.utils.formatdate(ts, usegmt=False)


@dataclass(frozen=True)
class SentMessage:
    """One Messages.json POST as received, and what the fake answered."""

    account_sid: str
    to: str
    from_: str
    body: str
    media_urls: tuple[str, ...]
    status_callback: str | None
    fields: dict[str, list[str]]
    time: float  # time.monotonic() on arrival
    status: int  # HTTP status answered
    sid: str | None = None  # the MessageSid, for a 201
    error_code: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == 201

    @property
    def content_sid(self) -> str | None:
        return (self.fields.get("ContentSid") or [None])[0]

    @property
    def content_variables(self) -> dict[str, str]:
        raw = (self.fields.get("ContentVariables") or [""])[0]
        return json.loads(raw) if raw else {}


@dataclass(frozen=True)
class Callback:
    """One status callback the fake posted, and Talon's answer."""

    sid: str
    status: str
    error_code: int | None
    answered: int


@dataclass(frozen=True)
class MediaFetch:
    path: str
    authorized: bool
    status: int
    time: float


@dataclass
class _Failure:
    status: int
    code: int
    message: str
    remaining: int
    predicate: Callable[[dict[str, list[str]]], bool] | None = None


@dataclass
class _Media:
    data: bytes
    content_type: str
    redirect: str | None  # absolute URL or a path on the fake
    cdn_key: str = field(default_factory=lambda: secrets.token_urlsafe(12))


class FakeTwilio(LoopbackServer):
    def __init__(self, account_sid: str | None = None, auth_token: str = "test-auth-token", *,
                 whatsapp_from: str = "whatsapp:+14155238886") -> None:
        super().__init__()
        self.account_sid = account_sid or _sid("AC")
        self.auth_token = auth_token
        self.whatsapp_from = whatsapp_from
        self.messages: list[SentMessage] = []
        self.media_fetches: list[MediaFetch] = []
        self._failures: deque[_Failure] = deque()
        self._media: dict[str, _Media] = {}
        self._cdn: dict[str, _Media] = {}
        self._seq = itertools.count(1)
        self._closed: set[str] = set()  # numbers (digits) whose 24-hour window the fake holds closed
        self._callback_map: tuple[str, str] | None = None
        self._statuses: deque[tuple[tuple[str, ...], int | None, Callable[[dict[str, list[str]]], bool] | None]] = deque()
        self.callbacks: list[Callback] = []
        self._posting: set[asyncio.Task[None]] = set()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT`` — the TWILIO_API_BASE_URL value."""
        return self.root_url

    def _make_app(self) -> web.Application:
        app = web.Application()
        prefix = f"/{API_VERSION}/Accounts/{{account}}"
        app.router.add_get(f"{prefix}.json", self._handle_account)
        app.router.add_post(f"{prefix}/Messages.json", self._handle_create)
        app.router.add_get(f"{prefix}/Messages/{{message}}/Media/{{media}}", self._handle_media)
        app.router.add_get("/cdn/{key}", self._handle_cdn)
        return app

    # -- scripting -------------------------------------------------------------------------

    def fail_next(self, status: int = 400, code: int | None = None, message: str | None = None, *,
                  times: int = 1,
                  when: Callable[[dict[str, list[str]]], bool] | None = None) -> None:
        """Answer the next ``times`` message creations (matching ``when``, if given) with an error.

        E.g. ``fail_next(429)``, ``fail_next(500)``, ``fail_next(400, 63016, "...")``.
        """
        default_code, default_message = _DEFAULT_MESSAGES.get(status, (status * 100, f"HTTP {status}"))
        failure = _Failure(status, code or default_code, message or default_message, times, when)
        with self._cond:
            self._failures.append(failure)

    def close_window(self, number: str) -> None:
        """Refuse free-form messages to ``number`` with 63016 until the person writes."""
        with self._cond:
            self._closed.add(_digits(number))

    def open_window(self, number: str) -> None:
        with self._cond:
            self._closed.discard(_digits(number))

    def callbacks_to(self, public_base: str, local_base: str) -> None:
        """Post status callbacks for StatusCallback URLs under ``public_base`` to ``local_base``."""
        self._callback_map = (public_base.rstrip("/"), local_base.rstrip("/"))

    def statuses_next(self, *statuses: str, error_code: int | None = None,
                      when: Callable[[dict[str, list[str]]], bool] | None = None) -> None:
        """The callbacks of the next accepted message (matching ``when``): e.g. ``("sent", "failed")``."""
        with self._cond:
            self._statuses.append((statuses, error_code, when))

    def _callbacks(self, n: int) -> Callable[[], list[Callback] | None]:
        def check() -> list[Callback] | None:
            with self._cond:
                return list(self.callbacks) if len(self.callbacks) >= n else None

        return check

    async def wait_for_callbacks(self, n: int, timeout: float = 20.0) -> list[Callback]:
        """Wait until ``n`` status callbacks were posted and answered."""
        return await self._wait_until(self._callbacks(n), timeout, lambda: f"waited for {n} callbacks; got {self.callbacks}")

    def wait_for_callbacks_sync(self, n: int, timeout: float = 20.0) -> list[Callback]:
        return self._wait_until_sync(self._callbacks(n), timeout, lambda: f"waited for {n} callbacks; got {self.callbacks}")

    def add_media(self, data: bytes, content_type: str, *, redirect: bool | str = False,
                  message_sid: str | None = None) -> str:
        """Register inbound media; returns its MediaUrl.

        ``redirect=True`` answers the (authenticated) media URL with a 307 to a CDN path on the fake;
        a string redirects to that URL instead (e.g. a host Talon must not fetch from).
        """
        message_sid = message_sid or _sid("MM")
        media_sid = _sid("ME")
        path = f"/{API_VERSION}/Accounts/{self.account_sid}/Messages/{message_sid}/Media/{media_sid}"
        media = _Media(data, content_type, None)
        if redirect is True:
            media.redirect = f"/cdn/{media.cdn_key}"
        elif isinstance(redirect, str) and redirect:
            media.redirect = redirect
        with self._cond:
            self._media[path] = media
            self._cdn[media.cdn_key] = media
        return self.root_url + path

    # -- webhooks ----------------------------------------------------------------------------

    def inbound_params(self, from_: str, body: str = "", *,
                       media: Sequence[tuple[str, str]] = (), message_sid: str | None = None,
                       profile_name: str = "Test User", account_sid: str | None = None,
                       **extra: str) -> dict[str, str]:
        """The form Twilio POSTs for an incoming WhatsApp message (``media``: (url, type) pairs).
        The person wrote: their 24-hour window is open from now."""
        sid = message_sid or _sid("SM" if not media else "MM")
        number = from_.removeprefix("whatsapp:")
        self.open_window(number)
        params = {
            "SmsMessageSid": sid,
            "NumMedia": str(len(media)),
            "ProfileName": profile_name,
            "MessageType": "text" if not media else media[0][1].split("/")[0],
            "SmsSid": sid,
            "WaId": number.lstrip("+"),
            "SmsStatus": "received",
            "Body": body,
            "To": self.whatsapp_from,
            "NumSegments": "1",
            "ReferralNumMedia": "0",
            "MessageSid": sid,
            "AccountSid": account_sid or self.account_sid,
            "From": from_ if from_.startswith("whatsapp:") else f"whatsapp:{from_}",
            "ApiVersion": API_VERSION,
        }
        for i, (url, content_type) in enumerate(media):
            params[f"MediaUrl{i}"] = url
            params[f"MediaContentType{i}"] = content_type
        params.update(extra)
        return params

    def sign(self, url: str, params: Mapping[str, str], auth_token: str | None = None) -> str:
        """The X-Twilio-Signature Twilio would send for ``params`` posted to ``url``."""
        return RequestValidator(auth_token or self.auth_token).compute_signature(url, dict(params))

    # -- reading -----------------------------------------------------------------------------

    def sent(self, to: str | None = None) -> list[SentMessage]:
        """Accepted messages (201), optionally only those to one number."""
        with self._cond:
            return [m for m in self.messages if m.ok and (to is None or _same_number(m.to, to))]

    async def wait_for_messages(self, n: int = 1, to: str | None = None,
                                timeout: float = 20.0) -> list[SentMessage]:
        """Wait until at least ``n`` messages were accepted (to ``to``); returns all of them."""
        return await self._wait_until(self._have(n, to), timeout, self._describe(n, to))

    def wait_for_messages_sync(self, n: int = 1, to: str | None = None,
                               timeout: float = 20.0) -> list[SentMessage]:
        return self._wait_until_sync(self._have(n, to), timeout, self._describe(n, to))

    def _have(self, n: int, to: str | None) -> Callable[[], list[SentMessage] | None]:
        def check() -> list[SentMessage] | None:
            found = self.sent(to)
            return found if len(found) >= n else None

        return check

    def _describe(self, n: int, to: str | None) -> Callable[[], str]:
        def describe() -> str:
            got = [(m.status, m.to, m.body[:40]) for m in self.messages]
            return f"waited for {n} messages{f' to {to}' if to else ''}; received {got}"

        return describe

    # -- HTTP --------------------------------------------------------------------------------

    def _authorized(self, request: web.Request, account: str) -> bool:
        header = request.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except ValueError:
            return False
        return user == account == self.account_sid and password == self.auth_token

    def _error(self, status: int, code: int, message: str) -> web.Response:
        return web.json_response({"code": code, "message": message,
                                  "more_info": f"https://www.twilio.com/docs/errors/{code}",
                                  "status": status}, status=status)

    async def _handle_account(self, request: web.Request) -> web.Response:
        """The account fetch (``talon doctor``'s credential check): 401 with error 20003 for a
        wrong sid or token, like Twilio."""
        account = request.match_info["account"]
        if not self._authorized(request, account):
            return self._error(401, 20003, "Authenticate")
        return web.json_response({
            "sid": account, "owner_account_sid": account, "friendly_name": "Talon test account",
            "status": "active", "type": "Full", "auth_token": self.auth_token,
            "date_created": _rfc2822(time.time()), "date_updated": _rfc2822(time.time()),
            "uri": f"/{API_VERSION}/Accounts/{account}.json", "subresource_uris": {},
        })

    async def _handle_create(self, request: web.Request) -> web.Response:
        arrived = time.monotonic()
        account = request.match_info["account"]
        form = await request.post()
        fields: dict[str, list[str]] = {}
        for key, value in form.items():
            fields.setdefault(key, []).append(value if isinstance(value, str) else str(value))

        def first(name: str) -> str:
            return (fields.get(name) or [""])[0]

        if not self._authorized(request, account):
            status, code, text = 401, 20003, "Authenticate"
        else:
            status, code, text = self._scripted(fields) or self._validate(fields) or (201, 0, "")
        sid = _sid("SM") if status == 201 else None
        record = SentMessage(account_sid=account, to=first("To"), from_=first("From"), body=first("Body"),
                             media_urls=tuple(fields.get("MediaUrl", [])),
                             status_callback=first("StatusCallback") or None, fields=fields,
                             time=arrived, status=status, sid=sid, error_code=code or None)
        with self._cond:
            self.messages.append(record)
        self._notify()
        if status != 201:
            return self._error(status, code, text)
        assert sid is not None
        self._post_callbacks(sid, fields)
        now = time.time()
        return web.json_response({
            "account_sid": account,
            "api_version": API_VERSION,
            "body": record.body,
            "date_created": _rfc2822(now),
            "date_sent": None,
            "date_updated": _rfc2822(now),
            "direction": "outbound-api",
            "error_code": None,
            "error_message": None,
            "from": record.from_,
            "messaging_service_sid": None,
            "num_media": str(len(record.media_urls)),
            "num_segments": "1",
            "price": None,
            "price_unit": "USD",
            "sid": sid,
            "status": "queued",
            "subresource_uris": {"media": f"/{API_VERSION}/Accounts/{account}/Messages/{sid}/Media.json"},
            "to": record.to,
            "uri": f"/{API_VERSION}/Accounts/{account}/Messages/{sid}.json",
        }, status=201)

    def _scripted(self, fields: dict[str, list[str]]) -> tuple[int, int, str] | None:
        with self._cond:
            for failure in list(self._failures):
                if failure.predicate is not None and not failure.predicate(fields):
                    continue
                failure.remaining -= 1
                if failure.remaining <= 0:
                    self._failures.remove(failure)
                return failure.status, failure.code, failure.message
        return None

    def _validate(self, fields: dict[str, list[str]]) -> tuple[int, int, str] | None:
        to = (fields.get("To") or [""])[0]
        from_ = (fields.get("From") or [""])[0]
        body = (fields.get("Body") or [""])[0]
        media = fields.get("MediaUrl", [])
        if not to:
            return 400, 21604, "A 'To' phone number is required."
        if not from_:
            return 400, 21603, "A 'From' phone number is required."
        content_sid = (fields.get("ContentSid") or [""])[0]
        variables = (fields.get("ContentVariables") or [""])[0]
        if variables and not content_sid:
            return 400, 21654, "A ContentSid must be specified if ContentVariables are provided in the request."
        if content_sid and not re.fullmatch(r"HX[0-9a-fA-F]{32}", content_sid):
            return 400, 21655, "The ContentSid is Invalid."
        if variables:
            try:
                parsed = json.loads(variables)
            except ValueError:
                parsed = None
            if (not isinstance(parsed, dict) or len(parsed) > 100
                    or not all(isinstance(v, str) and len(v) <= 1024 for v in parsed.values())):
                return 400, 21656, "The Content Variables parameter is invalid."
        if not body and not media and not content_sid:
            return 400, 21602, "Message body is required."
        if len(body) > BODY_LIMIT:
            return 400, 21617, "The concatenated message body exceeds the 1600 character limit."
        if to.startswith("whatsapp:") != from_.startswith("whatsapp:"):
            return 400, 21910, "Invalid From and To pair. From and To should be of the same channel"
        if from_.startswith("whatsapp:") and from_ != self.whatsapp_from:
            return 400, 63007, "Twilio could not find a Channel with the specified From address"
        if any(not url.startswith(("http://", "https://")) for url in media):
            return 400, 21620, "Invalid media URL(s)"
        if to.startswith("whatsapp:") and len(media) > 1:
            return 400, 21620, "A WhatsApp message can carry only one media item"
        if to.startswith("whatsapp:") and not content_sid:
            with self._cond:
                closed = _digits(to) in self._closed
            if closed:
                return 400, 63016, ("Failed to send freeform message because you are outside the allowed window. "
                                    "If you want to send messages outside this window, use a Template.")
        return None

    def _post_callbacks(self, sid: str, fields: dict[str, list[str]]) -> None:
        url = (fields.get("StatusCallback") or [""])[0]
        mapping = self._callback_map
        if not url or mapping is None or not url.startswith(mapping[0] + "/"):
            return
        statuses: tuple[str, ...] = ("sent", "delivered")
        code: int | None = None
        with self._cond:
            for scripted in list(self._statuses):
                if scripted[2] is None or scripted[2](fields):
                    self._statuses.remove(scripted)
                    statuses, code = scripted[0], scripted[1]
                    break
        local = mapping[1] + url[len(mapping[0]):]
        to = (fields.get("To") or [""])[0]
        task = asyncio.get_running_loop().create_task(self._post_all(url, local, sid, to, statuses, code))
        self._posting.add(task)
        task.add_done_callback(self._posting.discard)

    async def _post_all(self, public: str, local: str, sid: str, to: str, statuses: tuple[str, ...],
                        code: int | None) -> None:
        async with aiohttp.ClientSession() as session:
            for status in statuses:
                form = {"MessageSid": sid, "SmsSid": sid, "MessageStatus": status, "SmsStatus": status,
                        "AccountSid": self.account_sid, "From": self.whatsapp_from, "To": to,
                        "ApiVersion": API_VERSION, "ChannelPrefix": "whatsapp"}
                if status in ("failed", "undelivered") and code is not None:
                    form["ErrorCode"] = str(code)  # Twilio sends the code alone, no words
                headers = {"X-Twilio-Signature": self.sign(public, form)}
                try:
                    async with session.post(local, data=form, headers=headers) as resp:
                        answered = resp.status
                except aiohttp.ClientError:
                    answered = 0
                with self._cond:
                    self.callbacks.append(Callback(sid, status, code if status in ("failed", "undelivered") else None,
                                                   answered))
                self._notify()

    async def _handle_media(self, request: web.Request) -> web.StreamResponse:
        authorized = self._authorized(request, request.match_info["account"])
        with self._cond:
            media = self._media.get(request.path)
        if not authorized:
            response: web.StreamResponse = self._error(401, 20003, "Authenticate")
        elif media is None:
            response = self._error(404, 20404, "The requested resource was not found")
        elif media.redirect is not None:
            response = web.Response(status=307, headers={"Location": media.redirect})
        else:
            response = web.Response(body=media.data, content_type=media.content_type)
        self._record_fetch(request.path, authorized, response.status)
        return response

    async def _handle_cdn(self, request: web.Request) -> web.Response:
        with self._cond:
            media = self._cdn.get(request.match_info["key"])
        if media is None:
            response = web.Response(status=404, text="NoSuchKey")
        else:
            response = web.Response(body=media.data, content_type=media.content_type)
        # Pre-signed CDN URLs need no credentials: record whether any were sent anyway.
        self._record_fetch(request.path, "Authorization" in request.headers, response.status)
        return response

    def _record_fetch(self, path: str, authorized: bool, status: int) -> None:
        with self._cond:
            self.media_fetches.append(MediaFetch(path, authorized, status, time.monotonic()))
        self._notify()


def _digits(x: str) -> str:
    return "".join(c for c in x if c.isdigit())


def _same_number(a: str, b: str) -> bool:
    def digits(x: str) -> str:
        return "".join(c for c in x if c.isdigit())

    return digits(a) == digits(b)

