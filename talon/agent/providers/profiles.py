"""Model profiles: how much a model can read, how much it may write, and whether it sees images.

Every context budget derives from the profile (``TALON_MODEL_CONTEXT_WINDOW``,
``TALON_MODEL_MAX_OUTPUT`` and ``TALON_MODEL_VISION`` override it). Known models are matched by
the longest table key that prefixes the normalized name; OpenRouter-style ``vendor/model`` and
Ollama-style ``model:tag`` names are reduced to the bare model name first.

What the server itself reports (``talon.agent.providers.discovery``: llama.cpp's ``/props``, Ollama's
``/api/show``, vLLM's ``max_model_len``...) beats the table, and explicit settings beat both; each
value remembers where it came from, for /status and ``talon doctor``.

An unknown model that discovery says nothing about gets a conservative window (32k tokens) so a
small local server is not overrun. Its vision is assumed ON under ``TALON_MODEL_VISION=auto``, with
a safety net: when the server says it takes no images (whatever the status code), the adapter
drops to text placeholders for the rest of the process and sends the request again. Guessing "off"
instead would silently blind every custom vision model; guessing "on" costs one refused request.

``max_output`` is what Talon requests (and reserves out of the window) per reply, not the model's
hard ceiling: reserving 128k tokens of a 400k window for one chat answer would waste a third of it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from talon.errors import ConfigError

if TYPE_CHECKING:
    from talon.agent.providers.discovery import ServerFacts
    from talon.config import Settings

K = 1024


@dataclass(frozen=True)
class ModelProfile:
    context_window: int
    max_output: int
    vision: bool
    # False when the name matched nothing and the values are the conservative defaults.
    known: bool = True
    # OpenAI reasoning models take ``max_completion_tokens`` and refuse ``max_tokens``.
    reasoning: bool = False
    tools: bool = True
    # Where each value came from, when not the table: (field, source) pairs.
    sources: tuple[tuple[str, str], ...] = ()
    # True when TALON_MODEL_MAX_OUTPUT set the reply length (it is then never changed behind
    # the owner's back).
    explicit_output: bool = False

    def source(self, name: str) -> str:
        found = dict(self.sources).get(name)
        if found:
            return found
        return "Talon's model table" if self.known else "Talon's default for unknown models"

    def learned(self, *, source: str, context_window: int | None = None, vision: bool | None = None,
                tools: bool | None = None) -> "ModelProfile":
        """This profile with what the server revealed while running (a stated window, a refusal)."""
        sources = dict(self.sources)
        profile = self
        if context_window is not None:
            out = self.max_output
            fitted = min(context_window // 2, max(context_window // 4, 256))
            if (out > fitted and not self.explicit_output) or out > context_window * 3 // 4:
                out = fitted
                sources["max_output"] = f"fitted to the window {source}"
            profile = replace(profile, context_window=context_window, max_output=out)
            sources["context_window"] = source
        if vision is not None:
            profile = replace(profile, vision=vision)
            sources["vision"] = source
        if tools is not None:
            profile = replace(profile, tools=tools)
            sources["tools"] = source
        return replace(profile, sources=tuple(sources.items()))

    def describe(self, *, with_sources: bool = False) -> str:
        def src(name: str) -> str:
            return f" ({self.source(name)})" if with_sources else ""

        return (
            f"context window {self.context_window:,} tokens{src('context_window')}, replies up to "
            f"{self.max_output:,}{src('max_output')}, images {'yes' if self.vision else 'no'}{src('vision')}, "
            f"tools {'yes' if self.tools else 'no'}{src('tools')}"
        )


def _p(window: int, out: int, vision: bool, reasoning: bool = False) -> ModelProfile:
    return ModelProfile(window, out, vision, True, reasoning)


# Longest matching key wins, so "gpt-4o-mini" beats "gpt-4o" beats "gpt-4".
KNOWN_MODELS: dict[str, ModelProfile] = {
    # OpenAI
    "gpt-6": _p(400_000, 32_000, True, reasoning=True),
    "gpt-5": _p(400_000, 32_000, True, reasoning=True),
    "gpt-5-chat": _p(128_000, 16_384, True),
    "gpt-5.1-chat": _p(128_000, 16_384, True),
    "gpt-5.2-chat": _p(128_000, 16_384, True),
    "gpt-5.3-chat": _p(128_000, 16_384, True),
    "gpt-4.1": _p(1_047_576, 32_768, True),
    "gpt-4.5": _p(128_000, 16_384, True),
    "gpt-4o": _p(128_000, 16_384, True),
    "chatgpt-4o": _p(128_000, 16_384, True),
    "gpt-4-turbo": _p(128_000, 4_096, True),
    "gpt-4-vision": _p(128_000, 4_096, True),
    "gpt-4-32k": _p(32_768, 4_096, False),
    "gpt-4": _p(8_192, 2_048, False),
    "gpt-3.5-turbo": _p(16_385, 4_096, False),
    "o1": _p(200_000, 32_000, True, reasoning=True),
    "o1-mini": _p(128_000, 32_000, False, reasoning=True),
    "o1-preview": _p(128_000, 32_000, False, reasoning=True),
    "o3": _p(200_000, 32_000, True, reasoning=True),
    "o3-mini": _p(200_000, 32_000, False, reasoning=True),
    "o4-mini": _p(200_000, 32_000, True, reasoning=True),
    # Anthropic
    "claude-": _p(200_000, 8_192, True),
    "claude-3-haiku": _p(200_000, 4_096, True),
    "claude-3-opus": _p(200_000, 4_096, True),
    "claude-3-sonnet": _p(200_000, 4_096, True),
    "claude-3-5": _p(200_000, 8_192, True),
    "claude-3-7": _p(200_000, 16_384, True),
    "claude-sonnet-4": _p(200_000, 16_384, True),
    "claude-opus-4": _p(200_000, 16_384, True),
    "claude-haiku-4": _p(200_000, 16_384, True),
    "claude-2": _p(100_000, 4_096, False),
    "claude-instant": _p(100_000, 4_096, False),
    # Open-weight families as Ollama / vLLM / llama.cpp / OpenRouter name them
    "llama3": _p(8_192, 2_048, False),
    "llama-3": _p(8_192, 2_048, False),
    "llama3.1": _p(128_000, 4_096, False),
    "llama-3.1": _p(128_000, 4_096, False),
    "llama3.2": _p(128_000, 4_096, False),
    "llama-3.2": _p(128_000, 4_096, False),
    "llama3.2-vision": _p(128_000, 4_096, True),
    "llama-3.2-11b-vision": _p(128_000, 4_096, True),
    "llama-3.2-90b-vision": _p(128_000, 4_096, True),
    "llama3.3": _p(128_000, 4_096, False),
    "llama-3.3": _p(128_000, 4_096, False),
    "llama4": _p(128_000, 4_096, True),
    "llama-4": _p(128_000, 4_096, True),
    "llava": _p(4_096, 1_024, True),
    "bakllava": _p(4_096, 1_024, True),
    "qwen2": _p(32_768, 4_096, False),
    "qwen2.5": _p(32_768, 4_096, False),
    "qwen2.5-vl": _p(32_768, 4_096, True),
    "qwen2.5vl": _p(32_768, 4_096, True),
    "qwen2-vl": _p(32_768, 4_096, True),
    "qwen3": _p(32_768, 4_096, False),
    "qwen3-vl": _p(32_768, 4_096, True),
    "qwq": _p(32_768, 8_192, False),
    "mistral": _p(32_768, 4_096, False),
    "mistral-small3.1": _p(128_000, 4_096, True),
    "mistral-small-3.1": _p(128_000, 4_096, True),
    "mixtral": _p(32_768, 4_096, False),
    "pixtral": _p(128_000, 4_096, True),
    "gemma2": _p(8_192, 2_048, False),
    "gemma-2": _p(8_192, 2_048, False),
    "gemma3": _p(128_000, 4_096, True),
    "gemma-3": _p(128_000, 4_096, True),
    "phi3": _p(4_096, 1_024, False),
    "phi-3": _p(4_096, 1_024, False),
    "phi4": _p(16_384, 4_096, False),
    "phi-4": _p(16_384, 4_096, False),
    "deepseek-r1": _p(64_000, 8_192, False),
    "deepseek-v3": _p(64_000, 8_192, False),
    "deepseek-chat": _p(64_000, 8_192, False),
    "minicpm-v": _p(8_192, 2_048, True),
    "moondream": _p(2_048, 512, True),
}

UNKNOWN_MODEL = ModelProfile(context_window=32 * K, max_output=4 * K, vision=True, known=False)

VisionSetting = Literal["auto", "true", "false"]


def normalize_model_name(name: str) -> str:
    """``openrouter/anthropic/claude-3.5-sonnet`` -> ``claude-3.5-sonnet``; ``llama3.1:8b`` -> ``llama3.1``."""
    bare = name.strip().lower().rsplit("/", 1)[-1]
    return bare.split(":", 1)[0]


def lookup_profile(provider: str, model: str) -> ModelProfile:
    """The table's profile for a model, or the conservative default for an unknown one."""
    bare = normalize_model_name(model)
    # Claude names sometimes use dots (OpenRouter: claude-3.5-sonnet).
    candidates = {bare, bare.replace(".", "-")} if bare.startswith("claude") else {bare}
    best: str | None = None
    for key in KNOWN_MODELS:
        if any(c.startswith(key) for c in candidates) and (best is None or len(key) > len(best)):
            best = key
    if best is not None:
        return KNOWN_MODELS[best]
    if provider == "anthropic":
        return KNOWN_MODELS["claude-"]
    return UNKNOWN_MODEL


def resolve_profile(
    provider: str,
    model: str,
    *,
    context_window: int | None = None,
    max_output: int | None = None,
    vision: VisionSetting = "auto",
    tools: VisionSetting = "auto",
    facts: "ServerFacts | None" = None,
) -> ModelProfile:
    """The model's profile: explicit settings, then what the server said (discovery), then the table.

    An explicit ``max_output`` is honoured exactly, or refused (``ConfigError``) when it leaves
    less than a quarter of the window for reading. A default one is at most a quarter of the
    window (at least 256 tokens, never more than half), so a small local window keeps room to read.
    """
    profile = lookup_profile(provider, model)
    sources: dict[str, str] = {}
    window = profile.context_window
    if context_window and context_window > 0:
        window = context_window
        sources["context_window"] = "TALON_MODEL_CONTEXT_WINDOW"
    elif facts is not None and facts.context_window:
        window = facts.context_window
        sources["context_window"] = facts.source("context_window")
    if max_output is not None:
        if max_output <= 0 or max_output > window * 3 // 4:
            raise ConfigError(
                f"TALON_MODEL_MAX_OUTPUT={max_output} does not fit the model's context window of "
                f"{window:,} tokens ({sources.get('context_window', profile.source('context_window'))}): "
                f"set it between 1 and {window * 3 // 4:,}, or unset it",
                ["TALON_MODEL_MAX_OUTPUT"])
        out = max_output
        sources["max_output"] = "TALON_MODEL_MAX_OUTPUT"
    else:
        out = profile.max_output
        if facts is not None and facts.max_output:
            out = min(out, facts.max_output) if profile.known else facts.max_output
            sources["max_output"] = facts.source("max_output")
        fitted = min(window // 2, max(window // 4, 256))
        if out > fitted:
            out = fitted
            sources["max_output"] = "a quarter of the window"
    sees = profile.vision
    if vision != "auto":
        sees = vision == "true"
        sources["vision"] = "TALON_MODEL_VISION"
    elif facts is not None and facts.vision is not None:
        sees = facts.vision
        sources["vision"] = facts.source("vision")
    calls = True
    if tools != "auto":
        calls = tools == "true"
        sources["tools"] = "TALON_MODEL_TOOLS"
    elif facts is not None and facts.tools is not None:
        calls = facts.tools
        sources["tools"] = facts.source("tools")
    return replace(profile, context_window=window, max_output=out, vision=sees, tools=calls,
                   sources=tuple(sources.items()), explicit_output=max_output is not None)


def settings_profile(settings: "Settings", spec: str | None = None,
                     facts: "ServerFacts | None" = None) -> ModelProfile:
    """The profile of ``TALON_MODEL`` with its overrides, or of another model ``spec`` without.

    A ``spec`` with no ``provider:`` prefix uses the main model's provider (so
    ``TALON_SUMMARY_MODEL=claude-3-5-haiku-latest`` works beside an ``anthropic:`` main model).
    """
    if spec is None:
        return resolve_profile(
            settings.provider_name,
            settings.model_name,
            context_window=settings.model_context_window,
            max_output=settings.model_max_output,
            vision=settings.model_vision,
            tools=settings.model_tools,
            facts=facts,
        )
    provider, name = split_summary_model(spec, settings.provider_name)
    return resolve_profile(provider, name, facts=facts)


def split_summary_model(spec: str, default_provider: str) -> tuple[str, str]:
    """``anthropic:claude-x`` -> (anthropic, claude-x); ``qwen2.5:7b`` keeps the default provider."""
    from talon.config import split_model

    provider, name = split_model(spec)
    if ":" in spec and provider in ("openai", "anthropic"):
        return provider, name
    return default_provider, spec.strip()
