"""`talon migrate` carries WhatsApp's state from the embedded store to PostgreSQL: windows, the
messages waiting for them (in order, once, also when run again), receipts and button tokens."""

from __future__ import annotations

from pathlib import Path

from talon.storage.embedded.whatsapp import SqliteWhatsAppStore
from talon.storage.migrate import migrate_embedded
from talon.storage.postgres.db import AsyncDatabase
from talon.storage.postgres.whatsapp import PgWhatsAppStore
from talon.storage.whatsapp import ButtonToken


async def test_waiting_messages_and_windows_move_to_postgres_in_order_once(tmp_path: Path, pg_url: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    local = SqliteWhatsAppStore(data / "whatsapp.sqlite3")
    await local.seen("+1555", 1000.0)
    await local.refused("+1555", 1100.0)
    await local.add_pending("+1555", ["p1", "p2", "p3"], 1200.0)
    await local.add_pending("+1666", ["q1"], 1300.0)
    await local.record_sent("SM" + "a" * 32, "+1555", "answer", "x", 1000.0)
    await local.record_status("SM" + "a" * 32, "undelivered", 30008, "unknown", 1001.0)
    await local.add_tokens([ButtonToken("tok" * 8, "approve", "ap", "d", "+1555", 9e9)])
    await local.close()
    db = AsyncDatabase(pg_url, max_size=2)
    await db.open()
    try:
        first = await migrate_embedded(data, db)
        again = await migrate_embedded(data, db)
        pg = PgWhatsAppStore(db)
        assert [p.payload for p in await pg.pending("+1555")] == ["p1", "p2", "p3"]
        assert [p.payload for p in await pg.pending("+1666")] == ["q1"]
        assert await pg.last_inbound("+1555") == 1000.0 and await pg.last_refused("+1555") == 1100.0
        failure = await pg.last_failure("+1555")
        assert failure is not None and failure.error_code == 30008
        assert (await pg.take_token("tok" * 8, "+1555", 1.0)) is not None
    finally:
        await db.close()
    [report] = [r for r in first.stores if r.name.startswith("whatsapp")]
    assert first.ok and report.found == report.verified == 7 and report.copied == 7  # 1 window, 4 parts, 1 receipt, 1 token
    [report] = [r for r in again.stores if r.name.startswith("whatsapp")]
    assert again.ok and report.copied == 0
