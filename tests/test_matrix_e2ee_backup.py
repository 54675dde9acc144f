"""The Matrix device's key store (``channels/matrix/crypto.py``) is in ``talon backup``: every file
of ``TALON_DATA_DIR/matrix/e2ee-*/`` is archived, and a restore brings it back private (0600)."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

from channels.matrix.crypto import store_dir
from talon.storage.backup import backup, restore
from tests.support.archives import listing


def test_the_key_store_is_archived_and_restored_private(tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = store_dir(data, "https://matrix.example.org", "@talon:example.org")
    store.mkdir(parents=True)
    db = sqlite3.connect(str(store / "olm-DEVICE.db"))
    db.execute("CREATE TABLE accounts (pickle TEXT)")
    db.execute("INSERT INTO accounts VALUES ('the device keys')")
    db.commit()
    db.close()
    (store / "pickle.key").write_text("k" * 43)
    (store / "device_id").write_text("DEVICE")
    backup(tmp_path / "a.tar.gz", data, tmp_path / "media_root")
    rel = store.relative_to(data).as_posix()
    assert {f"data/{rel}/olm-DEVICE.db", f"data/{rel}/pickle.key", f"data/{rel}/device_id"} <= set(listing(tmp_path / "a.tar.gz"))
    back = tmp_path / "restored"
    restore(tmp_path / "a.tar.gz", back)
    again = back / rel
    assert sqlite3.connect(str(again / "olm-DEVICE.db")).execute("SELECT pickle FROM accounts").fetchall() == [
        ("the device keys",)]
    for name in ("olm-DEVICE.db", "pickle.key"):
        assert stat.S_IMODE(os.stat(again / name).st_mode) == 0o600
