"""Ask the model server what it serves: its context window, whether it takes images, tools.

Each family answers on its own endpoints, and each tells different things:

| family | asked | read |
|---|---|---|
| llama.cpp | ``GET /v1/models``, ``GET /props`` | ``n_ctx`` per slot, ``modalities.vision``, ``chat_template_caps.supports_tools`` |
| Ollama | ``POST /api/show`` | ``num_ctx`` (else Ollama's default), ``capabilities`` (vision, tools) |
| vLLM | ``GET /v1/models`` | ``max_model_len`` |
| LM Studio | ``GET /api/v0/models`` | ``loaded_context_length`` / ``max_context_length``, ``type`` vlm, ``capabilities`` tool_use |
| OpenRouter | ``GET /api/v1/models`` | ``context_length``, ``architecture.input_modalities``, ``supported_parameters``, ``top_provider.max_completion_tokens`` |
| OpenAI | ``GET /v1/models/{id}`` | only whether the model exists |
| Anthropic | ``GET /v1/models/{id}`` | whether it exists (and limits, where the API states them) |

Discovery is bounded (``timeout_s`` for everything together) and never fatal: a server that
hangs, refuses or answers something unexpected leaves the facts empty and says why. The parsers
are pure functions of the bodies, tested on each family's real shapes.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

import httpx
from talon.tls import httpx_tls

if TYPE_CHECKING:
    from talon.agent.providers.profiles import ModelProfile

log = logging.getLogger(__name__)

# Ollama truncates a prompt longer than num_ctx silently; when a model sets none, the server's
# default applies (4096 tokens in current releases, OLLAMA_CONTEXT_LENGTH overrides it).
OLLAMA_DEFAULT_NUM_CTX = 4096


@dataclass
class ServerFacts:
    family: str = "unknown"
    model: str = ""
    context_window: int | None = None
    max_output: int | None = None
    vision: bool | None = None
    tools: bool | None = None
    listed: bool | None = None  # the configured model is among those the server lists
    models: list[str] = field(default_factory=list)
    found: dict[str, str] = field(default_factory=dict)  # fact -> where it was read
    reachable: bool = True
    error: str | None = None
    elapsed_s: float = 0.0

    def source(self, name: str) -> str:
        where = self.found.get(name)
        return f"{self.family} {where}" if where else f"{self.family} server"

    def set(self, name: str, value: Any, where: str) -> None:
        if value is None:
            return
        setattr(self, name, value)
        self.found[name] = where

    def describe(self) -> str:
        if not self.reachable:
            return f"not reachable: {self.error}"
        parts = [f"{self.family} server"]
        if self.context_window:
            parts.append(f"context window {self.context_window:,} ({self.found['context_window']})")
        if self.max_output:
            parts.append(f"replies up to {self.max_output:,} ({self.found['max_output']})")
        if self.vision is not None:
            parts.append(f"images {'yes' if self.vision else 'no'} ({self.found['vision']})")
        if self.tools is not None:
            parts.append(f"tools {'yes' if self.tools else 'no'} ({self.found['tools']})")
        if self.listed is False:
            shown = ", ".join(self.models[:5]) or "none"
            parts.append(f"NO model named {self.model!r} (it serves: {shown})")
        if len(parts) == 1:
            parts.append("it states no limits")
        if self.error:
            parts.append(f"({self.error})")
        return "; ".join(parts)


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value > 0:
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip()) or None
    return None


def _entries(body: Any) -> list[dict[str, Any]]:
    if isinstance(body, Mapping):
        data = body.get("data")
        if isinstance(data, list):
            return [d for d in data if isinstance(d, Mapping)]  # type: ignore[misc]
    return []


def pick_entry(entries: list[dict[str, Any]], model: str) -> dict[str, Any] | None:
    """The entry for ``model``: by id, alias or a name that ends with it; else None."""
    wanted = model.strip().lower()
    for entry in entries:
        names = [str(entry.get("id", ""))] + [str(a) for a in entry.get("aliases") or []]
        if any(name.lower() == wanted for name in names):
            return entry
    for entry in entries:
        ident = str(entry.get("id", "")).lower()
        if wanted and (ident.endswith("/" + wanted) or ident.rsplit("/", 1)[-1] == wanted):
            return entry
    return None


# --- pure parsers, one per family ---------------------------------------------------------------
def read_llamacpp_models(facts: ServerFacts, body: Any) -> None:
    entries = _entries(body)
    facts.models = [str(e.get("id")) for e in entries]
    entry = pick_entry(entries, facts.model)
    # One model served: llama.cpp answers whatever name is asked for, so it is that one.
    facts.listed = entry is not None or len(entries) == 1
    entry = entry or (entries[0] if len(entries) == 1 else None)
    if entry is None:
        return
    meta: Mapping[str, Any] = entry["meta"] if isinstance(entry.get("meta"), Mapping) else {}
    facts.set("context_window", _int(meta.get("n_ctx")), "/v1/models meta.n_ctx")
    modalities = (entry.get("architecture") or {}).get("input_modalities") if isinstance(
        entry.get("architecture"), Mapping) else None
    if isinstance(modalities, list):
        facts.set("vision", "image" in modalities, "/v1/models architecture.input_modalities")


def read_llamacpp_props(facts: ServerFacts, body: Any) -> None:
    if not isinstance(body, Mapping):
        return
    settings = body.get("default_generation_settings")
    n_ctx = _int(settings.get("n_ctx")) if isinstance(settings, Mapping) else None
    # Per slot: with --parallel N each request gets n_ctx / N, and that is the window that counts.
    facts.set("context_window", n_ctx, "/props default_generation_settings.n_ctx")
    modalities = body.get("modalities")
    if isinstance(modalities, Mapping) and "vision" in modalities:
        facts.set("vision", bool(modalities.get("vision")), "/props modalities.vision")
    caps = body.get("chat_template_caps")
    if isinstance(caps, Mapping) and "supports_tools" in caps:
        facts.set("tools", bool(caps.get("supports_tools")), "/props chat_template_caps.supports_tools")


def is_llamacpp_props(body: Any) -> bool:
    return isinstance(body, Mapping) and "default_generation_settings" in body


_NUM_CTX = re.compile(r"^\s*num_ctx\s+(\d+)\s*$", re.M)


def read_ollama_show(facts: ServerFacts, body: Any, ps: Any = None) -> None:
    if not isinstance(body, Mapping):
        return
    caps = body.get("capabilities")
    if isinstance(caps, list):
        facts.set("vision", "vision" in caps, "/api/show capabilities")
        facts.set("tools", "tools" in caps, "/api/show capabilities")
    info: Mapping[str, Any] = body["model_info"] if isinstance(body.get("model_info"), Mapping) else {}
    trained = next((_int(v) for k, v in info.items() if str(k).endswith(".context_length")), None)
    match = _NUM_CTX.search(str(body.get("parameters") or ""))
    loaded = None
    for entry in (ps or {}).get("models") or [] if isinstance(ps, Mapping) else []:
        if isinstance(entry, Mapping) and facts.model and str(entry.get("name", "")).split(":")[0] == \
                facts.model.split(":")[0]:
            loaded = _int(entry.get("context_length"))
    if loaded:
        facts.set("context_window", loaded, "/api/ps context_length (as loaded)")
    elif match:
        facts.set("context_window", int(match.group(1)), "/api/show parameters num_ctx")
    elif trained:
        window = min(trained, OLLAMA_DEFAULT_NUM_CTX)
        facts.set("context_window", window,
                  f"Ollama's default num_ctx; the model itself takes {trained:,} (set num_ctx or "
                  "OLLAMA_CONTEXT_LENGTH for more)" if window < trained else "/api/show model_info context_length")


def read_vllm_models(facts: ServerFacts, body: Any) -> None:
    entries = _entries(body)
    facts.models = [str(e.get("id")) for e in entries]
    entry = pick_entry(entries, facts.model)
    facts.listed = entry is not None
    if entry is not None:
        facts.set("context_window", _int(entry.get("max_model_len")), "/v1/models max_model_len")


def read_lmstudio_models(facts: ServerFacts, body: Any) -> None:
    entries = [e for e in _entries(body) if e.get("type") != "embeddings"]
    facts.models = [str(e.get("id")) for e in entries]
    entry = pick_entry(entries, facts.model)
    facts.listed = entry is not None
    if entry is None:
        return
    loaded = _int(entry.get("loaded_context_length"))
    if loaded:
        facts.set("context_window", loaded, "/api/v0/models loaded_context_length")
    else:
        facts.set("context_window", _int(entry.get("max_context_length")), "/api/v0/models max_context_length")
    if entry.get("type") in ("llm", "vlm"):
        facts.set("vision", entry.get("type") == "vlm", "/api/v0/models type")
    caps = entry.get("capabilities")
    if isinstance(caps, list):
        facts.set("tools", "tool_use" in caps, "/api/v0/models capabilities")


def read_openrouter_models(facts: ServerFacts, body: Any) -> None:
    entries = _entries(body)
    facts.models = [str(e.get("id")) for e in entries][:50]
    entry = pick_entry(entries, facts.model)
    facts.listed = entry is not None
    if entry is None:
        return
    facts.set("context_window", _int(entry.get("context_length")), "/models context_length")
    top: Mapping[str, Any] = entry["top_provider"] if isinstance(entry.get("top_provider"), Mapping) else {}
    facts.set("max_output", _int(top.get("max_completion_tokens")), "/models top_provider.max_completion_tokens")
    arch: Mapping[str, Any] = entry["architecture"] if isinstance(entry.get("architecture"), Mapping) else {}
    modalities = arch.get("input_modalities")
    if isinstance(modalities, list):
        facts.set("vision", "image" in modalities, "/models architecture.input_modalities")
    params = entry.get("supported_parameters")
    if isinstance(params, list):
        facts.set("tools", "tools" in params, "/models supported_parameters")


def read_anthropic_model(facts: ServerFacts, body: Any) -> None:
    if not isinstance(body, Mapping) or not body.get("id"):
        return
    facts.listed = True
    facts.set("context_window", _int(body.get("max_input_tokens")), "/v1/models max_input_tokens")
    facts.set("max_output", _int(body.get("max_tokens")), "/v1/models max_tokens")
    caps = body.get("capabilities")
    image = caps.get("image_input") if isinstance(caps, Mapping) else None
    if isinstance(image, Mapping) and "supported" in image:
        facts.set("vision", bool(image["supported"]), "/v1/models capabilities.image_input")


def family_of_models(base_url: str, body: Any) -> str:
    """Which family a ``/models`` answer comes from, when it says so."""
    host = (urlsplit(base_url).hostname or "").lower()
    entries = _entries(body)
    if host.endswith("openrouter.ai") or any("context_length" in e and "architecture" in e for e in entries):
        return "openrouter"
    if any(e.get("owned_by") == "llamacpp" or isinstance(e.get("meta"), Mapping) and "n_ctx" in e["meta"]
           for e in entries):
        return "llama.cpp"
    if any(e.get("owned_by") == "vllm" or "max_model_len" in e for e in entries):
        return "vllm"
    if host == "api.openai.com":
        return "openai"
    if any(e.get("owned_by") == "library" for e in entries):
        return "ollama"
    return "unknown"


# --- asking ---------------------------------------------------------------------------------
class _Asker:
    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def get(self, url: str, **kw: Any) -> Any:
        return await self._json(await self.client.get(url, **kw))

    async def post(self, url: str, body: dict[str, Any]) -> Any:
        return await self._json(await self.client.post(url, json=body))

    @staticmethod
    async def _json(resp: httpx.Response) -> Any:
        if resp.status_code != 200:
            return None
        try:
            return resp.json()
        except ValueError:
            return None


def _root(base_url: str) -> str:
    base = base_url.rstrip("/")
    for suffix in ("/api/v1", "/v1"):
        if base.endswith(suffix):
            return base[: -len(suffix)]
    return base


async def _ask_openai_compatible(ask: _Asker, facts: ServerFacts, base_url: str) -> None:
    base = base_url.rstrip("/")
    root = _root(base)
    models = await ask.get(f"{base}/models")
    family = family_of_models(base, models)
    if family == "openrouter":
        facts.family = "openrouter"
        read_openrouter_models(facts, models)
        return
    if family == "vllm":
        facts.family = "vllm"
        read_vllm_models(facts, models)
        return
    if family == "openai":
        facts.family = "openai"
        facts.models = [str(e.get("id")) for e in _entries(models)][:50]
        facts.listed = pick_entry(_entries(models), facts.model) is not None if models else None
        return
    # llama.cpp, Ollama, LM Studio, or a server that does not say: ask each family's own endpoint.
    props, show, ps, lms = await asyncio.gather(
        ask.get(f"{root}/props"),
        ask.post(f"{root}/api/show", {"model": facts.model}) if family in ("unknown", "ollama") else _none(),
        ask.get(f"{root}/api/ps") if family in ("unknown", "ollama") else _none(),
        ask.get(f"{root}/api/v0/models") if family == "unknown" else _none(),
    )
    if family == "llama.cpp" or is_llamacpp_props(props):
        facts.family = "llama.cpp"
        read_llamacpp_models(facts, models)
        read_llamacpp_props(facts, props)
    elif isinstance(show, Mapping) and ("model_info" in show or "capabilities" in show):
        facts.family = "ollama"
        read_ollama_show(facts, show, ps)
        facts.models = [str(e.get("id")) for e in _entries(models)]
        facts.listed = True
    elif _entries(lms):
        facts.family = "lmstudio"
        read_lmstudio_models(facts, lms)
    else:
        entries = _entries(models)
        facts.models = [str(e.get("id")) for e in entries][:50]
        if entries:
            facts.listed = pick_entry(entries, facts.model) is not None


async def _none() -> None:
    return None


async def discover(kind: str, *, base_url: str | None, api_key: str, model: str,
                   timeout_s: float = 3.0) -> ServerFacts:
    """What the server for ``kind`` (``openai`` or ``anthropic``) says about ``model``."""
    facts = ServerFacts(model=model)
    started = time.monotonic()
    headers: dict[str, str] = {}
    if kind == "anthropic":
        base = (base_url or "https://api.anthropic.com").rstrip("/")
        headers = {"x-api-key": api_key, "anthropic-version": "2023-06-01"}
        facts.family = "anthropic"
    else:
        base = (base_url or "https://api.openai.com/v1").rstrip("/")
        if api_key:
            headers = {"Authorization": f"Bearer {api_key}"}
    try:
        async with httpx.AsyncClient(verify=httpx_tls(), timeout=timeout_s, headers=headers) as client, \
                asyncio.timeout(timeout_s):
            ask = _Asker(client)
            if kind == "anthropic":
                probe = await client.get(f"{base}/v1/models/{quote(model, safe='')}")
                if probe.status_code == 404:
                    facts.listed = False
                elif probe.status_code in (401, 403):
                    facts.error = f"the API refused the key ({probe.status_code})"
                else:
                    read_anthropic_model(facts, await ask._json(probe))
            else:
                await _ask_openai_compatible(ask, facts, base)
    except TimeoutError:
        facts.error = f"the server did not answer discovery within {timeout_s:g} s"
        facts.reachable = facts.family != "unknown" or bool(facts.found)
        if not facts.reachable:
            facts.error = f"no answer within {timeout_s:g} s"
    except httpx.HTTPError as exc:
        facts.reachable = False
        facts.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    facts.elapsed_s = time.monotonic() - started
    log.info("model discovery at %s (%.2f s): %s", base, facts.elapsed_s, facts.describe())
    return facts


class Discoverer:
    """Discovery for one configured model, and how its facts become a profile (settings first)."""

    def __init__(self, kind: str, *, base_url: str | None, api_key: str, model: str, timeout_s: float,
                 resolve: "Callable[[ServerFacts | None], ModelProfile]") -> None:
        self.kind = kind
        self.base_url = base_url
        self.api_key = api_key
        self.model = model
        self.timeout_s = timeout_s
        self.resolve = resolve

    async def discover(self) -> ServerFacts:
        return await discover(self.kind, base_url=self.base_url, api_key=self.api_key, model=self.model,
                              timeout_s=self.timeout_s)
