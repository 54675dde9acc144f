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

import logging
from typing import Any

import openai

from talon.agent.provider import (
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
)
from talon.content import ImageBlock, Message, TextBlock, ToolCall
from talon.errors import ContextOverflow, ImageRejected, ProviderError, ProviderUnavailable

log = logging.getLogger(__name__)

def _user_parts(blocks: list[Any], hydrate: Hydrate, vision: bool) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for block in blocks:
        if isinstance(block, ImageBlock):
            if vision:
                parts.append({"type": "image_url", "image_url": {"url": hydrate(block)}})
            else:
                parts.append({"type": "text", "text": image_placeholder(block, "this model takes no images")})
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
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
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
            if images:
                if vision:
                    names = ", ".join(b.ref.name or b.ref.id[:12] for b in images)
                    text = (text + "\n" if text else "") + f"[{len(images)} image(s) follow in the next message: {names}]"
                    pending_images.extend(
                        {"type": "image_url", "image_url": {"url": hydrate(b)}} for b in images
                    )
                else:
                    text = (text + "\n" if text else "") + "\n".join(
                        image_placeholder(b, "this model takes no images") for b in images
                    )
            wire.append({"role": "tool", "tool_call_id": msg.tool_call_id or "", "content": text or "(no output)"})
    flush_tool_images()
    return wire


def from_openai_message(choice_message: Any) -> Message:
    calls = [
        ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments or "{}")
        for c in (choice_message.tool_calls or [])
        if getattr(c, "function", None) is not None
    ]
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
