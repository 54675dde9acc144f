"""OpenAI-compatible Chat Completions adapter (OpenAI, Ollama, vLLM, llama.cpp, OpenRouter...).

``to_openai_messages`` is a pure mapper from neutral messages to the wire format; images are
hydrated from the attachment store only here, at request time. Chat Completions refuses images
inside ``tool`` messages, so a tool result's images travel in a synthetic user message placed
right after the run of tool results.

Vision comes from the model profile. For a model the profile table does not know, vision is tried
(``vision_fallback``): if the server refuses the images, the provider switches to text placeholders
for the rest of the process and sends the request again, once.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import openai

from talon.agent.provider import (
    MISSING_BYTES,
    Hydrate,
    ModelRequest,
    ModelResponse,
    Provider,
    ToolSpec,
    Usage,
    block_text,
    has_images,
    image_placeholder,
    mentions_image,
    try_hydrate,
)
from talon.content import ImageBlock, Message, TextBlock, ToolCall
from talon.errors import ContextOverflow, ImageRejected, ProviderError, ProviderUnavailable

log = logging.getLogger(__name__)

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
    system: str, messages: list[Message], hydrate: Hydrate, *, vision: bool = True
) -> list[dict[str, Any]]:
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

    for msg in messages:
        if msg.role != "tool":
            flush_tool_images()
        if msg.role == "user":
            parts = _user_parts(msg.content, hydrate, vision)
            if all(p["type"] == "text" for p in parts):
                wire.append({"role": "user", "content": "\n".join(p["text"] for p in parts)})
            else:
                wire.append({"role": "user", "content": parts})
        elif msg.role == "assistant":
            entry: dict[str, Any] = {"role": "assistant", "content": msg.text or None}
            if msg.tool_calls:
                entry["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _json_arguments(c)}}
                    for c in msg.tool_calls
                ]
            elif entry["content"] is None:
                entry["content"] = ""
            wire.append(entry)
        elif msg.role == "tool":
            text = _plain(
                [b for b in msg.content if not isinstance(b, ImageBlock)], "not attached"
            )
            images = msg.images()
            urls = [try_hydrate(hydrate, b) for b in images] if vision else []
            if vision and any(url is None for url in urls):
                text = (text + "\n" if text else "") + "\n".join(
                    image_placeholder(b, MISSING_BYTES) for b, url in zip(images, urls) if url is None
                )
                images = [b for b, url in zip(images, urls) if url is not None]
                urls = [url for url in urls if url is not None]
            if images:
                if vision:
                    names = ", ".join(b.ref.name or b.ref.id[:12] for b in images)
                    text = (text + "\n" if text else "") + f"[{len(images)} image(s) follow in the next message: {names}]"
                    pending_images.extend({"type": "image_url", "image_url": {"url": url}} for url in urls)
                else:
                    text = (text + "\n" if text else "") + "\n".join(
                        image_placeholder(b, "this model takes no images") for b in images
                    )
            wire.append({"role": "tool", "tool_call_id": msg.tool_call_id or "", "content": text or "(no output)"})
    flush_tool_images()
    return _merge_user_runs(wire)


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


def refuses_images(exc: openai.APIStatusError) -> bool:
    """A 400 that says the model cannot take image input (as local servers word it)."""
    message = str(exc.message or "").lower()
    return any(word in message for word in ("image", "vision", "multimodal", "multi-modal")) and any(
        word in message for word in ("not support", "unsupported", "does not support", "cannot", "can't", "not enabled")
    )


def is_context_overflow(exc: openai.APIStatusError) -> bool:
    body = exc.body if isinstance(exc.body, dict) else {}
    code = str(body.get("code") or getattr(exc, "code", "") or "")
    message = str(exc.message or "").lower()
    return (
        code == "context_length_exceeded"
        or "maximum context length" in message
        or "context length" in message
        or "context window" in message
        or "too many tokens" in message
    )


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
        vision_fallback: bool = False,
        reasoning: bool = False,
        timeout_s: float = 120.0,
        max_retries: int = 2,
    ) -> None:
        self.model = model
        self.vision = vision
        self.vision_fallback = vision_fallback
        # Reasoning models take max_completion_tokens and refuse max_tokens.
        self.reasoning = reasoning
        self._hydrate = hydrate
        # Local servers (Ollama, llama.cpp) take any key; the SDK insists on one being set.
        self._client = openai.AsyncOpenAI(
            api_key=api_key or "not-needed",
            base_url=base_url or None,
            timeout=timeout_s,
            max_retries=max_retries,
        )

    async def complete(self, request: ModelRequest) -> ModelResponse:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": to_openai_messages(
                request.system, request.messages, self._hydrate, vision=self.vision
            ),
        }
        if request.tools:
            kwargs["tools"] = to_openai_tools(request.tools)
        if request.max_output_tokens:
            kwargs["max_completion_tokens" if self.reasoning else "max_tokens"] = request.max_output_tokens
        try:
            resp = await self._client.chat.completions.create(**kwargs)
        except openai.BadRequestError as exc:
            if is_context_overflow(exc):
                raise ContextOverflow(f"the model's context window was exceeded: {exc.message}") from exc
            if not self.reasoning and "max_completion_tokens" in str(exc.message or ""):
                log.warning("model %s wants max_completion_tokens; using it from now on", self.model)
                self.reasoning = True
                return await self.complete(request)
            if self.vision and self.vision_fallback and refuses_images(exc) and has_images(request.messages):
                log.warning("model %s refused images (%s); sending text placeholders from now on",
                            self.model, exc.message)
                self.vision = False
                return await self.complete(request)
            if self.vision and has_images(request.messages) and mentions_image(str(exc.message or "")):
                raise ImageRejected(f"the model refused an image (400): {exc.message}") from exc
            raise ProviderError(f"the model refused the request (400): {exc.message}") from exc
        except (openai.APIConnectionError, openai.APITimeoutError) as exc:
            raise ProviderUnavailable(f"could not reach the model server: {exc}") from exc
        except openai.RateLimitError as exc:
            raise ProviderUnavailable(f"the model server is rate limiting us (429): {exc.message}") from exc
        except openai.APIStatusError as exc:
            if exc.status_code == 413:
                # Typically a proxy's body limit (nginx: 1 MB): the images are what makes it big.
                if self.vision and has_images(request.messages):
                    raise ImageRejected(f"the request with its images is too large for the server (413): "
                                        f"{exc.message}") from exc
                raise ContextOverflow(f"the request is too large for the server (413): {exc.message}") from exc
            if exc.status_code >= 500:
                raise ProviderUnavailable(
                    f"the model server failed ({exc.status_code}): {exc.message}"
                ) from exc
            raise ProviderError(f"the model server said {exc.status_code}: {exc.message}") from exc
        if not resp.choices:
            raise ProviderError("the model returned no choices")
        choice = resp.choices[0]
        usage = (
            Usage(input_tokens=resp.usage.prompt_tokens or 0, output_tokens=resp.usage.completion_tokens or 0)
            if resp.usage
            else None
        )
        return ModelResponse(
            message=from_openai_message(choice.message), usage=usage, finish_reason=choice.finish_reason
        )

    async def aclose(self) -> None:
        await self._client.close()
