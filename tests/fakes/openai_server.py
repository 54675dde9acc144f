"""A loopback fake of an OpenAI-compatible chat completions server, for the real openai SDK.

Point the SDK at ``fake.base_url`` (``http://127.0.0.1:PORT/v1``). Replies are scripted with
``fake.queue(...)``; an empty queue falls back to ``fake.default_responder`` (echo by default).
Every request is recorded as a :class:`Req` when it arrives, so a test can see a request that is
still being delayed or held.

With ``strict`` on (the default) the fake rejects what OpenAI itself rejects and an agent loop can
easily get wrong: a tool-call turn without a tool result for every call id (typical after context
trimming), a tool result answering no call, image parts outside user messages, and image data URLs
that are not base64 PNG/JPEG/GIF/WebP.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import inspect
import io
import itertools
import json
import re
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
from aiohttp import web

from tests.fakes import MAX_BODY_BYTES, LoopbackServer, UploadedFile, read_form

__all__ = [
    "ErrorReply",
    "FakeOpenAI",
    "Reply",
    "Req",
    "ToolCall",
    "TranscriptionReq",
    "decode_data_url",
    "image_urls",
    "last_user_text",
]


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] | str  # a str is sent verbatim (e.g. to script malformed JSON)
    id: str = field(default_factory=_call_id)

    def to_wire(self) -> dict[str, Any]:
        args = self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": args}}


@dataclass(frozen=True)
class Reply:
    """A full assistant turn: text and/or tool calls, optionally with forced usage numbers."""

    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None  # default: "tool_calls" if any, else "stop"
    usage: dict[str, int] | None = None  # e.g. {"prompt_tokens": 120000} overrides the estimate


@dataclass(frozen=True)
class ErrorReply:
    status: int
    message: str
    type: str | None = None
    code: str | None = None
    param: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type or _error_type(self.status),
                          "param": self.param, "code": self.code}}


Scripted: TypeAlias = "str | ToolCall | list[ToolCall] | Reply | ErrorReply"
Responder: TypeAlias = Callable[[dict[str, Any]], "Scripted | Awaitable[Scripted]"]


def _error_response(error: ErrorReply) -> web.Response:
    return web.json_response(error.body(), status=error.status, headers=error.headers)


def _error_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


@dataclass
class Req:
    """One chat completion request; ``end`` and ``status`` are set once it is answered."""

    json: dict[str, Any]
    start: float  # time.monotonic()
    headers: dict[str, str]
    end: float | None = None
    status: int | None = None
    response: dict[str, Any] | None = None
    first_text_at: float | None = None  # time.monotonic() when a streamed answer's first text went out

    def last_user_text(self) -> str:
        return last_user_text(self)

    def image_urls(self) -> list[str]:
        return image_urls(self)


@dataclass
class TranscriptionReq:
    fields: dict[str, str]  # model, language, response_format, prompt, ...
    file: UploadedFile | None
    start: float
    headers: dict[str, str]
    end: float | None = None


def _body(req: Req | dict[str, Any]) -> dict[str, Any]:
    return req.json if isinstance(req, Req) else req


def _text_parts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [p.get("text", "") for p in content
                if isinstance(p, dict) and p.get("type") == "text"]
    return []


def last_user_text(req: Req | dict[str, Any]) -> str:
    """The text parts of the last user message, joined by newlines ("" if there is none)."""
    for message in reversed(_body(req).get("messages") or []):
        if message.get("role") == "user":
            return "\n".join(_text_parts(message.get("content")))
    return ""


def image_urls(req: Req | dict[str, Any]) -> list[str]:
    """The URLs (normally data: URLs) of every image_url part, in message order."""
    urls = []
    for message in _body(req).get("messages") or []:
        content = message.get("content")
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") == "image_url":
                    url = part.get("image_url")
                    urls.append(url.get("url", "") if isinstance(url, dict) else str(url))
    return urls


_DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+);base64,(?P<data>.*)$", re.DOTALL)


def decode_data_url(url: str) -> tuple[str, bytes]:
    """(mime type, bytes) of a base64 data: URL; ValueError if it is not one."""
    match = _DATA_URL.match(url)
    if match is None:
        raise ValueError(f"not a base64 data URL: {url[:60]!r}")
    try:
        return match["mime"], base64.b64decode(match["data"], validate=True)
    except binascii.Error as exc:
        raise ValueError(f"invalid base64 in data URL: {exc}") from exc


def _echo(request: dict[str, Any]) -> str:
    return f"echo: {last_user_text(request)}"


class FakeOpenAI(LoopbackServer):
    """An OpenAI-compatible server: /v1/chat/completions, /v1/models, /v1/audio/transcriptions,
    /v1/audio/speech (answers 24 kHz 16-bit PCM: a 220 Hz tone, ``speech_seconds_per_char`` long)."""

    def __init__(
        self,
        *,
        delay: float = 0.0,
        hang: bool = False,
        strict: bool = True,
        models: tuple[str, ...] = ("gpt-fake",),
        api_key: str | None = None,
        transcription_text: str = "hello from the fake transcriber",
        streaming: bool = True,
        chunk_delay: float = 0.0,
    ) -> None:
        super().__init__()
        self.delay = delay  # seconds before each chat completion is answered
        self.strict = strict
        self.models = list(models)
        self.api_key = api_key  # when set, requests must send "Bearer <api_key>"
        self.transcription_text: str | ErrorReply = transcription_text
        self.default_responder: Responder = _echo
        # stream=true answered as server-sent events, as OpenAI and every local server do; False
        # refuses it with a 400 (a proxy or server that cannot stream). ``stream_options`` can be
        # refused on its own, as some older servers do.
        self.streaming = streaming
        self.stream_options = True
        self.chunk_delay = chunk_delay  # seconds between streamed chunks
        # False: no usage in any answer, streamed or not, whatever the request asks (servers that
        # report none). ``stall``: a streamed answer stops after its text and waits until ``stall``
        # is False again or the fake stops (a long answer the person stops midway).
        self.report_usage = True
        self._stall = False
        self.chunk_chars = 12  # roughly how much text each streamed chunk carries
        self.requests: list[Req] = []
        self.transcriptions: list[TranscriptionReq] = []
        self.speech_requests: list[dict[str, Any]] = []
        self.speech_seconds_per_char = 0.05
        self._replies: deque[Scripted | Responder] = deque()
        self._hang = hang
        self._ids = itertools.count(1)

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1`` — the OPENAI_BASE_URL value."""
        return f"{self.root_url}/v1"

    def _make_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/chat/completions", self._handle_chat)
        app.router.add_get("/v1/models", self._handle_models)
        app.router.add_post("/v1/audio/transcriptions", self._handle_transcription)
        app.router.add_post("/v1/audio/speech", self._handle_speech)
        return app

    # -- scripting -------------------------------------------------------------------------

    def queue(self, *replies: Scripted | Responder) -> None:
        """Answer the next chat requests, in arrival order, with these replies.

        Each is a text, a ToolCall or list of them, a Reply, an ErrorReply, or a callable taking
        the request JSON and returning (or awaiting to) one of those.
        """
        with self._cond:
            self._replies.extend(replies)

    @property
    def queued(self) -> int:
        with self._cond:
            return len(self._replies)

    @staticmethod
    def tool_call(name: str, args: dict[str, Any] | str | None = None,
                  id: str | None = None) -> ToolCall:
        return ToolCall(name, {} if args is None else args, id or _call_id())

    @staticmethod
    def reply(content: str | None = None, tool_calls: list[ToolCall] | tuple[ToolCall, ...] = (),
              *, finish_reason: str | None = None,
              usage: dict[str, int] | None = None) -> Reply:
        return Reply(content, tuple(tool_calls), finish_reason, usage)

    @staticmethod
    def error(status: int, message: str, type: str | None = None, code: str | None = None,
              *, param: str | None = None, headers: dict[str, str] | None = None) -> ErrorReply:
        return ErrorReply(status, message, type, code, param, headers or {})

    @staticmethod
    def context_length_exceeded(limit: int = 128000, requested: int = 130000) -> ErrorReply:
        return ErrorReply(
            400,
            f"This model's maximum context length is {limit} tokens. However, your messages "
            f"resulted in {requested} tokens. Please reduce the length of the messages.",
            "invalid_request_error", "context_length_exceeded", "messages",
        )

    @property
    def hang(self) -> bool:
        return self._hang

    @hang.setter
    def hang(self, value: bool) -> None:
        """While True, chat requests are held unanswered (recorded on arrival) until release()."""
        with self._cond:
            self._hang = value
        self._notify()

    @property
    def stall(self) -> bool:
        return self._stall

    @stall.setter
    def stall(self, value: bool) -> None:
        with self._cond:
            self._stall = value
        self._notify()

    def release(self) -> None:
        """Answer every held request and stop holding new ones."""
        self.hang = False

    # -- waiting ---------------------------------------------------------------------------

    async def wait_for_requests(self, n: int = 1, timeout: float = 10.0) -> list[Req]:
        """Wait until at least ``n`` chat requests have arrived; returns all of them."""
        return await self._wait_until(self._have(n), timeout, self._timeout_text(n))

    def wait_for_requests_sync(self, n: int = 1, timeout: float = 10.0) -> list[Req]:
        return self._wait_until_sync(self._have(n), timeout, self._timeout_text(n))

    def _have(self, n: int) -> Callable[[], list[Req] | None]:
        return lambda: list(self.requests) if len(self.requests) >= n else None

    def _timeout_text(self, n: int) -> Callable[[], str]:
        def describe() -> str:
            seen = [repr(last_user_text(r))[:60] for r in self.requests]
            return f"waited for {n} chat requests, got {len(seen)}: last user texts {seen}"

        return describe

    # -- HTTP ------------------------------------------------------------------------------

    def _auth_error(self, request: web.Request) -> ErrorReply | None:
        if self.api_key is None or request.headers.get("Authorization") == f"Bearer {self.api_key}":
            return None
        return ErrorReply(401, "Incorrect API key provided.", code="invalid_api_key")

    async def _handle_models(self, request: web.Request) -> web.Response:
        if (denied := self._auth_error(request)) is not None:
            return _error_response(denied)
        created = int(time.time())
        return web.json_response({"object": "list", "data": [
            {"id": m, "object": "model", "created": created, "owned_by": "fake"}
            for m in self.models]})

    async def _handle_chat(self, request: web.Request) -> web.Response:
        start = time.monotonic()
        try:
            body = await request.json()
        except ValueError:
            body = None
        req = Req(body if isinstance(body, dict) else {}, start, dict(request.headers))
        with self._cond:
            self.requests.append(req)
        self._notify()
        try:
            status, payload, headers = await self._answer(request, body)
        except Exception as exc:  # a broken scripted responder must fail its test, not hang it
            failure = ErrorReply(500, f"fake responder failed: {exc!r}")
            status, payload, headers = 500, failure.body(), {}
        if status == 200 and isinstance(body, dict) and body.get("stream"):
            return await self._stream(request, req, body, payload)
        with self._cond:
            req.end, req.status, req.response = time.monotonic(), status, payload
        self._notify()
        return web.json_response(payload, status=status, headers=headers)

    async def _stream(self, request: web.Request, req: Req, body: dict[str, Any],
                      completion: dict[str, Any]) -> web.StreamResponse:
        """The completion as OpenAI's chunks: role, text pieces, tool-call deltas, finish, usage."""
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        base = {k: completion[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
        choice = completion["choices"][0]
        message = choice["message"]

        async def send(delta: dict[str, Any], finish: str | None = None) -> None:
            chunk = base | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())

        try:
            await self._write_stream(resp, req, body, completion, message, choice, send)
        except ConnectionResetError:  # the client went away mid-stream (a stopped turn)
            with self._cond:
                req.end, req.status, req.response = time.monotonic(), 0, completion
            self._notify()
        return resp

    async def _write_stream(self, resp: web.StreamResponse, req: Req, body: dict[str, Any], completion: dict[str, Any],
                            message: dict[str, Any], choice: dict[str, Any],
                            send: Callable[..., Awaitable[None]]) -> None:
        base = {k: completion[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
        await send({"role": "assistant", "content": ""})
        text = message.get("content") or ""
        pieces = re.findall(r".{1,%d}(?:\s+|$)|\S+" % self.chunk_chars, text, re.S) if text else []
        for piece in pieces:
            if self.chunk_delay:
                await asyncio.sleep(self.chunk_delay)
            if req.first_text_at is None:
                req.first_text_at = time.monotonic()
            await send({"content": piece})
        if self.stall:
            await self._wait_until(lambda: True if self._closing or not self._stall else None, _HOLD_LIMIT,
                                   lambda: "stream stalled past the hold limit")
        for index, call in enumerate(message.get("tool_calls") or []):
            args = call["function"]["arguments"]
            await send({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                        "function": {"name": call["function"]["name"], "arguments": ""}}]})
            for start in range(0, len(args), 16):
                await send({"tool_calls": [{"index": index, "function": {"arguments": args[start:start + 16]}}]})
        await send({}, choice["finish_reason"])
        if (body.get("stream_options") or {}).get("include_usage") and "usage" in completion:
            await resp.write(f"data: {json.dumps(base | {'choices': [], 'usage': completion['usage']})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        with self._cond:
            req.end, req.status, req.response = time.monotonic(), 200, completion
        self._notify()

    async def _answer(
        self, request: web.Request, body: Any
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        if (denied := self._auth_error(request)) is not None:
            return denied.status, denied.body(), denied.headers
        problem = self._invalid(body)
        if problem is not None:
            return 400, ErrorReply(400, problem, param="messages").body(), {}
        # Take the scripted reply on arrival, so concurrent requests get replies in arrival order.
        with self._cond:
            scripted = self._replies.popleft() if self._replies else self.default_responder
        await self._wait_until(lambda: True if not self._hang or self._closing else None,
                               _HOLD_LIMIT, lambda: "request held past the hold limit")
        if self._closing:
            return 503, ErrorReply(503, "fake server shutting down").body(), {}
        if self.delay:
            await asyncio.sleep(self.delay)
        if callable(scripted):
            produced = scripted(body)
            reply = await produced if inspect.isawaitable(produced) else produced
        else:
            reply = scripted
        if isinstance(reply, ErrorReply):
            return reply.status, reply.body(), reply.headers
        return 200, self._completion(body, reply), {}

    def _invalid(self, body: Any) -> str | None:
        if not isinstance(body, dict):
            return "We could not parse the JSON body of your request."
        if body.get("stream") and not self.streaming:
            return "stream=true is not supported by this server; request a non-streaming completion."
        if "stream_options" in body and not self.stream_options:
            return "Unrecognized request argument supplied: stream_options"
        if not body.get("model"):
            return "you must provide a model parameter"
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return "Missing required parameter: 'messages'."
        return _check_messages(messages) if self.strict else None

    def _completion(self, request: dict[str, Any], reply: Scripted) -> dict[str, Any]:
        if isinstance(reply, str):
            reply = Reply(content=reply)
        elif isinstance(reply, ToolCall):
            reply = Reply(tool_calls=(reply,))
        elif isinstance(reply, list):
            reply = Reply(tool_calls=tuple(reply))
        if not isinstance(reply, Reply):
            raise TypeError(f"unsupported scripted reply: {reply!r}")
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            message["tool_calls"] = [call.to_wire() for call in reply.tool_calls]
        generated = (reply.content or "") + "".join(
            json.dumps(c["function"]) for c in message.get("tool_calls", []))
        usage = {"prompt_tokens": max(1, len(json.dumps(request)) // 4),
                 "completion_tokens": max(1, len(generated) // 4)}
        usage.update(reply.usage or {})
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        completion = {
            "id": f"chatcmpl-fake{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.get("model", "gpt-fake"),
            "choices": [{
                "index": 0,
                "message": message,
                "finish_reason": reply.finish_reason
                or ("tool_calls" if reply.tool_calls else "stop"),
                "logprobs": None,
            }],
            "usage": usage,
        }
        if not self.report_usage:
            del completion["usage"]
        return completion

    async def _handle_transcription(self, request: web.Request) -> web.Response:
        if (denied := self._auth_error(request)) is not None:
            return _error_response(denied)
        start = time.monotonic()
        fields, files = await read_form(request)
        record = TranscriptionReq(fields, files.get("file"), start, dict(request.headers),
                                  time.monotonic())
        with self._cond:
            self.transcriptions.append(record)
        self._notify()
        result = self.transcription_text
        if isinstance(result, ErrorReply):
            return _error_response(result)
        if record.file is None:
            return _error_response(ErrorReply(400, "Missing required parameter: 'file'.",
                                              param="file"))
        fmt = fields.get("response_format", "json")
        if fmt in ("text", "srt", "vtt"):
            return web.Response(text=result, content_type="text/plain")
        if fmt == "verbose_json":
            return web.json_response({"task": "transcribe", "language": "english",
                                      "duration": 1.0, "text": result, "segments": []})
        return web.json_response({"text": result})


    async def _handle_speech(self, request: web.Request) -> web.Response:
        if (denied := self._auth_error(request)) is not None:
            return _error_response(denied)
        body = await request.json()
        with self._cond:
            self.speech_requests.append(body)
        self._notify()
        if body.get("response_format") != "pcm":
            return _error_response(ErrorReply(400, "the fake speaks only response_format=pcm",
                                              param="response_format"))
        rate = 24_000
        seconds = max(0.2, len(str(body.get("input", ""))) * self.speech_seconds_per_char)
        t = np.arange(int(seconds * rate)) / rate
        pcm = (np.sin(2 * np.pi * 220 * t) * 12_000).astype("<i2").tobytes()
        return web.Response(body=pcm, content_type="audio/pcm")


_IMAGE_FORMATS = {"PNG", "JPEG", "GIF", "WEBP"}
_HOLD_LIMIT = 3600.0  # seconds a held request waits for release() before failing


def _check_messages(messages: list[Any]) -> str | None:
    """The first message-list error OpenAI would report, in its wording, or None."""
    pending: dict[str, int] = {}  # tool_call_id -> index of the assistant message that made it
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message:
            return f"Invalid 'messages[{index}]': expected an object with a 'role'."
        role = message["role"]
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in pending:
                return (f"Invalid parameter: messages with role 'tool' must be a response to a "
                        f"preceeding message with 'tool_calls'. (messages[{index}], "
                        f"tool_call_id={call_id!r})")
            del pending[call_id]
        elif pending:
            return ("An assistant message with 'tool_calls' must be followed by tool messages "
                    "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                    f"response messages: {', '.join(pending)}")
        if role == "assistant":
            for call in message.get("tool_calls") or []:
                pending[call.get("id")] = index
        problem = _check_images(index, role, message.get("content"))
        if problem is not None:
            return problem
    if pending:
        return ("An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(pending)}")
    return None


def _check_images(index: int, role: str, content: Any) -> str | None:
    if not isinstance(content, list):
        return None
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "image_url":
            continue
        if role != "user":
            return (f"Invalid 'messages[{index}]'. Image URLs are only allowed for messages with "
                    f"role 'user', but this message with role '{role}' contains an image URL.")
        url = (part.get("image_url") or {}).get("url", "")
        if url.startswith(("http://", "https://")):
            continue
        try:
            _, data = decode_data_url(url)
        except ValueError:
            return f"Invalid image URL in 'messages[{index}]': expected a URL or base64 data URL."
        if _image_format(data) not in _IMAGE_FORMATS:
            return ("You uploaded an unsupported image. Please make sure your image has of one "
                    "the following formats: ['png', 'jpeg', 'gif', 'webp'].")
    return None


def _image_format(data: bytes) -> str | None:
    try:
        from PIL import Image

        with Image.open(io.BytesIO(data)) as image:
            return image.format
    except Exception:  # anything Pillow cannot identify is "unsupported" to the API too
        return None
