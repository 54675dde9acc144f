"""The background jobs' stores (talon.storage.jobs): the same answers from the dict, SQLite and
PostgreSQL (a real server, tests/pg.py): the per-chat limit, scoping to the chat, guarded updates."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from talon.storage.embedded.jobs import SqliteJobs
from talon.storage.jobs import CANCELLED, DONE, QUEUED, RUNNING, UNFINISHED, Job, JobStore, MemoryJobs


def job(id_: str, conversation: str = "111", channel: str = "telegram", at: float = 1.0) -> Job:
    return Job(id=id_, channel=channel, conversation=conversation, owner_id="111", task=f"task {id_}",
               tools='["read_file"]', status=QUEUED, created=at, updated=at)


@pytest_asyncio.fixture(params=["memory", "sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[JobStore]:
    if request.param == "memory":
        yield MemoryJobs()
        return
    if request.param == "sqlite":
        jobs = SqliteJobs(tmp_path / "jobs.sqlite3")
        yield jobs
        await jobs.close()
        return
    from talon.storage.postgres.db import AsyncDatabase
    from talon.storage.postgres.jobs import PgJobs
    from talon.storage.postgres.schema import migrate_schema

    db = AsyncDatabase(request.getfixturevalue("pg_url"))
    await db.open()
    await migrate_schema(db)
    yield PgJobs(db)
    await db.close()


async def test_a_chat_holds_at_most_its_limit_of_unfinished_jobs(store: JobStore) -> None:
    assert await store.add(job("a1"), max_unfinished=2)
    assert await store.add(job("a2", at=2.0), max_unfinished=2)
    assert not await store.add(job("a3", at=3.0), max_unfinished=2)
    assert await store.add(job("b1", conversation="222"), max_unfinished=2)  # another chat has its own count
    await store.update("telegram", "111", "a1", status=DONE, result="42", now=5.0, only_from=UNFINISHED)
    assert await store.add(job("a3", at=3.0), max_unfinished=2)  # a finished one no longer counts
    assert [j.id for j in await store.for_chat("telegram", "111")] == ["a1", "a2", "a3"]


async def test_two_adds_at_once_cannot_both_pass_the_limit(store: JobStore) -> None:
    results = await asyncio.gather(*(store.add(job(f"x{i}", at=float(i)), max_unfinished=1) for i in range(6)))
    assert sorted(results) == [False] * 5 + [True]


async def test_every_read_and_write_is_scoped_to_the_chat(store: JobStore) -> None:
    await store.add(job("a1"), max_unfinished=3)
    assert (await store.get("telegram", "111", "a1")) is not None
    # Another conversation, another channel, a topic of the same chat: not found, not changed.
    for channel, conversation in (("telegram", "222"), ("whatsapp", "111"), ("telegram", "111:7")):
        assert await store.get(channel, conversation, "a1") is None
        assert await store.for_chat(channel, conversation) == []
        assert await store.update(channel, conversation, "a1", status=CANCELLED, now=9.0) is None
    assert (await store.get("telegram", "111", "a1")).status == QUEUED  # type: ignore[union-attr]


async def test_updates_keep_what_they_do_not_name_and_honour_only_from(store: JobStore) -> None:
    await store.add(job("a1"), max_unfinished=3)
    running = await store.update("telegram", "111", "a1", status=RUNNING, now=2.0, only_from=(QUEUED,))
    assert running is not None and running.status == RUNNING and running.updated == 2.0 and running.result == ""
    assert await store.update("telegram", "111", "a1", status=RUNNING, now=3.0, only_from=(QUEUED,)) is None
    done = await store.update("telegram", "111", "a1", status=DONE, result="the answer", now=4.0,
                              only_from=(RUNNING,))
    assert done is not None and (done.status, done.result, done.delivered) == (DONE, "the answer", False)
    delivered = await store.update("telegram", "111", "a1", delivered=True, now=5.0)
    assert delivered is not None and delivered.delivered and delivered.result == "the answer"
    assert delivered.tools == '["read_file"]' and delivered.task == "task a1"
    # A job cancelled meanwhile is not made done.
    await store.add(job("a2"), max_unfinished=3)
    await store.update("telegram", "111", "a2", status=CANCELLED, now=6.0, only_from=UNFINISHED)
    assert await store.update("telegram", "111", "a2", status=DONE, result="x", now=7.0,
                              only_from=(RUNNING,)) is None
