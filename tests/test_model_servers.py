"""Model servers as they really are: every family's verbatim error bodies classified, every
family's discovery answers read, and discovery bounded against servers that refuse or hang."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import pytest
from aiohttp import web

from talon.agent.providers.discovery import (
    OLLAMA_DEFAULT_NUM_CTX,
    ServerFacts,
    discover,
    read_anthropic_model,
    read_llamacpp_models,
    read_llamacpp_props,
    read_lmstudio_models,
    read_ollama_show,
    read_openrouter_models,
    read_vllm_models,
)
from talon.agent.providers.refusals import classify, refusal_error, retry_after_seconds
from talon.errors import (
    AuthRejected,
    ContextOverflow,
    ImagesUnsupported,
    ModelNotFound,
    ProviderUnavailable,
    QuotaExceeded,
    RateLimited,
    ToolsUnsupported,
)
from tests.fixtures.server_samples import DISCOVERY_SAMPLES, ERROR_SAMPLES

CLASSIFIED = [s for s in ERROR_SAMPLES if s["kind"] != "other"]


@pytest.mark.parametrize("sample", CLASSIFIED, ids=[f"{s['family']}-{s['kind']}-{i}" for i, s in enumerate(CLASSIFIED)])
def test_every_verbatim_error_body_is_understood(sample: dict[str, Any]) -> None:
    refusal = classify(sample["status"], sample["body"], sample.get("headers"))
    assert refusal.kind == sample["kind"], sample["source"]
    if sample.get("window") is not None:
        assert refusal.window == sample["window"]


def test_the_sample_set_covers_every_family_and_kind() -> None:
    families = {s["family"] for s in CLASSIFIED}
    assert families == {"llama.cpp", "ollama", "vllm", "lmstudio", "openai", "anthropic", "openrouter"}
    for kind in ("images_unsupported", "context_overflow", "tools_unsupported", "rate_limited",
                 "model_not_found", "auth"):
        assert {s["family"] for s in CLASSIFIED if s["kind"] == kind}, kind


def test_llamacpp_bodies_seen_from_a_running_server() -> None:
    image = classify(500, {"error": {"code": 500, "message": "image input is not supported - hint: if this is "
                                     "unexpected, you may need to provide the mmproj", "type": "server_error"}})
    assert image.kind == "images_unsupported" and not image.transient  # a 500 that must not be retried
    overflow = classify(400, '{"error":{"code":400,"message":"request (25676 tokens) exceeds the available '
                             'context size (8192 tokens), try increasing it","type":"exceed_context_size_error",'
                             '"n_prompt_tokens":25676,"n_ctx":8192}}')
    assert (overflow.kind, overflow.window, overflow.requested) == ("context_overflow", 8192, 25676)


def test_each_kind_becomes_its_typed_error() -> None:
    def err(status: int, body: Any, **kw: Any) -> Exception:
        return refusal_error(classify(status, body, kw.get("headers")))

    assert isinstance(err(400, {"error": "llama3 does not support tools"}), ToolsUnsupported)
    assert isinstance(err(500, {"error": {"message": "image input is not supported"}}), ImagesUnsupported)
    overflow = err(400, {"type": "error", "error": {"type": "invalid_request_error",
                                                    "message": "prompt is too long: 208310 tokens > 200000 maximum"}})
    assert isinstance(overflow, ContextOverflow) and overflow.window == 200_000
    limited = err(429, {"error": {"message": "Rate limit reached", "type": "rate_limit_error"}},
                  headers={"retry-after": "7"})
    assert isinstance(limited, RateLimited) and limited.retry_after == 7
    assert isinstance(err(404, {"error": 'model "llama9" not found, try pulling it first'}), ModelNotFound)
    assert isinstance(err(401, {"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}}),
                      AuthRejected)
    assert isinstance(err(429, {"error": {"message": "You exceeded your current quota",
                                          "code": "insufficient_quota"}}), QuotaExceeded)
    assert isinstance(err(529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
                      ProviderUnavailable)
    # A 404 that names no model is a wrong URL, told as what the server said.
    wrong_url = err(404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})
    assert not isinstance(wrong_url, ModelNotFound) and "File Not Found" in str(wrong_url)


def test_words_about_context_alone_do_not_make_an_overflow() -> None:
    bad = classify(400, {"error": {"message": "Invalid 'context_length' parameter: expected an integer",
                                   "type": "invalid_request_error"}})
    assert bad.kind == "bad_request"
    assert classify(413, {"type": "error", "error": {"type": "request_too_large",
                                                     "message": "Request exceeds the maximum size"}}).kind \
        == "context_overflow"


def test_retry_after_in_seconds_milliseconds_and_dates() -> None:
    assert retry_after_seconds({"Retry-After": "3"}) == 3
    assert retry_after_seconds({"retry-after-ms": "1500"}) == 1.5
    assert 50 < (retry_after_seconds({"retry-after": "Wed, 01 Jan 2031 00:01:00 GMT"},
                                     now=1924992000.0) or 0) <= 60
    assert retry_after_seconds({"retry-after": "soon"}) is None and retry_after_seconds(None) is None


READERS = {
    ("llama.cpp", "GET /v1/models"): read_llamacpp_models,
    ("llama.cpp", "GET /props"): read_llamacpp_props,
    ("ollama", "POST /api/show"): read_ollama_show,
    ("vllm", "GET /v1/models"): read_vllm_models,
    ("lmstudio", "GET /api/v0/models"): read_lmstudio_models,
    ("openrouter", "GET /api/v1/models"): read_openrouter_models,
    ("anthropic", "GET /v1/models/{id}"): read_anthropic_model,
}


def _model_in(sample: dict[str, Any]) -> str:
    body = sample["body"]
    entries = body.get("data") if isinstance(body, dict) else None
    if isinstance(entries, list) and entries:
        # The model that is loaded, where the server says (LM Studio lists every downloaded one).
        loaded = [e for e in entries if e.get("state") == "loaded"]
        return str((loaded or entries)[0].get("id"))
    return str(body.get("id") or "") if isinstance(body, dict) else ""


@pytest.mark.parametrize("sample", [s for s in DISCOVERY_SAMPLES if (s["family"], s["endpoint"]) in READERS],
                         ids=lambda s: f"{s['family']} {s['endpoint']}")
def test_discovery_reads_each_family_answer(sample: dict[str, Any]) -> None:
    facts = ServerFacts(family=sample["family"], model=_model_in(sample))
    READERS[(sample["family"], sample["endpoint"])](facts, sample["body"])
    expected = dict(sample["facts"])
    if sample["family"] == "ollama":
        # The window that applies is num_ctx (a longer prompt is cut silently), not the training maximum.
        params = str(sample["body"].get("parameters") or "")
        if "num_ctx" in params:
            expected["context_window"] = int(params.split("num_ctx")[1].split()[0])
        elif expected.get("context_window"):  # no num_ctx: Ollama's own default applies
            expected["context_window"] = min(expected["context_window"], OLLAMA_DEFAULT_NUM_CTX)
    for name in ("context_window", "vision", "tools", "max_output"):
        if expected.get(name) is not None:
            assert getattr(facts, name) == expected[name], (name, sample["source"])
            assert facts.found[name]  # and it says where it was read


def test_anthropic_model_facts_from_the_list_shape() -> None:
    entry = next(s for s in DISCOVERY_SAMPLES if s["family"] == "anthropic" and s["endpoint"] == "GET /v1/models")
    facts = ServerFacts(family="anthropic", model="claude-opus-4-6")
    read_anthropic_model(facts, entry["body"]["data"][0])
    assert (facts.context_window, facts.max_output, facts.vision) == (200_000, 128_000, True)


# --- discovery against live servers that misbehave -----------------------------------------------
async def test_discovery_of_a_server_that_hangs_is_bounded() -> None:
    held: list[web.Request] = []
    done = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        held.append(request)
        await asyncio.wait_for(done.wait(), 30)
        return web.json_response({})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", hang)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        started = time.monotonic()
        facts = await discover("openai", base_url=f"http://127.0.0.1:{port}/v1", api_key="", model="m",
                               timeout_s=1.0)
        elapsed = time.monotonic() - started
    finally:
        done.set()
        await runner.cleanup()
    assert held and not facts.reachable and "no answer within 1 s" in (facts.error or "")
    assert elapsed < 10  # bounded (the server would have held it for 30 s)


async def test_discovery_of_a_refused_connection_says_so() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    facts = await discover("openai", base_url=f"http://127.0.0.1:{port}/v1", api_key="", model="m", timeout_s=2)
    assert not facts.reachable and facts.error and "not reachable" in facts.describe()
