"""Caps without holes (issue 27): every model call is counted, also when it is stopped or the server
reports no usage (estimated then, and /usage says so); a message that joins a running group turn
is checked against its own sender's cap and shares the turn's later calls; concurrent turns of one
person pass a cap by at most one call's worth; ``talon doctor`` refuses a money cap ``talon run``
refuses. End to end through the fake Bot API and the scripted fake model server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from talon.agent.providers.base import ModelRequest
from talon.config import Settings
from talon.content import Message
from talon.storage.usage import UsageTotals
from tests.conftest import ALICE, BOB, make_settings, running_telegram
from tests.fakes.openai_server import FakeOpenAI, Req
from tests.fakes.telegram import FakeTelegram
from tests.support.waiting import until as _until

GROUP = -1001234567890
BOT = "@talon_test_bot"
CAP_LINE = "You have reached the limit of"


def _settings(tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI, **extra: object) -> Settings:
    values: dict[str, object] = dict(TALON_MODEL_DISCOVERY="false", TALON_TELEGRAM_ACK_REACTION="")
    values.update(extra)
    return make_settings(tmp_path, tg.base_url, llm.base_url, **values)


def _texts(req: Req) -> str:
    return " ".join(str(m.get("content")) for m in req.json["messages"])


async def _totals(runtime: Any, **where: str) -> UsageTotals:
    await runtime.bridge.control.settled()
    return await runtime.stores.usage.totals(0.0, channel="telegram", **where)  # type: ignore[no-any-return]


# --- stopped streams ------------------------------------------------------------------------------

async def test_five_stopped_streams_count_toward_the_cap_and_usage_says_they_are_estimated(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    """The red team: five long answers stopped with /stop before the end of their stream left
    /usage at "nothing yet" and the cap never reached. Each call here costs over 5,000 tokens (a
    ~3,250-token question, the instructions and tools, ~550 streamed back before the stop), each in
    a new conversation; under a 25,000-token cap, at most five are made."""
    question = "Please summarise this: " + "lorem ipsum dolor sit amet " * 480  # ~13,000 characters
    part = " ".join(f"word{n}" for n in range(300)) + " END-OF-PART"  # ~2,200 characters streamed
    llm.default_responder = lambda body: part
    llm.stall = True  # every answer stops after its text, as a long one the person stops midway
    settings = _settings(tmp_path, tg, llm, TALON_LIMIT_PER_PERSON="25000 tokens/day")

    def drafts() -> int:
        return len([c for c in tg.sent("sendMessageDraft") if "END-OF-PART" in c.params.get("text", "")])

    def refusals() -> list[str]:
        return [c.params["text"] for c in tg.sent("sendMessage") if CAP_LINE in c.params.get("text", "")]

    async with running_telegram(settings) as runtime:
        spent: list[int] = []  # the person's tokens after each stopped call
        for n in range(6):
            shown = drafts()
            tg.push_update(tg.text_message(ALICE, f"{question} ({n})", user_id=ALICE))
            # The answer is on screen so far (the draft shows its end): the stream began and stalls;
            # or the message was refused at the cap.
            await _until(lambda: _now(drafts() > shown or bool(refusals())))
            if refusals():
                break
            tg.push_update(tg.text_message(ALICE, "/stop", user_id=ALICE))
            await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "Stopped.", count=n + 1)
            tg.push_update(tg.text_message(ALICE, "/new", user_id=ALICE))
            await tg.wait_for("sendMessage", lambda c: "Started a new conversation" in c.params.get("text", ""),
                              count=n + 1)
            await runtime.bridge.idle()
            spent.append((await _totals(runtime, person=str(ALICE))).tokens)
        mine = await _totals(runtime, person=str(ALICE))
        tg.push_update(tg.text_message(ALICE, "/usage", user_id=ALICE))
        [usage] = await tg.wait_for("sendMessage", lambda c: "Your use" in c.params.get("text", ""))
        llm.stall = False
    stopped = len(spent)
    assert refusals() and "25,000 tokens per day" in refusals()[0]
    assert stopped <= 5 and len(llm.requests) == stopped  # the refused message never reached the model
    assert spent[-2] < 25_000 <= spent[-1]  # each stopped call counted; the cap held at the first past it
    assert mine.calls == stopped and mine.estimated_calls == stopped and mine.estimated_tokens == mine.tokens
    # What was sent and what came back, for each call.
    assert mine.input_tokens >= stopped * 4500 and mine.output_tokens >= stopped * 500
    assert f"today: ~{mine.tokens:,} tokens (estimated;" in usage.params["text"]
    assert f"in {stopped} model calls" in usage.params["text"]


async def _now(value: bool) -> bool:
    return value


# --- a server that reports no usage ---------------------------------------------------------------

@pytest.mark.parametrize("streaming", [True, False])
async def test_a_server_that_reports_no_usage_is_held_by_a_5000_token_cap(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path, streaming: bool) -> None:
    """The red team: 10 of 10 questions answered (~149k tokens) under a 5,000-token cap, as the
    server reported no usage. Estimated usage stops it, at most one call's worth past the cap."""
    llm.report_usage = False
    llm.streaming = streaming  # not streaming: the provider asks again without stream=true
    answer = "A long answer. " * 100  # ~1,500 characters
    llm.default_responder = lambda body: answer
    settings = _settings(tmp_path, tg, llm, TALON_LIMIT_PER_PERSON="5000 tokens/day", TALON_TELEGRAM_STREAMING="off")
    async with running_telegram(settings) as runtime:
        spent: list[int] = []  # the person's tokens after each answer
        for n in range(10):
            tg.push_update(tg.text_message(ALICE, f"question {n}: " + "tell me more " * 100, user_id=ALICE))
            [last] = (await tg.wait_for("sendMessage", count=n + 1))[-1:]
            if CAP_LINE in last.params["text"]:
                break
            spent.append((await _totals(runtime, person=str(ALICE))).tokens)
        mine = await _totals(runtime, person=str(ALICE))
        tg.push_update(tg.text_message(ALICE, "/usage", user_id=ALICE))
        [usage] = await tg.wait_for("sendMessage", lambda c: "Your use" in c.params.get("text", ""))
    answered = len(spent)
    assert 0 < answered < 10 and CAP_LINE in last.params["text"]
    assert mine.calls == answered and mine.estimated_calls == answered and mine.tokens == spent[-1]
    # Every call was counted, and the last one was made below the cap: one call's worth past it at most.
    assert (spent[-2] if answered > 1 else 0) < 5000 <= spent[-1]
    assert "(estimated;" in usage.params["text"]


# --- a group turn joined by another member --------------------------------------------------------

def _group(tg: FakeTelegram, user: int, text: str) -> dict[str, Any]:
    name = "alice" if user == ALICE else "bob"
    return tg.text_message(GROUP, text, user_id=user, username=name, first_name=name.title(),
                           chat_type="supergroup")


async def _alice_turn_with_bob_queued(tg: FakeTelegram, llm: FakeOpenAI, runtime: Any, bob_says: str) -> int:
    """Alice's turn asks for a tool; while the model holds that step, Bob's message arrives (its
    id is returned)."""
    seen = len(llm.requests)
    llm.hang = True
    tg.push_update(_group(tg, ALICE, f"{BOT} list the files please"))
    await llm.wait_for_requests(seen + 1)
    bob = _group(tg, BOB, f"{BOT} {bob_says}")
    tg.push_update(bob)
    await _until(lambda: _pending_more_than(runtime, 1))
    llm.release()
    return int(bob["message"]["message_id"])


async def _pending_more_than(runtime: Any, n: int) -> bool:
    return len(await runtime.inbox.pending()) > n


async def test_a_member_at_their_cap_does_not_ride_on_another_members_running_turn(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.queue(FakeOpenAI.reply("Bob's answer.", usage={"prompt_tokens": 1500, "completion_tokens": 100}),
              FakeOpenAI.reply(tool_calls=[FakeOpenAI.tool_call("ls", {"path": "."})],
                               usage={"prompt_tokens": 300, "completion_tokens": 20}),
              FakeOpenAI.reply("Here are the files.", usage={"prompt_tokens": 400, "completion_tokens": 30}),
              "Never sent to Bob.")
    settings = _settings(tmp_path, tg, llm, TALON_TELEGRAM_ALLOWED_CHATS=str(GROUP),
                         TALON_LIMIT_PER_PERSON="1000 tokens/day", TALON_TELEGRAM_STREAMING="off")
    async with running_telegram(settings) as runtime:
        tg.push_update(_group(tg, BOB, f"{BOT} hello"))
        await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "Bob's answer.")
        await runtime.bridge.idle()  # Bob is past his cap now (1,600 of 1,000 tokens)
        bob_message = await _alice_turn_with_bob_queued(tg, llm, runtime, "SECRET-RIDE and the hidden ones too")
        await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "Here are the files.")
        [refused] = await tg.wait_for("sendMessage", lambda c: CAP_LINE in c.params.get("text", ""))
        await runtime.bridge.idle()
        alice = await _totals(runtime, person=str(ALICE))
        bob = await _totals(runtime, person=str(BOB))
    assert len(llm.requests) == 3 and not any("SECRET-RIDE" in _texts(r) for r in llm.requests)
    assert refused.params["text"].startswith(CAP_LINE + " 1,000 tokens per day")
    assert refused.params["reply_parameters"]["message_id"] == bob_message  # the line answers Bob
    assert (alice.tokens, bob.tokens) == (750, 1600)  # Alice's two calls; Bob's hello alone


async def test_a_member_who_joins_a_running_turn_shares_its_later_calls(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.queue(FakeOpenAI.reply(tool_calls=[FakeOpenAI.tool_call("ls", {"path": "."})],
                               usage={"prompt_tokens": 300, "completion_tokens": 20}),
              FakeOpenAI.reply("Files, and Bob's question too.", usage={"prompt_tokens": 801, "completion_tokens": 41}))
    settings = _settings(tmp_path, tg, llm, TALON_TELEGRAM_ALLOWED_CHATS=str(GROUP),
                         TALON_LIMIT_PER_PERSON="100000 tokens/day", TALON_TELEGRAM_STREAMING="off")
    async with running_telegram(settings) as runtime:
        await _alice_turn_with_bob_queued(tg, llm, runtime, "JOINED-QUESTION what is in there?")
        await tg.wait_for("sendMessage", lambda c: c.params.get("text") == "Files, and Bob's question too.")
        await runtime.bridge.idle()
        alice = await _totals(runtime, person=str(ALICE))
        bob = await _totals(runtime, person=str(BOB))
        group = await _totals(runtime, chat_id=str(GROUP))
        tg.push_update(_group(tg, BOB, "/usage@talon_test_bot"))
        [usage] = await tg.wait_for("sendMessage", lambda c: "Your use" in c.params.get("text", ""))
    assert "JOINED-QUESTION" in _texts(llm.requests[1])  # Bob's message joined the turn
    # The first call was Alice's alone; the second, made after Bob joined, is shared half and half.
    assert (alice.input_tokens, alice.output_tokens) == (300 + 401, 20 + 21)
    assert (bob.input_tokens, bob.output_tokens) == (400, 20)
    assert (alice.calls, bob.calls, group.calls) == (2, 1, 2)  # a shared call is one call of the group
    assert group.tokens == 300 + 20 + 801 + 41
    mine, whole = usage.params["text"].split("This group:")
    assert "420 tokens (400 in, 20 out) in 1 model call" in mine
    assert "1,162 tokens (1,101 in, 61 out) in 2 model calls" in whole


# --- concurrent turns of one person ---------------------------------------------------------------

async def test_concurrent_turns_of_one_person_pass_the_cap_by_at_most_one_call(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    """Six groups, one person asking in all of them at once: without a reservation every turn
    passed the check (nothing recorded yet) and six calls of 2,000 tokens were made under a
    5,000-token cap."""
    groups = [GROUP - n for n in range(6)]
    llm.delay = 0.3  # the calls overlap
    llm.default_responder = lambda body: FakeOpenAI.reply("Answered.", usage={"prompt_tokens": 1800,
                                                                               "completion_tokens": 200})
    settings = _settings(tmp_path, tg, llm, TALON_TELEGRAM_ALLOWED_CHATS=",".join(map(str, groups)),
                         TALON_LIMIT_PER_PERSON="5000 tokens/day", TALON_TELEGRAM_STREAMING="off")
    async with running_telegram(settings) as runtime:
        for group in groups:
            tg.push_update(tg.text_message(group, f"{BOT} a question", user_id=ALICE, username="alice",
                                           chat_type="supergroup"))
        replies = await tg.wait_for("sendMessage", count=len(groups), timeout=30)
        await runtime.bridge.idle()
        mine = await _totals(runtime, person=str(ALICE))
    texts = [r.params["text"] for r in replies]
    assert texts.count("Answered.") + sum(CAP_LINE in t for t in texts) == len(groups)
    assert mine.tokens <= 5000 + 2000, texts  # within the cap and one call's worth
    assert mine.tokens >= 5000 and len(llm.requests) == mine.calls == 3


async def test_a_stopped_call_is_counted_from_what_was_sent_and_received() -> None:
    """The estimate of a call with no usage: the request's tokens and the text streamed so far."""
    from talon.agent.hooks import spent
    from talon.agent.providers.base import CallMeter, ModelResponse, Usage

    request = ModelRequest(system="s" * 400, messages=[Message.user("q" * 4000)])
    meter = CallMeter()
    assert spent(request, None, ValueError("refused"), meter) is None  # refused before any answer: nothing
    meter.received("a" * 2000)
    stopped = spent(request, None, asyncio.CancelledError(), meter)
    assert stopped is not None and stopped.estimated
    assert stopped.usage.output_tokens == 500 and stopped.usage.input_tokens >= 1100
    # A server that sends zeros for every call reported nothing: the call is estimated too.
    zeros = ModelResponse(Message.assistant("b" * 400), Usage(0, 0))
    answered = spent(request, zeros, None, meter)
    assert answered is not None and answered.estimated and answered.usage.output_tokens >= 100
    reported = spent(request, ModelResponse(Message.assistant("ok"), Usage(7, 3)), None, meter)
    assert reported is not None and not reported.estimated and reported.usage == Usage(7, 3)


# --- talon doctor ---------------------------------------------------------------------------------

def test_doctor_refuses_a_money_cap_for_a_model_with_no_price_as_run_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The newcomer: `talon doctor` passed TALON_LIMIT_PER_PERSON=$1/day, `talon run` refused it
    (the model on a local server has no known price)."""
    from talon.control import Control
    from talon.control.doctor import control_rows
    from talon.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    env = {"TALON_TRANSCRIBER": "off", "TALON_MODEL": "openai:my-local-model", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
           "TALON_LIMIT_PER_PERSON": "$1/day", "TALON_MODEL_DISCOVERY": "false", "TALON_DATA_DIR": str(tmp_path)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as refused:
        Control.from_settings(Settings(_env_file=None))  # type: ignore[call-arg]
    rows = dict(control_rows(Settings(_env_file=None)))  # type: ignore[call-arg]
    assert rows["caps"] == f"INVALID: {refused.value}"
    assert "TALON_LIMIT_PER_PERSON sets an amount of money" in rows["caps"] and "TALON_PRICES" in rows["caps"]


# --- the stores -----------------------------------------------------------------------------------

from tests.support.stores import stores  # noqa: E402,F401  (memory, embedded, postgres)


async def test_estimated_and_shared_calls_add_up_alike_in_every_store(stores: tuple[Any, Any]) -> None:
    from talon.storage.usage import UsageRecord

    usage, _ = stores

    def rec(person: str, inp: int, out: int, **kw: Any) -> UsageRecord:
        return UsageRecord(at=100.0, channel="telegram", chat_id="g", person=person, model="m",
                           input_tokens=inp, output_tokens=out, **kw)

    await usage.record(rec("alice", 1000, 100, cost=0.01))  # reported
    await usage.record(rec("alice", 2000, 300, estimated=True))  # estimated, no price
    await usage.record(rec("alice", 501, 21, cost=0.002))  # one call shared by two
    await usage.record(rec("bob", 500, 20, cost=0.002, extra_share=True))
    group = await usage.totals(0.0, channel="telegram", chat_id="g")
    alice = await usage.totals(0.0, channel="telegram", person="alice")
    bob = await usage.totals(0.0, channel="telegram", person="bob")
    assert (group.calls, group.tokens, group.unpriced_calls) == (3, 4442, 1)
    assert (group.estimated_calls, group.estimated_tokens) == (1, 2300)
    assert (alice.calls, alice.tokens, alice.estimated_tokens) == (3, 3922, 2300)
    assert (bob.calls, bob.tokens, bob.estimated_calls) == (1, 520, 0)
    assert group.cost == pytest.approx(0.014)
    lean = await usage.spend(0.0, channel="telegram", person="alice")  # what a caps check reads
    assert (lean.tokens, lean.cost) == (alice.tokens, pytest.approx(alice.cost))


def _old_control_file(path: Path) -> None:
    """A control database as Talon wrote it before estimated usage: two reported calls."""
    import sqlite3

    from talon.storage.embedded.control import _SCHEMA

    old = _SCHEMA.replace(",\n    estimated INTEGER NOT NULL DEFAULT 0, extra_share INTEGER NOT NULL DEFAULT 0", "")
    assert "extra_share" not in old
    conn = sqlite3.connect(path)
    with conn:
        conn.executescript(old)
        conn.executemany("INSERT INTO usage (at, channel, chat_id, person, model, purpose, input_tokens, "
                         "output_tokens, cached_tokens, cost) VALUES (?, 'telegram', 'g', 'alice', 'm', 'turn', ?, ?, "
                         "0, NULL)", [(50.0, 900, 100), (60.0, 90, 10)])
    conn.close()


async def test_a_control_file_from_before_keeps_its_usage_and_gains_estimates(tmp_path: Path) -> None:
    from talon.storage.embedded.control import SqliteUsageStore, open_control_db
    from talon.storage.usage import UsageRecord

    path = tmp_path / "control.sqlite3"
    _old_control_file(path)
    runner = open_control_db(path)
    try:
        usage = SqliteUsageStore(runner)
        await usage.record(UsageRecord(at=70.0, channel="telegram", chat_id="g", person="alice", model="m",
                                       input_tokens=400, output_tokens=0, estimated=True))
        totals = await usage.totals(0.0, channel="telegram", person="alice")
    finally:
        runner.close()
    assert (totals.calls, totals.tokens, totals.estimated_calls, totals.estimated_tokens) == (3, 1500, 1, 400)


async def test_talon_migrate_copies_an_old_and_a_new_control_file(tmp_path: Path, pg_url: str) -> None:
    from talon.storage.embedded.control import SqliteUsageStore, open_control_db
    from talon.storage.migrate import migrate_embedded
    from talon.storage.postgres.control import PgUsageStore
    from talon.storage.postgres.db import AsyncDatabase
    from talon.storage.usage import UsageRecord

    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    _old_control_file(old / "control.sqlite3")
    runner = open_control_db(new / "control.sqlite3")
    try:
        await SqliteUsageStore(runner).record(UsageRecord(at=80.0, channel="telegram", chat_id="g", person="bob",
                                                          model="m", input_tokens=300, output_tokens=30,
                                                          estimated=True, extra_share=True))
    finally:
        runner.close()
    db = AsyncDatabase(pg_url, max_size=2)
    await db.open()
    try:
        for source in (old, new, new):  # the second copy of the new file finds every row there
            await migrate_embedded(source, db)
        usage = PgUsageStore(db)
        alice = await usage.totals(0.0, channel="telegram", person="alice")
        bob = await usage.totals(0.0, channel="telegram", person="bob")
    finally:
        await db.close()
    assert (alice.calls, alice.tokens, alice.estimated_calls) == (2, 1100, 0)
    assert (bob.calls, bob.tokens, bob.estimated_calls, bob.estimated_tokens) == (1, 330, 1, 330)


# --- the providers' meters ------------------------------------------------------------------------

class _Recorder:
    """A call guard that keeps what each call cost."""

    def __init__(self) -> None:
        self.spent: list[Any] = []

    async def before_call(self, model: str, purpose: str, request: ModelRequest) -> None:
        return None

    def after_call(self, model: str, purpose: str, ticket: object, response: Any, error: BaseException | None,
                   spent: Any) -> None:
        self.spent.append((type(error).__name__ if error else None, spent))


@pytest.mark.parametrize("vendor", ["openai", "anthropic"])
async def test_a_call_stopped_midway_keeps_what_the_server_said_and_counts_what_came(vendor: str) -> None:
    """A stop in the middle of a streamed answer: the input tokens the server stated at the start
    (Anthropic's message_start) are used; the output is estimated from the text received."""
    from talon.agent.providers.anthropic import AnthropicProvider
    from talon.agent.hooks import guarding, model_call
    from talon.agent.providers.openai import OpenAIProvider
    from tests.fakes.anthropic_server import FakeAnthropic

    received = asyncio.Event()
    never = asyncio.Event()

    async def sink(delta: str) -> None:
        received.set()
        await never.wait()  # the person stops the turn while the answer is on screen

    text = "x" * 400
    guard = _Recorder()
    fake: Any = FakeAnthropic() if vendor == "anthropic" else FakeOpenAI()
    async with fake:
        fake.default_responder = lambda body: text
        provider: Any = (AnthropicProvider("claude-fake", api_key="k", base_url=fake.base_url, hydrate=lambda b: "")
                         if vendor == "anthropic" else
                         OpenAIProvider("gpt-fake", api_key="k", base_url=fake.base_url, hydrate=lambda b: ""))
        request = ModelRequest(system="be brief", messages=[Message.user("q" * 2000)], on_text=sink)

        async def turn() -> None:
            with guarding(guard):
                await model_call(provider, request)

        task = asyncio.create_task(turn())
        await asyncio.wait_for(received.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await provider.aclose()
        stated = fake.requests[0].response["usage"]["input_tokens"] if vendor == "anthropic" else None
    [(error, cost)] = guard.spent
    assert error == "CancelledError" and cost is not None and cost.estimated
    assert 1 <= cost.usage.output_tokens <= 100  # what came before the stop, not the whole answer
    if stated is not None:
        assert cost.usage.input_tokens == stated  # as the server stated it
    else:
        assert cost.usage.input_tokens >= 500  # estimated from the request sent
