"""Control: approvals for risky tool calls, usage per conversation/person/model, and caps checked
before every model call. ``Control`` is what the bridge holds; per turn it lends the agent a
``TurnHooks`` (``talon.agent.hooks``) built from the message that started the turn.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from talon.agent.hooks import CallGuard, TurnHooks
from talon.agent.provider import ModelResponse
from talon.content import ToolCall
from talon.control.approvals import ApprovalPolicy, Approvals, Prompter, TurnOrigin
from talon.control.caps import Caps, parse_limits, period_bounds
from talon.control.prices import PriceTable
from talon.errors import CapReached, ConfigError
from talon.metrics import Metrics
from talon.storage.approvals import ApprovalStore, MemoryApprovalStore
from talon.storage.usage import MemoryUsageStore, UsageRecord, UsageStore, UsageTotals

if TYPE_CHECKING:
    from talon.config import Settings
    from talon.envelope import InboundMessage

log = logging.getLogger(__name__)

__all__ = ["ApprovalPolicy", "Approvals", "Caps", "Control", "PriceTable", "TurnOrigin"]


@dataclass
class Control:
    usage: UsageStore
    prices: PriceTable
    caps: Caps
    approvals: Approvals
    metrics: Metrics = field(default_factory=Metrics)
    clock: Callable[[], float] = time.time
    # Usage records being written: a reply does not wait for its bookkeeping, but the next caps
    # check, /usage and shutdown do (``settled``).
    _recording: set["asyncio.Task[None]"] = field(default_factory=set, init=False, repr=False)

    @classmethod
    def from_settings(cls, settings: "Settings", usage: UsageStore | None = None,
                      approvals: ApprovalStore | None = None, metrics: Metrics | None = None) -> "Control":
        """Raises ``ConfigError`` for a setting that cannot be used (a limit that does not parse,
        an amount of money for a model with no price)."""
        usage = usage if usage is not None else MemoryUsageStore()
        metrics = metrics or Metrics()
        prices = PriceTable.from_settings(settings)
        caps = Caps(usage, parse_limits(settings.limit_per_person, "TALON_LIMIT_PER_PERSON"),
                    parse_limits(settings.limit_per_chat, "TALON_LIMIT_PER_CHAT"),
                    parse_limits(settings.limit_total, "TALON_LIMIT_TOTAL"), settings.zone)
        if caps.priced and prices.price(settings.model_name) is None:
            named = [n for n, v in (("TALON_LIMIT_PER_PERSON", caps.person), ("TALON_LIMIT_PER_CHAT", caps.chat),
                                    ("TALON_LIMIT_TOTAL", caps.total)) if any(lim.unit == "usd" for lim in v)]
            raise ConfigError(f"{', '.join(named)} sets an amount of money, but the model {settings.model_name!r} "
                              "has no known price: set it in TALON_PRICES (model=input/output per million "
                              "tokens) or limit tokens instead", [*named, "TALON_PRICES"])
        policy = ApprovalPolicy.parse(settings.approval, settings.approvers, settings.approval_timeout_s)
        gate = Approvals(approvals if approvals is not None else MemoryApprovalStore(), policy,
                         on_decision=lambda a: metrics.approvals.labels(a.kind, a.status).inc())
        return cls(usage, prices, caps, gate, metrics)

    def hooks_for(self, message: "InboundMessage", prompter: Prompter, chat_id: str) -> TurnHooks:
        """What the turn answering ``message`` is lent: its calls are counted against the
        message's person and conversation, and its risky tools ask in its chat."""
        origin = TurnOrigin(channel=message.channel, chat_id=chat_id, platform_chat=message.chat_id,
                            thread_id=message.thread_id, requester=message.sender_id, turn_id=message.key,
                            group=message.is_group)

        async def approve(call: ToolCall) -> str | None:
            return await self.approvals.gate(call, origin, prompter)

        # Whenever a kind is named, not only when a tool of it exists now: MCP servers add their
        # tools once they are up, which may be after this turn began (the gate asks only when the
        # call's kind is named).
        return TurnHooks(guard=self.guard(message.channel, chat_id, message.sender_id),
                         approve=approve if self.approvals.policy.kinds else None,
                         tool_done=self.metrics.tool)

    def guard(self, channel: str, chat_id: str, person: str) -> CallGuard:
        """The guard of the calls made for ``person`` in a conversation: caps before, usage after."""
        return _Guard(self, channel, chat_id, person)

    def record_soon(self, channel: str, chat_id: str, person: str, model: str, purpose: str,
                    response: ModelResponse) -> None:
        """Record a call's usage without holding up the turn (see ``settled``)."""
        if response.usage is None:
            return
        task = asyncio.create_task(self.record(channel, chat_id, person, model, purpose, response))
        self._recording.add(task)
        task.add_done_callback(self._recording.discard)

    async def settled(self) -> None:
        """Wait until every usage record started so far is in the store."""
        while self._recording:
            await asyncio.gather(*list(self._recording), return_exceptions=True)

    async def record(self, channel: str, chat_id: str, person: str, model: str, purpose: str,
                     response: ModelResponse) -> None:
        usage = response.usage
        if usage is None:
            return
        self.metrics.tokens.labels(model, "input").inc(usage.input_tokens)
        self.metrics.tokens.labels(model, "output").inc(usage.output_tokens)
        self.metrics.tokens.labels(model, "cached").inc(usage.cached_tokens)
        record = UsageRecord(at=self.clock(), channel=channel, chat_id=chat_id, person=person, model=model,
                             input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                             cached_tokens=usage.cached_tokens, cost=self.prices.cost(model, usage), purpose=purpose)
        try:
            await self.usage.record(record)
        except Exception:  # the answer is not lost over its bookkeeping; the log says what was missed
            log.exception("usage of a %s call in %s:%s (%d in, %d out) could not be recorded", model, channel,
                          chat_id, usage.input_tokens, usage.output_tokens)

    # --- /usage -----------------------------------------------------------------------------
    async def usage_text(self, message: "InboundMessage", chat_id: str) -> str:
        await self.settled()
        now = self.clock()
        zone = self.caps.zone
        day, _ = period_bounds("day", now, zone)
        month, _ = period_bounds("month", now, zone)
        lines = ["Your use of the model:"]
        for label, since in (("today", day), ("this month", month), ("all time", 0.0)):
            totals = await self.usage.totals(since, channel=message.channel, person=message.sender_id)
            lines.append(f"- {label}: {_totals_words(totals)}")
        if message.is_group:
            lines.append("This group:" if not message.thread_id else "This topic:")
            for label, since in (("today", day), ("this month", month), ("all time", 0.0)):
                totals = await self.usage.totals(since, channel=message.channel, chat_id=chat_id)
                lines.append(f"- {label}: {_totals_words(totals)}")
        limits = _limits_words(self.caps)
        if limits:
            lines.append(f"Limits: {limits} (days begin at 00:00 {zone.key}).")
        return "\n".join(lines)


def _totals_words(totals: UsageTotals) -> str:
    if not totals.calls:
        return "nothing yet"
    text = (f"{totals.tokens:,} tokens ({totals.input_tokens:,} in, {totals.output_tokens:,} out"
            + (f", {totals.cached_tokens:,} of them cached" if totals.cached_tokens else "")
            + f") in {totals.calls:,} model call{'s' if totals.calls != 1 else ''}")
    if totals.unpriced_calls == totals.calls:
        return text + "; no price known for the model"
    cost = f"about ${totals.cost:,.4f}" if totals.cost < 1 else f"about ${totals.cost:,.2f}"
    if totals.unpriced_calls:
        cost += f" ({totals.unpriced_calls} call(s) with no known price left out)"
    return f"{text}, {cost}"


def _limits_words(caps: Caps) -> str:
    parts: list[str] = []
    for scope, limits in (("per person", caps.person), ("per chat", caps.chat), ("for the bot", caps.total)):
        parts.extend(f"{limit.describe()} {scope}" for limit in limits)
    return "; ".join(parts)


class _Guard:
    """The call guard of one turn: caps before, usage and metrics after."""

    def __init__(self, control: Control, channel: str, chat_id: str, person: str) -> None:
        self.control = control
        self.channel = channel
        self.chat_id = chat_id
        self.person = person

    async def before_call(self, model: str, purpose: str) -> None:
        if not self.control.caps.any:
            return
        await self.control.settled()  # the calls just made count
        try:
            await self.control.caps.check(self.channel, self.chat_id, self.person)
        except CapReached as exc:
            self.control.metrics.cap_refusals.labels(exc.scope).inc()
            log.info("%s:%s: %s call not made: %s cap reached", self.channel, self.chat_id, purpose, exc.scope)
            raise

    async def after_call(self, model: str, purpose: str, response: ModelResponse | None,
                         error: BaseException | None) -> None:
        self.control.metrics.model_calls.labels(model, purpose).inc()
        if error is not None or response is None:
            self.control.metrics.model_errors.labels(model, type(error).__name__).inc()
            return
        self.control.record_soon(self.channel, self.chat_id, self.person, model, purpose, response)

