"""Control's parts as values: limits, periods, prices, the approval policy, the call guard."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from talon.agent.hooks import Spent, guarding, model_call
from talon.agent.providers.base import ModelRequest, ModelResponse, Provider, Usage
from talon.agent.context.summary import Summarizer
from talon.content import Message, ToolCall
from talon.control import Control
from talon.control.approvals import ApprovalPolicy, describe_call, reply_choice, tool_kind
from talon.control.caps import Caps, Limit, parse_grant, parse_limits, period_bounds
from talon.control.prices import Price, PriceTable, parse_prices
from talon.errors import CapReached, ConfigError
from talon.storage.usage import MemoryUsageStore, UsageRecord
from tests.conftest import make_settings

BERLIN = ZoneInfo("Europe/Berlin")


def test_limits_parse_tokens_and_money_per_day_or_month() -> None:
    assert parse_limits("200000 tokens/day", "X") == [Limit(200000, "tokens", "day")]
    assert parse_limits("200k tokens / day, $2/day,$20.50/month, 1M tokens/month", "X") == [
        Limit(200000, "tokens", "day"), Limit(2, "usd", "day"), Limit(20.5, "usd", "month"),
        Limit(1_000_000, "tokens", "month")]
    assert parse_limits("", "X") == []
    assert Limit(200000, "tokens", "day").describe() == "200,000 tokens per day"
    assert Limit(2, "usd", "day").describe() == "$2 per day" and Limit(2.5, "usd", "month").describe() == "$2.50 per month"


@pytest.mark.parametrize("bad", ["200000", "2 dollars/day", "$2/week", "tokens/day", "-5 tokens/day"])
def test_a_limit_that_does_not_parse_names_its_setting(bad: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_limits(bad, "TALON_LIMIT_PER_CHAT")
    assert caught.value.missing == ["TALON_LIMIT_PER_CHAT"] and "200000 tokens/day" in str(caught.value)


def test_days_and_months_begin_at_local_midnight() -> None:
    now = dt.datetime(2026, 3, 29, 12, 0, tzinfo=BERLIN).timestamp()  # the day clocks go forward
    since, reset = period_bounds("day", now, BERLIN)
    assert dt.datetime.fromtimestamp(since, BERLIN) == dt.datetime(2026, 3, 29, 0, 0, tzinfo=BERLIN)
    assert (reset.day, reset.hour) == (30, 0)
    since, reset = period_bounds("month", dt.datetime(2026, 12, 31, 23, 30, tzinfo=BERLIN).timestamp(), BERLIN)
    assert dt.datetime.fromtimestamp(since, BERLIN) == dt.datetime(2026, 12, 1, tzinfo=BERLIN)
    assert (reset.year, reset.month, reset.day) == (2027, 1, 1)


async def test_caps_check_each_scope_and_a_grant_lifts_the_persons() -> None:
    usage = MemoryUsageStore()
    now = dt.datetime(2026, 5, 10, 15, 0, tzinfo=BERLIN).timestamp()
    caps = Caps(usage, parse_limits("1000 tokens/day", "P"), parse_limits("$1/month", "C"),
                parse_limits("5000 tokens/day", "T"), BERLIN, clock=lambda: now)
    await caps.check("telegram", "g", "alice")  # nothing used yet
    await usage.record(UsageRecord(now - 3600, "telegram", "g", "alice", "m", 900, 100, cost=0.2))
    with pytest.raises(CapReached) as caught:
        await caps.check("telegram", "g", "alice")
    assert caught.value.scope == "person"
    assert str(caught.value) == ("You have reached the limit of 1,000 tokens per day for today, so I did not ask "
                                 "the model; it resets at 00:00 Europe/Berlin.")
    await caps.check("telegram", "g", "bob")  # another person in the same chat
    # Yesterday's use does not count today.
    await usage.record(UsageRecord(now - 86400, "telegram", "g", "bob", "m", 9000, 0, cost=0.0))
    await caps.check("telegram", "g", "bob")
    await usage.grant("telegram", "alice", 500, "tokens", now - 60)
    await caps.check("telegram", "g", "alice")  # lifted by the grant
    await usage.record(UsageRecord(now - 30, "telegram", "g", "bob", "m", 10, 10, cost=0.85))
    with pytest.raises(CapReached) as caught:
        await caps.check("telegram", "g", "alice")
    assert caught.value.scope == "chat" and "This chat has reached the limit of $1 per month for this month" in str(
        caught.value) and "it resets on 1 June at 00:00 Europe/Berlin" in str(caught.value)


def test_grant_amounts() -> None:
    assert parse_grant("50000") == (50000, "tokens") and parse_grant("50k") == (50000, "tokens")
    assert parse_grant("$5") == (5, "usd") and parse_grant("2M tokens") == (2_000_000, "tokens")
    for bad in ("five", "$", "-3", "0"):
        with pytest.raises(ConfigError):
            parse_grant(bad)


def test_prices_from_the_table_and_the_setting() -> None:
    vendor = PriceTable.from_settings(make_settings(Path("/tmp"), "http://x", "", TALON_MODEL="openai:gpt-4.1-mini",
                                                    OPENAI_BASE_URL=""))
    assert vendor.price("gpt-4.1-mini") == Price(0.40, 1.60, 0.10)
    assert vendor.price("gpt-4.1-mini-2025-04-14") == Price(0.40, 1.60, 0.10)  # a dated snapshot
    assert vendor.price("gpt-4.1") == Price(2.00, 8.00, 0.50) and vendor.price("o3-mini") == Price(1.10, 4.40, 0.55)
    assert vendor.price("gpt-4.1x") is None
    # 1M in (400k of them cached) and 100k out.
    assert vendor.cost("gpt-4.1-mini", Usage(1_000_000, 100_000, 400_000)) == pytest.approx(0.24 + 0.04 + 0.16)
    local = PriceTable.from_settings(make_settings(Path("/tmp"), "http://x", "http://127.0.0.1:8080/v1",
                                                   TALON_MODEL="openai:gpt-4.1-mini",
                                                   TALON_PRICES="qwen2.5:7b=0.1/0.2"))
    assert local.price("gpt-4.1-mini") is None  # a local server: no price assumed
    assert local.price("qwen2.5:7b") == Price(0.1, 0.2, 0.1)  # cached defaults to the input price
    for bad in ("gpt-4=1", "gpt-4=a/b", "=1/2", "gpt-4=1/2/3/4", "gpt-4=-1/2"):
        with pytest.raises(ConfigError) as caught:
            parse_prices(bad)
        assert caught.value.missing == ["TALON_PRICES"]


def test_money_caps_need_a_price_and_a_bad_zone_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        Control.from_settings(make_settings(tmp_path, "http://x", "http://127.0.0.1:1/v1",
                                            TALON_LIMIT_TOTAL="$20/month"))
    assert "TALON_LIMIT_TOTAL" in caught.value.missing and "fake-model" in str(caught.value)
    Control.from_settings(make_settings(tmp_path, "http://x", "http://127.0.0.1:1/v1", TALON_LIMIT_TOTAL="$20/month",
                                        TALON_PRICES="fake-model=1/2"))
    with pytest.raises(ConfigError) as caught:
        Control.from_settings(make_settings(tmp_path, "http://x", "http://x", TALON_TIMEZONE="Mars/Olympus"))
    assert caught.value.missing == ["TALON_TIMEZONE"]


def test_approval_kinds_by_tool_name() -> None:
    assert [tool_kind(t) for t in ("shell", "write_file", "edit_file", "read_file", "mcp__github__create_issue",
                                   "web_fetch", "speak", "send_file")] == \
        ["shell", "write", "write", None, "mcp", "web", "send", "send"]
    policy = ApprovalPolicy.parse("shell, mcp:GitHub, web")
    assert policy.kind_of("shell") == "shell" and policy.kind_of("write_file") is None
    # mcp:<server> is matched by the server a tool belongs to; a tool of no known server waits.
    assert policy.kind_of("mcp__github__create_issue", "github") == "mcp"
    assert policy.kind_of("mcp__files__read", "files") is None
    assert policy.kind_of("mcp__files__read") == "mcp"
    assert policy.kind_of("web_fetch") == "web"
    assert ApprovalPolicy.parse("mcp").kind_of("mcp__files__read") == "mcp"
    assert not ApprovalPolicy.parse("off").kinds and not ApprovalPolicy.parse("").kinds
    with pytest.raises(ConfigError) as caught:
        ApprovalPolicy.parse("shell,rm")
    assert caught.value.missing == ["TALON_APPROVAL"] and "'rm'" in str(caught.value)


def test_approvers_and_replies() -> None:
    policy = ApprovalPolicy.parse("shell", "telegram:42, 7, @Bob")
    assert policy.is_approver("telegram", "42") and not policy.is_approver("whatsapp", "42")
    assert policy.is_approver("whatsapp", "7")
    assert policy.is_approver("telegram", "99", "bob") and not policy.is_approver("telegram", "99", "eve")
    assert [reply_choice(t) for t in ("yes", "Yes!", "/approve", "/approve@talon_bot", "no", "/deny", "yes please")] \
        == ["approve", "approve", "approve", "approve", "deny", "deny", None]


def test_a_call_is_described_whole() -> None:
    assert describe_call(ToolCall(id="1", name="shell", arguments='{"command": "ls -la"}'), "shell") == \
        "run a shell command:\nls -la"
    assert describe_call(ToolCall(id="1", name="write_file", arguments='{"path": "a.txt", "content": "hello"}'),
                         "write") == "write the file a.txt (5 characters):\nhello"
    long = describe_call(ToolCall(id="1", name="mcp__github__create_issue", arguments='{"body": "' + "x" * 2000 + '"}'),
                         "mcp")
    assert long.startswith("use the tool github / create_issue with:\nbody: x") and long.endswith("x" * 2000)


class _Counting(Provider):
    name = "openai"
    model = "m"

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        return ModelResponse(Message.assistant("a summary"), Usage(100, 10, 40))


class _Guard:
    def __init__(self, block: bool) -> None:
        self.block = block
        self.seen: list[tuple[str, str, int | None]] = []

    async def before_call(self, model: str, purpose: str, request: ModelRequest) -> None:
        if self.block:
            raise CapReached("capped", "total")

    def after_call(self, model: str, purpose: str, ticket: object, response: ModelResponse | None,
                   error: BaseException | None, spent: Spent | None) -> None:
        self.seen.append((model, purpose, response.usage.cached_tokens if response and response.usage else None))


async def test_summaries_go_through_the_turns_guard() -> None:
    provider = _Counting()
    summarizer = Summarizer(provider, window=8000)
    guard = _Guard(block=False)
    with guarding(guard):
        await summarizer.summarize(None, [Message.user("hello"), Message.assistant("hi")], max_tokens=200)
    assert guard.seen == [("m", "summary", 40)]
    blocked = _Guard(block=True)
    with guarding(blocked), pytest.raises(CapReached):
        await summarizer.summarize(None, [Message.user("hello")], max_tokens=200)
    assert provider.calls == 1  # the capped summary was never asked for
    assert await model_call(provider, ModelRequest(system="", messages=[])) is not None  # no turn: no guard


def test_doctor_shows_control_and_names_a_bad_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from talon.cli import main

    monkeypatch.chdir(tmp_path)
    for name, value in (("TALON_TRANSCRIBER", "off"), ("TALON_APPROVAL", "shell,mcp:github"),
                        ("TALON_APPROVAL_TIMEOUT", "120"), ("TALON_LIMIT_PER_CHAT", "$2/day"),
                        ("TALON_TIMEZONE", "Europe/Berlin"), ("TALON_METRICS", "false")):
        monkeypatch.setenv(name, value)
    main(["doctor"])  # no model configured: no request leaves; the control rows are what counts
    rows = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines()
                if line.startswith(("approvals", "caps", "metrics")))
    assert rows["approvals"].strip() == "mcp:github, shell; wait 2 minutes"
    assert rows["caps"].strip() == "$2 per day per chat (days begin at 00:00 Europe/Berlin)"
    assert rows["metrics"].strip() == "off (TALON_METRICS=false)"
    monkeypatch.setenv("TALON_APPROVAL", "shel")
    assert main(["doctor"]) == 1
    out = capsys.readouterr()
    assert "INVALID: TALON_APPROVAL: 'shel' is not a kind of tool call" in out.out and "approvals" in out.err


def test_approvals_are_on_only_when_a_gated_tool_exists() -> None:
    from talon.control.approvals import Approvals
    from talon.storage.approvals import MemoryApprovalStore

    approvals = Approvals(MemoryApprovalStore(), ApprovalPolicy.parse("shell"))
    approvals.tool_names = lambda: {"ls", "read_file"}
    assert not approvals.enabled  # the default (shell) with the shell off: yes/no stay ordinary messages
    approvals.tool_names = lambda: {"ls", "shell"}
    assert approvals.enabled
    files = Approvals(MemoryApprovalStore(), ApprovalPolicy.parse("send"))
    files.tool_names = lambda: {"ls"}
    assert files.enabled  # any reply may attach files
    assert not Approvals(MemoryApprovalStore(), ApprovalPolicy.parse("off")).enabled


async def test_a_waiting_approval_outlasts_a_store_that_does_not_answer_for_a_moment() -> None:
    import asyncio

    from talon.control.approvals import Approvals, TurnOrigin
    from talon.errors import StoreUnavailable
    from talon.storage.approvals import Approval, MemoryApprovalStore

    class Flaky(MemoryApprovalStore):
        def __init__(self) -> None:
            super().__init__()
            self.failures = 3

        async def get(self, approval_id: str) -> Approval | None:
            if self.failures:
                self.failures -= 1
                raise StoreUnavailable("the database did not answer within 10s")
            return await super().get(approval_id)

    class Prompts:
        def __init__(self) -> None:
            self.asked: list[Approval] = []
            self.settled: list[str] = []

        async def ask_approval(self, approval: Approval, text: str) -> str | None:
            self.asked.append(approval)
            return "7"

        async def settle_approval(self, approval: Approval, text: str) -> None:
            self.settled.append(text)

    store, prompts = Flaky(), Prompts()
    approvals = Approvals(store, ApprovalPolicy.parse("shell"), poll_s=0.01)
    origin = TurnOrigin("telegram", "111", "111", None, "111", "telegram:111:1")
    waiting = asyncio.create_task(approvals.gate(ToolCall(id="c1", name="shell", arguments='{"command": "ls"}'),
                                                 origin, prompts))
    deadline = asyncio.get_running_loop().time() + 5
    while store.failures or not prompts.asked:  # the waiting turn has met the silent store
        assert asyncio.get_running_loop().time() < deadline and not waiting.done()
        await asyncio.sleep(0.01)
    answer = await approvals.answer(prompts.asked[0].id, "approve", "telegram", "111", "Alice")
    assert answer.outcome == "decided"
    assert await asyncio.wait_for(waiting, 5) is None  # approved: the call runs
    assert (await store.get(prompts.asked[0].id)).prompt_id == "7"  # type: ignore[union-attr]
