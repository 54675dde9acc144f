"""The usage store: every model call's tokens, per conversation, person and model, and the
allowances the owner granted (``talon usage --grant``). A call's tokens are what the provider
reported, or an estimate marked ``estimated`` (a server that reports none, a call stopped or
broken off midway). A call shared by several people (a group turn that others' messages joined)
is one record per person with their share (the first is the call's own, the others are marked
``extra_share``): it counts as one call for each person, and as one call of the conversation.

Caps are checked against sums over this store, so with many workers every worker sees the same
spend: the store is the truth, not a counter in one process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

GrantUnit = Literal["tokens", "usd"]


@dataclass(frozen=True)
class UsageRecord:
    """One model call as the provider reported it."""

    at: float  # Unix time
    channel: str
    chat_id: str  # the conversation (a chat, or a forum topic)
    person: str  # the sender's id on the channel; "" when no person asked (a call outside a turn)
    model: str  # the model spec (TALON_MODEL or the summary model)
    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0
    cost: float | None = None  # estimated US dollars; None: the model has no known price
    purpose: str = "turn"  # "turn" or "summary"
    estimated: bool = False  # the tokens are Talon's estimate: the provider reported none
    extra_share: bool = False  # a further share of a call whose first record counts it (a shared turn)


@dataclass(frozen=True)
class UsageTotals:
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost: float = 0.0  # of the priced calls
    unpriced_calls: int = 0
    estimated_calls: int = 0  # calls whose tokens are (partly) Talon's estimate
    estimated_tokens: int = 0  # of the tokens, those estimated

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


class UsageStore(Protocol):
    async def record(self, record: UsageRecord) -> None: ...

    async def totals(self, since: float, *, channel: str | None = None, chat_id: str | None = None,
                     person: str | None = None) -> UsageTotals:
        """Sums over the calls from ``since`` on, narrowed to a conversation and/or a person
        (``person`` needs ``channel``: ids are per channel)."""
        ...

    async def by_model(self, since: float, *, channel: str | None = None, chat_id: str | None = None,
                       person: str | None = None) -> dict[str, UsageTotals]:
        """``totals`` for each model that was called (failover: ``TALON_MODEL_FALLBACKS``)."""
        ...

    async def spend(self, since: float, *, channel: str | None = None, chat_id: str | None = None,
                    person: str | None = None) -> UsageTotals:
        """Like ``totals``, but only the tokens and the cost (what caps count; the rest is 0): the
        query before every model call, kept lean."""
        ...

    async def grant(self, channel: str, person: str, amount: float, unit: GrantUnit, at: float) -> None: ...

    async def granted(self, channel: str, person: str, unit: GrantUnit, since: float) -> float:
        """What was granted to the person from ``since`` on, in ``unit``."""
        ...


def matches(record: UsageRecord, since: float, channel: str | None, chat_id: str | None,
            person: str | None) -> bool:
    return (record.at >= since and (channel is None or record.channel == channel)
            and (chat_id is None or record.chat_id == chat_id) and (person is None or record.person == person))


def add_up(records: list[UsageRecord], *, per_person: bool = False) -> UsageTotals:
    """The sums over ``records``; ``per_person``: they are one person's, each share a call of theirs."""
    calls = [r for r in records if per_person or not r.extra_share]
    return UsageTotals(
        calls=len(calls),
        input_tokens=sum(r.input_tokens for r in records),
        output_tokens=sum(r.output_tokens for r in records),
        cached_tokens=sum(r.cached_tokens for r in records),
        cost=sum(r.cost or 0.0 for r in records),
        unpriced_calls=sum(1 for r in calls if r.cost is None),
        estimated_calls=sum(1 for r in calls if r.estimated),
        estimated_tokens=sum(r.input_tokens + r.output_tokens for r in records if r.estimated),
    )


class MemoryUsageStore:
    """In memory, for tests and for a runtime built without stores."""

    def __init__(self) -> None:
        self.records: list[UsageRecord] = []
        self.grants: list[tuple[str, str, float, GrantUnit, float]] = []

    async def record(self, record: UsageRecord) -> None:
        self.records.append(record)

    async def totals(self, since: float, *, channel: str | None = None, chat_id: str | None = None,
                     person: str | None = None) -> UsageTotals:
        return add_up([r for r in self.records if matches(r, since, channel, chat_id, person)],
                      per_person=person is not None)

    async def by_model(self, since: float, *, channel: str | None = None, chat_id: str | None = None,
                       person: str | None = None) -> dict[str, UsageTotals]:
        chosen = [r for r in self.records if matches(r, since, channel, chat_id, person)]
        return {model: add_up([r for r in chosen if r.model == model], per_person=person is not None)
                for model in sorted({r.model for r in chosen})}

    async def spend(self, since: float, *, channel: str | None = None, chat_id: str | None = None,
                    person: str | None = None) -> UsageTotals:
        t = await self.totals(since, channel=channel, chat_id=chat_id, person=person)
        return UsageTotals(input_tokens=t.input_tokens, output_tokens=t.output_tokens, cost=t.cost)

    async def grant(self, channel: str, person: str, amount: float, unit: GrantUnit, at: float) -> None:
        self.grants.append((channel, person, amount, unit, at))

    async def granted(self, channel: str, person: str, unit: GrantUnit, since: float) -> float:
        return sum(g[2] for g in self.grants if g[0] == channel and g[1] == person and g[3] == unit
                   and g[4] >= since)
