"""How Slack's requests reach Talon, by either of two doors, and what is done with each.

- **Events API over HTTP** (``SLACK_SIGNING_SECRET``): Slack POSTs events, interactions (button
  presses) and slash commands to ``TALON_SLACK_EVENTS_PATH`` on Talon's HTTP server. Every
  request is checked before anything is read from it: ``X-Slack-Signature`` must be the
  HMAC-SHA256 of ``v0:<timestamp>:<body>`` under the signing secret (compared in constant time,
  by slack-sdk's ``SignatureVerifier``), and ``X-Slack-Request-Timestamp`` within five minutes of
  now, so a captured request cannot be replayed later. A forged, stale or unsigned request gets
  401 and nothing else happens. The URL check (``url_verification``) is answered with its
  challenge, signed like the rest.
- **Socket Mode** (``SLACK_APP_TOKEN``, for a bot without a public URL): slack-sdk's
  ``SocketModeClient`` opens the websocket that ``apps.connections.open`` names (on
  ``SLACK_API_BASE_URL``), and the same three kinds of requests arrive as envelopes.

Nothing lost: an event is acknowledged (HTTP 200, or the envelope's ack) only after the message
is in the durable inbox; Slack redelivers what was not acknowledged, and the inbox drops the copy.
A button press is decided (in the approvals store) before it is acknowledged, and its outcome
shown after; a press that could not be decided is not acknowledged (Slack shows the person it
failed, and they press again).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web
from slack_sdk.signature import SignatureVerifier

log = logging.getLogger(__name__)

REPLAY_WINDOW_S = 60 * 5
MAX_BODY_BYTES = 512 * 1024

OnEvent = Callable[[dict[str, Any]], Awaitable[None]]
OnForm = Callable[[dict[str, str]], Awaitable[None]]
OnAction = Callable[[dict[str, Any]], Awaitable[Callable[[], Awaitable[None]] | None]]


class Verifier:
    """Slack's signature and replay window; ``ok`` never raises on what a client sent."""

    def __init__(self, secret: str, clock: Any = None) -> None:
        self._verifier = SignatureVerifier(secret, clock) if clock is not None else SignatureVerifier(secret)

    def ok(self, body: bytes, timestamp: str | None, signature: str | None) -> bool:
        if not timestamp or not signature or not timestamp.isdigit() or len(timestamp) > 12:
            return False
        return bool(self._verifier.is_valid(body=body, timestamp=timestamp, signature=signature))


class Dispatch:
    """What arrives, by either door: events, button presses, slash commands."""

    def __init__(self, *, on_event: OnEvent, on_action: OnAction, on_command: OnForm) -> None:
        self.on_event = on_event
        self.on_action = on_action
        self.on_command = on_command
        self._pressing: set[asyncio.Task[None]] = set()
        self.received = 0

    async def event(self, envelope: dict[str, Any]) -> None:
        if envelope.get("type") != "event_callback" or not isinstance(envelope.get("event"), dict):
            return
        self.received += 1
        await self.on_event(envelope["event"])

    async def interaction(self, payload: dict[str, Any]) -> None:
        """A button press: decided (in the store) before this returns, so before Slack is answered;
        showing the outcome runs after. Raises when it could not be decided (not acknowledged)."""
        if payload.get("type") != "block_actions":
            return
        show = await self.on_action(payload)
        if show is None:
            return
        task = asyncio.create_task(self._show(show))
        self._pressing.add(task)
        task.add_done_callback(self._pressing.discard)

    async def _show(self, show: Callable[[], Awaitable[None]]) -> None:
        try:
            await show()
        except Exception:  # the decision holds; a press on the prompt again shows it
            log.exception("slack: showing a button press's outcome failed")

    async def command(self, form: dict[str, str]) -> None:
        await self.on_command(form)

    async def close(self) -> None:
        for task in list(self._pressing):
            task.cancel()
        await asyncio.gather(*self._pressing, return_exceptions=True)


class HttpDoor:
    """The Events API endpoint on Talon's HTTP server."""

    def __init__(self, dispatch: Dispatch, verifier: Verifier) -> None:
        self.dispatch = dispatch
        self.verifier = verifier
        self.refused = 0

    async def handle(self, request: web.Request) -> web.Response:
        if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
            return web.Response(status=413, text="too large")
        body = await request.read()
        if len(body) > MAX_BODY_BYTES:
            return web.Response(status=413, text="too large")
        if not self.verifier.ok(body, request.headers.get("X-Slack-Request-Timestamp"),
                                request.headers.get("X-Slack-Signature")):
            self.refused += 1
            log.warning("slack: refused a request to %s from %s: bad or missing signature, or older than "
                        "five minutes", request.path, request.remote or "?")
            return web.Response(status=401, text="invalid signature")
        kind = request.content_type
        try:
            if kind == "application/json":
                data = json.loads(body)
                if not isinstance(data, dict):
                    raise ValueError("not an object")
                if data.get("type") == "url_verification":
                    return web.json_response({"challenge": str(data.get("challenge", ""))})
                await self.dispatch.event(data)
                return web.Response(status=200)
            form = dict(parse_qsl(body.decode("utf-8"), keep_blank_values=True))
        except (ValueError, UnicodeDecodeError):
            return web.Response(status=400, text="malformed body")
        if "payload" in form:
            try:
                payload = json.loads(form["payload"])
            except ValueError:
                return web.Response(status=400, text="malformed payload")
            if isinstance(payload, dict):
                try:
                    await self.dispatch.interaction(payload)
                except Exception:
                    log.exception("slack: a button press could not be decided; not acknowledged")
                    return web.Response(status=503, text="could not record the press; press again")
            return web.Response(status=200)
        if "command" in form:
            await self.dispatch.command(form)
            return web.Response(status=200)
        return web.Response(status=400, text="unknown request")


class SocketDoor:
    """Socket Mode: the websocket slack-sdk keeps open (and reopens) for us."""

    def __init__(self, dispatch: Dispatch, app_token: str, web_client: Any) -> None:
        from slack_sdk.socket_mode.aiohttp import SocketModeClient

        self.dispatch = dispatch
        self.client = SocketModeClient(app_token=app_token, web_client=web_client, auto_reconnect_enabled=True,
                                       ping_interval=10)
        self.client.socket_mode_request_listeners.append(self._on_request)

    async def _on_request(self, client: Any, request: Any) -> None:
        from slack_sdk.socket_mode.response import SocketModeResponse

        payload = request.payload if isinstance(request.payload, dict) else {}
        try:
            if request.type == "events_api":
                await self.dispatch.event(payload)
            elif request.type == "interactive":
                await self.dispatch.interaction(payload)
            elif request.type == "slash_commands":
                await self.dispatch.command({k: str(v) for k, v in payload.items()})
        except Exception:
            log.exception("slack: a Socket Mode %s request failed; not acknowledged (Slack sends it again)",
                          request.type)
            return
        await client.send_socket_mode_response(SocketModeResponse(envelope_id=request.envelope_id))

    async def connect(self) -> None:
        await self.client.connect()

    async def connected(self) -> bool:
        return bool(await self.client.is_connected())

    async def close(self) -> None:
        await self.client.close()
