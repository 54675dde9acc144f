"""The session store's incremental loading agrees with a full re-read in every case."""

from __future__ import annotations

from pathlib import Path

from talon.storage.embedded.sessions import JsonlSessions
from talon.storage.sessions import ChatKey
from talon.content import Message

CHAT = ChatKey("telegram", "1")


async def test_incremental_load_matches_a_fresh_store(tmp_path: Path) -> None:
    store = JsonlSessions(tmp_path)
    await store.append(CHAT, Message.user("one"))
    assert [m.text for m in await store.load(CHAT)] == ["one"]
    await store.append(CHAT, Message.user("two"), Message.user("three"))
    assert [m.text for m in await store.load(CHAT)] == ["one", "two", "three"]
    with open(store.thread_path(CHAT), "a") as fh:
        fh.write('{"role": "user", "content": [{"type": "te')  # torn by a crash
    assert [m.text for m in await store.load(CHAT)] == ["one", "two", "three"]
    await store.append(CHAT, Message.user("four"))
    cached = [m.text for m in await store.load(CHAT)]
    assert cached == [m.text for m in await JsonlSessions(tmp_path).load(CHAT)] == ["one", "two", "three", "four"]
    # A replaced file (new inode, shorter) is read from the start again.
    path = store.thread_path(CHAT)
    replacement = path.with_suffix(".new")
    replacement.write_text(Message.user("fresh").to_json() + "\n")
    replacement.replace(path)
    assert [m.text for m in await store.load(CHAT)] == ["fresh"]
    # Loads hand out new lists: appending to one does not change the store.
    (await store.load(CHAT)).append(Message.user("stray"))
    assert [m.text for m in await store.load(CHAT)] == ["fresh"]
