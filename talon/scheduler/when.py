"""When a task runs: reading ``when``, the next run after a moment, and times as a person reads them.

Plain functions of their arguments (the clock is passed in as ``now``), so every rule is tested
with fixed times. What ``when`` may be:

- an ISO 8601 date-time, best with its offset (``2026-12-02T08:00:00+01:00``); without one it is
  read in the task's time zone;
- a duration from now: ISO 8601 (``PT90S``, ``P1D``) or words (``in 2 hours``, ``in 1 hour 30 minutes``);
- a repeat: ``every <duration>`` (``every 2 hours``, ``every PT30M``) or a five-field cron
  expression (``0 8 * * 1-5``).

Cron expressions are read on the wall clock of the task's zone (``croniter`` walks the naive local
time; ``zoneinfo`` turns each step into an instant), so ``0 8 * * *`` stays at 08:00 across
daylight-saving changes. A local time the clock skips (spring forward) runs at the same wall time
after the jump, an hour later; a local time that happens twice (fall back) runs once, the first time.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import isodate
from croniter import croniter

from talon.errors import ScheduleError

ONCE, EVERY, CRON = "once", "every", "cron"
UTC = ZoneInfo("UTC")

_UNITS = {
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
    "w": 604800, "week": 604800, "weeks": 604800,
}
_AMOUNT = re.compile(r"(\d+(?:\.\d+)?|an?)\s*([a-z]+)")
_HELP = ("give an ISO 8601 date-time with its offset (2026-12-02T08:00:00+01:00), a duration from now "
         "(PT90S, in 2 hours), 'every <duration>' for a repeat (every 2 hours), or a five-field cron "
         "expression (0 8 * * 1-5)")


@dataclass(frozen=True)
class Schedule:
    kind: str  # ONCE, EVERY or CRON
    spec: str  # "" for ONCE, the interval in seconds for EVERY, the expression for CRON
    first: float  # when it runs first (epoch seconds)


def zone_named(name: str) -> ZoneInfo:
    """The IANA zone ``name`` (``Europe/Berlin``); ScheduleError when there is no such zone."""
    name = name.strip()
    if not name or name.startswith(("/", ".")) or ".." in name:
        raise ScheduleError(f"{name!r} is not a time zone: give an IANA name such as Europe/Berlin")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(f"unknown time zone {name!r}: give an IANA name such as Europe/Berlin, "
                            "America/New_York or UTC") from None


def _word_seconds(text: str) -> float | None:
    """``2 hours 30 minutes`` (or ``an hour``) in seconds; None when it is not such a phrase."""
    text = text.replace(",", " ").replace(" and ", " ").strip()
    pos, total, found = 0, 0.0, False
    for match in _AMOUNT.finditer(text):
        if text[pos:match.start()].strip():
            return None
        amount, unit = match.groups()
        if unit not in _UNITS:
            return None
        total += (1.0 if amount in ("a", "an") else float(amount)) * _UNITS[unit]
        pos, found = match.end(), True
    return total if found and not text[pos:].strip() else None


def _duration_seconds(text: str, *, what: str) -> float:
    """A duration in ISO 8601 (PT90S) or words (90 seconds), in seconds; months and years only
    where a calendar is not needed (never: they are refused, use a date or cron instead)."""
    text = text.strip()
    if text.upper().startswith("P"):
        try:
            parsed = isodate.parse_duration(text.upper())
        except (isodate.ISO8601Error, ValueError):
            raise ScheduleError(f"{what} {text!r} is not an ISO 8601 duration such as PT90S or P1D") from None
        if not isinstance(parsed, timedelta):
            raise ScheduleError(f"{what} {text!r} counts months or years, whose length varies: give a date "
                                "or a cron expression instead")
        seconds = parsed.total_seconds()
    else:
        words = _word_seconds(text.lower())
        if words is None:
            raise ScheduleError(f"could not read {what} {text!r}: {_HELP}")
        seconds = words
    if not math.isfinite(seconds) or seconds <= 0:
        raise ScheduleError(f"{what} {text!r} is not a positive duration")
    return seconds


def _is_cron(text: str) -> bool:
    fields = text.split()
    return len(fields) == 5 and not any(f.upper().startswith("P") for f in fields)


def parse_when(when: str, zone: ZoneInfo, now: float, *, min_interval_s: float) -> Schedule:
    """Read ``when`` for a task in ``zone`` at ``now``; ScheduleError says what is wrong with it."""
    text = " ".join(when.split())
    lowered = text.lower()
    if not text:
        raise ScheduleError(f"when is empty: {_HELP}")
    if lowered.startswith("every ") or lowered.startswith("r/"):
        interval = _duration_seconds(text.split(" ", 1)[1] if lowered.startswith("every ") else text[2:],
                                     what="the repeat interval")
        check_interval(interval, min_interval_s)
        return Schedule(EVERY, format_seconds_spec(interval), now + interval)
    if lowered.startswith("in "):
        return Schedule(ONCE, "", now + _duration_seconds(text[3:], what="the delay"))
    if lowered.startswith("p"):
        return Schedule(ONCE, "", now + _duration_seconds(text, what="the delay"))
    if _is_cron(text):
        if not croniter.is_valid(text):
            raise ScheduleError(f"{text!r} is not a valid five-field cron expression "
                                "(minute hour day-of-month month day-of-week, e.g. 0 8 * * 1-5)")
        runs = upcoming(CRON, text, zone, now, 24)
        gaps = [b - a for a, b in zip(runs, runs[1:])]
        if gaps:
            check_interval(min(gaps), min_interval_s)
        return Schedule(CRON, text, runs[0])
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ScheduleError(f"could not read when={text!r}: {_HELP}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=zone)
    at = moment.timestamp()
    if at <= now:
        raise ScheduleError(f"{text} has already passed (it is now {local_time(now, zone)}): give a time "
                            "in the future")
    return Schedule(ONCE, "", at)


def check_interval(seconds: float, min_interval_s: float) -> None:
    if seconds < min_interval_s:
        raise ScheduleError(f"that repeats every {format_seconds(seconds)}, more often than the limit of once "
                            f"every {format_seconds(min_interval_s)} (TALON_TASK_MIN_INTERVAL)")


def format_seconds_spec(seconds: float) -> str:
    return f"{seconds:g}" if seconds != int(seconds) else str(int(seconds))


def next_run(kind: str, spec: str, zone: ZoneInfo, after: float) -> float | None:
    """The first run strictly after ``after``; None for a task that runs once."""
    if kind == ONCE:
        return None
    return upcoming(kind, spec, zone, after, 1)[0]


def next_run_from(kind: str, spec: str, zone: ZoneInfo, due: float, now: float) -> float | None:
    """The run after the one due at ``due``, never at or before ``now``: a repeating task that
    was held up (Talon down, a slow poll) goes on from now, with no backlog of missed runs.
    ``every`` keeps its rhythm (due + k * interval)."""
    if kind == ONCE:
        return None
    if kind == EVERY:
        interval = float(spec)
        steps = max(1, math.floor((now - due) / interval) + 1)
        return due + steps * interval
    return next_run(kind, spec, zone, max(due, now))


def upcoming(kind: str, spec: str, zone: ZoneInfo, after: float, count: int) -> list[float]:
    """The next ``count`` runs strictly after ``after`` (epoch seconds)."""
    if kind == EVERY:
        interval = float(spec)
        return [after + interval * (i + 1) for i in range(count)]
    if kind != CRON:
        return []
    wall = datetime.fromtimestamp(after, zone).replace(tzinfo=None)
    steps = croniter(spec, wall)
    runs: list[float] = []
    last = after
    # A skipped wall time (spring forward) maps onto the instant of the next wall time; steps that
    # land at or before the last run are passed over, so no run is ever doubled.
    for _ in range(count * 4 + 8):
        at = steps.get_next(datetime).replace(tzinfo=zone).timestamp()
        if at > last:
            runs.append(at)
            last = at
            if len(runs) == count:
                break
    return runs


def local_time(ts: float, zone: ZoneInfo) -> str:
    """``Tue 02 Dec 2026 08:00 CET``: how times are shown to the person."""
    return datetime.fromtimestamp(ts, zone).strftime("%a %d %b %Y %H:%M %Z")


def iso_local(ts: float, zone: ZoneInfo) -> str:
    return datetime.fromtimestamp(ts, zone).isoformat(timespec="seconds")


def format_seconds(seconds: float) -> str:
    """90 -> ``1 min 30 s``; 7200 -> ``2 h``."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if seconds >= size:
            amount, seconds = divmod(seconds, size)
            parts.append(f"{amount} {unit}")
    return " ".join(parts)


def describe(kind: str, spec: str) -> str:
    if kind == EVERY:
        return f"every {format_seconds(float(spec))}"
    if kind == CRON:
        return f"cron {spec}"
    return "once"


