"""A loopback fake of Discord, REST and gateway, for driving the real discord.py client.

Point discord.py at it with ``DISCORD_API_BASE_URL=fake.api_url``; the gateway's address comes
from ``GET /gateway/bot``, as on the real platform.

What it imitates, because Talon's behaviour depends on it:

- **REST** under ``/api/v10`` with ``Authorization: Bot <token>`` (401 ``{"code": 0}`` otherwise):
  ``GET /users/@me``, ``GET /oauth2/applications/@me``, ``GET /gateway/bot``, messages (``POST`` as JSON or multipart with
  ``payload_json`` and ``files[n]``; ``PATCH`` only the bot's own: 403 code 50005 otherwise;
  ``DELETE``), reactions (``PUT``/``DELETE .../reactions/{emoji}/@me``), typing, interaction
  application commands (``PUT /applications/{id}/commands``, the bulk overwrite, each command
  checked and recorded in ``commands``; ``slash_command`` builds the APPLICATION_COMMAND
  interaction a person's use sends over the gateway), interaction
  callbacks (authorized by the token in their path; one per interaction: 400 code 40060 for a
  second; with ``with_response`` the callback response object, else 204), attachments served at their URL.
  Discord's error shape ``{"code", "message"}``: 404 10003 Unknown Channel, 404 10008 Unknown
  Message, 400 50035 Invalid Form Body (over 2,000 characters, empty message), 413 for a file over
  the upload limit.
- **Rate limits**: every route has a bucket (``X-RateLimit-Bucket``, ``-Limit``, ``-Remaining``,
  ``-Reset-After``, counted for real over ``BUCKET_WINDOW_S``); ``rate_limit_next`` scripts a 429
  with ``retry_after`` in the body (and ``Retry-After``, ``X-RateLimit-Scope``).
- **The gateway** websocket: HELLO (op 10), IDENTIFY (op 2; a wrong token closes with 4004, a
  missing intent the bot relies on leaves message content empty as Discord does), READY then
  GUILD_CREATE for each server, HEARTBEAT (op 1) answered by HEARTBEAT_ACK (op 11), RESUME (op 6),
  and the dispatches the tests push (``MESSAGE_CREATE``, ``INTERACTION_CREATE``...), each with the
  next sequence number; frames compressed as the client asked (``zstd-stream``, ``zlib-stream``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes import MAX_BODY_BYTES, LoopbackServer

__all__ = ["FakeDiscord"]

TOKEN = "discord-test-token"
BOT_ID = 900000000000000001
APP_ID = 900000000000000002
TEXT_LIMIT = 2000
UPLOAD_LIMIT = 10 * 1024 * 1024
BUCKET_LIMIT = 50
BUCKET_WINDOW_S = 1.0
DISCORD_EPOCH_MS = 1420070400000
MESSAGE_CONTENT = 1 << 15
ADMINISTRATOR = 1 << 3


@dataclass
class Call:
    method: str
    path: str
    route: str
    body: dict[str, Any]
    status: int = 200
    result: Any = None
    files: list[tuple[str, bytes]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status < 300


@dataclass
class Message:
    channel_id: int
    id: int
    author: dict[str, Any]
    content: str
    components: list[Any] = field(default_factory=list)
    attachments: list[dict[str, Any]] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)
    reference: int | None = None

    @property
    def bot(self) -> bool:
        return int(self.author["id"]) == BOT_ID


class _Refuse(Exception):
    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class _Socket:
    def __init__(self, ws: web.WebSocketResponse, compress: str) -> None:
        self.ws = ws
        self.compress = compress
        self.seq = 0
        self.identified = False
        self.intents = 0
        if compress == "zstd-stream":
            import zstandard

            self._zstd = zstandard.ZstdCompressor().compressobj()
            self._flush = zstandard.COMPRESSOBJ_FLUSH_BLOCK
        elif compress == "zlib-stream":
            self._zlib = zlib.compressobj()

    async def send(self, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        if self.compress == "zstd-stream":
            await self.ws.send_bytes(self._zstd.compress(data) + self._zstd.flush(self._flush))
        elif self.compress == "zlib-stream":
            await self.ws.send_bytes(self._zlib.compress(data) + self._zlib.flush(zlib.Z_SYNC_FLUSH))
        else:
            await self.ws.send_str(data.decode())


class FakeDiscord(LoopbackServer):
    def __init__(self, *, token: str = TOKEN) -> None:
        super().__init__()
        self.token = token
        self.calls: list[Call] = []
        self.messages: dict[tuple[int, int], Message] = {}
        self.nonces: dict[str, tuple[int, int]] = {}  # enforced nonces: the message each created
        self.reactions: dict[tuple[int, int], set[str]] = {}
        self.guilds: dict[int, dict[str, Any]] = {}
        self.channels: dict[int, dict[str, Any]] = {}
        self.users: dict[int, dict[str, Any]] = {}
        self.members: dict[tuple[int, int], list[int]] = {}  # (guild, user) -> role ids
        self.files: dict[str, tuple[bytes, str]] = {}
        self.interaction_answers: dict[int, list[dict[str, Any]]] = {}
        self.commands: list[dict[str, Any]] = []  # the application's global commands (bulk overwrite)
        self.command_puts = 0
        self._interaction_types: dict[int, int] = {}
        self.gateway_events: list[dict[str, Any]] = []  # what clients sent on the gateway
        self._interaction_tokens: dict[int, str] = {}
        self._rate_limits: dict[str, list[float]] = {}
        self._buckets: dict[str, list[float]] = {}
        self._sockets: list[_Socket] = []
        self._counter = itertools.count(1)
        self.bot = self.add_user(BOT_ID, "talon", bot=True)

    # --- setup -----------------------------------------------------------------------------------
    @property
    def api_url(self) -> str:
        return f"{self.root_url}/api/v10"

    def snowflake(self) -> int:
        return ((int(time.time() * 1000) - DISCORD_EPOCH_MS) << 22) | (next(self._counter) & 0x3FFFFF)

    def add_user(self, user_id: int, name: str, *, bot: bool = False) -> dict[str, Any]:
        user = {"id": str(user_id), "username": name, "discriminator": "0", "global_name": name.title(),
                "avatar": None, "bot": bot}
        with self._cond:
            self.users[user_id] = user
        return user

    def add_guild(self, guild_id: int, name: str, *, admins: tuple[int, ...] = ()) -> None:
        admin_role = guild_id + 1
        with self._cond:
            self.guilds[guild_id] = {"id": str(guild_id), "name": name, "roles": [
                {"id": str(guild_id), "name": "@everyone", "permissions": str(1 << 10 | 1 << 11), "position": 0,
                 "color": 0, "hoist": False, "managed": False, "mentionable": False},
                {"id": str(admin_role), "name": "admin", "permissions": str(ADMINISTRATOR), "position": 1,
                 "color": 0, "hoist": False, "managed": False, "mentionable": False}]}
            for user in admins:
                self.members[(guild_id, user)] = [admin_role]

    def add_channel(self, channel_id: int, name: str, *, guild_id: int | None = None,
                    parent_id: int | None = None, recipient: int | None = None) -> None:
        """A server text channel, a thread (``parent_id``) or a direct message channel (``recipient``)."""
        with self._cond:
            if recipient is not None:
                self.channels[channel_id] = {"id": str(channel_id), "type": 1,
                                             "recipients": [self.users[recipient]], "last_message_id": None}
            elif parent_id is not None:
                self.channels[channel_id] = {"id": str(channel_id), "type": 11, "name": name, "guild_id": str(guild_id),
                                             "parent_id": str(parent_id), "owner_id": str(BOT_ID),
                                             "thread_metadata": {"archived": False, "auto_archive_duration": 1440,
                                                                 "archive_timestamp": _iso(), "locked": False},
                                             "message_count": 0, "member_count": 1}
            else:
                self.channels[channel_id] = {"id": str(channel_id), "type": 0, "name": name, "guild_id": str(guild_id),
                                             "position": 0, "permission_overwrites": [], "nsfw": False,
                                             "parent_id": None}

    def add_attachment(self, channel_id: int, data: bytes, filename: str, content_type: str) -> dict[str, Any]:
        attachment_id = self.snowflake()
        key = f"{channel_id}/{attachment_id}/{filename}"
        with self._cond:
            self.files[key] = (data, content_type)
        return {"id": str(attachment_id), "filename": filename, "size": len(data), "content_type": content_type,
                "url": f"{self.root_url}/attachments/{key}", "proxy_url": f"{self.root_url}/attachments/{key}"}

    def rate_limit_next(self, route: str, retry_after: float = 1.0, *, times: int = 1) -> None:
        """``route`` like ``POST /channels/{channel_id}/messages``."""
        with self._cond:
            self._rate_limits.setdefault(route, []).extend([retry_after] * times)

    # --- what tests read ---------------------------------------------------------------------------
    def bot_messages(self, channel_id: int) -> list[Message]:
        with self._cond:
            return sorted((m for m in self.messages.values() if m.channel_id == channel_id and m.bot),
                          key=lambda m: m.id)

    def texts(self, channel_id: int) -> list[str]:
        return [m.content for m in self.bot_messages(channel_id) if m.content]

    def summary(self) -> str:
        with self._cond:
            return "\n".join(f"  {c.method} {c.path} {c.status} {json.dumps(c.body, default=str)[:160]}"
                             for c in self.calls[-40:])

    async def wait_until(self, check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
        return await self._wait_until(lambda: check() or None, timeout, lambda: f"waited for {what}:\n{self.summary()}")

    def wait_until_sync(self, check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
        return self._wait_until_sync(lambda: check() or None, timeout, lambda: f"waited for {what}:\n{self.summary()}")

    def connected(self) -> bool:
        return any(s.identified and not s.ws.closed for s in self._sockets)

    # --- the gateway: what people do ---------------------------------------------------------------------
    def message_create(self, channel_id: int, user_id: int, content: str, *,
                       attachments: list[dict[str, Any]] | None = None, mentions: tuple[int, ...] = (),
                       reply_to: int | None = None) -> dict[str, Any]:
        channel = self.channels[channel_id]
        message_id = self.snowflake()
        data: dict[str, Any] = {
            "id": str(message_id), "channel_id": str(channel_id), "author": self.users[user_id], "content": content,
            "timestamp": _iso(), "edited_timestamp": None, "tts": False, "mention_everyone": False,
            "mentions": [self.users[m] for m in mentions], "mention_roles": [], "attachments": attachments or [],
            "embeds": [], "pinned": False, "type": 19 if reply_to else 0, "flags": 0, "components": [],
        }
        if reply_to is not None:
            data["message_reference"] = {"message_id": str(reply_to), "channel_id": str(channel_id)}
        guild_id = channel.get("guild_id")
        if guild_id is not None:
            data["guild_id"] = guild_id
            data["member"] = self._member(int(guild_id), user_id, with_user=False)
        with self._cond:
            self.messages[(channel_id, message_id)] = Message(channel_id, message_id, self.users[user_id], content,
                                                              attachments=attachments or [], versions=[content])
        return data

    def button_press(self, channel_id: int, message_id: int, custom_id: str, user_id: int) -> dict[str, Any]:
        with self._cond:
            message = self.messages[(channel_id, message_id)]
            ids = [c.get("custom_id") for row in message.components for c in row.get("components", [])]
            if custom_id not in ids:
                raise KeyError(f"the message has no button {custom_id!r}: {ids}")
            channel = self.channels[channel_id]
        interaction_id = self.snowflake()
        token = uuid.uuid4().hex
        with self._cond:
            self._interaction_tokens[interaction_id] = token
        data: dict[str, Any] = {
            "id": str(interaction_id), "application_id": str(APP_ID), "type": 3, "token": token, "version": 1,
            "data": {"custom_id": custom_id, "component_type": 2}, "channel_id": str(channel_id),
            "channel": {k: v for k, v in channel.items() if k != "recipients"},
            "message": self._message_json(message), "locale": "en-US", "app_permissions": "0",
            "entitlements": [], "authorizing_integration_owners": {}, "context": 0,
            "attachment_size_limit": UPLOAD_LIMIT,
        }
        return self._invoked_by(data, channel, user_id)

    def _invoked_by(self, data: dict[str, Any], channel: dict[str, Any], user_id: int) -> dict[str, Any]:
        """Who an interaction is from, as Discord says it: in a server a ``member`` with its
        ``user`` (and the server), in a direct message the ``user``."""
        guild_id = channel.get("guild_id")
        if guild_id is not None:
            data["guild_id"] = guild_id
            data["guild_locale"] = "en-US"
            data["member"] = self._member(int(guild_id), user_id, with_user=True)
        else:
            data["user"] = self.users[user_id]
        return data

    def slash_command(self, channel_id: int, name: str, user_id: int) -> dict[str, Any]:
        """An APPLICATION_COMMAND interaction (type 2) for a registered chat-input command, as the
        gateway's INTERACTION_CREATE carries it (in a server: ``member`` with its ``user``; in a
        direct message: ``user``)."""
        with self._cond:
            command = next((c for c in self.commands if c["name"] == name), None)
            if command is None:
                raise KeyError(f"no registered command /{name}: {[c['name'] for c in self.commands]}")
            channel = self.channels[channel_id]
        interaction_id = self.snowflake()
        token = uuid.uuid4().hex
        with self._cond:
            self._interaction_tokens[interaction_id] = token
            self._interaction_types[interaction_id] = 2
        data: dict[str, Any] = {
            "id": str(interaction_id), "application_id": str(APP_ID), "type": 2, "token": token, "version": 1,
            "data": {"id": command["id"], "name": name, "type": 1}, "channel_id": str(channel_id),
            "channel": {k: v for k, v in channel.items() if k != "recipients"}, "locale": "en-US",
            "app_permissions": "0", "entitlements": [], "authorizing_integration_owners": {"0": str(channel_id)},
            "context": 1 if channel.get("type") == 1 else 0, "attachment_size_limit": UPLOAD_LIMIT,
        }
        return self._invoked_by(data, channel, user_id)

    def _put_commands(self, app: str, body: Any) -> tuple[int, Any]:
        """The bulk overwrite: the whole list replaced, each command checked as Discord does."""
        if app != str(APP_ID):
            raise _Refuse(404, 10002, "Unknown Application")
        if not isinstance(body, list) or len(body) > 100:
            raise _Refuse(400, 50035, "Invalid Form Body")
        made = []
        for command in body:
            name, what = command.get("name", ""), command.get("description", "")
            if not (1 <= len(name) <= 32 and name == name.lower() and name.replace("-", "").replace("_", "").isalnum()
                    and 1 <= len(what) <= 100 and command.get("type", 1) == 1):
                raise _Refuse(400, 50035, f"Invalid Form Body (command {name!r})")
            made.append({**command, "id": str(self.snowflake()), "application_id": str(APP_ID), "version": "1",
                         "default_member_permissions": None, "nsfw": False, "type": 1})
        self.commands = made
        self.command_puts += 1
        return 200, made

    def _member(self, guild_id: int, user_id: int, *, with_user: bool) -> dict[str, Any]:
        roles = self.members.get((guild_id, user_id), [])
        permissions = ADMINISTRATOR if roles else 0
        member: dict[str, Any] = {"roles": [str(r) for r in roles], "joined_at": _iso(), "deaf": False,
                                  "mute": False, "flags": 0, "nick": None, "permissions": str(permissions)}
        if with_user:
            member["user"] = self.users[user_id]
        return member

    async def dispatch(self, event: str, data: dict[str, Any]) -> None:
        """Send a dispatch (op 0) to every identified gateway connection."""
        if not self._in_server_loop():
            assert self._loop is not None
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.dispatch(event, data), self._loop))
            return
        live = [s for s in self._sockets if s.identified and not s.ws.closed]
        if not live:
            raise RuntimeError("no gateway connection to dispatch to")
        for sock in live:
            payload = data
            if event == "MESSAGE_CREATE" and not sock.intents & MESSAGE_CONTENT and payload.get("guild_id") and not any(
                    int(m["id"]) == BOT_ID for m in payload.get("mentions", [])):
                payload = {**payload, "content": "", "attachments": [], "embeds": []}
            sock.seq += 1
            await sock.send({"op": 0, "t": event, "s": sock.seq, "d": payload})

    def dispatch_sync(self, event: str, data: dict[str, Any]) -> None:
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self.dispatch(event, data), self._loop).result(30)

    # --- the server ----------------------------------------------------------------------------------
    def _make_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_route("*", "/api/v10/{path:.+}", self._rest)
        app.router.add_get("/attachments/{key:.+}", self._attachment)
        app.router.add_get("/gateway", self._gateway)
        return app

    def _json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> web.Response:
        if status == 204:
            return web.Response(status=204, headers={**(headers or {}), "Via": "1.1 google"})
        # Exactly "application/json", as Discord sends it (discord.py compares the header whole).
        # Discord answers through its proxy: a Via header (discord.py takes a 429 without one for a
        # Cloudflare ban and does not retry it).
        return web.Response(body=json.dumps(body).encode(), status=status,
                            headers={**(headers or {}), "Content-Type": "application/json", "Via": "1.1 google"})

    async def _rest(self, request: web.Request) -> web.Response:
        path = "/" + request.match_info["path"]
        route = _route(request.method, path)
        body: dict[str, Any] = {}
        files: list[tuple[str, bytes]] = []
        if request.content_type == "multipart/form-data":
            reader = await request.multipart()
            async for part in reader:  # type: ignore[union-attr]
                if part.name == "payload_json":
                    body = json.loads(await part.text())  # type: ignore[union-attr]
                elif part.name and part.name.startswith("files["):
                    files.append((part.filename or "file", bytes(await part.read())))  # type: ignore[union-attr]
        elif request.can_read_body:
            raw = await request.read()
            body = json.loads(raw) if raw else {}
        call = Call(request.method, path, route, body, files=files)
        bucket = f"bucket-{abs(hash(route)) % 10**8:08d}"
        headers: dict[str, str] = {}
        try:
            with self._cond:
                waits = self._rate_limits.get(route)
                if waits:
                    retry = waits.pop(0)
                    headers = {"Retry-After": str(int(retry + 0.999)), "X-RateLimit-Bucket": bucket,
                               "X-RateLimit-Limit": str(BUCKET_LIMIT), "X-RateLimit-Remaining": "0",
                               "X-RateLimit-Reset-After": f"{retry:.3f}", "X-RateLimit-Scope": "user"}
                    raise _RateLimited(retry)
            # Interaction callbacks are authorized by the token in their path, not the bot token.
            if not path.startswith("/interactions/") and request.headers.get("Authorization") != f"Bot {self.token}":
                raise _Refuse(401, 0, "401: Unauthorized")
            with self._cond:
                headers = self._bucket_headers(bucket)
                call.status, call.result = self._handle(request.method, path, body, files,
                                                        with_response=request.query.get("with_response") in ("1", "true"))
        except _RateLimited as exc:
            call.status, call.result = 429, {"message": "You are being rate limited.", "retry_after": exc.retry_after,
                                             "global": False}
        except _Refuse as exc:
            call.status, call.result = exc.status, {"code": exc.code, "message": exc.message}
        with self._cond:
            self.calls.append(call)
        self._notify()
        return self._json(call.status, call.result, headers)

    def _bucket_headers(self, bucket: str) -> dict[str, str]:
        now = time.monotonic()
        used = [t for t in self._buckets.get(bucket, []) if now - t < BUCKET_WINDOW_S]
        if len(used) >= BUCKET_LIMIT:
            raise _RateLimited(BUCKET_WINDOW_S - (now - used[0]))
        used.append(now)
        self._buckets[bucket] = used
        reset = BUCKET_WINDOW_S - (now - used[0])
        return {"X-RateLimit-Bucket": bucket, "X-RateLimit-Limit": str(BUCKET_LIMIT),
                "X-RateLimit-Remaining": str(BUCKET_LIMIT - len(used)), "X-RateLimit-Reset-After": f"{reset:.3f}"}

    def _handle(self, method: str, path: str, body: dict[str, Any], files: list[tuple[str, bytes]], *,
                with_response: bool = False) -> tuple[int, Any]:
        parts = path.strip("/").split("/")
        if method == "GET" and path == "/users/@me":
            return 200, {**self.bot, "verified": True, "mfa_enabled": False, "flags": 0}
        if method == "GET" and path == "/oauth2/applications/@me":
            return 200, {"id": str(APP_ID), "name": "Talon", "icon": None, "description": "", "bot_public": False,
                         "bot_require_code_grant": False, "verify_key": "0" * 64, "flags": 0, "team": None,
                         "summary": "", "rpc_origins": [], "owner": self.users.get(BOT_ID + 7, self.bot)}
        if method == "GET" and path == "/gateway/bot":
            return 200, {"url": f"ws://{self.host}:{self.port}/gateway", "shards": 1,
                         "session_start_limit": {"total": 1000, "remaining": 999, "reset_after": 0,
                                                 "max_concurrency": 1}}
        if parts[0] == "applications" and len(parts) == 3 and parts[2] == "commands":
            if method == "PUT":
                return self._put_commands(parts[1], body)
            if method == "GET":
                return 200, list(self.commands)
        if parts[0] == "interactions" and len(parts) == 4 and method == "POST":
            interaction = int(parts[1])
            if self._interaction_tokens.get(interaction) != parts[2]:
                raise _Refuse(404, 10062, "Unknown interaction")
            answers = self.interaction_answers.setdefault(interaction, [])
            if answers:
                raise _Refuse(400, 40060, "Interaction has already been acknowledged.")
            answers.append(body)
            if not with_response:
                return 204, None
            data = body.get("data") or {}
            return 200, {"interaction": {"id": str(interaction), "type": self._interaction_types.get(interaction, 3), "response_message_loading": body.get("type") == 5,
                                         "response_message_ephemeral": bool(int(data.get("flags") or 0) & 64)},
                         "resource": {"type": body.get("type")}}
        if parts[0] != "channels" or len(parts) < 2 or not parts[1].isdigit():
            raise _Refuse(404, 0, "404: Not Found")
        channel_id = int(parts[1])
        if channel_id not in self.channels:
            raise _Refuse(404, 10003, "Unknown Channel")
        if parts[2:] == [] and method == "GET":
            return 200, dict(self.channels[channel_id])
        if parts[2:] == ["typing"] and method == "POST":
            return 204, None
        if parts[2:] == ["messages"] and method == "POST":
            return 200, self._create(channel_id, body, files)
        if len(parts) >= 4 and parts[2] == "messages":
            key = (channel_id, int(parts[3]))
            message = self.messages.get(key)
            if message is None:
                raise _Refuse(404, 10008, "Unknown Message")
            if len(parts) == 4 and method == "PATCH":
                if not message.bot:
                    raise _Refuse(403, 50005, "Cannot edit a message authored by another user")
                if "content" in body:
                    content = body["content"] or ""
                    if len(content) > TEXT_LIMIT:
                        raise _Refuse(400, 50035, "Invalid Form Body (content: Must be 2000 or fewer in length.)")
                    message.content = content
                    message.versions.append(content)
                if "components" in body:
                    message.components = body["components"] or []
                return 200, self._message_json(message)
            if len(parts) == 4 and method == "DELETE":
                del self.messages[key]
                return 204, None
            if len(parts) == 7 and parts[4] == "reactions" and parts[6] == "@me":
                have = self.reactions.setdefault(key, set())
                if method == "PUT":
                    have.add(parts[5])
                elif method == "DELETE":
                    have.discard(parts[5])
                return 204, None
            if len(parts) == 7 and parts[4] == "reactions" and method == "DELETE":
                self.reactions.setdefault(key, set()).discard(parts[5])
                return 204, None
        raise _Refuse(405, 0, "405: Method Not Allowed")

    def _create(self, channel_id: int, body: dict[str, Any], files: list[tuple[str, bytes]]) -> dict[str, Any]:
        content = body.get("content") or ""
        if len(content) > TEXT_LIMIT:
            raise _Refuse(400, 50035, "Invalid Form Body (content: Must be 2000 or fewer in length.)")
        if not content and not files and not body.get("components") and not body.get("embeds"):
            raise _Refuse(400, 50006, "Cannot send an empty message")
        if any(len(data) > UPLOAD_LIMIT for _, data in files):
            raise _Refuse(413, 40005, "Request entity too large")
        nonce = body.get("nonce")
        if nonce is not None and body.get("enforce_nonce"):
            # Discord: a nonce enforced and already used by this author within minutes returns
            # that message and creates none.
            earlier = self.nonces.get(str(nonce))
            if earlier is not None and earlier in self.messages:
                return self._message_json(self.messages[earlier])
        message_id = self.snowflake()
        attachments = []
        for name, data in files:
            attachments.append(self.add_attachment(channel_id, data, name, "application/octet-stream"))
        reference = (body.get("message_reference") or {}).get("message_id")
        message = Message(channel_id, message_id, self.bot, content, components=body.get("components") or [],
                          attachments=attachments, versions=[content], reference=int(reference) if reference else None)
        self.messages[(channel_id, message_id)] = message
        if nonce is not None and body.get("enforce_nonce"):
            self.nonces[str(nonce)] = (channel_id, message_id)
        return self._message_json(message)

    def _message_json(self, message: Message) -> dict[str, Any]:
        channel = self.channels[message.channel_id]
        out: dict[str, Any] = {
            "id": str(message.id), "channel_id": str(message.channel_id), "author": message.author,
            "content": message.content, "timestamp": _iso(), "edited_timestamp": None, "tts": False,
            "mention_everyone": False, "mentions": [], "mention_roles": [], "attachments": message.attachments,
            "embeds": [], "pinned": False, "type": 0, "flags": 0, "components": message.components,
        }
        if channel.get("guild_id"):
            out["guild_id"] = channel["guild_id"]
        return out

    async def _attachment(self, request: web.Request) -> web.Response:
        with self._cond:
            found = self.files.get(request.match_info["key"])
        if found is None:
            return web.Response(status=404)
        return web.Response(body=found[0], content_type=found[1])

    async def _gateway(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True, max_msg_size=MAX_BODY_BYTES)
        await ws.prepare(request)
        sock = _Socket(ws, request.query.get("compress", ""))
        with self._cond:
            self._sockets.append(sock)
        await sock.send({"op": 10, "d": {"heartbeat_interval": 41250}, "s": None, "t": None})
        async for msg in ws:
            try:
                payload = json.loads(msg.data)
            except (TypeError, ValueError):
                await ws.close(code=4002, message=b"Error while decoding payload.")
                break
            with self._cond:
                self.gateway_events.append({"op": payload.get("op")})
            op = payload.get("op")
            if op == 1:
                await sock.send({"op": 11, "d": None, "s": None, "t": None})
            elif op == 2:
                data = payload.get("d") or {}
                if data.get("token") != self.token:
                    await ws.close(code=4004, message=b"Authentication failed.")
                    break
                sock.intents = int(data.get("intents") or 0)
                sock.identified = True
                await self._ready(sock, data.get("shard"))
            elif op == 6:
                sock.identified = True
                sock.seq += 1
                await sock.send({"op": 0, "t": "RESUMED", "s": sock.seq, "d": {}})
            self._notify()
        self._notify()
        return ws

    async def _ready(self, sock: _Socket, shard: Any) -> None:
        with self._cond:
            guilds = list(self.guilds.values())
            channels = list(self.channels.values())
        sock.seq += 1
        await sock.send({"op": 0, "t": "READY", "s": sock.seq, "d": {
            "v": 10, "user": self.bot, "guilds": [{"id": g["id"], "unavailable": True} for g in guilds],
            "session_id": uuid.uuid4().hex, "resume_gateway_url": f"ws://{self.host}:{self.port}/gateway",
            "shard": shard or [0, 1], "application": {"id": str(APP_ID), "flags": 0}, "private_channels": [],
            "relationships": [], "user_settings": {}}})
        for guild in guilds:
            mine = [c for c in channels if c.get("guild_id") == guild["id"]]
            sock.seq += 1
            await sock.send({"op": 0, "t": "GUILD_CREATE", "s": sock.seq, "d": {
                **guild, "channels": [c for c in mine if c["type"] != 11], "threads": [c for c in mine if c["type"] == 11],
                "members": [], "member_count": 3, "unavailable": False, "large": False, "owner_id": str(BOT_ID + 7),
                "features": [], "emojis": [], "stickers": [], "voice_states": [], "presences": [],
                "premium_tier": 0, "joined_at": _iso(), "stage_instances": [], "guild_scheduled_events": [],
                "soundboard_sounds": [], "verification_level": 0, "default_message_notifications": 0,
                "explicit_content_filter": 0, "mfa_level": 0, "afk_timeout": 300, "system_channel_flags": 0,
                "nsfw_level": 0, "preferred_locale": "en-US", "premium_progress_bar_enabled": False}})

    async def stop(self) -> None:
        for sock in list(self._sockets):
            if not sock.ws.closed:
                await sock.ws.close()
        await super().stop()


class _RateLimited(Exception):
    def __init__(self, retry_after: float) -> None:
        super().__init__(retry_after)
        self.retry_after = round(retry_after, 3)


def _route(method: str, path: str) -> str:
    """The route a bucket is per: ids other than the top-level channel's replaced by placeholders."""
    parts = path.strip("/").split("/")
    out = []
    for i, part in enumerate(parts):
        if part.isdigit():
            out.append("{channel_id}" if i == 1 and parts[0] == "channels" else "{id}")
        elif i > 0 and parts[i - 1] == "reactions" and part != "@me":
            out.append("{emoji}")
        elif parts[0] == "interactions" and i == 2:
            out.append("{token}")
        else:
            out.append(part)
    return f"{method} /" + "/".join(out)


def _iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000+00:00", time.gmtime())
