"""The approval store: tool calls waiting for a person's yes, and every decision made on them.

A pending approval outlives the process that asked: after a restart its button (or a yes/no
reply) still finds it here, and the resumed turn finds the decision. An approval is for one exact
call: it is keyed by (turn, call id, digest), the digest being a sha256 of the tool's name and its
full arguments (``talon.control.approvals.call_digest``), so a call id the model uses again with
other arguments finds no decision and is asked about anew. Deciding is a compare-and-set from
``pending``, so two presses (or a press and the timeout, on two workers) cannot both win.

"Always in this chat" grants (``allow_always``) are kept per (channel, conversation, tool) and can
be listed (``grants``) and revoked (``revoke``): the ``/approvals`` chat command.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal, Protocol

Status = Literal["pending", "approved", "denied", "timeout", "stopped"]


@dataclass(frozen=True)
class Grant:
    """An "always in this chat" grant: calls of ``tool`` in the conversation run without asking."""

    channel: str
    chat_id: str
    tool: str
    decided_by: str
    at: float


@dataclass(frozen=True)
class Approval:
    id: str  # short random token: it travels in Telegram's callback data (64 bytes at most)
    channel: str
    chat_id: str  # the conversation (a chat, or a forum topic)
    platform_chat: str  # where the prompt is sent (the chat of a topic)
    thread_id: str | None
    requester: str  # the sender id of the person whose message started the turn
    turn_id: str  # the inbox key of that message
    call_id: str  # the tool call waiting ("" for something that is not a tool call)
    tool: str
    kind: str  # shell, write, mcp, send, web
    summary: str  # what the person is shown: the whole call, whitespace and control characters made visible
    created: float
    expires: float
    status: Status = "pending"
    decided_by: str = ""  # "channel:id (name)" of the person, or "" for a timeout or a stop
    decided_at: float | None = None
    prompt_id: str | None = None  # the platform message that shows the prompt
    digest: str = ""  # sha256 of the tool's name and full arguments: the one call this approval is for
    in_group: bool = False  # asked in a group (who may grant "always" depends on it)

    def decided(self, status: Status, by: str, at: float) -> "Approval":
        return dataclasses.replace(self, status=status, decided_by=by, decided_at=at)


class ApprovalStore(Protocol):
    async def add(self, approval: Approval) -> Approval:
        """Store a new approval; when one already exists for its (turn_id, call_id, digest) (a
        resumed turn asking again about the same call), that one is returned instead and nothing
        changes."""
        ...

    async def get(self, approval_id: str) -> Approval | None: ...

    async def set_prompt(self, approval_id: str, prompt_id: str) -> None: ...

    async def decide(self, approval_id: str, status: Status, by: str, at: float) -> bool:
        """Record the decision if the approval is still pending; False when it was not."""
        ...

    async def pending(self, channel: str, chat_id: str) -> list[Approval]:
        """The conversation's pending approvals, oldest first."""
        ...

    async def allow_always(self, channel: str, chat_id: str, tool: str, by: str, at: float) -> None: ...

    async def always_allowed(self, channel: str, chat_id: str, tool: str) -> bool: ...

    async def grants(self, channel: str, chat_id: str) -> list[Grant]:
        """The conversation's standing "always" grants, oldest first."""
        ...

    async def revoke(self, channel: str, chat_id: str, tool: str | None = None) -> int:
        """Remove the grant of ``tool`` (every grant of the conversation when None); how many went."""
        ...


class MemoryApprovalStore:
    def __init__(self) -> None:
        self.items: dict[str, Approval] = {}
        self.always: dict[tuple[str, str, str], tuple[str, float]] = {}

    async def add(self, approval: Approval) -> Approval:
        for known in self.items.values():
            if (known.turn_id, known.call_id, known.digest) == (approval.turn_id, approval.call_id,
                                                                approval.digest):
                return known
        self.items[approval.id] = approval
        return approval

    async def get(self, approval_id: str) -> Approval | None:
        return self.items.get(approval_id)

    async def set_prompt(self, approval_id: str, prompt_id: str) -> None:
        known = self.items.get(approval_id)
        if known is not None:
            self.items[approval_id] = dataclasses.replace(known, prompt_id=prompt_id)

    async def decide(self, approval_id: str, status: Status, by: str, at: float) -> bool:
        known = self.items.get(approval_id)
        if known is None or known.status != "pending":
            return False
        self.items[approval_id] = known.decided(status, by, at)
        return True

    async def pending(self, channel: str, chat_id: str) -> list[Approval]:
        return sorted((a for a in self.items.values()
                       if a.channel == channel and a.chat_id == chat_id and a.status == "pending"),
                      key=lambda a: a.created)

    async def allow_always(self, channel: str, chat_id: str, tool: str, by: str, at: float) -> None:
        self.always[(channel, chat_id, tool)] = (by, at)

    async def always_allowed(self, channel: str, chat_id: str, tool: str) -> bool:
        return (channel, chat_id, tool) in self.always

    async def grants(self, channel: str, chat_id: str) -> list[Grant]:
        return sorted((Grant(c, chat, tool, by, at) for (c, chat, tool), (by, at) in self.always.items()
                       if (c, chat) == (channel, chat_id)), key=lambda g: (g.at, g.tool))

    async def revoke(self, channel: str, chat_id: str, tool: str | None = None) -> int:
        gone = [key for key in self.always if key[:2] == (channel, chat_id) and tool in (None, key[2])]
        for key in gone:
            del self.always[key]
        return len(gone)
