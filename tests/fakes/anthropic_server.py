"""A loopback fake of Anthropic's Messages API (POST /v1/messages), for the real anthropic SDK.

Point ``anthropic.AsyncAnthropic(base_url=fake.base_url)`` at it. Replies are scripted with
``fake.queue(...)``: a text, ``FakeAnthropic.tool_use(name, input)`` (or a list of them), a
``Reply`` with both, ``FakeAnthropic.error(status, message)`` — ``prompt_too_long()`` is the
400 Anthropic sends when a request is over the window — or a callable taking the request JSON and
returning one of those. With an empty queue ``fake.default_responder`` answers (it echoes the last
user text). Every request is recorded (``fake.requests[i].json``) as it arrives.

With ``strict`` on (the default) the fake rejects what the real API rejects and an adapter can
easily get wrong: a first message that is not the user's, a ``tool_use`` not answered by a
``tool_result`` at the start of the next user message, a ``tool_result`` answering nothing, empty
text blocks, a message whose only text is whitespace, images that are not base64 JPEG/PNG/GIF/WebP or whose base64 is over 5 MB, more than 4 ``cache_control``
breakpoints, and a missing ``max_tokens``.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from aiohttp import web

from tests.fakes import MAX_BODY_BYTES, LoopbackServer

__all__ = ["AnthropicReq", "ErrorReply", "FakeAnthropic", "Reply", "ToolUse"]

_MEDIA_TYPES = {"image/jpeg", "image/png", "image/gif", "image/webp"}
_MAX_IMAGE_BASE64 = 5 * 1024 * 1024


@dataclass(frozen=True)
class ToolUse:
    name: str
    input: dict[str, Any]
    id: str = field(default_factory=lambda: f"toolu_{uuid.uuid4().hex[:24]}")


@dataclass(frozen=True)
class Reply:
    text: str | None = None
    tool_uses: tuple[ToolUse, ...] = ()
    usage: dict[str, int] | None = None


@dataclass(frozen=True)
class ErrorReply:
    status: int
    message: str
    type: str = "invalid_request_error"

    def body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": self.type, "message": self.message}}


Scripted: TypeAlias = "str | ToolUse | list[ToolUse] | Reply | ErrorReply"
Responder: TypeAlias = Callable[[dict[str, Any]], Scripted]


@dataclass
class AnthropicReq:
    json: dict[str, Any]
    headers: dict[str, str]
    status: int | None = None
    response: dict[str, Any] | None = None

    def images(self) -> list[dict[str, Any]]:
        """Every image block, wherever it is (top level or inside tool_result content)."""
        found: list[dict[str, Any]] = []
        for message in self.json.get("messages") or []:
            for block in _blocks(message.get("content")):
                if block.get("type") == "image":
                    found.append(block)
                if block.get("type") == "tool_result":
                    found += [b for b in _blocks(block.get("content")) if b.get("type") == "image"]
        return found


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, dict)]


def _last_user_text(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            texts = [b.get("text", "") for b in _blocks(message.get("content")) if b.get("type") == "text"]
            if texts:
                return "\n".join(texts)
    return ""


class FakeAnthropic(LoopbackServer):
    def __init__(self, *, strict: bool = True) -> None:
        super().__init__()
        self.strict = strict
        self.requests: list[AnthropicReq] = []
        self.default_responder: Responder = lambda body: f"echo: {_last_user_text(body)}"
        self._replies: deque[Scripted | Responder] = deque()
        self._ids = itertools.count(1)

    @property
    def base_url(self) -> str:
        """The ``base_url`` for the SDK (it appends /v1/messages itself)."""
        return self.root_url

    def _make_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/messages", self._handle)
        return app

    # -- scripting -------------------------------------------------------------------------
    def queue(self, *replies: Scripted | Responder) -> None:
        with self._cond:
            self._replies.extend(replies)

    @staticmethod
    def tool_use(name: str, input: dict[str, Any] | None = None, id: str | None = None) -> ToolUse:
        return ToolUse(name, input or {}, id or f"toolu_{uuid.uuid4().hex[:24]}")

    @staticmethod
    def error(status: int, message: str, type: str = "invalid_request_error") -> ErrorReply:
        return ErrorReply(status, message, type)

    @staticmethod
    def prompt_too_long(tokens: int = 210_000, maximum: int = 200_000) -> ErrorReply:
        return ErrorReply(400, f"prompt is too long: {tokens} tokens > {maximum} maximum")

    # -- HTTP ------------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            body = None
        req = AnthropicReq(body if isinstance(body, dict) else {}, dict(request.headers))
        with self._cond:
            self.requests.append(req)
        self._notify()
        status, payload = self._answer(body)
        with self._cond:
            req.status, req.response = status, payload
        self._notify()
        headers = {"request-id": f"req_fake{next(self._ids)}"}
        if status == 200 and isinstance(body, dict) and body.get("stream"):
            return await self._stream(request, payload, headers)
        return web.json_response(payload, status=status, headers=headers)

    async def _stream(self, request: web.Request, message: dict[str, Any],
                      headers: dict[str, str]) -> web.StreamResponse:
        """The message as Anthropic's server-sent events, text in small deltas."""
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream", **headers})
        await resp.prepare(request)

        async def event(kind: str, data: dict[str, Any]) -> None:
            await resp.write(f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode())

        usage = message["usage"]
        await event("message_start", {"message": {**message, "content": [], "stop_reason": None,
                                                   "usage": {**usage, "output_tokens": 1}}})
        for index, block in enumerate(message["content"]):
            if block["type"] == "text":
                await event("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}})
                text = block["text"]
                for start in range(0, len(text), 10):
                    await event("content_block_delta", {"index": index, "delta": {"type": "text_delta",
                                                                                  "text": text[start:start + 10]}})
            else:
                await event("content_block_start", {"index": index, "content_block": {**block, "input": {}}})
                await event("content_block_delta", {"index": index, "delta": {
                    "type": "input_json_delta", "partial_json": json.dumps(block["input"])}})
            await event("content_block_stop", {"index": index})
        await event("message_delta", {"delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                                      "usage": {"output_tokens": usage["output_tokens"]}})
        await event("message_stop", {})
        await resp.write_eof()
        return resp

    def _answer(self, body: Any) -> tuple[int, dict[str, Any]]:
        if not isinstance(body, dict):
            return 400, ErrorReply(400, "invalid JSON body").body()
        problem = self._invalid(body) if self.strict else None
        if problem is not None:
            return 400, ErrorReply(400, problem).body()
        with self._cond:
            next_reply = self._replies.popleft() if self._replies else self.default_responder
        scripted = next_reply(body) if callable(next_reply) else next_reply
        if isinstance(scripted, ErrorReply):
            return scripted.status, scripted.body()
        if isinstance(scripted, str):
            scripted = Reply(text=scripted)
        elif isinstance(scripted, ToolUse):
            scripted = Reply(tool_uses=(scripted,))
        elif isinstance(scripted, list):
            scripted = Reply(tool_uses=tuple(scripted))
        content: list[dict[str, Any]] = []
        if scripted.text:
            content.append({"type": "text", "text": scripted.text})
        content += [{"type": "tool_use", "id": t.id, "name": t.name, "input": t.input} for t in scripted.tool_uses]
        usage = {
            "input_tokens": max(1, _estimate_input(body)),
            "output_tokens": max(1, len(json.dumps(content)) // 4),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
        usage.update(scripted.usage or {})
        return 200, {
            "id": f"msg_fake{next(self._ids)}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "claude-fake"),
            "content": content,
            "stop_reason": "tool_use" if scripted.tool_uses else "end_turn",
            "stop_sequence": None,
            "usage": usage,
        }

    def _invalid(self, body: dict[str, Any]) -> str | None:
        if not body.get("model"):
            return "model: Field required"
        if not isinstance(body.get("max_tokens"), int):
            return "max_tokens: Field required"
        breakpoints = 0
        system = body.get("system")
        if isinstance(system, list):
            for block in system:
                if block.get("type") != "text" or not block.get("text"):
                    return "system: text content blocks must be non-empty"
                breakpoints += "cache_control" in block
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return "messages: at least one message is required"
        if messages[0].get("role") != "user":
            return "messages: first message must use the \"user\" role"
        pending: set[str] = set()
        for index, message in enumerate(messages):
            role = message.get("role")
            blocks = _blocks(message.get("content"))
            if not blocks:
                return f"messages.{index}: content must be non-empty"
            results = [b for b in blocks if b.get("type") == "tool_result"]
            if pending:
                if role != "user":
                    return f"messages.{index}: tool_use ids were found without tool_result blocks immediately after"
                leading = list(itertools.takewhile(lambda b: b.get("type") == "tool_result", blocks))
                answered = {b.get("tool_use_id") for b in leading}
                if pending - answered:
                    return (f"messages.{index}: tool_use ids were found without tool_result blocks "
                            f"immediately after: {', '.join(sorted(pending - answered))}")
                if len(leading) != len(results):
                    return f"messages.{index}: tool_result blocks must come first in the user message"
                pending = set()
            elif results:
                return f"messages.{index}.content.0: unexpected `tool_use_id` found in `tool_result` blocks"
            problem = _whitespace_only(index, blocks)
            if problem:
                return problem
            for block in blocks:
                breakpoints += "cache_control" in block
                problem = _check_block(index, role, block)
                if problem:
                    return problem
                if block.get("type") == "tool_result":
                    for inner in _blocks(block.get("content")):
                        problem = _check_block(index, "tool_result", inner)
                        if problem:
                            return problem
            if role == "assistant":
                pending = {b.get("id") for b in blocks if b.get("type") == "tool_use"}
        if pending:
            return "messages: the final assistant tool_use has no tool_result"
        if breakpoints > 4:
            return f"A maximum of 4 blocks with cache_control may be provided. Found {breakpoints}."
        return None


def _whitespace_only(index: int, blocks: list[dict[str, Any]]) -> str | None:
    """The API refuses a message (or tool result) whose text blocks are all whitespace."""
    for group in [blocks] + [_blocks(b.get("content")) for b in blocks if b.get("type") == "tool_result"]:
        texts = [b.get("text") or "" for b in group if b.get("type") == "text"]
        if texts and any(texts) and not any(t.strip() for t in texts):
            return f"messages.{index}: text content blocks must contain non-whitespace text"
    return None


def _check_block(index: int, role: str, block: dict[str, Any]) -> str | None:
    kind = block.get("type")
    if kind == "text" and not block.get("text"):
        return f"messages.{index}: text content blocks must be non-empty"
    if kind == "image":
        if role == "assistant":
            return f"messages.{index}: images are not allowed in assistant messages"
        source = block.get("source") or {}
        if source.get("type") != "base64" or source.get("media_type") not in _MEDIA_TYPES:
            return f"messages.{index}: image source must be base64 jpeg/png/gif/webp"
        try:
            data = base64.b64decode(source.get("data", ""), validate=True)
        except (binascii.Error, ValueError):
            return f"messages.{index}: image data is not valid base64"
        if not data:
            return f"messages.{index}: image data is empty"
        encoded = len(source.get("data", ""))
        if encoded > _MAX_IMAGE_BASE64:  # the API's 5 MB per image counts the base64 text
            return (f"messages.{index}.content.0.image.source.base64: image exceeds 5 MB maximum: "
                    f"{encoded} bytes > {_MAX_IMAGE_BASE64} bytes")
    if kind == "tool_use" and role != "assistant":
        return f"messages.{index}: tool_use blocks are only allowed in assistant messages"
    return None


def _estimate_input(body: dict[str, Any]) -> int:
    """Roughly what Anthropic would count: text at ~3.5 chars/token, an image ~1600 tokens."""
    text = json.dumps(body.get("system", "")) + json.dumps(body.get("tools", []))
    images = 0
    for message in body.get("messages") or []:
        for block in _blocks(message.get("content")):
            inner = _blocks(block.get("content")) if block.get("type") == "tool_result" else [block]
            for b in inner:
                if b.get("type") == "image":
                    images += 1
                else:
                    text += json.dumps(b)
    return int(len(text) / 3.5) + 1600 * images
