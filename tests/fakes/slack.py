"""A loopback fake of Slack for driving slack-sdk's real ``AsyncWebClient`` and
``SocketModeClient``, and of Slack's side of the Events API (signed requests to the app).

Point the client at it with ``base_url=fake.api_url`` (``SLACK_API_BASE_URL``).

What it imitates, because Talon's behaviour depends on it:

- the Web API's wire format: ``POST /api/<method>``, arguments as JSON, form fields or the query
  string (slack-sdk uses each, by method); the token in ``Authorization: Bearer`` (or a ``token``
  field); answers are HTTP 200 with ``{"ok": false, "error": ...}`` for a refusal
  (``invalid_auth``, ``channel_not_found``, ``message_not_found``, ``cant_update_message``,
  ``msg_too_long``, ``invalid_blocks``, ``already_reacted``, ``no_reaction``), and
  **429 with ``Retry-After``** (seconds) and ``{"ok": false, "error": "ratelimited"}`` when scripted
  with ``rate_limit_next``;
- the methods Talon uses: ``auth.test``, ``chat.postMessage`` (with ``thread_ts`` and Block Kit
  ``blocks``), ``chat.update`` (only the bot's own messages; blocks kept unless given), ``chat.delete``,
  ``reactions.add``/``remove``, ``conversations.info``, ``users.info``, and the upload flow:
  ``files.getUploadURLExternal`` (a one-time upload URL on this server, the declared ``length``
  enforced), the bytes POSTed there, ``files.completeUploadExternal`` (the file shared into the
  channel/thread as a message with ``files``); ``apps.connections.open`` (an app-level token)
  gives a Socket Mode websocket on this server;
- people's files: ``add_file`` keeps bytes served at ``url_private_download`` only with the bot
  token as a Bearer header (anything else gets 403, as Slack answers a login page);
- Slack's side of the Events API: ``deliver`` POSTs an event, a button press or a slash command to
  the app's URL signed with the signing secret (``X-Slack-Signature``, ``X-Slack-Request-Timestamp``),
  retrying what was not answered 200 (``X-Slack-Retry-Num``) like Slack; over Socket Mode the same
  envelopes go down the websocket and wait for their ack.

Everything received is recorded as a :class:`Call`; the channels' messages (with every version of
an edited one) are in ``messages``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode

import aiohttp
from aiohttp import web

from tests.fakes import MAX_BODY_BYTES, LoopbackServer

__all__ = ["Call", "FakeSlack", "sign"]

TEXT_LIMIT = 40_000
SECTION_LIMIT = 3000
BOT_TOKEN = "xoxb-test-token"
APP_TOKEN = "xapp-test-token"
SIGNING_SECRET = "test-signing-secret"
BOT_USER = "UBOT0001"
BOT_ID = "BBOT0001"
TEAM = "T0TEAM01"
REACTION_NAMES = frozenset({"eyes", "white_check_mark", "thumbsup", "+1", "x", "hourglass"})


def sign(secret: str, body: bytes, timestamp: int | None = None) -> dict[str, str]:
    """The headers Slack puts on a request it sends: the v0 signature of ``v0:<ts>:<body>``."""
    ts = str(int(time.time()) if timestamp is None else timestamp)
    digest = hmac.new(secret.encode(), f"v0:{ts}:".encode() + body, hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": f"v0={digest}"}


@dataclass
class Call:
    method: str
    params: dict[str, Any]
    status: int = 200
    result: dict[str, Any] = field(default_factory=dict)
    retry_after: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and bool(self.result.get("ok"))


@dataclass
class Message:
    channel: str
    ts: str
    user: str
    text: str
    thread_ts: str | None = None
    blocks: list[Any] | None = None
    files: list[dict[str, Any]] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)
    bot: bool = False


class _Refuse(Exception):
    def __init__(self, error: str, status: int = 200, retry_after: int | None = None) -> None:
        super().__init__(error)
        self.error, self.status, self.retry_after = error, status, retry_after


class FakeSlack(LoopbackServer):
    def __init__(self, *, bot_token: str = BOT_TOKEN, app_token: str = APP_TOKEN,
                 signing_secret: str = SIGNING_SECRET) -> None:
        super().__init__()
        self.bot_token = bot_token
        self.app_token = app_token
        self.signing_secret = signing_secret
        self.calls: list[Call] = []
        self.messages: dict[tuple[str, str], Message] = {}
        self.reactions: dict[tuple[str, str], set[str]] = {}
        self.channels: dict[str, dict[str, Any]] = {}
        self.users: dict[str, dict[str, Any]] = {}
        self.files: dict[str, tuple[bytes, str, str]] = {}  # id -> (data, name, mimetype)
        self.uploads: dict[str, dict[str, Any]] = {}  # pending upload id -> {length, name, data}
        self.deliveries: list[tuple[str, int]] = []  # (kind, status) of what was sent to the app
        self._rate_limits: dict[str, list[int]] = {}
        self._ts = itertools.count(1)
        self._sockets: list[web.WebSocketResponse] = []
        self._acks: dict[str, asyncio.Event] = {}
        self.add_user(BOT_USER, "talon", bot=True)

    # --- setup ---------------------------------------------------------------------------------
    @property
    def api_url(self) -> str:
        return f"{self.root_url}/api/"

    def add_channel(self, channel: str, name: str, *, kind: str = "channel") -> None:
        with self._cond:
            self.channels[channel] = {"id": channel, "name": name, "is_im": kind == "im",
                                      "is_private": kind == "group", "is_mpim": kind == "mpim"}

    def add_user(self, user: str, name: str, *, admin: bool = False, bot: bool = False) -> None:
        with self._cond:
            self.users[user] = {"id": user, "name": name, "real_name": name.title(), "is_admin": admin,
                                "is_owner": False, "is_bot": bot, "profile": {"display_name": name}}

    def add_file(self, data: bytes, name: str, mimetype: str) -> dict[str, Any]:
        """A file a person shared: its entry as Slack puts it in a message's ``files``."""
        file_id = "F" + uuid.uuid4().hex[:10].upper()
        with self._cond:
            self.files[file_id] = (data, name, mimetype)
        url = f"{self.root_url}/files-pri/{TEAM}-{file_id}/download/{name}"
        return {"id": file_id, "name": name, "title": name, "mimetype": mimetype, "size": len(data),
                "url_private": url, "url_private_download": url, "mode": "hosted"}

    def rate_limit_next(self, method: str, retry_after: int = 1, *, times: int = 1) -> None:
        with self._cond:
            self._rate_limits.setdefault(method, []).extend([retry_after] * times)

    def new_ts(self) -> str:
        return f"{1_700_000_000 + next(self._ts)}.{next(self._ts):06d}"

    # --- what the tests read ---------------------------------------------------------------------
    def sent(self, method: str, channel: str | None = None) -> list[Call]:
        with self._cond:
            return [c for c in self.calls if c.method == method and c.ok
                    and (channel is None or c.params.get("channel") in (channel,) or c.params.get("channel_id") == channel)]

    def bot_messages(self, channel: str, thread_ts: str | None = None) -> list[Message]:
        with self._cond:
            return [m for m in self.messages.values() if m.channel == channel and m.bot
                    and (thread_ts is None or m.thread_ts == thread_ts)]

    def summary(self) -> str:
        with self._cond:
            return "\n".join(f"  {c.method} {c.status} {c.result.get('error', '')} "
                             f"{json.dumps(c.params, default=str)[:200]}" for c in self.calls[-40:])

    async def wait_for(self, method: str, predicate: Callable[[Call], bool] | None = None, count: int = 1,
                       timeout: float = 30.0) -> list[Call]:
        def check() -> list[Call] | None:
            found = [c for c in self.calls if c.method == method and c.ok and (predicate is None or predicate(c))]
            return found if len(found) >= count else None

        return await self._wait_until(check, timeout, lambda: f"waited for {count} x {method}:\n{self.summary()}")

    def wait_for_sync(self, method: str, predicate: Callable[[Call], bool] | None = None, count: int = 1,
                      timeout: float = 30.0) -> list[Call]:
        def check() -> list[Call] | None:
            found = [c for c in self.calls if c.method == method and c.ok and (predicate is None or predicate(c))]
            return found if len(found) >= count else None

        return self._wait_until_sync(check, timeout, lambda: f"waited for {count} x {method}:\n{self.summary()}")

    async def wait_until(self, check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
        return await self._wait_until(lambda: check() or None, timeout, lambda: f"waited for {what}:\n{self.summary()}")

    # --- Slack's side of the Events API --------------------------------------------------------------
    def message_event(self, channel: str, user: str, text: str, *, channel_type: str = "im",
                      thread_ts: str | None = None, files: list[dict[str, Any]] | None = None,
                      ts: str | None = None) -> dict[str, Any]:
        """A person's message: kept in the channel, and the ``event_callback`` Slack would send."""
        ts = ts or self.new_ts()
        escaped = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        escaped = escaped.replace(f"&lt;@{BOT_USER}&gt;", f"<@{BOT_USER}>")
        with self._cond:
            self.messages[(channel, ts)] = Message(channel, ts, user, escaped, thread_ts, files=files or [])
        event: dict[str, Any] = {"type": "message", "channel": channel, "user": user, "text": escaped, "ts": ts,
                                 "event_ts": ts, "channel_type": channel_type, "team": TEAM}
        if thread_ts:
            event["thread_ts"] = thread_ts
        if files:
            event["files"] = files
            event["subtype"] = "file_share"
        return self.envelope(event)

    def envelope(self, event: dict[str, Any]) -> dict[str, Any]:
        return {"token": "verification-token-unused", "team_id": TEAM, "api_app_id": "A0APP001", "event": event,
                "type": "event_callback", "event_id": "Ev" + uuid.uuid4().hex[:10].upper(),
                "event_time": int(time.time()), "authorizations": [{"user_id": BOT_USER, "is_bot": True}]}

    def button_press(self, channel: str, ts: str, action_id: str, user: str) -> dict[str, Any]:
        """A ``block_actions`` payload for pressing a button the message has (KeyError otherwise)."""
        with self._cond:
            message = self.messages[(channel, ts)]
            buttons = [el for block in message.blocks or [] if block.get("type") == "actions"
                       for el in block.get("elements", [])]
            [button] = [b for b in buttons if b.get("action_id") == action_id]
            name = self.users.get(user, {}).get("name", user)
        return {"type": "block_actions", "user": {"id": user, "username": name, "name": name, "team_id": TEAM},
                "api_app_id": "A0APP001", "team": {"id": TEAM}, "trigger_id": uuid.uuid4().hex,
                "container": {"type": "message", "message_ts": ts, "channel_id": channel},
                "channel": {"id": channel}, "message": {"ts": ts, "thread_ts": message.thread_ts, "text": message.text},
                "response_url": f"{self.root_url}/respond/{uuid.uuid4().hex}",
                "actions": [{"action_id": action_id, "block_id": "b", "value": button.get("value"), "type": "button",
                             "action_ts": str(time.time())}]}

    def slash_command(self, channel: str, user: str, command: str, text: str = "") -> dict[str, str]:
        return {"command": command, "text": text, "user_id": user, "channel_id": channel, "team_id": TEAM,
                "trigger_id": uuid.uuid4().hex, "response_url": f"{self.root_url}/respond/{uuid.uuid4().hex}"}

    @staticmethod
    def encode(kind: str, body: dict[str, Any]) -> tuple[bytes, str]:
        if kind == "event":
            return json.dumps(body).encode(), "application/json"
        if kind == "interactive":
            return urlencode({"payload": json.dumps(body)}).encode(), "application/x-www-form-urlencoded"
        return urlencode(body).encode(), "application/x-www-form-urlencoded"

    async def deliver(self, url: str, kind: str, body: dict[str, Any], *, tries: int = 4,
                      headers: dict[str, str] | None = None) -> int:
        """Send to the app's Request URL as Slack does (signed; retried up to ``tries`` times, with
        ``X-Slack-Retry-Num``, until answered 200). ``headers`` replaces the signature (forgeries)."""
        data, content_type = self.encode(kind, body)
        status = 0
        async with aiohttp.ClientSession() as session:
            for attempt in range(tries):
                sent = dict(headers) if headers is not None else sign(self.signing_secret, data)
                sent["Content-Type"] = content_type
                if attempt:
                    sent["X-Slack-Retry-Num"] = str(attempt)
                    sent["X-Slack-Retry-Reason"] = "http_error"
                try:
                    async with session.post(url, data=data, headers=sent) as resp:
                        status = resp.status
                        await resp.read()
                except aiohttp.ClientError:
                    status = 0
                with self._cond:
                    self.deliveries.append((kind, status))
                self._notify()
                if status == 200:
                    return status
                await asyncio.sleep(0.2 * (attempt + 1))
        return status

    def deliver_sync(self, url: str, kind: str, body: dict[str, Any], **kw: Any) -> int:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(self.deliver(url, kind, body, **kw), self._loop).result(60)

    async def push_socket(self, kind: str, body: dict[str, Any], timeout: float = 30.0) -> None:
        """Over Socket Mode: one envelope to a connected client; returns once it is acknowledged."""
        if not self._in_server_loop():
            assert self._loop is not None
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.push_socket(kind, body, timeout),
                                                                       self._loop))
            return
        socket_type = {"event": "events_api", "interactive": "interactive", "command": "slash_commands"}[kind]
        envelope_id = uuid.uuid4().hex
        acked = self._acks[envelope_id] = asyncio.Event()
        deadline = time.monotonic() + timeout
        while not [ws for ws in self._sockets if not ws.closed]:
            if time.monotonic() > deadline:
                raise TimeoutError("no Socket Mode connection")
            await asyncio.sleep(0.05)
        ws = [ws for ws in self._sockets if not ws.closed][-1]
        await ws.send_json({"envelope_id": envelope_id, "type": socket_type, "payload": body,
                            "accepts_response_payload": kind != "event", "retry_attempt": 0, "retry_reason": ""})
        await asyncio.wait_for(acked.wait(), timeout)

    def socket_connected(self) -> bool:
        return any(not ws.closed for ws in self._sockets)

    # --- the server ------------------------------------------------------------------------------
    def _make_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_route("*", "/api/{method}", self._api)  # Slack takes GET and POST alike
        app.router.add_post("/upload/{upload_id}", self._upload)
        app.router.add_get("/files-pri/{path:.+}", self._file)
        app.router.add_get("/link/", self._socket)
        return app

    async def _args(self, request: web.Request) -> tuple[dict[str, Any], str | None]:
        args: dict[str, Any] = dict(request.query)
        raw = await request.read()
        if request.content_type == "application/json" and raw:
            body = json.loads(raw)
            if isinstance(body, dict):
                args.update(body)
        elif raw:
            args.update(dict(parse_qsl(raw.decode(), keep_blank_values=True)))
        auth = request.headers.get("Authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else args.pop("token", None)
        for key in ("blocks", "files"):
            if isinstance(args.get(key), str):
                args[key] = json.loads(args[key])
        return args, token

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        args, token = await self._args(request)
        call = Call(method, args)
        try:
            with self._cond:
                waits = self._rate_limits.get(method)
                if waits:
                    raise _Refuse("ratelimited", 429, waits.pop(0))
            expected = self.app_token if method == "apps.connections.open" else self.bot_token
            if token != expected:
                raise _Refuse("invalid_auth" if token else "not_authed")
            handler = getattr(self, "_m_" + method.replace(".", "_"), None)
            if handler is None:
                raise _Refuse("unknown_method", 404)
            with self._cond:
                call.result = {"ok": True, **handler(args)}
        except _Refuse as exc:
            call.status, call.result = exc.status, {"ok": False, "error": exc.error}
            call.retry_after = exc.retry_after
        with self._cond:
            self.calls.append(call)
        self._notify()
        headers = {"Retry-After": str(call.retry_after)} if call.retry_after is not None else {}
        return web.json_response(call.result, status=call.status, headers=headers)

    # --- methods (run under the lock) ---------------------------------------------------------------
    def _channel(self, args: dict[str, Any], key: str = "channel") -> str:
        channel = args.get(key)
        if not isinstance(channel, str) or channel not in self.channels:
            raise _Refuse("channel_not_found")
        return channel

    def _m_auth_test(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"url": "https://talon-test.slack.com/", "team": "Talon Test", "user": "talon", "team_id": TEAM,
                "user_id": BOT_USER, "bot_id": BOT_ID, "is_enterprise_install": False}

    def _check_text(self, args: dict[str, Any]) -> str:
        text = args.get("text")
        blocks = args.get("blocks")
        if not text and not blocks:
            raise _Refuse("no_text")
        if isinstance(text, str) and len(text) > TEXT_LIMIT:
            raise _Refuse("msg_too_long")
        if blocks is not None:
            self._check_blocks(blocks)
        return str(text or "")

    def _check_blocks(self, blocks: Any) -> None:
        if not isinstance(blocks, list) or len(blocks) > 50:
            raise _Refuse("invalid_blocks")
        for block in blocks:
            if not isinstance(block, dict) or block.get("type") not in ("section", "actions", "context", "divider"):
                raise _Refuse("invalid_blocks")
            text = (block.get("text") or {}).get("text", "")
            if len(text) > SECTION_LIMIT:
                raise _Refuse("invalid_blocks")
            ids = [el.get("action_id") for el in block.get("elements", []) if isinstance(el, dict)]
            if block.get("type") == "actions" and (len(ids) != len(set(ids)) or len(ids) > 25):
                raise _Refuse("invalid_blocks")

    def _m_chat_postMessage(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(args)
        text = self._check_text(args)
        thread = args.get("thread_ts") or None
        ts = self.new_ts()
        message = Message(channel, ts, BOT_USER, text, thread, blocks=args.get("blocks"), versions=[text], bot=True)
        self.messages[(channel, ts)] = message
        return {"channel": channel, "ts": ts, "message": {"type": "message", "text": text, "user": BOT_USER,
                                                        "bot_id": BOT_ID, "ts": ts}}

    def _own(self, args: dict[str, Any]) -> Message:
        channel = self._channel(args)
        message = self.messages.get((channel, str(args.get("ts"))))
        if message is None:
            raise _Refuse("message_not_found")
        if not message.bot:
            raise _Refuse("cant_update_message")
        return message

    def _m_chat_update(self, args: dict[str, Any]) -> dict[str, Any]:
        message = self._own(args)
        text = self._check_text(args) if args.get("text") or args.get("blocks") else message.text
        message.text = text
        message.versions.append(text)
        if "blocks" in args:
            message.blocks = args["blocks"]
        return {"channel": message.channel, "ts": message.ts, "text": text}

    def _m_chat_delete(self, args: dict[str, Any]) -> dict[str, Any]:
        message = self._own(args)
        del self.messages[(message.channel, message.ts)]
        return {"channel": message.channel, "ts": message.ts}

    def _reaction_target(self, args: dict[str, Any]) -> tuple[tuple[str, str], str]:
        channel = self._channel(args)
        key = (channel, str(args.get("timestamp")))
        if key not in self.messages:
            raise _Refuse("message_not_found")
        name = str(args.get("name", ""))
        if name not in REACTION_NAMES:
            raise _Refuse("invalid_name")
        return key, name

    def _m_reactions_add(self, args: dict[str, Any]) -> dict[str, Any]:
        key, name = self._reaction_target(args)
        have = self.reactions.setdefault(key, set())
        if name in have:
            raise _Refuse("already_reacted")
        have.add(name)
        return {}

    def _m_reactions_remove(self, args: dict[str, Any]) -> dict[str, Any]:
        key, name = self._reaction_target(args)
        if name not in self.reactions.get(key, set()):
            raise _Refuse("no_reaction")
        self.reactions[key].discard(name)
        return {}

    def _m_conversations_info(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"channel": self.channels[self._channel(args)]}

    def _m_users_info(self, args: dict[str, Any]) -> dict[str, Any]:
        user = self.users.get(str(args.get("user")))
        if user is None:
            raise _Refuse("user_not_found")
        return {"user": user}

    def _m_files_getUploadURLExternal(self, args: dict[str, Any]) -> dict[str, Any]:
        try:
            length = int(args.get("length", ""))
        except ValueError:
            raise _Refuse("invalid_arguments") from None
        if not args.get("filename") or length <= 0:
            raise _Refuse("invalid_arguments")
        file_id = "F" + uuid.uuid4().hex[:10].upper()
        self.uploads[file_id] = {"length": length, "name": args["filename"], "data": None}
        return {"upload_url": f"{self.root_url}/upload/{file_id}", "file_id": file_id}

    def _m_files_completeUploadExternal(self, args: dict[str, Any]) -> dict[str, Any]:
        files = args.get("files")
        if not isinstance(files, list) or not files:
            raise _Refuse("invalid_arguments")
        channel = self._channel(args, "channel_id") if args.get("channel_id") else None
        done = []
        for item in files:
            upload = self.uploads.get(str(item.get("id")))
            if upload is None or upload["data"] is None:
                raise _Refuse("file_not_found")
            if len(upload["data"]) != upload["length"]:
                raise _Refuse("file_upload_size_mismatch")
            self.files[item["id"]] = (upload["data"], upload["name"], "application/octet-stream")
            done.append({"id": item["id"], "title": item.get("title") or upload["name"], "name": upload["name"],
                         "size": len(upload["data"])})
        if channel is not None:
            ts = self.new_ts()
            comment = str(args.get("initial_comment") or "")
            self.messages[(channel, ts)] = Message(channel, ts, BOT_USER, comment, args.get("thread_ts") or None,
                                                   files=done, versions=[comment], bot=True)
        return {"files": done}

    def _m_apps_connections_open(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"url": f"ws://{self.host}:{self.port}/link/?ticket={uuid.uuid4().hex}"}

    # --- uploads, files, the socket -----------------------------------------------------------------
    async def _upload(self, request: web.Request) -> web.Response:
        upload_id = request.match_info["upload_id"]
        data = await request.read()
        with self._cond:
            upload = self.uploads.get(upload_id)
            if upload is None or upload["data"] is not None:
                return web.Response(status=404, text="unknown upload")
            upload["data"] = data
        self._notify()
        return web.Response(status=200, text=f"OK - {len(data)}")

    async def _file(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {self.bot_token}":
            return web.Response(status=403, text="<html>sign in</html>", content_type="text/html")
        file_id = request.match_info["path"].split("/")[0].split("-")[-1]
        with self._cond:
            found = self.files.get(file_id)
        if found is None:
            return web.Response(status=404)
        data, _, mimetype = found
        return web.Response(body=data, content_type=mimetype)

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        with self._cond:
            self._sockets.append(ws)
        self._notify()
        await ws.send_json({"type": "hello", "num_connections": len(self._sockets),
                            "connection_info": {"app_id": "A0APP001"}})
        async for msg in ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            try:
                ack = json.loads(msg.data)
            except ValueError:
                continue
            event = self._acks.pop(str(ack.get("envelope_id")), None) if isinstance(ack, dict) else None
            if event is not None:
                event.set()
        return ws

    async def stop(self) -> None:
        for ws in list(self._sockets):
            if not ws.closed:
                await ws.close()
        await super().stop()

