"""WhatsApp's durable state (``channels.whatsapp``): the 24-hour window, what waits for it, receipts.

WhatsApp lets a business number send free-form messages only within 24 hours of the person's last
message. What the channel must remember across restarts and share between workers lives here:

- per conversation: when the person last wrote (the window), when Twilio last refused a message
  for the window (closed until they write again), when they last read a message, and
  which worker is delivering its waiting messages right now (a claim with an expiry, so a dead
  worker's claim lapses);
- the waiting messages themselves (``PendingPart``: one reply part each, in order, as the
  channel's own JSON), kept until the window reopens or ``TALON_WHATSAPP_PENDING_DAYS`` passes;
- every message Talon sent (its MessageSid, what it was, and the latest status Twilio reported:
  queued, sent, delivered, read, failed, undelivered, with the error), so a status callback for a
  message that is not ours records nothing, and a failed answer can be retried once;
- one-time tokens of approval buttons, bound to the approval's id and the digest of its call.

Implementations: ``talon.storage.embedded.whatsapp.SqliteWhatsAppStore`` (the default, one SQLite
file) and ``talon.storage.postgres.whatsapp.PgWhatsAppStore`` (schema script 9), which share the
SQL below where they can.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# The order statuses move in; a callback that arrives late (Twilio does not promise order) never
# moves a message back. failed / undelivered are final.
STATUS_RANK = {"accepted": 0, "queued": 1, "sending": 2, "sent": 3, "delivered": 4, "read": 5,
               "failed": 6, "undelivered": 6}
FAILED = frozenset({"failed", "undelivered"})


@dataclass(frozen=True)
class PendingPart:
    """One reply part waiting for the window to reopen."""

    id: int
    chat_id: str
    created: float
    payload: str  # the channel's JSON of the part


@dataclass(frozen=True)
class SentRecord:
    """One message Talon sent, and the latest status Twilio reported for it."""

    sid: str
    chat_id: str
    kind: str  # "answer", "template", "approval", "notice"...
    payload: str  # what to send again on a retry ("" when it cannot be)
    sent_at: float
    status: str
    error_code: int | None
    error_message: str
    updated: float
    retried: bool


@dataclass(frozen=True)
class ButtonToken:
    token: str
    choice: str  # "approve" or "deny"
    approval_id: str
    digest: str
    chat_id: str
    expires: float


class WhatsAppStore(Protocol):
    # --- the window ---------------------------------------------------------------------------
    async def seen(self, chat_id: str, at: float) -> None:
        """The person wrote at ``at`` (a later time only ever moves the window forward)."""

    async def last_inbound(self, chat_id: str) -> float | None: ...

    async def refused(self, chat_id: str, at: float) -> None:
        """Twilio refused a free-form message for the window at ``at``: closed until the person
        writes after that (a later time only ever moves it forward)."""

    async def last_refused(self, chat_id: str) -> float | None: ...

    async def mark_read(self, chat_id: str, at: float) -> None: ...

    async def last_read(self, chat_id: str) -> float | None: ...

    # --- waiting messages ---------------------------------------------------------------------
    async def add_pending(self, chat_id: str, payloads: list[str], at: float) -> None:
        """Append parts, in order, behind those already waiting."""

    async def pending(self, chat_id: str) -> list[PendingPart]:
        """The chat's waiting parts, oldest first."""

    async def pending_count(self, chat_id: str | None = None) -> int: ...

    async def chats_with_pending(self) -> list[str]: ...

    async def remove_pending(self, part_id: int) -> None: ...

    async def expire_pending(self, before: float) -> list[PendingPart]:
        """Remove and return the parts created before ``before``."""

    async def claim(self, chat_id: str, holder: str, until: float, now: float) -> bool:
        """Become the one delivering the chat's waiting parts until ``until`` (True), unless
        another holder's claim has not expired yet (False). A holder may renew its own claim."""

    async def release(self, chat_id: str, holder: str) -> None: ...

    # --- receipts -----------------------------------------------------------------------------
    async def record_sent(self, sid: str, chat_id: str, kind: str, payload: str, at: float) -> None: ...

    async def record_status(self, sid: str, status: str, error_code: int | None, error_message: str,
                            at: float) -> SentRecord | None:
        """Record a status callback; the message as recorded now, or None when ``sid`` is not a
        message Talon sent (nothing is recorded then)."""

    async def mark_retried(self, sid: str) -> bool:
        """True the first time only: whoever gets True retries the message."""

    async def last_failure(self, chat_id: str | None = None) -> SentRecord | None: ...

    # --- approval buttons ---------------------------------------------------------------------
    async def add_tokens(self, tokens: list[ButtonToken]) -> None: ...

    async def take_token(self, token: str, chat_id: str, now: float) -> ButtonToken | None:
        """The token, once: a live token of ``chat_id`` is consumed with every other token of its
        approval (one press decides); None for an unknown, used, expired or foreign token (a
        foreign one is left as it is)."""

    async def close(self) -> None: ...


SENT_COLUMNS = "sid, chat_id, kind, payload, sent_at, status, error_code, error_message, updated, retried"


def sent_of(row: tuple[object, ...] | None) -> SentRecord | None:
    if row is None:
        return None
    sid, chat, kind, payload, sent_at, status, code, message, updated, retried = row
    return SentRecord(str(sid), str(chat), str(kind), str(payload), float(sent_at),  # type: ignore[arg-type]
                      str(status), int(code) if code is not None else None,  # type: ignore[call-overload]
                      str(message), float(updated), bool(retried))  # type: ignore[arg-type]


def rank_case(column: str) -> str:
    """SQL: the rank of a status column (see STATUS_RANK)."""
    whens = " ".join(f"WHEN '{status}' THEN {rank}" for status, rank in STATUS_RANK.items())
    return f"(CASE {column} {whens} ELSE 0 END)"
