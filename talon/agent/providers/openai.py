"""OpenAI-compatible Chat Completions adapter (OpenAI, Ollama, vLLM, llama.cpp, OpenRouter...).

``to_openai_messages`` is a pure mapper from neutral messages to the wire format; images are
hydrated from the attachment store only here, at request time. Chat Completions refuses images
inside ``tool`` messages, so a tool result's images travel in a synthetic user message placed
right after the run of tool results.

Vision and tools come from the model profile (settings, discovery, the table). Whatever the
status code, an error body that says the model takes no images or cannot call tools switches
them off for the rest of the process and the request is sent again (``talon.agent.providers.refusals``).
Replies are streamed (``stream=True``, with usage through ``stream_options`` where the server
takes it), so ``TALON_MODEL_TIMEOUT`` bounds the silence between chunks, not the whole answer;
a server that refuses streaming is asked without it from then on. As the answer streams, the
request's ``meter`` hears what came back and the usage the server reported, so a call stopped or
broken off midway is still counted (``talon.control``).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import httpx
import openai
from openai.types.chat import ChatCompletion

from talon.agent.context.memo import DerivedCache
from talon.agent.providers.base import (
    MISSING_BYTES,
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
from talon.errors import ProviderError, SendAgain
from talon.tls import sdk_tls

log = logging.getLogger(__name__)

# The SDK's own errors, and the transport's when a streamed body breaks off after the headers.
_TIMEOUTS: tuple[type[Exception], ...] = (openai.APITimeoutError, *TIMEOUTS)
_UNREACHABLE: tuple[type[Exception], ...] = (openai.APIConnectionError, *TRANSPORT_ERRORS)
_PATH = "/chat/completions"

def _user_parts(blocks: list[Any], hydrate: Hydrate, vision: bool) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for block in blocks:
        if isinstance(block, ImageBlock):
            url = try_hydrate(hydrate, block) if vision else None
            if url is not None:
                parts.append({"type": "image_url", "image_url": {"url": url}})
            else:
                reason = MISSING_BYTES if vision else "this model takes no images"
                parts.append({"type": "text", "text": image_placeholder(block, reason)})
            continue
        text = block_text(block)
        if text:
            parts.append({"type": "text", "text": text})
    return parts


def _plain(blocks: list[Any], vision_note: str) -> str:
    out: list[str] = []
    for block in blocks:
        if isinstance(block, ImageBlock):
            out.append(image_placeholder(block, vision_note))
        else:
            text = block_text(block)
            if text:
                out.append(text)
    return "\n".join(out)


def _json_arguments(call: ToolCall) -> str:
    """The call's arguments as a JSON object text, as servers that parse them require.

    A model cut off by its output limit (or a small local one) can write arguments that are not
    JSON; vLLM and llama.cpp parse every call in the history and would refuse each later request.
    The raw text is kept inside a JSON object, as the Anthropic adapter does.
    """
    try:
        value = json.loads(call.arguments or "{}")
    except ValueError:
        return json.dumps({"_unparsed_arguments": call.arguments}, ensure_ascii=False)
    if isinstance(value, dict):
        return call.arguments or "{}"
    return json.dumps({"_arguments": value}, ensure_ascii=False)


def to_openai_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]


def to_openai_messages(
    system: str, messages: list[Message], hydrate: Hydrate, *, vision: bool = True,
    copies: DerivedCache | None = None,
) -> list[dict[str, Any]]:
    """The Chat Completions ``messages``. With ``copies``, the wire form of a message without
    images is made once and used again by every later request that sends that same object (the
    result is the same either way; a message with images is mapped afresh: its bytes are read
    at request time, and large)."""
    wire: list[dict[str, Any]] = []
    if system:
        wire.append({"role": "system", "content": system})
    pending_images: list[dict[str, Any]] = []

    def flush_tool_images() -> None:
        if pending_images:
            wire.append(
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Images returned by the tool calls above:"}]
                    + pending_images.copy(),
                }
            )
            pending_images.clear()

    def without_images(msg: Message) -> _Mapped | None:
        return None if msg.images() else _to_openai(msg, hydrate, vision)

    for msg in messages:
        if msg.role != "tool":
            flush_tool_images()
        mapped = copies.derive(msg, _WIRE_TAG, without_images) if copies is not None else None
        entries, images = mapped or _to_openai(msg, hydrate, vision)
        wire.extend(entries)
        pending_images.extend(images)
    flush_tool_images()
    return _merge_user_runs(wire)


_WIRE_TAG = "openai"
_Mapped = tuple[list[dict[str, Any]], list[dict[str, Any]]]


def _to_openai(msg: Message, hydrate: Hydrate, vision: bool) -> _Mapped:
    """One message's wire entries, and the image parts that must follow its run of tool results
    (Chat Completions takes no images inside ``tool`` messages)."""
    if msg.role == "user":
        parts = _user_parts(msg.content, hydrate, vision)
        if all(p["type"] == "text" for p in parts):
            return [{"role": "user", "content": "\n".join(p["text"] for p in parts)}], []
        return [{"role": "user", "content": parts}], []
    if msg.role == "assistant":
        entry: dict[str, Any] = {"role": "assistant", "content": msg.text or None}
        if msg.tool_calls:
            entry["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _json_arguments(c)}}
                for c in msg.tool_calls
            ]
        elif entry["content"] is None:
            entry["content"] = ""
        return [entry], []
    if msg.role != "tool":
        return [], []
    text = _plain([b for b in msg.content if not isinstance(b, ImageBlock)], "not attached")
    images = msg.images()
    urls = [try_hydrate(hydrate, b) for b in images] if vision else []
    if vision and any(url is None for url in urls):
        text = (text + "\n" if text else "") + "\n".join(
            image_placeholder(b, MISSING_BYTES) for b, url in zip(images, urls) if url is None
        )
        images = [b for b, url in zip(images, urls) if url is not None]
        urls = [url for url in urls if url is not None]
    follow: list[dict[str, Any]] = []
    if images:
        if vision:
            names = ", ".join(b.ref.name or b.ref.id[:12] for b in images)
            text = (text + "\n" if text else "") + f"[{len(images)} image(s) follow in the next message: {names}]"
            follow = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
        else:
            text = (text + "\n" if text else "") + "\n".join(
                image_placeholder(b, "this model takes no images") for b in images
            )
    return [{"role": "tool", "tool_call_id": msg.tool_call_id or "", "content": text or "(no output)"}], follow


def _merge_user_runs(wire: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One user message per run of them.

    A run happens when a message went unanswered (the model was down), after a summary, or
    after the images of tool results. OpenAI accepts it, but the chat templates of many local
    servers (Gemma's, Mistral's under vLLM or llama.cpp) refuse anything but strict alternation,
    which would fail every later request of the chat.
    """
    out: list[dict[str, Any]] = []
    for entry in wire:
        last = out[-1] if out else None
        if last is None or last["role"] != "user" or entry["role"] != "user":
            out.append(entry)
            continue
        if isinstance(last["content"], str) and isinstance(entry["content"], str):
            merged: str | list[dict[str, Any]] = f"{last['content']}\n\n{entry['content']}"
        else:
            merged = _parts(last["content"]) + _parts(entry["content"])
        out[-1] = {"role": "user", "content": merged}
    return out


def _parts(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def from_openai_message(choice_message: Any) -> Message:
    calls: list[ToolCall] = []
    for c in choice_message.tool_calls or []:
        if getattr(c, "function", None) is None:
            continue
        # Some OpenAI-compatible servers (Gemini's, LM Studio) give every call the id "" or none;
        # each call needs its own id, or results pair with the wrong call (or are dropped).
        call_id = c.id if isinstance(c.id, str) and c.id and all(c.id != k.id for k in calls) else None
        calls.append(ToolCall(id=call_id or f"call_{uuid.uuid4().hex[:24]}", name=c.function.name or "",
                              arguments=c.function.arguments or "{}"))
    text = choice_message.content or ""
    return Message(role="assistant", content=[TextBlock(text=text)] if text else [], tool_calls=calls)


class OpenAIProvider(Provider):
    name = "openai"

    def __init__(
        self,
        model: str,
        *,
        api_key: str,
        base_url: str | None,
        hydrate: Hydrate,
        vision: bool = True,
        tools: bool = True,
        reasoning: bool = False,
        timeout_s: float = 120.0,
        total_timeout_s: float = 900.0,
        max_retries: int = 2,
        stream: bool = True,
    ) -> None:
        self.model = model
        self.vision = vision
        self.tools = tools
        # Reasoning models take max_completion_tokens and refuse max_tokens.
        self.reasoning = reasoning
        self.stream = stream
        self.stream_usage = True  # stream_options.include_usage; dropped if the server refuses it
        self.max_retries = max_retries
        self.total_timeout_s = total_timeout_s
        self.idle_timeout_s = timeout_s
        self._hydrate = hydrate
        self.copies = DerivedCache(name="wire_memo")  # each message's wire form, for every later request of its chat
        # ``timeout_s`` bounds each read: between streamed chunks, or while the server reads the
        # prompt. The SDK's own retries are off: a timed-out generation must never be repeated
        # behind the person's back (``complete`` retries only what cannot have generated anything).
        self._client = openai.AsyncOpenAI(
            api_key=api_key or "not-needed",  # local servers take any key; the SDK insists on one
            base_url=base_url or None,
            timeout=openai.Timeout(timeout_s, connect=min(10.0, timeout_s)),
            max_retries=0,
            http_client=openai.DefaultAsyncHttpxClient(verify=sdk_tls()),
        )

    def _body(self, request: ModelRequest, hydrate: Hydrate | None = None) -> dict[str, Any]:
        """The JSON body of a chat completion request, exactly as it goes on the wire (``hydrate``:
        the images' data, fetched from the store before, off the event loop)."""
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": to_openai_messages(
                request.system, request.messages, hydrate or self._hydrate, vision=self.vision,
                copies=self.copies
            ),
        }
        if request.tools and self.tools:
            kwargs["tools"] = to_openai_tools(request.tools)
        if request.max_output_tokens:
            kwargs["max_completion_tokens" if self.reasoning else "max_tokens"] = request.max_output_tokens
        if self.stream:
            kwargs["stream"] = True
            if self.stream_usage:
                kwargs["stream_options"] = {"include_usage": True}
        return kwargs

    async def complete(self, request: ModelRequest) -> ModelResponse:
        return await complete_with_retries(self, request, self._once)

    async def _once(self, request: ModelRequest) -> ModelResponse:
        body = self._body(request, await prefetch_images(request.messages, self._hydrate))
        relay = StreamRelay(request.on_text)
        try:
            # The body goes out as built, through the client's plain ``post``: its auth, base URL,
            # timeouts and error types, without ``chat.completions.create``'s transform, which walks
            # every message of every request against the SDK's typed dicts (more than half the
            # CPU of a turn in a long chat) only to return what our mapper already produced.
            if self.stream:
                # The raw event stream, read line by line: one json.loads per chunk instead of the
                # SDK's model objects keeps streaming about as cheap as one whole answer.
                response = await self._client.post(_PATH, cast_to=httpx.Response, body=body, stream=True)
                try:
                    return await self._collect(response.aiter_lines(), relay, request)
                finally:
                    await response.aclose()
            result = await self._client.post(_PATH, cast_to=ChatCompletion, body=body)
        except openai.APIStatusError as exc:
            raise self._refused(exc.status_code, response_body(exc), exc.response.headers, request) from exc
        except _TIMEOUTS as exc:
            raise silent_for(self.idle_timeout_s) from exc
        except _UNREACHABLE as exc:
            raise unreachable(exc, sent=bool(relay.sent), url=str(self._client.base_url)) from exc
        if not result.choices:
            raise ProviderError("the model returned no choices")
        choice = result.choices[0]
        usage = (
            Usage(input_tokens=result.usage.prompt_tokens or 0, output_tokens=result.usage.completion_tokens or 0,
                  cached_tokens=_cached(result.usage.model_dump()))
            if result.usage
            else None
        )
        message = from_openai_message(choice.message)
        meter = request.meter
        if meter is not None:
            meter.received(message.text + "".join(c.arguments for c in message.tool_calls))
            meter.reported = usage
        if message.text:
            await relay(message.text)
        return ModelResponse(message=message, usage=usage, finish_reason=choice.finish_reason)

    async def _collect(self, lines: AsyncIterator[str], relay: StreamRelay, request: ModelRequest) -> ModelResponse:
        """Assemble a streamed reply: text as it comes (handed on), tool calls by their index."""
        texts: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        finish: str | None = None
        usage: Usage | None = None
        meter = request.meter
        async for line in lines:
            if not line.startswith("data:"):
                continue  # blank separators, comments (": ping"), event names
            data = line[5:].strip()
            if data == "[DONE]":
                break
            try:
                chunk = json.loads(data)
            except ValueError:
                log.warning("model server sent an unreadable stream event: %.200s", data)
                continue
            if not isinstance(chunk, dict):
                continue
            if chunk.get("error"):  # an error inside the stream (OpenRouter, llama.cpp, vLLM)
                if relay.sent:
                    raise broke_off(str(chunk["error"])[:300])
                raise self._refused(None, chunk, None, request)
            if meter is not None:
                meter.answer_began()  # the server took the request: from here on it may bill it
            if isinstance(chunk.get("usage"), dict):
                u = chunk["usage"]
                usage = Usage(input_tokens=int(u.get("prompt_tokens") or 0),
                              output_tokens=int(u.get("completion_tokens") or 0), cached_tokens=_cached(u))
                if meter is not None:
                    meter.reported = usage
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                content = delta.get("content")
                if content:
                    texts.append(content)
                    if meter is not None:
                        meter.received(content)
                    await relay(content)
                for position, call in enumerate(delta.get("tool_calls") or ()):
                    index = call.get("index")
                    index = index if isinstance(index, int) else len(calls) + position
                    slot = calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
                    if call.get("id"):
                        slot["id"] = call["id"]
                    function = call.get("function") or {}
                    name = function.get("name")
                    if name and name != slot["name"]:
                        slot["name"] += name
                    slot["arguments"] += function.get("arguments") or ""
                    if meter is not None:
                        meter.received(function.get("arguments") or "")
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
        tool_calls = [SimpleNamespace(id=c["id"], function=SimpleNamespace(name=c["name"], arguments=c["arguments"]))
                      for _, c in sorted(calls.items())]
        message = from_openai_message(SimpleNamespace(content="".join(texts), tool_calls=tool_calls))
        return ModelResponse(message=message, usage=usage, finish_reason=finish)

    def _refused(self, status: int | None, body: Any, headers: Any, request: ModelRequest) -> Exception:
        """What to do about an error response: send again differently, retry, or give up."""
        refusal = classify(status, body, headers)
        if refusal.kind == "stream_unsupported" and self.stream and self.stream_usage \
                and "stream_options" in refusal.message:
            log.warning("model server refused stream_options (%s); streaming without usage from now on",
                        refusal.short())
            self.stream_usage = False
            return SendAgain()
        if not self.reasoning and "max_completion_tokens" in refusal.message and "max_tokens" in refusal.message:
            log.warning("model %s wants max_completion_tokens; using it from now on", self.model)
            self.reasoning = True
            return SendAgain()
        return adapt_or_fail(self, refusal, request)

    async def aclose(self) -> None:
        await self._client.close()


def _cached(usage: dict[str, Any]) -> int:
    """Input tokens the server read from its prompt cache (OpenAI's ``prompt_tokens_details``)."""
    details = usage.get("prompt_tokens_details")
    if not isinstance(details, dict):
        return 0
    try:
        return int(details.get("cached_tokens") or 0)
    except (TypeError, ValueError):
        return 0
