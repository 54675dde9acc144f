"""Anthropic Messages API adapter (``anthropic:`` models), on the official async SDK.

``to_anthropic_messages`` is a pure mapper from neutral messages to the wire format:

- tool results become ``tool_result`` blocks inside a user message, and images a tool returned
  go natively inside the ``tool_result`` content (no synthetic turn needed, unlike OpenAI);
- consecutive messages of one role are merged (tool results first, as the API requires), and a
  conversation that starts with the assistant gets a short user turn in front;
- images are hydrated from the attachment store only here, at request time; a model without
  vision, or an image type the API does not take, gets a text placeholder saying why.

Prompt caching: the system prompt is sent as text blocks split at ``ModelRequest
.system_cache_points`` with a ``cache_control`` breakpoint at each (after the stable prompt and
after the memory block), plus one on the newest message so the conversation prefix is reused
from one step to the next (not for one-off requests such as summaries, which have no system
cache points). That is at most 4 breakpoints, the API's limit.

Replies stream (``messages.stream``); errors are classified from their bodies like the OpenAI
adapter's (``talon.agent.providers.refusals``).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import anthropic

from talon.agent.providers.base import (
    MISSING_BYTES,
    CallMeter,
    Hydrate,
    ModelRequest,
    ModelResponse,
    Provider,
    StreamRelay,
    ToolSpec,
    Usage,
    block_text,
    image_placeholder,
    prefetch_images,
    try_hydrate,
)
from talon.agent.providers.refusals import classify
from talon.agent.providers.retries import (
    TIMEOUTS,
    TRANSPORT_ERRORS,
    adapt_or_fail,
    broke_off,
    complete_with_retries,
    response_body,
    silent_for,
    unreachable,
)
from talon.content import ImageBlock, Message, TextBlock, ToolCall
from talon.tls import sdk_tls

log = logging.getLogger(__name__)

# The SDK's own errors, and the transport's when a streamed body breaks off after the headers.
_TIMEOUTS: tuple[type[Exception], ...] = (anthropic.APITimeoutError, *TIMEOUTS)
_UNREACHABLE: tuple[type[Exception], ...] = (anthropic.APIConnectionError, *TRANSPORT_ERRORS)

ANTHROPIC_IMAGE_TYPES = {"image/jpeg", "image/png", "image/gif", "image/webp"}
CACHE = {"type": "ephemeral"}
MAX_SYSTEM_BREAKPOINTS = 3
_ID = re.compile(r"[^A-Za-z0-9_-]")
_DATA_URL = re.compile(r"^data:(?P<mime>[^;,]+);base64,(?P<data>.*)$", re.DOTALL)


def _tool_id(raw: str | None) -> str:
    return _ID.sub("_", raw or "") or "call"


def to_anthropic_system(system: str, cache_points: list[int]) -> list[dict[str, Any]]:
    """The system prompt as text blocks, each stable prefix ending in a cache breakpoint."""
    cuts = sorted({p for p in cache_points if 0 < p <= len(system)})[:MAX_SYSTEM_BREAKPOINTS]
    blocks: list[dict[str, Any]] = []
    start = 0
    for cut in cuts:
        piece = system[start:cut]
        if piece.strip():
            blocks.append({"type": "text", "text": piece, "cache_control": dict(CACHE)})
        start = cut
    rest = system[start:]
    if rest.strip():
        blocks.append({"type": "text", "text": rest})
    return blocks


def to_anthropic_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    return [{"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools]


def _image(block: ImageBlock, hydrate: Hydrate, vision: bool) -> dict[str, Any]:
    if not vision:
        return {"type": "text", "text": image_placeholder(block, "this model takes no images")}
    if block.ref.mime not in ANTHROPIC_IMAGE_TYPES:
        return {"type": "text", "text": image_placeholder(block, f"{block.ref.mime} is not an image type this model takes")}
    url = try_hydrate(hydrate, block)
    if url is None:
        return {"type": "text", "text": image_placeholder(block, MISSING_BYTES)}
    match = _DATA_URL.match(url)
    if match is None:
        return {"type": "text", "text": image_placeholder(block, "its bytes could not be read")}
    return {"type": "image", "source": {"type": "base64", "media_type": match["mime"], "data": match["data"]}}


def _content(blocks: list[Any], hydrate: Hydrate, vision: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for block in blocks:
        if isinstance(block, ImageBlock):
            out.append(_image(block, hydrate, vision))
        elif (text := block_text(block)) and text.strip():
            # The API refuses whitespace-only text (Claude itself often writes "\n\n" before a
            # tool call); the caller's placeholder covers a message left with nothing.
            out.append({"type": "text", "text": text})
    return out


def _tool_input(call: ToolCall) -> dict[str, Any]:
    try:
        value = json.loads(call.arguments or "{}")
    except ValueError:
        return {"_unparsed_arguments": call.arguments}
    return value if isinstance(value, dict) else {"_arguments": value}


def to_anthropic_messages(
    messages: list[Message], hydrate: Hydrate, *, vision: bool = True, cache_last: bool = True
) -> list[dict[str, Any]]:
    wire: list[dict[str, Any]] = []

    def push(role: str, content: list[dict[str, Any]]) -> None:
        if wire and wire[-1]["role"] == role:
            wire[-1]["content"].extend(content)
        else:
            wire.append({"role": role, "content": content})

    for msg in messages:
        if msg.role == "user":
            push("user", _content(msg.content, hydrate, vision) or [{"type": "text", "text": "(empty message)"}])
        elif msg.role == "assistant":
            content = _content([b for b in msg.content if isinstance(b, TextBlock)], hydrate, vision)
            content += [
                {"type": "tool_use", "id": _tool_id(c.id), "name": c.name, "input": _tool_input(c)}
                for c in msg.tool_calls
            ]
            push("assistant", content or [{"type": "text", "text": "(no reply)"}])
        else:
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": _tool_id(msg.tool_call_id),
                "content": _content(msg.content, hydrate, vision) or [{"type": "text", "text": "(no output)"}],
            }
            if msg.meta.get("error"):
                result["is_error"] = True
            push("user", [result])
    if wire and wire[0]["role"] != "user":
        wire.insert(0, {"role": "user", "content": [{"type": "text", "text": "(conversation continues)"}]})
    if cache_last and wire and wire[-1]["content"]:
        wire[-1]["content"][-1]["cache_control"] = dict(CACHE)
    return wire


def from_anthropic_message(resp: Any) -> Message:
    texts: list[str] = []
    calls: list[ToolCall] = []
    for block in resp.content or []:
        kind = getattr(block, "type", None)
        if kind == "text" and block.text:
            texts.append(block.text)
        elif kind == "tool_use":
            calls.append(ToolCall(id=block.id, name=block.name, arguments=json.dumps(block.input or {})))
    text = "".join(texts)
    return Message(role="assistant", content=[TextBlock(text=text)] if text.strip() else [], tool_calls=calls)


class AnthropicProvider(Provider):
    name = "anthropic"

    def __init__(
        self,
        model: str,
        *,
        api_key: str,
        base_url: str | None,
        hydrate: Hydrate,
        vision: bool = True,
        tools: bool = True,
        timeout_s: float = 120.0,
        total_timeout_s: float = 900.0,
        max_retries: int = 2,
        stream: bool = True,
    ) -> None:
        self.model = model
        self.vision = vision
        self.tools = tools
        self.stream = stream
        self.max_retries = max_retries
        self.total_timeout_s = total_timeout_s
        self.idle_timeout_s = timeout_s
        self._hydrate = hydrate
        # Per read (between streamed events), not per answer; retries are ours (talon.agent.providers.retries).
        self._client = anthropic.AsyncAnthropic(
            api_key=api_key or "not-set",
            base_url=base_url or None,
            timeout=anthropic.Timeout(timeout_s, connect=min(10.0, timeout_s)),
            max_retries=0,
            http_client=anthropic.DefaultAsyncHttpxClient(verify=sdk_tls()),
        )

    def build(self, request: ModelRequest, hydrate: Hydrate | None = None) -> dict[str, Any]:
        """The keyword arguments of ``messages.create`` for a request (pure; used by tests)."""
        kwargs: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_output_tokens or 4096,
            # A one-off request (a summary: no cache points) would pay for a cache write it never reads.
            "messages": to_anthropic_messages(request.messages, hydrate or self._hydrate, vision=self.vision,
                                              cache_last=bool(request.system_cache_points)),
        }
        system = to_anthropic_system(request.system, request.system_cache_points)
        if system:
            kwargs["system"] = system
        if request.tools and self.tools:
            kwargs["tools"] = to_anthropic_tools(request.tools)
        return kwargs

    async def complete(self, request: ModelRequest) -> ModelResponse:
        return await complete_with_retries(self, request, self._once)

    async def _once(self, request: ModelRequest) -> ModelResponse:
        kwargs = self.build(request, await prefetch_images(request.messages, self._hydrate))
        relay = StreamRelay(request.on_text)
        meter = request.meter
        try:
            if self.stream:
                async with self._client.messages.stream(**kwargs) as stream:
                    try:
                        async for delta in stream.text_stream:
                            if meter is not None:
                                meter.received(delta)
                            await relay(delta)
                    finally:
                        _note_usage(stream, meter)  # the input tokens are known from the first event
                    resp = await stream.get_final_message()
            else:
                resp = await self._client.messages.create(**kwargs)
                text = "".join(b.text for b in resp.content or [] if getattr(b, "type", "") == "text")
                if meter is not None:
                    meter.received(text)
                await relay(text)
        except anthropic.APIStatusError as exc:
            if relay.sent:
                raise broke_off(exc.message) from exc
            raise self._refused(exc.status_code, response_body(exc), exc.response.headers, request) from exc
        except _TIMEOUTS as exc:
            raise silent_for(self.idle_timeout_s) from exc
        except _UNREACHABLE as exc:
            raise unreachable(exc, sent=bool(relay.sent), url=str(self._client.base_url)) from exc
        except anthropic.APIError as exc:  # an error event inside the stream
            if relay.sent:
                raise broke_off(exc) from exc
            raise self._refused(None, exc.body, None, request) from exc
        usage = None
        if resp.usage is not None:
            u = resp.usage
            usage = Usage(
                input_tokens=(u.input_tokens or 0) + (u.cache_creation_input_tokens or 0) + (u.cache_read_input_tokens or 0),
                output_tokens=u.output_tokens or 0,
                cached_tokens=u.cache_read_input_tokens or 0,
            )
        if meter is not None:
            meter.reported = usage
        return ModelResponse(message=from_anthropic_message(resp), usage=usage, finish_reason=resp.stop_reason)

    def _refused(self, status: int | None, body: Any, headers: Any, request: ModelRequest) -> Exception:
        return adapt_or_fail(self, classify(status, body, headers), request)

    async def aclose(self) -> None:
        await self._client.close()


def _note_usage(stream: Any, meter: CallMeter | None) -> None:
    """What the server reported of a streamed answer so far (``message_start`` carries the input
    tokens): kept on the call's meter, for a call that is stopped or breaks off."""
    if meter is None:
        return
    try:
        u = stream.current_message_snapshot.usage
    except Exception:  # no message_start yet: nothing reported
        return
    meter.answer_began()
    meter.reported = Usage(
        input_tokens=(u.input_tokens or 0) + (u.cache_creation_input_tokens or 0) + (u.cache_read_input_tokens or 0),
        output_tokens=u.output_tokens or 0, cached_tokens=u.cache_read_input_tokens or 0)
