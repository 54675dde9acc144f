"""Control: approvals for risky tool calls, usage per conversation/person/model (reported, or
estimated when the provider reports none or a call is stopped midway), and caps checked (and a
reservation made) before every model call. ``Control`` is what the bridge holds; per turn it lends the agent a
``TurnHooks`` (``talon.agent.hooks``) built from the message that started the turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from talon.agent.hooks import Spent, TurnHooks
from talon.agent.providers.base import ModelRequest, ModelResponse, Usage
from talon.agent.context.tokens import estimate_request
from talon.content import ToolCall
from talon.control.approvals import ApprovalPolicy, Approvals, Prompter, TurnOrigin
from talon.control.caps import Caps, Hold, caps_from_settings, period_bounds
from talon.control.prices import PriceTable
from talon.errors import CapReached
from talon.metrics import Metrics
from talon.storage.approvals import ApprovalStore, MemoryApprovalStore
from talon.storage.usage import MemoryUsageStore, UsageRecord, UsageStore, UsageTotals

if TYPE_CHECKING:
    from talon.config import Settings
    from talon.envelope import InboundMessage

log = logging.getLogger(__name__)

__all__ = ["ApprovalPolicy", "Approvals", "Caps", "Control", "PriceTable", "TurnGuard", "TurnOrigin"]

# Output tokens reserved for a call that names no limit of its own (the caps' estimate of its cost).
RESERVED_OUTPUT = 4096


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
    # One caps check and reservation at a time on this worker (else two calls could both pass on
    # the same room); set when a call in flight settles, for the calls waiting on it.
    _admitting: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)
    _changed: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)

    @classmethod
    def from_settings(cls, settings: "Settings", usage: UsageStore | None = None,
                      approvals: ApprovalStore | None = None, metrics: Metrics | None = None) -> "Control":
        """Raises ``ConfigError`` for a setting that cannot be used (a limit that does not parse,
        an amount of money for a model with no price)."""
        usage = usage if usage is not None else MemoryUsageStore()
        metrics = metrics or Metrics()
        prices = PriceTable.from_settings(settings)
        caps = caps_from_settings(settings, usage)
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

    def guard(self, channel: str, chat_id: str, person: str) -> "TurnGuard":
        """The guard of the calls made for ``person`` in a conversation: caps before, usage after."""
        return TurnGuard(self, channel, chat_id, person)

    def _changed_now(self) -> None:
        """Wake the calls waiting for calls in flight to settle."""
        self._changed.set()
        self._changed = asyncio.Event()

    def _release(self, holds: list[Hold]) -> None:
        if holds:
            self.caps.holds[:] = [h for h in self.caps.holds if all(h is not mine for mine in holds)]
            self._changed_now()

    def record_soon(self, records: list[UsageRecord], holds: list[Hold] | None = None) -> None:
        """Write a call's usage records without holding up the turn (see ``settled``); its holds
        on the caps go when the records are in the store."""
        task = asyncio.create_task(self._write(records))
        self._recording.add(task)

        def done(finished: "asyncio.Task[None]") -> None:
            self._recording.discard(finished)
            self._release(holds or [])

        task.add_done_callback(done)

    async def settled(self) -> None:
        """Wait until every usage record started so far is in the store."""
        while self._recording:
            await asyncio.gather(*list(self._recording), return_exceptions=True)

    async def _write(self, records: list[UsageRecord]) -> None:
        for record in records:
            try:
                await self.usage.record(record)
            except Exception:  # the answer is not lost over its bookkeeping; the log says what was missed
                log.exception("usage of a %s call in %s:%s (%d in, %d out%s) could not be recorded", record.model,
                              record.channel, record.chat_id, record.input_tokens, record.output_tokens,
                              ", estimated" if record.estimated else "")

    def records(self, channel: str, chat_id: str, payers: list[str], model: str, purpose: str,
                spent: Spent) -> list[UsageRecord]:
        """A call's usage records: one per payer, each with an equal share (the rest of an
        uneven split goes to the first, the person who started the turn)."""
        usage = spent.usage
        self.metrics.tokens.labels(model, "input").inc(usage.input_tokens)
        self.metrics.tokens.labels(model, "output").inc(usage.output_tokens)
        self.metrics.tokens.labels(model, "cached").inc(usage.cached_tokens)
        now = self.clock()
        return [UsageRecord(at=now, channel=channel, chat_id=chat_id, person=person, model=model,
                            input_tokens=share.input_tokens, output_tokens=share.output_tokens,
                            cached_tokens=share.cached_tokens, cost=self.prices.cost(model, share),
                            purpose=purpose, estimated=spent.estimated, extra_share=index > 0)
                for index, (person, share) in enumerate(zip(payers, _shares(usage, len(payers))))]

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
        models = await self.usage.by_model(month, channel=message.channel, person=message.sender_id)
        if len(models) > 1:  # a fallback answered too (TALON_MODEL_FALLBACKS)
            lines.append("By model, this month:")
            lines += [f"- {model}: {_totals_words(totals)}" for model, totals in models.items()]
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
    calls = f"in {totals.calls:,} model call{'s' if totals.calls != 1 else ''}"
    if totals.estimated_tokens and totals.estimated_tokens >= totals.tokens:
        # The server reported nothing for these calls (or they were stopped midway): Talon's count.
        text = (f"~{totals.tokens:,} tokens (estimated; ~{totals.input_tokens:,} in, ~{totals.output_tokens:,} out) "
                f"{calls}")
    else:
        text = (f"{totals.tokens:,} tokens ({totals.input_tokens:,} in, {totals.output_tokens:,} out"
                + (f", {totals.cached_tokens:,} of them cached" if totals.cached_tokens else "")
                + (f"; ~{totals.estimated_tokens:,} of them estimated" if totals.estimated_tokens else "")
                + f") {calls}")
    if totals.unpriced_calls == totals.calls:
        return text + "; no price known for the model"
    cost = f"about ${totals.cost:,.4f}" if totals.cost < 1 else f"about ${totals.cost:,.2f}"
    if totals.unpriced_calls:
        cost += f" ({totals.unpriced_calls} call(s) with no known price left out)"
    return f"{text}, {cost}"


def _shares(usage: Usage, n: int) -> list[Usage]:
    """``usage`` split into ``n`` equal shares of whole tokens; the first takes what is left over."""
    if n <= 1:
        return [usage]
    parts = [divmod(v, n) for v in (usage.input_tokens, usage.output_tokens, usage.cached_tokens)]
    first = Usage(*(q + r for q, r in parts))
    return [first] + [Usage(*(q for q, _ in parts))] * (n - 1)


def _limits_words(caps: Caps) -> str:
    parts: list[str] = []
    for scope, limits in (("per person", caps.person), ("per chat", caps.chat), ("for the bot", caps.total)):
        parts.extend(f"{limit.describe()} {scope}" for limit in limits)
    return "; ".join(parts)


@dataclass
class _Ticket:
    payers: list[str]  # who the call is charged to, in equal shares
    holds: list[Hold]  # its reservation on the caps (none without caps)


class TurnGuard:
    """The call guard of one turn: caps before (with a reservation), usage and metrics after.

    A turn is charged to the person whose message started it. A message of another person that
    joins it (steer, in a group) is let in only if its sender is under their cap (``admit``);
    from the next call on, each call is shared in equal parts by the starter and the people whose
    messages joined, as long as they are under their own caps (one who reaches theirs pays no
    more shares of this turn; the starter's cap ends the turn as always)."""

    def __init__(self, control: Control, channel: str, chat_id: str, person: str) -> None:
        self.control = control
        self.channel = channel
        self.chat_id = chat_id
        self.person = person
        self.joiners: list[str] = []

    async def admit(self, person: str) -> None:
        """Raise ``CapReached`` when ``person`` may not join this turn (their cap, the chat's, the
        bot's is reached)."""
        control = self.control
        if not control.caps.any or not person:
            return
        await control.settled()
        try:
            await control.caps.check(self.channel, self.chat_id, person)
        except CapReached as exc:
            control.metrics.cap_refusals.labels(exc.scope).inc()
            log.info("%s:%s: a message did not join the running turn: %s cap reached", self.channel, self.chat_id,
                     exc.scope)
            raise

    def joined(self, person: str) -> None:
        if person and person != self.person and person not in self.joiners:
            self.joiners.append(person)

    async def before_call(self, model: str, purpose: str, request: ModelRequest) -> _Ticket:
        control = self.control
        caps = control.caps
        if not caps.any:
            return _Ticket([self.person, *self.joiners], [])
        # The reservation: the request as sent and all the output it may ask for.
        estimate = Usage(estimate_request(request), request.max_output_tokens or RESERVED_OUTPUT)
        while True:
            async with control._admitting:
                await control.settled()  # the calls just made count
                try:
                    wait = await caps.check(self.channel, self.chat_id, self.person)
                except CapReached as exc:
                    control.metrics.cap_refusals.labels(exc.scope).inc()
                    log.info("%s:%s: %s call not made: %s cap reached", self.channel, self.chat_id, purpose,
                             exc.scope)
                    raise
                if not wait:
                    payers = [self.person]
                    for joiner in self.joiners:
                        with contextlib.suppress(CapReached):  # at their cap: no more shares for them
                            await caps.check(self.channel, self.chat_id, joiner, scopes=("person",))
                            payers.append(joiner)
                    holds = [Hold(self.channel, self.chat_id, person, share.input_tokens + share.output_tokens,
                                  control.prices.cost(model, share) or 0.0)
                             for person, share in zip(payers, _shares(estimate, len(payers)))]
                    caps.holds.extend(holds)
                    return _Ticket(payers, holds)
                changed = control._changed
            # Only calls still in flight on this worker would pass a cap: wait for them to settle.
            log.info("%s:%s: %s call waits for calls in flight to settle against the caps", self.channel,
                     self.chat_id, purpose)
            await changed.wait()

    def after_call(self, model: str, purpose: str, ticket: object, response: ModelResponse | None,
                   error: BaseException | None, spent: Spent | None) -> None:
        control = self.control
        assert isinstance(ticket, _Ticket)
        control.metrics.model_calls.labels(model, purpose).inc()
        if error is not None and not isinstance(error, asyncio.CancelledError):
            control.metrics.model_errors.labels(model, type(error).__name__).inc()
        if spent is None:  # refused before the server answered: nothing to charge
            control._release(ticket.holds)
            return
        try:
            records = control.records(self.channel, self.chat_id, ticket.payers, model, purpose, spent)
        except Exception:
            log.exception("usage of a %s call in %s:%s could not be counted", model, self.channel, self.chat_id)
            control._release(ticket.holds)
            return
        # Until its records are in the store, the call counts against the caps with what it cost.
        for hold, record in zip(ticket.holds, records):
            hold.tokens, hold.cost, hold.settled = record.input_tokens + record.output_tokens, record.cost or 0.0, True
        control._changed_now()
        control.record_soon(records, ticket.holds)
