"""The search index travels in the archive: a snapshot taken before the session logs are read,
brought up to the restored logs' end on restore (only the lines past it are read), and rebuilt
when the source's index cannot be read. Search works in the restored data dir, in its chat only."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import talon.storage.embedded.search as search_module
from talon.cli.reindex import index_embedded
from talon.storage.backup import backup, restore
from tests.support.archives import listing
from talon.storage.embedded.search import INDEX_FILE, SearchIndex
from talon.storage.sessions import ChatKey

pytestmark = pytest.mark.slow  # real archives written and restored


def tree(root: Path) -> tuple[Path, Path]:
    data, media = root / "data", root / "media_root"
    for c, word in ((100, "kettle"), (101, "canary")):
        chat = data / "sessions" / "telegram" / str(c)
        chat.mkdir(parents=True)
        (chat / "CHAT").write_text(f"telegram:{c}")
        write_lines(chat / "main.jsonl", [f"{word} {c} line {i}" for i in range(5)])
    (media / "telegram" / "100").mkdir(parents=True)
    (media / "telegram" / "100" / "AGENTS.md").write_text("memory")
    return data, media


def write_lines(log: Path, texts: list[str]) -> None:
    with open(log, "a") as fh:
        for i, text in enumerate(texts):
            fh.write(json.dumps({"role": "user", "content": [{"type": "text", "text": text}],
                                 "at": 1_700_000_000 + i}) + "\n")


def hits(data_dir: Path, chat: str, words: list[str]) -> list[str]:
    index = SearchIndex(data_dir / INDEX_FILE)
    try:
        return sorted(h.text for h in index.search(ChatKey("telegram", chat), words, 20))
    finally:
        index.close()


def test_the_index_is_archived_and_only_lines_past_it_are_read_on_restore(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    data, media = tree(tmp_path / "src")
    assert index_embedded(data) == (10, 10)  # as a running Talon keeps it
    # Two lines the index has not seen yet (as when a backup snapshots it between an append and
    # its indexing): in the archive's log, so the restore must index them.
    write_lines(data / "sessions" / "telegram" / "100" / "main.jsonl", ["kettle late one", "kettle late two"])
    archive = tmp_path / "a.tar.zst"
    backup(archive, data, media)
    assert "data/search.sqlite3" in listing(archive)

    read: list[int] = []
    real = search_module.read_lines

    def counting(path: Path, start: int = 0) -> Iterator[Any]:
        for item in real(path, start):
            read.append(1)
            yield item

    monkeypatch.setattr(search_module, "read_lines", counting)
    result = restore(archive, tmp_path / "r" / "data")
    assert len(read) == 2  # not the ten lines the snapshot covers
    assert result.indexed == 12
    found = hits(result.data_dir, "100", ["kettle"])
    assert len(found) == 7 and "kettle late two" in found and "kettle 100 line 0" in found
    assert hits(result.data_dir, "101", ["canary"]) == [f"canary 101 line {i}" for i in range(5)]
    assert hits(result.data_dir, "100", ["canary"]) == []  # another chat's line, never found here
    assert hits(result.data_dir, "101", ["kettle"]) == []


def test_an_unreadable_index_is_left_out_and_the_restore_builds_it(tmp_path: Path) -> None:
    data, media = tree(tmp_path / "src")
    (data / INDEX_FILE).write_bytes(b"not a database at all" * 100)
    archive = tmp_path / "a.tar.zst"
    backup(archive, data, media)
    assert not any(n.startswith("data/search.sqlite3") for n in listing(archive))
    result = restore(archive, tmp_path / "r" / "data")
    assert result.indexed == 10
    assert hits(result.data_dir, "100", ["kettle", "4"]) == ["kettle 100 line 4"]


def test_an_archive_without_an_index_restores_a_whole_one(tmp_path: Path) -> None:
    data, media = tree(tmp_path / "src")  # no index kept (TALON_SEARCH_INDEX off, or an older archive)
    archive = tmp_path / "a.tar.gz"
    backup(archive, data, media)
    result = restore(archive, tmp_path / "r" / "data")
    assert result.indexed == 10
    assert hits(result.data_dir, "101", ["canary", "3"]) == ["canary 101 line 3"]
