"""The PostgreSQL schema: numbered scripts, applied in order by ``migrate_schema`` (at start).

A store that needs a table appends ONE script at the end; a script, once released, never changes
(a deployed database has run it). Each runs in the migration's transaction.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from talon.errors import ConfigError

if TYPE_CHECKING:
    from talon.storage.postgres.db import AsyncDatabase

log = logging.getLogger(__name__)

MIGRATIONS: tuple[str, ...] = (
    # 1: the stores of one deployment.
    """
    CREATE TABLE talon_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE talon_inbox (
        seq BIGSERIAL PRIMARY KEY,
        key TEXT UNIQUE NOT NULL,
        channel TEXT NOT NULL,
        chat_id TEXT NOT NULL,
        payload TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'pending',
        attempts INTEGER NOT NULL DEFAULT 0,
        delivered_parts INTEGER NOT NULL DEFAULT 0,
        created DOUBLE PRECISION NOT NULL,
        finished DOUBLE PRECISION
    );
    CREATE INDEX talon_inbox_chat_pending ON talon_inbox (channel, chat_id, seq) WHERE status = 'pending';
    CREATE TABLE talon_threads (
        channel TEXT NOT NULL, chat_id TEXT NOT NULL, current TEXT NOT NULL,
        PRIMARY KEY (channel, chat_id)
    );
    CREATE TABLE talon_session_lines (
        channel TEXT NOT NULL, chat_id TEXT NOT NULL, thread TEXT NOT NULL,
        n INTEGER NOT NULL, body TEXT NOT NULL,
        PRIMARY KEY (channel, chat_id, thread, n)
    );
    CREATE TABLE talon_pairing_pending (
        channel TEXT NOT NULL, sender_id TEXT NOT NULL, name TEXT NOT NULL,
        code TEXT UNIQUE NOT NULL, created DOUBLE PRECISION NOT NULL, id BIGSERIAL,
        PRIMARY KEY (channel, sender_id)
    );
    CREATE TABLE talon_pairing_replied (
        channel TEXT NOT NULL, sender_id TEXT NOT NULL, at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (channel, sender_id)
    );
    CREATE TABLE talon_approved (
        channel TEXT NOT NULL, sender_id TEXT NOT NULL, name TEXT NOT NULL,
        approved_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (channel, sender_id)
    );
    CREATE TABLE talon_attachments (
        sha256 TEXT PRIMARY KEY, size BIGINT NOT NULL, chunks INTEGER NOT NULL
    );
    CREATE TABLE talon_attachment_chunks (
        sha256 TEXT NOT NULL REFERENCES talon_attachments (sha256) ON DELETE CASCADE,
        n INTEGER NOT NULL, data BYTEA NOT NULL,
        PRIMARY KEY (sha256, n)
    );
    CREATE TABLE talon_media_links (
        token TEXT PRIMARY KEY, name TEXT NOT NULL, mime TEXT NOT NULL,
        expires TIMESTAMPTZ NOT NULL, path TEXT, inode BIGINT, size BIGINT, mtime_ns BIGINT,
        sha256 TEXT, fetched BOOLEAN NOT NULL DEFAULT FALSE
    );
    """,
    # 2: leases (a chat's turn, the Telegram polling leader), renewed by their holder.
    """
    CREATE TABLE talon_leases (
        name TEXT PRIMARY KEY, holder TEXT NOT NULL, expires TIMESTAMPTZ NOT NULL
    );
    CREATE INDEX talon_leases_holder ON talon_leases (holder);
    """,
    # 3: the workspace a media link's file was checked against (per-chat workspaces), relative to
    # the media root; NULL for the media root itself.
    """
    ALTER TABLE talon_media_links ADD COLUMN root TEXT;
    """,
    # 4: the platform message that shows an answer while it is written (live replies), so the
    # final reply edits it, on whichever worker finishes the turn.
    """
    ALTER TABLE talon_inbox ADD COLUMN live_message_id TEXT;
    """,
    # 5: scheduled tasks (talon.storage.tasks), their runs, and each chat's time zone.
    """
    CREATE TABLE talon_tasks (
        id TEXT PRIMARY KEY, channel TEXT NOT NULL, chat_id TEXT NOT NULL, thread_id TEXT,
        owner_id TEXT NOT NULL, text TEXT NOT NULL, kind TEXT NOT NULL, spec TEXT NOT NULL,
        timezone TEXT NOT NULL, next_run DOUBLE PRECISION, status TEXT NOT NULL,
        created DOUBLE PRECISION NOT NULL, origin TEXT NOT NULL, version INTEGER NOT NULL,
        failures INTEGER NOT NULL, last_due DOUBLE PRECISION, last_status TEXT NOT NULL,
        last_reason TEXT NOT NULL
    );
    CREATE INDEX talon_tasks_due ON talon_tasks (next_run) WHERE status = 'active';
    CREATE INDEX talon_tasks_chat ON talon_tasks (channel, chat_id);
    CREATE TABLE talon_task_runs (
        task_id TEXT NOT NULL, due_ms BIGINT NOT NULL, due DOUBLE PRECISION NOT NULL,
        status TEXT NOT NULL, reason TEXT NOT NULL, updated DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (task_id, due_ms)
    );
    CREATE INDEX talon_task_runs_claimed ON talon_task_runs (updated) WHERE status = 'claimed';
    CREATE TABLE talon_chat_zones (
        channel TEXT NOT NULL, chat_id TEXT NOT NULL, zone TEXT NOT NULL,
        PRIMARY KEY (channel, chat_id)
    );
    """,
    # 6: control: model usage per call, allowances granted over caps, approvals and their decisions.
    """
    CREATE TABLE talon_usage (
        id BIGSERIAL PRIMARY KEY, at DOUBLE PRECISION NOT NULL, channel TEXT NOT NULL,
        chat_id TEXT NOT NULL, person TEXT NOT NULL, model TEXT NOT NULL, purpose TEXT NOT NULL,
        input_tokens BIGINT NOT NULL, output_tokens BIGINT NOT NULL, cached_tokens BIGINT NOT NULL,
        cost DOUBLE PRECISION
    );
    CREATE INDEX talon_usage_at ON talon_usage (at);
    CREATE INDEX talon_usage_person ON talon_usage (channel, person, at);
    CREATE INDEX talon_usage_chat ON talon_usage (channel, chat_id, at);
    CREATE TABLE talon_usage_grants (
        id BIGSERIAL PRIMARY KEY, channel TEXT NOT NULL, person TEXT NOT NULL, unit TEXT NOT NULL,
        amount DOUBLE PRECISION NOT NULL, at DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE talon_approvals (
        id TEXT PRIMARY KEY, channel TEXT NOT NULL, chat_id TEXT NOT NULL, platform_chat TEXT NOT NULL,
        thread_id TEXT, requester TEXT NOT NULL, turn_id TEXT NOT NULL, call_id TEXT NOT NULL,
        tool TEXT NOT NULL, kind TEXT NOT NULL, summary TEXT NOT NULL, created DOUBLE PRECISION NOT NULL,
        expires DOUBLE PRECISION NOT NULL, status TEXT NOT NULL, decided_by TEXT NOT NULL,
        decided_at DOUBLE PRECISION, prompt_id TEXT, UNIQUE (turn_id, call_id)
    );
    CREATE INDEX talon_approvals_pending ON talon_approvals (channel, chat_id) WHERE status = 'pending';
    CREATE TABLE talon_approval_always (
        channel TEXT NOT NULL, chat_id TEXT NOT NULL, tool TEXT NOT NULL, decided_by TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL, PRIMARY KEY (channel, chat_id, tool)
    );
    """,
    # 7: an approval is for one exact call: the digest of its tool and arguments is part of its key
    # (a call id used again with other arguments is asked about anew), and whether it was asked in
    # a group (who may grant "always in this chat").
    """
    ALTER TABLE talon_approvals ADD COLUMN digest TEXT NOT NULL DEFAULT '',
        ADD COLUMN in_group BOOLEAN NOT NULL DEFAULT FALSE;
    ALTER TABLE talon_approvals DROP CONSTRAINT talon_approvals_turn_id_call_id_key;
    ALTER TABLE talon_approvals ADD CONSTRAINT talon_approvals_turn_call_digest UNIQUE (turn_id, call_id, digest);
    """,
    # 8: usage Talon estimated (the provider reported none), and the further shares of a shared call.
    """
    ALTER TABLE talon_usage ADD COLUMN estimated BOOLEAN NOT NULL DEFAULT false;
    ALTER TABLE talon_usage ADD COLUMN extra_share BOOLEAN NOT NULL DEFAULT false;
    """,
    # 9: WhatsApp's 24-hour window, the messages waiting for it, delivery receipts and one-time
    # approval-button tokens (talon.storage.whatsapp).
    """
    CREATE TABLE talon_wa_windows (
        chat_id TEXT PRIMARY KEY, last_inbound DOUBLE PRECISION, last_read DOUBLE PRECISION,
        holder TEXT, until DOUBLE PRECISION, last_refused DOUBLE PRECISION
    );
    CREATE TABLE talon_wa_pending (
        id BIGSERIAL PRIMARY KEY, chat_id TEXT NOT NULL, created DOUBLE PRECISION NOT NULL, payload TEXT NOT NULL
    );
    CREATE INDEX talon_wa_pending_chat ON talon_wa_pending (chat_id, id);
    CREATE TABLE talon_wa_sent (
        sid TEXT PRIMARY KEY, chat_id TEXT NOT NULL, kind TEXT NOT NULL, payload TEXT NOT NULL,
        sent_at DOUBLE PRECISION NOT NULL, status TEXT NOT NULL, error_code INTEGER,
        error_message TEXT NOT NULL, updated DOUBLE PRECISION NOT NULL, retried BOOLEAN NOT NULL DEFAULT FALSE
    );
    CREATE INDEX talon_wa_sent_failed ON talon_wa_sent (chat_id, updated) WHERE status IN ('failed', 'undelivered');
    CREATE TABLE talon_wa_tokens (
        token TEXT PRIMARY KEY, choice TEXT NOT NULL, approval_id TEXT NOT NULL, digest TEXT NOT NULL,
        chat_id TEXT NOT NULL, expires DOUBLE PRECISION NOT NULL
    );
    CREATE INDEX talon_wa_tokens_approval ON talon_wa_tokens (approval_id);
    """,
    # 10: full-text search over session lines (talon.storage.search): when each was stored, who
    # wrote it, and its words ('simple' configuration: no stemming, any language) with the chat's
    # token, under a GIN index. Lines stored before this version are indexed by `talon migrate`.
    """
    ALTER TABLE talon_session_lines ADD COLUMN at DOUBLE PRECISION, ADD COLUMN role TEXT,
        ADD COLUMN sender TEXT, ADD COLUMN search tsvector, ADD COLUMN indexed BOOLEAN NOT NULL DEFAULT false;
    CREATE INDEX talon_session_lines_search ON talon_session_lines USING GIN (search);
    CREATE INDEX talon_session_lines_unindexed ON talon_session_lines (channel, chat_id) WHERE NOT indexed;
    """,
    # 11: the web panel (talon.storage.panel): sign-in sessions and links, failed sign-ins, its
    # audit log, and the chat index its lists read.
    """
    CREATE TABLE talon_panel_sessions (
        token_hash TEXT PRIMARY KEY, csrf TEXT NOT NULL, who TEXT NOT NULL, address TEXT NOT NULL,
        created DOUBLE PRECISION NOT NULL, last_seen DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE talon_panel_links (token_hash TEXT PRIMARY KEY, expires DOUBLE PRECISION NOT NULL);
    CREATE TABLE talon_panel_failures (address TEXT NOT NULL, at DOUBLE PRECISION NOT NULL);
    CREATE INDEX talon_panel_failures_address ON talon_panel_failures (address, at);
    CREATE TABLE talon_panel_audit (
        id BIGSERIAL PRIMARY KEY, at DOUBLE PRECISION NOT NULL, who TEXT NOT NULL, action TEXT NOT NULL,
        detail TEXT NOT NULL, address TEXT NOT NULL
    );
    CREATE TABLE talon_panel_chats (
        channel TEXT NOT NULL, chat_id TEXT NOT NULL, title TEXT NOT NULL, people TEXT NOT NULL,
        last_at DOUBLE PRECISION NOT NULL, messages BIGINT NOT NULL, PRIMARY KEY (channel, chat_id)
    );
    CREATE INDEX talon_panel_chats_last ON talon_panel_chats (last_at);
    CREATE TABLE talon_panel_days (day TEXT PRIMARY KEY, messages BIGINT NOT NULL);
    CREATE INDEX talon_approvals_status ON talon_approvals (status, created);
    CREATE TABLE talon_panel_usage_daily (
        day TEXT NOT NULL, channel TEXT NOT NULL, person TEXT NOT NULL, chat_id TEXT NOT NULL, model TEXT NOT NULL,
        calls BIGINT NOT NULL, person_calls BIGINT NOT NULL, input_tokens BIGINT NOT NULL,
        output_tokens BIGINT NOT NULL, cost DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (day, channel, person, chat_id, model)
    );
    CREATE INDEX talon_panel_usage_daily_chat ON talon_panel_usage_daily (channel, chat_id);
    CREATE FUNCTION talon_panel_usage_rollup() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO talon_panel_usage_daily VALUES (to_char(to_timestamp(NEW.at) AT TIME ZONE 'UTC', 'YYYY-MM-DD'),
            NEW.channel, NEW.person, NEW.chat_id, NEW.model, CASE WHEN NEW.extra_share THEN 0 ELSE 1 END, 1,
            NEW.input_tokens, NEW.output_tokens, coalesce(NEW.cost, 0))
        ON CONFLICT (day, channel, person, chat_id, model) DO UPDATE SET
            calls = talon_panel_usage_daily.calls + EXCLUDED.calls,
            person_calls = talon_panel_usage_daily.person_calls + 1,
            input_tokens = talon_panel_usage_daily.input_tokens + EXCLUDED.input_tokens,
            output_tokens = talon_panel_usage_daily.output_tokens + EXCLUDED.output_tokens,
            cost = talon_panel_usage_daily.cost + EXCLUDED.cost;
        RETURN NEW;
    END
    $$;
    CREATE TRIGGER talon_panel_usage_rollup AFTER INSERT ON talon_usage FOR EACH ROW
        EXECUTE FUNCTION talon_panel_usage_rollup();
    INSERT INTO talon_panel_usage_daily SELECT to_char(to_timestamp(at) AT TIME ZONE 'UTC', 'YYYY-MM-DD'), channel,
        person, chat_id, model, sum(CASE WHEN extra_share THEN 0 ELSE 1 END), count(*), sum(input_tokens),
        sum(output_tokens), coalesce(sum(cost), 0) FROM talon_usage GROUP BY 1, 2, 3, 4, 5;
    """,
    # 12: background delegations (talon.jobs, talon.storage.jobs): one row per job, read per chat.
    """
    CREATE TABLE talon_jobs (
        id TEXT PRIMARY KEY, channel TEXT NOT NULL, conversation TEXT NOT NULL, owner_id TEXT NOT NULL,
        task TEXT NOT NULL, tools TEXT NOT NULL, status TEXT NOT NULL, created DOUBLE PRECISION NOT NULL,
        updated DOUBLE PRECISION NOT NULL, result TEXT NOT NULL, delivered INTEGER NOT NULL
    );
    CREATE INDEX talon_jobs_chat ON talon_jobs (channel, conversation);
    """,
    # 13: the panel's overview charts messages answered per day (the days so far: 0 answered).
    """
    ALTER TABLE talon_panel_days ADD COLUMN answered BIGINT NOT NULL DEFAULT 0;
    """,
    # 14: files the agent sent in the web chat, kept in the attachment store (any worker serves them).
    """
    CREATE TABLE talon_panel_sent (
        channel TEXT NOT NULL, chat_id TEXT NOT NULL, sha TEXT NOT NULL, mime TEXT NOT NULL, name TEXT NOT NULL,
        path TEXT NOT NULL, at DOUBLE PRECISION NOT NULL, PRIMARY KEY (channel, chat_id, sha, path)
    );
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


# pg_advisory_xact_lock key for schema changes: any fixed 64-bit number ("talonsch" in ASCII).
_SCHEMA_LOCK = 0x74616C6F6E736368 & 0x7FFFFFFFFFFFFFFF


async def schema_version(db: "AsyncDatabase") -> int:
    row = await db.fetchone("SELECT to_regclass('talon_meta') IS NOT NULL")
    if not row or not row[0]:
        return 0
    found = await db.fetchone("SELECT value FROM talon_meta WHERE key = 'schema_version'")
    return int(found[0]) if found else 0


async def migrate_schema(db: "AsyncDatabase", target: int = SCHEMA_VERSION) -> tuple[int, int]:
    """Bring the schema to ``target``; (version before, version after).

    The missing scripts run in one transaction under a transaction-scoped advisory lock, so
    workers that start together wait for each other instead of racing, and a failed upgrade
    leaves the previous version intact."""
    if not 0 < target <= SCHEMA_VERSION:
        raise ValueError(f"no schema version {target} (known: 1..{SCHEMA_VERSION})")

    async def go() -> tuple[int, int]:
        async with db.transaction() as conn:
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            cur = await conn.execute("SELECT to_regclass('talon_meta') IS NOT NULL")
            exists = await cur.fetchone()
            before = 0
            if exists and exists[0]:
                cur = await conn.execute("SELECT value FROM talon_meta WHERE key = 'schema_version'")
                row = await cur.fetchone()
                before = int(row[0]) if row else 0
            if before > SCHEMA_VERSION:
                raise ConfigError(f"the database has schema version {before}, newer than this Talon knows "
                                  f"({SCHEMA_VERSION}): upgrade Talon on this worker", ["TALON_DATABASE_URL"])
            for version in range(before + 1, target + 1):
                await conn.execute(MIGRATIONS[version - 1])
                await conn.execute("INSERT INTO talon_meta (key, value) VALUES ('schema_version', %s) "
                                   "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value", (str(version),))
                log.info("database schema upgraded to version %d", version)
            db.count(3 + 2 * max(0, target - before))
            return before, max(before, target)

    # Not bounded by the statement limit: a first migration on a slow disk may take longer.
    return await go()
