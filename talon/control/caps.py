"""Caps on model use, checked before every model call against the usage store.

A limit is ``<N> tokens/day``, ``<N> tokens/month``, ``$<amount>/day`` or ``$<amount>/month``
(``k`` and ``M`` suffixes are taken for tokens: ``200k tokens/day``); a setting may hold several,
comma-separated. Days and months begin at midnight in ``TALON_TIMEZONE``. Tokens are input plus
output tokens as the provider reported them (or as Talon estimated them when it reported none: a
call stopped midway, a server that never reports usage); an amount counts the estimated cost of
priced calls.

Three scopes: per person (``TALON_LIMIT_PER_PERSON``, lifted by ``talon usage --grant``), per
conversation (``TALON_LIMIT_PER_CHAT``) and for the whole bot (``TALON_LIMIT_TOTAL``). The sums
come from the store on every check, so every worker holds the same line.

Within one worker, calls in flight count too (``holds``): each call reserves an estimate of its
cost before it is made (the request's tokens and its whole output allowance) and settles it with
the real figure after. A call that would pass a cap only because of calls still in flight waits
for them instead of being refused; so concurrent turns of one person pass a cap by at most one
call's worth. Workers do not see each other's calls in flight, only the store.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal
from zoneinfo import ZoneInfo

from talon.control.prices import PriceTable
from talon.errors import CapReached, ConfigError
from talon.storage.usage import GrantUnit, UsageStore, UsageTotals

if TYPE_CHECKING:
    from talon.config import Settings

Period = Literal["day", "month"]
Scope = Literal["person", "chat", "total"]

_LIMIT = re.compile(r"^\s*(?:(?P<usd>\$\s*\d+(?:\.\d+)?)|(?P<tokens>\d+(?:\.\d+)?\s*[kKmM]?)\s*tokens?)\s*/\s*"
                    r"(?P<period>day|month)\s*$")


@dataclass(frozen=True)
class Limit:
    amount: float
    unit: GrantUnit  # tokens or usd
    period: Period

    def describe(self) -> str:
        amount = f"${self.amount:,.2f}".replace(".00", "") if self.unit == "usd" else f"{int(self.amount):,} tokens"
        return f"{amount} per {self.period}"

    def used(self, totals: UsageTotals) -> float:
        return float(totals.tokens) if self.unit == "tokens" else totals.cost


def parse_limits(value: str, setting: str) -> list[Limit]:
    limits = []
    for entry in (part.strip() for part in value.split(",")):
        if not entry:
            continue
        match = _LIMIT.match(entry)
        if match is None:
            raise ConfigError(f"{setting}: {entry!r} is not a limit (write e.g. 200000 tokens/day, $2/day or "
                              "$20/month)", [setting])
        period: Period = "day" if match["period"] == "day" else "month"
        if match["usd"]:
            limits.append(Limit(float(match["usd"].lstrip("$").strip()), "usd", period))
        else:
            raw = match["tokens"].strip()
            scale = {"k": 1_000, "m": 1_000_000}.get(raw[-1].lower(), 1)
            number = float(raw[:-1] if scale != 1 else raw)
            limits.append(Limit(number * scale, "tokens", period))
    return limits


def caps_from_settings(settings: "Settings", usage: UsageStore) -> Caps:
    """The caps that ``talon run`` enforces, or the ``ConfigError`` it refuses to start with: a
    limit that does not parse, or an amount of money for a model with no known price. ``talon
    doctor`` asks the same (with no model configured, its own line says so first)."""
    caps = Caps(usage, parse_limits(settings.limit_per_person, "TALON_LIMIT_PER_PERSON"),
                parse_limits(settings.limit_per_chat, "TALON_LIMIT_PER_CHAT"),
                parse_limits(settings.limit_total, "TALON_LIMIT_TOTAL"), settings.zone)
    if caps.priced and settings.model and PriceTable.from_settings(settings).price(settings.model_name) is None:
        named = [n for n, v in (("TALON_LIMIT_PER_PERSON", caps.person), ("TALON_LIMIT_PER_CHAT", caps.chat),
                                ("TALON_LIMIT_TOTAL", caps.total)) if any(lim.unit == "usd" for lim in v)]
        raise ConfigError(f"{', '.join(named)} sets an amount of money, but the model {settings.model_name!r} "
                          "has no known price: set it in TALON_PRICES (model=input/output per million "
                          "tokens) or limit tokens instead", [*named, "TALON_PRICES"])
    return caps


def period_bounds(period: Period, now: float, zone: ZoneInfo) -> tuple[float, dt.datetime]:
    """When the current period began (Unix time) and when the next begins (local time)."""
    local = dt.datetime.fromtimestamp(now, zone)
    if period == "day":
        start = local.replace(hour=0, minute=0, second=0, microsecond=0)
        end = (start + dt.timedelta(days=1)).replace(tzinfo=None)
    else:
        start = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        end = (start.replace(year=start.year + 1, month=1) if start.month == 12
               else start.replace(month=start.month + 1)).replace(tzinfo=None)
    # Midnight after a daylight-saving change: build the wall-clock time, then attach the zone.
    start_local = start.replace(tzinfo=None).replace(tzinfo=zone)
    return start_local.timestamp(), end.replace(tzinfo=zone)


def reset_words(period: Period, reset: dt.datetime, zone: ZoneInfo) -> str:
    if period == "day":
        return f"it resets at {reset:%H:%M} {zone.key}"
    return f"it resets on {reset.day} {reset:%B} at {reset:%H:%M} {zone.key}"


@dataclass(eq=False)
class Hold:
    """A call of this worker that the store does not show yet: reserved before it is made (an
    estimate), then settled with what it cost until its usage record is written."""

    channel: str
    chat_id: str
    person: str
    tokens: float
    cost: float
    settled: bool = False

    def amount(self, unit: GrantUnit) -> float:
        return self.tokens if unit == "tokens" else self.cost


def _in_scope(hold: Hold, scope: Scope, channel: str, chat_id: str, person: str) -> bool:
    if scope == "person":
        return hold.channel == channel and hold.person == person
    if scope == "chat":
        return hold.channel == channel and hold.chat_id == chat_id
    return True


@dataclass
class Caps:
    usage: UsageStore
    person: list[Limit]
    chat: list[Limit]
    total: list[Limit]
    zone: ZoneInfo
    clock: Callable[[], float] = time.time

    @property
    def any(self) -> bool:
        return bool(self.person or self.chat or self.total)

    @property
    def priced(self) -> bool:
        """Whether any limit is an amount of money (and so needs a price for the model)."""
        return any(limit.unit == "usd" for limit in (*self.person, *self.chat, *self.total))

    holds: list[Hold] = field(default_factory=list)  # this worker's calls not in the store yet

    async def check(self, channel: str, chat_id: str, person: str,
                    scopes: tuple[Scope, ...] = ("person", "chat", "total")) -> bool:
        """Raise ``CapReached`` with the line for the person when a cap is reached (the store's
        sums and this worker's finished calls not written yet). True when a cap would be reached
        only counting the calls still in flight here: wait for them, then check again."""
        now = self.clock()
        held = list(self.holds)  # before the store is read: a call that settles meanwhile is seen once at least
        wait = False
        lists: dict[Scope, list[Limit]] = {"person": self.person, "chat": self.chat, "total": self.total}
        for scope in scopes:
            if scope == "person" and not person:
                continue
            mine = [h for h in held if _in_scope(h, scope, channel, chat_id, person)]
            for limit in lists[scope]:
                since, reset = period_bounds(limit.period, now, self.zone)
                if scope == "person":
                    totals = await self.usage.spend(since, channel=channel, person=person)
                    allowed = limit.amount + await self.usage.granted(channel, person, limit.unit, since)
                elif scope == "chat":
                    totals = await self.usage.spend(since, channel=channel, chat_id=chat_id)
                    allowed = limit.amount
                else:
                    totals = await self.usage.spend(since)
                    allowed = limit.amount
                used = limit.used(totals) + sum(h.amount(limit.unit) for h in mine if h.settled)
                if used >= allowed:
                    raise CapReached(_line(scope, limit, reset_words(limit.period, reset, self.zone)), scope)
                if used + sum(h.amount(limit.unit) for h in mine if not h.settled) >= allowed:
                    wait = True
        return wait


def _line(scope: Scope, limit: Limit, resets: str) -> str:
    when = "today" if limit.period == "day" else "this month"
    who = {"person": "You have", "chat": "This chat has", "total": "This bot has"}[scope]
    return f"{who} reached the limit of {limit.describe()} for {when}, so I did not ask the model; {resets}."


def parse_grant(value: str) -> tuple[float, GrantUnit]:
    """``talon usage --grant``'s amount: ``50000`` or ``50k`` (tokens) or ``$5`` (dollars)."""
    text = value.strip().lower().removesuffix("tokens").strip()
    try:
        if text.startswith("$"):
            amount, unit = float(text[1:]), "usd"
        else:
            scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
            amount, unit = float(text[:-1] if scale != 1 else text) * scale, "tokens"
    except ValueError:
        raise ConfigError(f"--grant: {value!r} is not an amount (write e.g. 50000 or 50k for tokens, $5 for "
                          "dollars)", []) from None
    if amount <= 0:
        raise ConfigError(f"--grant: {value!r} must be more than zero", [])
    return amount, unit  # type: ignore[return-value]
