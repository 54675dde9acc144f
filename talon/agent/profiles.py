"""Model profiles: how much a model can read, how much it may write, and whether it sees images.

Every context budget derives from the profile (``TALON_MODEL_CONTEXT_WINDOW``,
``TALON_MODEL_MAX_OUTPUT`` and ``TALON_MODEL_VISION`` override it). Known models are matched by
the longest table key that prefixes the normalized name; OpenRouter-style ``vendor/model`` and
Ollama-style ``model:tag`` names are reduced to the bare model name first.

An unknown model gets a conservative window (32k tokens, 4k output) so a small local server is not
overrun. Its vision is assumed ON under ``TALON_MODEL_VISION=auto``, with a safety net: when the
server refuses an image, the OpenAI adapter drops to text placeholders for the rest of the process
and retries the request (see ``OpenAIProvider``). Guessing "off" instead would silently blind every
custom vision model, which nobody would notice; guessing "on" costs one refused request at worst.

``max_output`` is what Talon requests (and reserves out of the window) per reply, not the model's
hard ceiling: reserving 128k tokens of a 400k window for one chat answer would waste a third of it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
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

    def describe(self) -> str:
        return (
            f"context window {self.context_window:,} tokens, replies up to {self.max_output:,}, "
            f"images {'yes' if self.vision else 'no'}"
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
) -> ModelProfile:
    """The table's profile with the settings' overrides applied.

    ``max_output`` never takes more than half the window, so a request always has room to read.
    """
    profile = lookup_profile(provider, model)
    window = context_window if context_window and context_window > 0 else profile.context_window
    out = max_output if max_output and max_output > 0 else profile.max_output
    out = max(256, min(out, window // 2))
    sees = profile.vision if vision == "auto" else vision == "true"
    return replace(profile, context_window=window, max_output=out, vision=sees)


def settings_profile(settings: "Settings", spec: str | None = None) -> ModelProfile:
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
        )
    provider, name = split_summary_model(spec, settings.provider_name)
    return resolve_profile(provider, name)


def split_summary_model(spec: str, default_provider: str) -> tuple[str, str]:
    """``anthropic:claude-x`` -> (anthropic, claude-x); ``qwen2.5:7b`` keeps the default provider."""
    from talon.config import split_model

    provider, name = split_model(spec)
    if ":" in spec and provider in ("openai", "anthropic"):
        return provider, name
    return default_provider, spec.strip()
