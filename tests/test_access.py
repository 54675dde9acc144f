"""Access: static allowlists, pairing codes for newcomers, `talon pair`, and the channels' deny path
end to end (Telegram and WhatsApp through their loopback fakes)."""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path

import pytest

from talon.storage.access import (
    CODE_ALPHABET,
    CODE_TTL_S,
    MAX_PENDING,
    REPLY_INTERVAL_S,
    AccessGate,
)
from talon.cli import main
from talon.storage.embedded.access import SqlitePairing
from talon.storage.factory import open_gate
from talon.config import Settings
from talon.errors import PairingError
from tests.conftest import ALICE, MALLORY, make_settings
from tests.fakes.openai_server import FakeOpenAI, last_user_text
from tests.fakes.telegram import FakeTelegram
from tests.fakes.twilio import FakeTwilio
from tests.conftest import running_telegram as running
from tests.support.telegram import texts_to
from tests.support.whatsapp import BOB as WA_BOB
from tests.support.whatsapp import EVE, post, twilio, wa_settings  # noqa: F401 - twilio is a fixture
from tests.support.whatsapp import running as wa_running
CODE = re.compile(r"\b([A-Z2-9]{3}-[A-Z2-9]{4})\b")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def gate_at(tmp_path: Path, clock: Clock, *, pairing: bool = True) -> AccessGate:
    return AccessGate(SqlitePairing(tmp_path / "access.sqlite3"),
                      {"telegram": {"111", "@bob"}, "whatsapp": {"+15550001111"}},
                      pairing=pairing, clock=clock)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def gate(tmp_path: Path, clock: Clock):
    gate = gate_at(tmp_path, clock)
    yield gate
    await gate.close()


# --- the gate -----------------------------------------------------------------------------------


async def test_static_allowlist(gate: AccessGate) -> None:
    assert await gate.allowed("telegram", ["111"])
    assert await gate.allowed("telegram", ["222", "@Bob"])  # usernames are case-insensitive
    assert not await gate.allowed("telegram", ["222", "@mallory"])
    assert await gate.allowed("whatsapp", ["+15550001111"])
    assert not await gate.allowed("whatsapp", ["111"])  # allowlists are per channel
    assert not await gate.allowed("console", ["111"])
    assert not await gate.allowed("telegram", [])


async def test_from_settings_reads_the_allowlist_settings(tmp_path: Path) -> None:
    settings = Settings(_env_file=None, TALON_DATA_DIR=str(tmp_path / "d"),  # type: ignore[call-arg]
                        TALON_TELEGRAM_ALLOWED_USERS="42, @Alice",
                        TALON_WHATSAPP_ALLOWED_NUMBERS="whatsapp:+1 555 000")
    gate = await open_gate(settings)
    try:
        assert await gate.allowed("telegram", ["42"]) and await gate.allowed("telegram", ["7", "@alice"])
        assert await gate.allowed("whatsapp", ["+1555000"])
        assert not gate.pairing and await gate.request_pairing("telegram", "7") is None
        assert isinstance(gate.store, SqlitePairing) and gate.store.path == tmp_path / "d" / "access.sqlite3"
    finally:
        await gate.close()


async def test_pairing_off_gives_no_code(tmp_path: Path, clock: Clock) -> None:
    gate = gate_at(tmp_path, clock, pairing=False)
    assert await gate.request_pairing("telegram", "999", "@mallory") is None
    assert await gate.pending() == []
    await gate.close()


async def test_code_is_issued_once_and_reused(gate: AccessGate, clock: Clock) -> None:
    first = await gate.request_pairing("telegram", "999", "@mallory")
    assert first is not None
    assert CODE.fullmatch(first.code) and set(first.code.replace("-", "")) <= set(CODE_ALPHABET)
    assert first.reply == f"This is a private bot. To ask for access, give its owner this code: {first.code}"
    [request] = await gate.pending()
    assert (request.channel, request.sender_id, request.name, request.code) == \
        ("telegram", "999", "@mallory", first.code)
    # Asking again reuses the code, and within 10 minutes nothing is sent again.
    clock.now += 60
    again = await gate.request_pairing("telegram", "999", "@mallory")
    assert again is not None and again.code == first.code and again.reply is None
    clock.now += REPLY_INTERVAL_S
    later = await gate.request_pairing("telegram", "999", "@mallory")
    assert later is not None and later.code == first.code and later.reply is not None
    assert len(await gate.pending()) == 1
    # Another sender gets a code of their own.
    other = await gate.request_pairing("whatsapp", "+15559999999", "Eve")
    assert other is not None and other.code != first.code and other.reply is not None


async def test_code_expires_after_an_hour(gate: AccessGate, clock: Clock) -> None:
    first = await gate.request_pairing("telegram", "999")
    assert first is not None
    clock.now += CODE_TTL_S + 1
    assert await gate.pending() == []
    with pytest.raises(PairingError, match="expired"):
        await gate.approve(first.code)
    fresh = await gate.request_pairing("telegram", "999")
    assert fresh is not None and fresh.code != first.code and fresh.reply is not None
    assert [p.code for p in await gate.pending()] == [fresh.code]


async def test_approve_is_case_insensitive_and_dash_optional(gate: AccessGate, clock: Clock) -> None:
    pairing = await gate.request_pairing("telegram", "999", "@mallory")
    assert pairing is not None
    assert not await gate.allowed("telegram", ["999", "@mallory"])
    approval = await gate.approve(" " + pairing.code.replace("-", "").lower() + " ")
    assert (approval.channel, approval.sender_id, approval.name) == ("telegram", "999", "@mallory")
    assert approval.who == "telegram:999 (@mallory)"
    assert await gate.allowed("telegram", ["999", "@mallory"])
    assert await gate.pending() == []
    assert [a.sender_id for a in await gate.approvals()] == ["999"]
    with pytest.raises(PairingError):  # a code works once
        await gate.approve(pairing.code)


async def test_unknown_code_is_refused(gate: AccessGate) -> None:
    with pytest.raises(PairingError, match="no pending request"):
        await gate.approve("ABC-DEFG")


async def test_revoke(gate: AccessGate, clock: Clock) -> None:
    pairing = await gate.request_pairing("whatsapp", "+15559999999", "Eve")
    assert pairing is not None
    await gate.approve(pairing.code)
    assert await gate.allowed("whatsapp", ["+15559999999"])
    revoked = await gate.revoke("whatsapp", "+15559999999")
    assert revoked is not None and revoked.name == "Eve"
    assert not await gate.allowed("whatsapp", ["+15559999999"])
    assert await gate.revoke("whatsapp", "+15559999999") is None
    # Denied again, they can ask again at once: the approval cleared the reply limit.
    again = await gate.request_pairing("whatsapp", "+15559999999", "Eve")
    assert again is not None and again.reply is not None


async def test_pending_codes_are_capped_oldest_dropped(gate: AccessGate, clock: Clock) -> None:
    codes = []
    for i in range(MAX_PENDING + 10):
        clock.now += 1
        pairing = await gate.request_pairing("telegram", str(5000 + i))
        assert pairing is not None
        codes.append(pairing.code)
    pending = await gate.pending()
    assert len(pending) == MAX_PENDING
    assert [p.code for p in pending] == codes[10:]
    with pytest.raises(PairingError):
        await gate.approve(codes[0])
    assert (await gate.approve(codes[-1])).sender_id == str(5000 + MAX_PENDING + 9)


async def test_approval_by_another_process_is_seen_at_once(gate: AccessGate, tmp_path: Path, clock: Clock) -> None:
    pairing = await gate.request_pairing("telegram", "999")
    assert pairing is not None
    cli = gate_at(tmp_path, clock, pairing=False)  # `talon pair` opens the same file
    await cli.approve(pairing.code)
    assert await gate.allowed("telegram", ["999"])
    await cli.revoke("telegram", "999")
    assert not await gate.allowed("telegram", ["999"])
    await cli.close()


async def test_approvals_outlive_turning_pairing_off(tmp_path: Path, clock: Clock) -> None:
    on = gate_at(tmp_path, clock)
    pairing = await on.request_pairing("telegram", "999")
    assert pairing is not None
    await on.approve(pairing.code)
    await on.close()
    off = gate_at(tmp_path, clock, pairing=False)
    assert await off.allowed("telegram", ["999"])
    assert await off.request_pairing("telegram", "998") is None
    await off.close()


async def test_stranger_chosen_names_are_cleaned(gate: AccessGate) -> None:
    await gate.request_pairing("whatsapp", "+15559999999", "Eve\x1b[2J\x07  the\nhacker" + "x" * 200)
    [request] = await gate.pending()
    assert request.name.startswith("Eve[2J the hacker") and len(request.name) == 64
    assert not any(ord(c) < 32 for c in request.name)


# --- talon pair -----------------------------------------------------------------------------------


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`talon pair` reads the same TALON_DATA_DIR as the gate under test."""
    data = tmp_path / "data"
    monkeypatch.chdir(tmp_path)  # no .env from elsewhere
    monkeypatch.setenv("TALON_DATA_DIR", str(data))
    monkeypatch.setenv("TALON_PAIRING", "true")
    return data


def test_talon_pair_lists_approves_and_revokes(cli_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Not a coroutine: `talon pair` runs its own event loop, as on the command line.
    gate = AccessGate(SqlitePairing(cli_env / "access.sqlite3"), {"telegram": set()}, pairing=True)
    pairing = asyncio.run(gate.request_pairing("telegram", "999", "@mallory"))
    assert pairing is not None

    assert main(["pair"]) == 0
    out = capsys.readouterr().out
    assert "pending requests" in out
    row = next(line for line in out.splitlines() if pairing.code in line)
    assert "telegram" in row and "999 (@mallory)" in row and "s ago" in row

    assert main(["pair", pairing.code.lower().replace("-", "")]) == 0
    assert "approved telegram:999 (@mallory)" in capsys.readouterr().out
    assert asyncio.run(gate.allowed("telegram", ["999"]))

    assert main(["pair"]) == 0
    out = capsys.readouterr().out
    assert "no pending requests" in out and "telegram:999 (@mallory)" in out

    assert main(["pair", "--revoke", "telegram:999"]) == 0
    assert "revoked telegram:999" in capsys.readouterr().out
    assert not asyncio.run(gate.allowed("telegram", ["999"]))
    assert main(["pair", "--revoke", "telegram:999"]) == 1
    assert "was not approved" in capsys.readouterr().err
    asyncio.run(gate.close())


def test_talon_pair_refuses_unknown_codes_and_bad_revokes(
        cli_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pair", "K7Q-4MX2"]) == 1
    err = capsys.readouterr().err
    assert "no pending request has the code 'K7Q-4MX2'" in err and "expired" in err
    assert main(["pair", "--revoke", "999"]) == 2
    assert "CHANNEL:ID" in capsys.readouterr().err
    assert main(["pair", "--revoke", "whatsapp:+1 555 999"]) == 1
    assert "whatsapp:+1555999 was not approved" in capsys.readouterr().err


# --- Telegram end to end ------------------------------------------------------------------------


def to(chat_id: int):
    return lambda c: str(c.params.get("chat_id")) == str(chat_id)


async def test_telegram_newcomer_pairs_and_then_chats(
    tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path, cli_env: Path,
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.WARNING)
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_PAIRING=True)
    assert settings.data_dir == cli_env
    async with running(settings) as runtime:
        first = tg.text_message(MALLORY, "let me in", user_id=MALLORY, username="mallory")
        tg.push_update(first)
        [sent] = await tg.wait_for("sendMessage", to(MALLORY))
        match = CODE.search(sent.params["text"])
        assert match is not None, sent.params
        code = match.group(1)
        assert sent.params["text"] == f"This is a private bot. To ask for access, give its owner this code: {code}"
        assert "parse_mode" not in sent.params  # plain text

        # The message itself went nowhere: no turn, no model request, nothing in the inbox.
        assert runtime.bridge.turns_started == 0 and llm.requests == []
        assert not await runtime.inbox.seen(f"telegram:{MALLORY}:{first['message']['message_id']}")
        assert any(f"talon pair {code}" in r.getMessage() and "TALON_TELEGRAM_ALLOWED_USERS" in r.getMessage()
                   for r in caplog.records)

        # Asking again within 10 minutes: no second code message. (Updates are handled in order,
        # so once Alice is answered, Mallory's second message was handled.)
        tg.push_update(tg.text_message(MALLORY, "hello??", user_id=MALLORY, username="mallory"))
        tg.push_update(tg.text_message(ALICE, "hi", user_id=ALICE))
        await tg.wait_for("sendMessage", to(ALICE))
        assert len(texts_to(tg, MALLORY)) == 1
        assert len(llm.requests) == 1 and "hello??" not in last_user_text(llm.requests[0])

        # The owner approves, in another process's way: `talon pair CODE` on the same data dir.
        assert await asyncio.to_thread(main, ["pair", code.lower()]) == 0
        assert f"approved telegram:{MALLORY} (@mallory)" in capsys.readouterr().out

        tg.push_update(tg.text_message(MALLORY, "thanks!", user_id=MALLORY, username="mallory"))
        await tg.wait_for("sendMessage", to(MALLORY), count=2)
        assert texts_to(tg, MALLORY)[1] == "echo: thanks!"
        assert last_user_text(llm.requests[-1]).endswith("thanks!")

        # Revoked: the next message is denied again (and may ask for a new code).
        assert await asyncio.to_thread(main, ["pair", "--revoke", f"telegram:{MALLORY}"]) == 0
        tg.push_update(tg.text_message(MALLORY, "still there?", user_id=MALLORY, username="mallory"))
        replies = await tg.wait_for("sendMessage", to(MALLORY), count=3)
        assert CODE.search(replies[2].params["text"])
    assert len(llm.requests) == 2


async def test_telegram_pairing_off_keeps_silence(
    tg: FakeTelegram, llm: FakeOpenAI, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    assert not settings.pairing  # the default
    async with running(settings) as runtime:
        tg.push_update(tg.text_message(MALLORY, "let me in", user_id=MALLORY, username="mallory"))
        tg.push_update(tg.text_message(ALICE, "hi", user_id=ALICE))
        await tg.wait_for("sendMessage", to(ALICE))
        assert await runtime.bridge.gate.pending() == []
    assert not tg.sent("sendMessage", chat_id=MALLORY)
    assert not any("talon pair" in r.getMessage() for r in caplog.records)


# --- WhatsApp end to end ------------------------------------------------------------------------


async def test_whatsapp_newcomer_gets_the_code_through_the_rest_api(
    twilio: FakeTwilio, llm: FakeOpenAI, tmp_path: Path  # noqa: F811 - the imported fixture
) -> None:
    settings = wa_settings(tmp_path, twilio, llm, TALON_PAIRING=True)
    async with wa_running(settings) as (runtime, channel):
        params = twilio.inbound_params(EVE, "let me in", profile_name="Eve")
        assert (await post(channel, params, sign_with=twilio))[0] == 200
        [sent] = await twilio.wait_for_messages(1, to=EVE)
        match = CODE.search(sent.body)
        assert match is not None, sent.body
        assert sent.body == f"This is a private bot. To ask for access, give its owner this code: {match.group(1)}"
        assert sent.media_urls == ()
        assert not await runtime.inbox.seen(f"whatsapp:{EVE}:{params['MessageSid']}")

        # A second message within 10 minutes: no second code.
        assert (await post(channel, twilio.inbound_params(EVE, "hello?"), sign_with=twilio))[0] == 200
        assert (await post(channel, twilio.inbound_params(WA_BOB, "bob here"), sign_with=twilio))[0] == 200
        await twilio.wait_for_messages(1, to=WA_BOB)
        await asyncio.sleep(0.2)
        assert len(twilio.sent(EVE)) == 1
        assert runtime.bridge.turns_started == 1 and len(llm.requests) == 1

        assert (await runtime.bridge.gate.approve(match.group(1))).who == f"whatsapp:{EVE} (Eve)"
        assert (await post(channel, twilio.inbound_params(EVE, "thanks"), sign_with=twilio))[0] == 200
        replies = await twilio.wait_for_messages(2, to=EVE)
        assert replies[1].body == "echo: thanks"
