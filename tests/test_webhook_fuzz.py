"""Doors: no body posted to a webhook gets a 500. A few thousand malformed bodies (seeded, so a
failure is reproducible) go to the Telegram webhook (with the right secret, so they reach the
parser) and to the Twilio webhook (signed, so they reach the parser): deep nesting, lone
surrogates, invalid UTF-8, wrong types in every field, huge bodies, random bytes. Each is
answered 400 (413 for a body over the server's size cap) or, where it is still a usable update,
200; never a 500, never a traceback, and each refusal is one log line."""

from __future__ import annotations

import copy
import json
import logging
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest

from tests.conftest import MALLORY
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram
from tests.fakes.twilio import FakeTwilio
from tests.support.telegram_webhook import PATH, SECRET, wh_settings
from channels.telegram import SECRET_HEADER
from tests.support.telegram_webhook import running as tg_running
from tests.support.whatsapp import EVE, HOOK, PUBLIC, wa_settings, twilio  # noqa: F401  (twilio is a fixture)
from tests.support.whatsapp import running as wa_running
ODD_VALUES: list[Any] = [None, True, False, 0, -1, 2**70, -2**63, 1.5, float("inf"), "", "x", "\ud800",
                         "a\udfffb", "9" * 400, [], {}, [1, 2], {"x": 1}, [[[]]], "0x10", " 12 "]


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*prefix, index))


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


def _nested(depth: int, rng: random.Random) -> str:
    if rng.random() < 0.5:
        return "[" * depth + "]" * depth
    return '{"update_id": 1, "message": ' + '{"a": ' * depth + "1" + "}" * depth + "}"


def telegram_bodies(template: dict[str, Any], count: int, seed: int = 22) -> Iterator[bytes]:
    rng = random.Random(seed)
    paths = [p for p in _paths(template) if p]
    for n in range(count):
        kind = n % 8
        update_id = 10_000 + n
        if kind == 0:  # random bytes
            yield rng.randbytes(rng.randint(0, 600))
        elif kind == 1:  # deep nesting
            yield _nested(rng.choice([200, 1_000, 5_000, 100_000]), rng).encode()
        elif kind == 2:  # a lone surrogate in a string field, as JSON escapes it
            doc = copy.deepcopy(template)
            doc["update_id"] = update_id
            text = json.dumps(doc).replace('"text": "', '"text": "\\ud800' if rng.random() < 0.5 else '"text": "x\\udfff')
            yield text.encode()
        elif kind == 3:  # invalid UTF-8 inside a string
            doc = copy.deepcopy(template)
            doc["update_id"] = update_id
            raw = json.dumps(doc).encode()
            at = raw.index(b'"text": "') + 9
            yield raw[:at] + bytes([rng.choice([0xff, 0xc0, 0xed, 0x80])]) + raw[at:]
        elif kind in (4, 5):  # wrong types anywhere (the update_id kept, so the parser is reached)
            doc = copy.deepcopy(template)
            for path in rng.sample(paths, rng.randint(1, 3)):
                try:
                    _set(doc, path, copy.deepcopy(rng.choice(ODD_VALUES)))
                except (KeyError, IndexError, TypeError):
                    pass
            if isinstance(doc, dict) and rng.random() < 0.8:
                doc["update_id"] = update_id
            yield json.dumps(doc, allow_nan=True).encode("utf-8", "surrogatepass")
        elif kind == 6:  # other top-level shapes and JSON oddities
            yield rng.choice([b"null", b"1", b'"update"', b"[]", b"{}", b'{"update_id": NaN}',
                              b'{"update_id": 1e400}', b'{"update_id": "1"}', b'{"update_id": true}',
                              b'{"update_id": 1, "message": []}', b'{"update_id": 1, "message": "hi"}',
                              b'{"update_id": 1, "update_id": 2}', b"\xef\xbb\xbf{}", b" ", b""])
        else:  # huge
            size = rng.choice([200_000, 1_500_000, 3_000_000])
            doc = copy.deepcopy(template)
            doc["update_id"] = update_id
            doc["message"]["text"] = "x" * size
            yield json.dumps(doc).encode()


class Doorman(logging.Handler):
    """Counts what Talon and aiohttp log while the fuzz runs."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def since(self, start: int) -> list[logging.LogRecord]:
        return [r for r in self.records[start:] if r.levelno >= logging.WARNING]


@pytest.fixture
def doorman() -> Iterator[Doorman]:
    handler = Doorman()
    root = logging.getLogger()
    root.addHandler(handler)
    old = root.level
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(old)


def _check_door(statuses: dict[int, int], refusals: list[list[logging.LogRecord]], doorman: Doorman) -> None:
    assert 500 not in statuses and not any(code >= 500 for code in statuses), statuses
    assert statuses.get(400, 0) > 0
    for lines in refusals:
        talon_lines = [r for r in lines if r.name.startswith(("channels", "talon"))]
        assert len(talon_lines) == 1, [r.getMessage() for r in lines]
    assert not any(r.exc_info for r in doorman.records), [r.getMessage() for r in doorman.records if r.exc_info][:3]
    assert not any(r.levelno >= logging.ERROR for r in doorman.records), \
        [r.getMessage() for r in doorman.records if r.levelno >= logging.ERROR][:3]


async def test_the_telegram_webhook_answers_no_malformed_body_with_a_500(
    tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI, doorman: Doorman
) -> None:
    template = {"update_id": 1, **tg.text_message(MALLORY, "hello", user_id=MALLORY)}
    statuses: dict[int, int] = {}
    refusals: list[list[logging.LogRecord]] = []
    async with tg_running(wh_settings(tmp_path, tg, llm)) as (_, channel):
        assert channel.http is not None
        url = channel.http.local_url + PATH
        headers = {"Content-Type": "application/json", SECRET_HEADER: SECRET}
        async with aiohttp.ClientSession() as session:
            for body in telegram_bodies(template, 2000):
                start = len(doorman.records)
                async with session.post(url, data=body, headers=headers) as resp:
                    await resp.read()
                    statuses[resp.status] = statuses.get(resp.status, 0) + 1
                    if resp.status == 400:
                        refusals.append(doorman.since(start))
    _check_door(statuses, refusals, doorman)
    assert statuses.get(200, 0) > 100, statuses  # still-usable updates were taken (and denied)
    assert not llm.requests  # the sender is not allowed: nothing reached the model


def twilio_bodies(twilio: FakeTwilio, count: int, seed: int = 22) -> Iterator[tuple[bytes, str | None]]:
    """Form bodies, each with the signature Twilio would send for it (None: not signable)."""
    rng = random.Random(seed)
    base = twilio.inbound_params(EVE, "hello")
    for n in range(count):
        kind = n % 6
        if kind == 0:  # random bytes
            yield rng.randbytes(rng.randint(0, 600)), None
        elif kind == 1:  # invalid UTF-8 / an encoded lone surrogate in a value
            bad = rng.choice(["%ED%A0%80", "%FF", "%C0%AF", "%80"])
            yield f"Body=a{bad}b&From=whatsapp%3A{quote(EVE)}&NumMedia=0".encode(), None
        elif kind == 2:  # huge
            yield b"Body=" + b"x" * rng.choice([200_000, 1_500_000]), None
        else:  # signed, with fields of the wrong type, missing or contradictory
            params = dict(base)
            params["MessageSid"] = "SM" + f"{n:032x}"
            params["SmsMessageSid"] = params["SmsSid"] = params["MessageSid"]
            for _ in range(rng.randint(1, 3)):
                field = rng.choice(["NumMedia", "MediaUrl0", "MediaContentType0", "From", "To", "Body",
                                    "MessageSid", "ProfileName", "WaId", "NumSegments",
                                    "MediaUrl7", "Latitude", "MessageType", "OriginalRepliedMessageSid"])
                value = rng.choice(["", "-1", "abc", "99999", "1e9", "3", " 1", "0x1", "\u0000", "x" * 5000,
                                    "whatsapp:", "whatsapp:+1", "http://127.0.0.1:9/x", "https://", "\u202e",
                                    "image/jpeg", "text/html; charset=\u00ff"])
                if rng.random() < 0.2:
                    params.pop(field, None)
                else:
                    params[field] = value
            body = "&".join(f"{quote(k)}={quote(v)}" for k, v in params.items()).encode()
            yield body, twilio.sign(PUBLIC + HOOK, params)


async def test_the_twilio_webhook_answers_no_malformed_body_with_a_500(
    tmp_path: Path, twilio: FakeTwilio, llm: FakeOpenAI, doorman: Doorman  # noqa: F811
) -> None:
    statuses: dict[int, int] = {}
    signed: dict[int, int] = {}
    refusals: list[list[logging.LogRecord]] = []
    async with wa_running(wa_settings(tmp_path, twilio, llm)) as (_, channel):
        url = channel.http.local_url + HOOK
        async with aiohttp.ClientSession() as session:
            for body, signature in twilio_bodies(twilio, 2000):
                headers = {"Content-Type": "application/x-www-form-urlencoded"}
                if signature is not None:
                    headers["X-Twilio-Signature"] = signature
                start = len(doorman.records)
                async with session.post(url, data=body, headers=headers) as resp:
                    await resp.read()
                    statuses[resp.status] = statuses.get(resp.status, 0) + 1
                    if signature is not None:
                        signed[resp.status] = signed.get(resp.status, 0) + 1
                    if resp.status in (400, 403):
                        refusals.append(doorman.since(start))
    _check_door(statuses, refusals, doorman)
    # Unsigned bodies that parse as a form are refused 403 (fail closed); the signed ones got past the signature to the parser: refused there, or taken (Eve is not
    # allowed, so a usable one is answered with empty TwiML and never reaches the model).
    assert signed.get(200, 0) > 100 and signed.get(403, 0) == 0, signed
    assert not llm.requests
