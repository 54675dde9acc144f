"""Who may talk to the agent: static allowlists, plus pairing codes for newcomers.

Deny by default. A sender is allowed when one of their identities (Telegram: numeric id and
``@username``; WhatsApp: E.164 number) is in the channel's allowlist setting, or when the owner
approved them with ``talon pair CODE``.

With ``TALON_PAIRING=true`` an unknown sender gets a pairing code instead of silence; the owner
approves it on the host. Codes are random (``secrets``) from an alphabet without look-alike
characters, live ``CODE_TTL_S`` (1 hour), one per sender (asking again gives the same code), at
most ``MAX_PENDING`` at a time (the oldest is dropped), and a sender is sent a code at most once
per ``REPLY_INTERVAL_S`` (10 minutes), so a stranger cannot make the bot spam.

``AccessGate`` holds the rules; the durable part (approvals, live codes, who was sent one) is a
``PairingStore``: ``MemoryPairing`` (tests), ``talon.storage.embedded.access.SqlitePairing``
(``TALON_DATA_DIR/access.sqlite3``) or ``talon.storage.postgres.access.PgPairing``. It is read on
every check, so an approval or a revocation from ``talon pair`` (a process of its own) takes effect
at once in a running ``talon run``. Approvals are kept whatever ``TALON_PAIRING`` says.
"""

from __future__ import annotations

import secrets
import time
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from talon.errors import PairingError

CODE_TTL_S = 3600.0
REPLY_INTERVAL_S = 600.0
MAX_PENDING = 50
# No 0/O, 1/I/L: a code read aloud or retyped from a phone screen comes out the same.
CODE_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"
CODE_LENGTH = 7  # shown as XXX-XXXX; 31**7 is about 2.7e10
NAME_MAX = 64


@dataclass(frozen=True)
class Pairing:
    """An unknown sender's live code; ``reply`` is the text to send them, or None when they were
    sent a code less than ``REPLY_INTERVAL_S`` ago (say nothing)."""

    code: str
    reply: str | None


@dataclass(frozen=True)
class PendingRequest:
    channel: str
    sender_id: str
    name: str
    code: str
    created: float


@dataclass(frozen=True)
class Approval:
    channel: str
    sender_id: str
    name: str
    approved_at: float

    @property
    def who(self) -> str:
        return f"{self.channel}:{self.sender_id}" + (f" ({self.name})" if self.name else "")


def format_code(raw: str) -> str:
    return f"{raw[:3]}-{raw[3:]}"


def normalize_code(text: str) -> str:
    """``k7q4mx2``, ``K7Q-4MX2`` and `` k7q 4mx2 `` are the same code."""
    return "".join(c for c in text.upper() if c.isalnum())


def new_code() -> str:
    return "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))


def pairing_reply(code: str) -> str:
    return f"This is a private bot. To ask for access, give its owner this code: {code}"


def clean_name(name: str) -> str:
    """Profile names are chosen by strangers: no control characters (terminal escapes) reach
    ``talon pair``'s output, and they stay short."""
    kept = "".join(" " if c.isspace() else c for c in name
                   if c.isspace() or unicodedata.category(c)[0] != "C")
    return " ".join(kept.split())[:NAME_MAX]


def identity(value: str) -> str:
    value = value.strip()
    return value.lower() if value.startswith("@") else value


def unknown_code(code: str) -> PairingError:
    return PairingError(
        f"no pending request has the code {code.strip()!r}: it is mistyped, or it expired "
        f"(codes live {CODE_TTL_S / 3600:.0f} hour) or was replaced by newer requests. Ask "
        "them to message the bot again for a new code; `talon pair` lists the live ones.")


class PairingStore(Protocol):
    """The durable side of access. Times are epoch seconds from the gate's clock."""

    async def is_approved(self, channel: str, ids: list[str]) -> bool: ...

    async def issue_code(self, channel: str, sender_id: str, name: str, now: float) -> tuple[str, bool]:
        """The sender's live code (reused, or a new one: expired codes pruned, at most
        ``MAX_PENDING`` kept) and whether they were sent one within ``REPLY_INTERVAL_S`` (if not,
        that they are sent one now is recorded)."""

    async def approve(self, raw_code: str, now: float) -> Approval | None:
        """Approve whoever holds the live ``raw_code``; None when nobody does."""

    async def reject(self, raw_code: str) -> PendingRequest | None:
        """Drop the pending request holding ``raw_code`` (no access given); None when none does."""

    async def revoke(self, channel: str, sender_id: str) -> Approval | None: ...

    async def pending(self, now: float) -> list[PendingRequest]:
        """Live requests, oldest first (codes shown formatted)."""

    async def approvals(self) -> list[Approval]: ...

    async def close(self) -> None: ...


class AccessGate:
    def __init__(self, store: PairingStore, allowlists: Mapping[str, Iterable[str]], *, pairing: bool = False,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.allowlists = {channel: frozenset(identity(x) for x in ids) for channel, ids in allowlists.items()}
        self.pairing = pairing
        self._clock = clock

    async def close(self) -> None:
        await self.store.close()

    # --- the check ------------------------------------------------------------------------
    async def allowed(self, channel: str, identities: Iterable[str]) -> bool:
        """Whether a sender known by ``identities`` may talk to the agent on ``channel``."""
        ids = {identity(i) for i in identities if i.strip()}
        if not ids:
            return False
        if ids & self.allowlists.get(channel, frozenset()):
            return True
        return await self.store.is_approved(channel, sorted(ids))

    async def request_pairing(self, channel: str, sender_id: str, name: str = "") -> Pairing | None:
        """The code for an unknown sender (issued or reused); None when pairing is off."""
        if not self.pairing:
            return None
        raw, recent = await self.store.issue_code(channel, sender_id, clean_name(name), self._clock())
        shown = format_code(raw)
        return Pairing(code=shown, reply=None if recent else pairing_reply(shown))

    # --- the owner's side (talon pair) ------------------------------------------------------
    async def pending(self) -> list[PendingRequest]:
        return await self.store.pending(self._clock())

    async def approvals(self) -> list[Approval]:
        return await self.store.approvals()

    async def approve(self, code: str) -> Approval:
        """Approve the sender a live code was given to; PairingError when there is none."""
        approval = await self.store.approve(normalize_code(code), self._clock())
        if approval is None:
            raise unknown_code(code)
        return approval

    async def reject(self, code: str) -> PendingRequest:
        """Turn a pending request down (the web panel's Reject); PairingError when there is none."""
        request = await self.store.reject(normalize_code(code))
        if request is None:
            raise unknown_code(code)
        return request

    async def revoke(self, channel: str, sender_id: str) -> Approval | None:
        """Remove an approval; None when this sender was not approved through pairing."""
        return await self.store.revoke(channel, sender_id)

    def in_allowlist(self, channel: str, who: str) -> bool:
        return identity(who) in self.allowlists.get(channel, frozenset())


class MemoryPairing:
    """Pairing state in dicts, for tests."""

    def __init__(self) -> None:
        self.approved: dict[tuple[str, str], Approval] = {}
        self.codes: dict[tuple[str, str], PendingRequest] = {}  # raw codes
        self.replied: dict[tuple[str, str], float] = {}

    async def is_approved(self, channel: str, ids: list[str]) -> bool:
        return any((channel, i) in self.approved for i in ids)

    async def issue_code(self, channel: str, sender_id: str, name: str, now: float) -> tuple[str, bool]:
        self.codes = {k: p for k, p in self.codes.items() if p.created > now - CODE_TTL_S}
        self.replied = {k: at for k, at in self.replied.items() if at > now - REPLY_INTERVAL_S}
        key = (channel, sender_id)
        if key not in self.codes:
            taken = {p.code for p in self.codes.values()}
            code = new_code()
            while code in taken:
                code = new_code()
            self.codes[key] = PendingRequest(channel, sender_id, name, code, now)
            for old in list(self.codes)[:-MAX_PENDING]:  # insertion order is age order
                del self.codes[old]
        recent = key in self.replied
        self.replied.setdefault(key, now)
        return self.codes[key].code, recent

    async def approve(self, raw_code: str, now: float) -> Approval | None:
        key = next((k for k, p in self.codes.items() if p.code == raw_code and p.created > now - CODE_TTL_S), None)
        if key is None:
            return None
        request = self.codes.pop(key)
        self.replied.pop(key, None)
        self.approved[key] = Approval(request.channel, request.sender_id, request.name, now)
        return self.approved[key]

    async def reject(self, raw_code: str) -> PendingRequest | None:
        key = next((k for k, p in self.codes.items() if p.code == raw_code), None)
        if key is None:
            return None
        p = self.codes.pop(key)
        return PendingRequest(p.channel, p.sender_id, p.name, format_code(p.code), p.created)

    async def revoke(self, channel: str, sender_id: str) -> Approval | None:
        return self.approved.pop((channel, sender_id), None)

    async def pending(self, now: float) -> list[PendingRequest]:
        return [PendingRequest(p.channel, p.sender_id, p.name, format_code(p.code), p.created)
                for p in self.codes.values() if p.created > now - CODE_TTL_S]

    async def approvals(self) -> list[Approval]:
        return sorted(self.approved.values(), key=lambda a: a.approved_at)

    async def close(self) -> None:
        pass
