"""Twilio's webhooks on Talon's HTTP server: incoming messages at ``TALON_WHATSAPP_WEBHOOK_PATH``
and status callbacks at ``<that path>/status``.

Every request must carry a valid ``X-Twilio-Signature`` (HMAC of ``TALON_PUBLIC_BASE_URL`` + path +
query and the form fields, keyed with ``TWILIO_AUTH_TOKEN``, checked with the twilio library's
``RequestValidator``) and our ``AccountSid``; otherwise it is refused with 403, never reaches the
agent and records nothing. A malformed webhook gets 400. A valid message is answered at once with
empty TwiML and the turn runs in the background (Twilio gives up after 15 s); the durable inbox
dedups by MessageSid. Before the message is handed on, the person's window is recorded as open and
what waited for it is sent (``window.py``). Senders not in ``TALON_WHATSAPP_ALLOWED_NUMBERS`` (nor
approved with ``talon pair``) are ignored; with ``TALON_PAIRING=true`` they get a pairing code. A
press of an approval button (``ButtonPayload``) is decided here and is not a turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from twilio.request_validator import RequestValidator

from talon.envelope import InboundMessage
from talon.errors import DeliveryError, MalformedWebhook, StoreUnavailable

from channels.base import BridgeHandle
from channels.whatsapp.api import TwilioApi
from channels.whatsapp.approvals import ApprovalPrompts
from channels.whatsapp.intake import button_press, parse_inbound
from channels.whatsapp.status import Receipts
from channels.whatsapp.window import Window

log = logging.getLogger("channels.whatsapp")

EMPTY_TWIML = '<?xml version="1.0" encoding="UTF-8"?>\n<Response/>'
CHANNEL = "whatsapp"


def _twiml() -> web.Response:
    return web.Response(text=EMPTY_TWIML, content_type="text/xml")


class Webhooks:
    def __init__(self, *, account_sid: str, auth_token: str, public_base_url: str, webhook_path: str,
                 insecure: bool, api: TwilioApi, window: Window, receipts: Receipts,
                 approvals: ApprovalPrompts) -> None:
        self.account_sid = account_sid
        self.public_base_url = public_base_url
        self.webhook_path = webhook_path
        self.status_path = webhook_path.rstrip("/") + "/status"
        self.insecure = insecure
        self.api = api
        self.window = window
        self.receipts = receipts
        self.approvals = approvals
        self._validator = RequestValidator(auth_token) if auth_token else None
        self._bridge: BridgeHandle | None = None
        self._sends: set[asyncio.Task[None]] = set()

    def bind(self, bridge: BridgeHandle) -> None:
        self._bridge = bridge

    async def stop(self) -> None:
        for task in self._sends:
            task.cancel()
        await asyncio.gather(*self._sends, return_exceptions=True)

    # --- authenticity -------------------------------------------------------------------------
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
                        "MessageSid=%.40s, peer=%s). If this was Twilio, TALON_PUBLIC_BASE_URL must be "
                        "exactly the URL configured in the Twilio console, without the path.",
                        what, sid, request.remote)
            raise web.HTTPForbidden(text="invalid signature")
        account = form.get("AccountSid", "")
        if account != self.account_sid:
            log.warning("whatsapp: %s for another account (AccountSid=%.40s) refused (403; MessageSid=%.40s)",
                        what, account or "<none>", sid)
            raise web.HTTPForbidden(text="wrong account")

    # --- incoming messages ----------------------------------------------------------------------
    async def on_webhook(self, request: web.Request) -> web.StreamResponse:
        if self._bridge is None:
            raise web.HTTPServiceUnavailable(text="not ready")  # Twilio retries
        form = await self._read_form(request)
        self._authentic(request, form, self.webhook_path, "webhook")
        if "MessageStatus" in form and "NumMedia" not in form:
            return await self._status(form)  # a status callback configured on the messaging URL
        try:
            message = parse_inbound(form)
            press = button_press(form)
        except MalformedWebhook as exc:
            log.warning("whatsapp: malformed webhook refused (400): %s (MessageSid=%.40s)", exc,
                        form.get("MessageSid") or "-")
            raise web.HTTPBadRequest(text=f"malformed webhook: {exc}") from None
        sender = form.get("From", "")
        if not sender.lower().startswith("whatsapp:"):
            log.warning("whatsapp: ignoring a non-WhatsApp message from %s (MessageSid=%s); point only "
                        "the WhatsApp sender's webhook at Talon", message.chat_id, message.message_id)
            return _twiml()
        if not await self._bridge.gate.allowed(CHANNEL, [message.chat_id]):
            pairing = await self._bridge.gate.request_pairing(CHANNEL, message.chat_id, message.sender_name or "")
            if pairing is None:
                log.warning("whatsapp: message from %s denied (MessageSid=%s); to allow them add %s to "
                            "TALON_WHATSAPP_ALLOWED_NUMBERS", message.chat_id, message.message_id, message.chat_id)
                return _twiml()
            log.warning("whatsapp: message from %s denied (MessageSid=%s); to allow them run `talon pair %s` "
                        "(or add %s to TALON_WHATSAPP_ALLOWED_NUMBERS)", message.chat_id, message.message_id,
                        pairing.code, message.chat_id)
            if pairing.reply is not None:
                chat, text = message.chat_id, pairing.reply
                self._background(lambda: self.api.send(chat, body=text, what="pairing code", kind="notice"),
                                 f"pairing code to {chat}")
            return _twiml()
        try:
            # The person wrote: the window is open from now (recorded before the message is queued,
            # so its answer is sent as free-form), and what waited for it goes first.
            await self.window.seen(message.chat_id, message.received_at)
        except StoreUnavailable as exc:
            log.warning("whatsapp: chat=%s: message %s: the window could not be recorded (%s); 503",
                        message.chat_id, message.message_id, exc)
            raise web.HTTPServiceUnavailable(text="the database is unavailable; try again",
                                             headers={"Retry-After": "5"}) from None
        self.window.kick(message.chat_id)
        if press is not None:
            chat, person, name = message.chat_id, message.sender_id, message.sender_name or ""
            self._background(lambda: self.approvals.on_press(chat, person, name, press),
                             f"approval button from {chat}")
            return _twiml()
        if not message.text.strip() and not message.files:
            log.info("whatsapp: chat=%s: message %s has no text or media (MessageType=%s); nothing to do",
                     message.chat_id, message.message_id, form.get("MessageType", "?"))
            return _twiml()
        return await self._submit(message)

    async def _submit(self, message: InboundMessage) -> web.StreamResponse:
        assert self._bridge is not None
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

    def _background(self, work: Callable[[], Awaitable[object]], what: str) -> None:
        """Run after the answer to the webhook: Twilio must have it at once."""

        async def run() -> None:
            try:
                await work()
            except (DeliveryError, StoreUnavailable) as exc:
                log.warning("whatsapp: %s failed: %s", what, exc)

        task = asyncio.create_task(run(), name=f"whatsapp-{what}")
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    # --- status callbacks ---------------------------------------------------------------------
    async def on_status(self, request: web.Request) -> web.StreamResponse:
        form = await self._read_form(request)
        self._authentic(request, form, self.status_path, "status callback")
        return await self._status(form)

    async def _status(self, form: Any) -> web.StreamResponse:
        try:
            await self.receipts.on_status(form)
        except StoreUnavailable as exc:
            log.warning("whatsapp: status callback not recorded (%s); 503 so that Twilio tries again", exc)
            raise web.HTTPServiceUnavailable(text="the database is unavailable; try again") from None
        return _twiml()
