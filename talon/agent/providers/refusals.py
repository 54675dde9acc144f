"""What a model server's error means, from the body it sent, whatever the status code.

Servers disagree on status codes for the same refusal: llama.cpp answers an image sent to a
text-only model with a **500**, Ollama refuses tools with a 400, OpenRouter says "no endpoints
support image input" with a 404, vLLM states its window in a 400 about ``max_tokens``. So the
classifier reads the body (OpenAI's ``{"error": {...}}``, Anthropic's ``{"type": "error",
"error": {...}}``, Ollama's ``{"error": "..."}``, FastAPI's ``{"detail": ...}``, or plain text)
and the status code only breaks ties. Each kind has one recovery in the providers and the agent:

| kind | recovery |
|---|---|
| ``images_unsupported`` | send text placeholders instead of images, from now on |
| ``image_invalid`` | withhold that image (and remember it for the chat) |
| ``context_overflow`` | believe the stated window, fit the request to it, retry |
| ``tools_unsupported`` | run without tools, from now on |
| ``stream_unsupported`` | ask without streaming, from now on |
| ``rate_limited`` / ``overloaded`` / ``server_error`` | wait (``retry_after`` when given), retry a few times |
| ``model_not_found`` / ``auth`` / ``quota`` / ``bad_request`` | none: the person is told what the server said |

Pure functions; the unit tests feed them the verbatim bodies each family sends.
"""

from __future__ import annotations

import email.utils
import json
import re
import time
from collections.abc import Mapping
from typing import Any

# A classified refusal is error data: it lives in the error tree, which imports nothing above it.
from talon.errors import ProviderError, Refusal, RefusalKind


def error_fields(body: Any) -> tuple[str, str, str, dict[str, Any]]:
    """(message, type, code, the error object) from any family's error body."""
    if isinstance(body, (bytes, bytearray)):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        stripped = body.strip()
        if stripped.startswith("{"):
            try:
                body = json.loads(stripped)
            except ValueError:
                return stripped, "", "", {}
        else:
            return stripped, "", "", {}
    if not isinstance(body, Mapping):
        return ("" if body is None else str(body)), "", "", {}
    err: Any = body.get("error", body)
    if isinstance(err, str):  # Ollama: {"error": "..."}
        return err, str(body.get("type") or ""), str(body.get("code") or ""), dict(body)
    if not isinstance(err, Mapping):
        err = body
    message = err.get("message")
    if message is None and "detail" in body:  # FastAPI (vLLM's older validation errors)
        detail = body["detail"]
        message = detail if isinstance(detail, str) else json.dumps(detail)
    if message is None:
        message = json.dumps(dict(body))
    raw = err.get("metadata", {}).get("raw") if isinstance(err.get("metadata"), Mapping) else None
    if isinstance(raw, str) and raw and raw not in str(message):
        # OpenRouter passes the upstream provider's own words in metadata.raw.
        message = f"{message} ({raw})"
    return str(message), str(err.get("type") or ""), str(err.get("code") or ""), dict(err)


# -- context windows ---------------------------------------------------------------------------

_WINDOW_PATTERNS = (
    re.compile(r"available context size \((\d+) tokens?\)", re.I),  # llama.cpp
    re.compile(r"\bn_ctx[:=]\s*(\d+)", re.I),  # LM Studio (llama.cpp inside): "n_ctx: 4096"
    re.compile(r"configured limit of (\d+)", re.I),  # OpenAI's input limit
    re.compile(r"maximum context length is (\d+)", re.I),  # OpenAI, vLLM, OpenRouter
    re.compile(r"maximum model length of (\d+)", re.I),  # vLLM (decoder prompt)
    re.compile(r"max(?:imum)?_model_len[^0-9]{0,10}(\d+)", re.I),
    re.compile(r"context length of only (\d+)", re.I),  # LM Studio
    re.compile(r">\s*(\d+)\s*maximum", re.I),  # Anthropic: "208310 tokens > 200000 maximum"
    re.compile(r"context (?:window|length|size)(?: of)?[^0-9]{0,30}(\d{3,})", re.I),
)
_REQUESTED_PATTERNS = (
    re.compile(r"request \((\d+) tokens?\)", re.I),
    re.compile(r"prompt is too long:\s*(\d+)", re.I),
    re.compile(r"resulted in (\d+) tokens", re.I),
    re.compile(r"you requested (?:about )?(\d+) tokens", re.I),
    re.compile(r"prompt \(length (\d+)\)", re.I),
)


def stated_window(message: str, err: Mapping[str, Any] | None = None) -> int | None:
    """The context window a "too long" error states, in tokens (None when it states none)."""
    if err:
        for key in ("n_ctx", "max_model_len", "context_length"):
            value = err.get(key)
            if isinstance(value, int) and value >= 256:
                return value
    for pattern in _WINDOW_PATTERNS:
        match = pattern.search(message)
        if match and int(match.group(1)) >= 256:
            return int(match.group(1))
    return None


def _requested(message: str, err: Mapping[str, Any]) -> int | None:
    value = err.get("n_prompt_tokens")
    if isinstance(value, int):
        return value
    for pattern in _REQUESTED_PATTERNS:
        match = pattern.search(message)
        if match:
            return int(match.group(1))
    return None


_OVERFLOW_WORDS = (
    "exceeds the available context size",
    "maximum context length",
    "maximum model length",
    "prompt is too long",
    "context window",
    "context length",
    "context_length_exceeded",
    "too many tokens",
    "reduce the length of the messages",
    "tokens to keep from the initial prompt is greater than the context length",
    "is longer than the maximum model length",
    "input is too long",
    "input length",
    "max_model_len",
    "configured limit of",
)

_NEGATION = r"(?:not supported|unsupported|not support|doesn'?t support|does not support|cannot|can'?t|" \
            r"not enabled|no support|isn'?t supported|is not a multimodal|not a multimodal|" \
            r"not capable|lacks? support|no endpoints found that support)"
_IMAGES_UNSUPPORTED = re.compile(
    r"not a multimodal model|required for image input|image_url is only supported by|"
    r"(?:(?:image|vision|multimodal|multi-modal|mmproj)[^.\n]{0,60}" + _NEGATION + r")|(?:" + _NEGATION +
    r"[^.\n]{0,60}(?:image|vision|multimodal|multi-modal))", re.I)
_TOOLS_UNSUPPORTED = re.compile(
    r"(?:(?:\btools?\b|tool[ _]?(?:use|call|choice)|function[ _]calling)[^.\n]{0,60}(?:" + _NEGATION +
    r"|requires --jinja|requires --enable-auto-tool-choice))|(?:" + _NEGATION +
    r"[^.\n]{0,40}(?:\btools?\b|tool use|tool calling|function calling))|enable-auto-tool-choice|"
    r"tools param requires", re.I)
_STREAM_UNSUPPORTED = re.compile(
    r"(?:stream(?:_options|ing)?[^.\n]{0,40}" + _NEGATION + r")|(?:unrecognized|unknown|unexpected|"
    r"extra)[^.\n]{0,30}stream_options|stream_options[^.\n]{0,30}(?:not permitted|extra|unrecognized)", re.I)
_INVALID_IMAGE = re.compile(
    r"invalid image|image_parse_error|could not process image|failed to (?:load|decode|process) image|"
    r"unsupported image|image (?:is )?too large|image exceeds|image dimensions|invalid base64|"
    r"image format", re.I)
_NOT_FOUND = re.compile(
    r"model[^.\n]{0,80}(?:not found|does not exist|doesn'?t exist|not available|is not a valid model)|"
    r"not found, try pulling|no such model|unknown model|invalid model identifier|model_not_found|"
    r"the model `[^`]*` does not exist|no models loaded|not a valid model", re.I)
_QUOTA = re.compile(r"insufficient_quota|exceeded your current quota|insufficient credits|"
                    r"credit balance is too low|out of credits|payment required|billing|"
                    r"free-models-per-day|add \d+ credits", re.I)
_AUTH = re.compile(r"invalid[ _]api[ _]key|incorrect api key|invalid x-api-key|authentication|"
                   r"unauthori[sz]ed|no auth credentials|api key (?:is )?(?:invalid|missing|not valid)",
                   re.I)


def retry_after_seconds(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """Seconds to wait, from ``retry-after-ms`` / ``retry-after`` (seconds or an HTTP date)."""
    if not headers:
        return None
    lower = {k.lower(): v for k, v in headers.items()}
    ms = lower.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = lower.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def classify(status: int | None, body: Any, headers: Mapping[str, str] | None = None) -> Refusal:
    """The kind of refusal a server's error response is (see the module docstring)."""
    message, etype, code, err = error_fields(body)
    text = f"{message} {etype} {code}"
    low = text.lower()
    window = stated_window(message, err)

    def make(kind: RefusalKind, **extra: Any) -> Refusal:
        return Refusal(kind=kind, status=status, message=message or f"HTTP {status}", **extra)

    explicit = etype in ("exceed_context_size_error", "request_too_large") or code == "context_length_exceeded"
    if explicit or (any(word in low for word in _OVERFLOW_WORDS) and not _INVALID_IMAGE.search(low)):
        # "context length" alone also appears in other errors; the type or code, a stated
        # number, or an explicit overflow phrase is what makes it one.
        if explicit or window is not None or "exceed" in low or "too long" in low or "reduce" in low \
                or "greater than" in low or "too many" in low or "longer than" in low or "fewer" in low:
            return make("context_overflow", window=window, requested=_requested(message, err))
    if _IMAGES_UNSUPPORTED.search(text):
        return make("images_unsupported")
    if _TOOLS_UNSUPPORTED.search(text):
        return make("tools_unsupported")
    if _STREAM_UNSUPPORTED.search(text):
        return make("stream_unsupported")
    if status == 413:
        return make("context_overflow", window=window)
    if _INVALID_IMAGE.search(text):
        return make("image_invalid")
    if status == 402 or _QUOTA.search(text):
        return make("quota")
    if status == 429 or etype in ("rate_limit_error", "rate_limit_exceeded") or code == "rate_limit_exceeded" \
            or "rate limit" in low:
        return make("rate_limited", retry_after=retry_after_seconds(headers))
    if status in (401, 403) or etype in ("authentication_error", "permission_error") or _AUTH.search(text):
        return make("auth")
    # A 404 that names no model is a wrong URL (e.g. OPENAI_BASE_URL without /v1), not a model.
    if code == "model_not_found" or _NOT_FOUND.search(text) or (
            (status == 404 or etype in ("not_found_error", "NotFoundError")) and "model" in low):
        return make("model_not_found")
    if status == 529 or etype in ("overloaded_error", "unavailable_error") or status == 503:
        return make("overloaded", retry_after=retry_after_seconds(headers))
    if status is None or status >= 500 or status == 408:
        return make("server_error", retry_after=retry_after_seconds(headers))
    return make("bad_request")


def refusal_error(refusal: Refusal, *, has_images: bool = False) -> ProviderError:
    """The typed error for a refusal that the provider could not recover from by itself."""
    from talon import errors

    said = refusal.short()
    status = f" ({refusal.status})" if refusal.status else ""
    kind = refusal.kind
    if kind == "context_overflow":
        if refusal.status == 413 and has_images:
            return errors.ImageRejected(f"the request with its images is too large for the server{status}: {said}",
                                        refusal=refusal)
        size = f" ({refusal.requested:,} tokens" if refusal.requested else ""
        size += (f", window {refusal.window:,})" if refusal.window else ")") if size else ""
        return errors.ContextOverflow(f"the request is too long for the model{size}: {said}",
                                      window=refusal.window, refusal=refusal)
    if kind == "image_invalid" and has_images:
        return errors.ImageRejected(f"the model refused an image{status}: {said}", refusal=refusal)
    if kind == "images_unsupported":
        return errors.ImagesUnsupported(f"the model takes no images{status}: {said}", refusal=refusal)
    if kind == "tools_unsupported":
        return errors.ToolsUnsupported(f"the model server cannot call tools{status}: {said}", refusal=refusal)
    if kind == "rate_limited":
        return errors.RateLimited(f"the model server is rate limiting us{status}: {said}",
                                  retry_after=refusal.retry_after, refusal=refusal)
    if kind in ("overloaded", "server_error"):
        return errors.ProviderUnavailable(f"the model server failed{status}: {said}", refusal=refusal)
    if kind == "quota":
        return errors.QuotaExceeded(f"the model account is out of credit or quota{status}: {said}", refusal=refusal)
    if kind == "model_not_found":
        return errors.ModelNotFound(f"the model server has no such model{status}: {said}", refusal=refusal)
    if kind == "auth":
        return errors.AuthRejected(f"the model server refused our API key{status}: {said}", refusal=refusal)
    return errors.ProviderError(f"the model server refused the request{status}: {said}", refusal=refusal)
