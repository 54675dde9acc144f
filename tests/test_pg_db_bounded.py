"""``AsyncDatabase.bounded``: a call refused before it starts leaves nothing half-made.

The stores hand ``bounded`` a coroutine they built (``go()``); while the monitor has marked the
database down, the call is refused at once. The coroutine was then dropped unstarted, and Python
reported it as "never awaited" (a RuntimeWarning in every store-outage run). No server is needed:
the pool is never opened.
"""

from __future__ import annotations

import inspect
import warnings

import pytest

from talon.errors import StoreUnavailable
from talon.storage.postgres.db import AsyncDatabase


def database() -> AsyncDatabase:
    return AsyncDatabase("postgresql://talon@127.0.0.1:9/talon")  # never opened: no connection is made


async def test_a_call_refused_while_the_database_is_down_closes_its_work_unstarted() -> None:
    db = database()
    db.problem = "no answer to SELECT 1 within 2s"
    ran: list[str] = []

    async def go() -> int:
        ran.append("ran")
        return 1

    work = go()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a "never awaited" RuntimeWarning would fail the test
        with pytest.raises(StoreUnavailable, match=r"the database is unavailable \(no answer to SELECT 1"):
            await db.bounded(work)
    assert ran == [] and inspect.getcoroutinestate(work) == inspect.CORO_CLOSED


async def test_a_call_while_the_database_answers_runs_its_work() -> None:
    db = database()

    async def go() -> int:
        return 7

    assert await db.bounded(go()) == 7
