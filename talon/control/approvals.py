"""Approvals: risky tool calls wait for a person's yes.

``TALON_APPROVAL`` names the kinds that wait (see ``kind_of``). When such a call comes, the chat
gets a prompt (Telegram: inline buttons; elsewhere: reply yes or no) and the turn waits. The
approval is in the store before the prompt is sent, so a restart loses nothing: the resumed turn
asks for the same (turn, call) again, finds it and waits on; a press after the restart decides
it. Deciding is a compare-and-set in the store, so with many workers the press may land on any
of them: the waiting turn reads the decision from the store.

Who may decide: the person whose message started the turn (in a private chat, its person), or
anyone listed in ``TALON_APPROVERS``. A denial or a timeout is given to the model as the call's
result; the prompt is edited (or answered) to say what happened and who decided.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import secrets
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Literal, Protocol

from talon.content import ToolCall
from talon.errors import ConfigError, StoreUnavailable
from talon.storage.approvals import Approval, ApprovalStore, Status

log = logging.getLogger(__name__)

KINDS = ("shell", "write", "mcp", "send", "web")
WRITE_TOOLS = frozenset({"write_file", "edit_file"})
SEND_TOOLS = frozenset({"speak"})  # plus every send_* tool
SEND_FILES_TOOL = "send_files"  # the files a reply attaches (talon.control.files)
SUMMARY_CHARS = 600

Choice = Literal["approve", "deny", "always"]

# Replies taken as an answer while an approval waits (WhatsApp, console, or typed on Telegram).
YES = frozenset({"yes", "y", "ok", "approve", "/approve", "allow"})
NO = frozenset({"no", "n", "deny", "/deny", "refuse"})


def reply_choice(text: str) -> Choice | None:
    """The answer a short reply gives, or None when it is not one (an ordinary message)."""
    word = text.strip().lower().rstrip(".!").split("@", 1)[0]
    if word in YES:
        return "approve"
    if word in NO:
        return "deny"
    return None


def tool_kind(tool: str) -> str | None:
    """The approval kind of a tool by its name; None for a tool no kind covers."""
    if tool == "shell":
        return "shell"
    if tool in WRITE_TOOLS:
        return "write"
    if tool.startswith("mcp__"):
        return "mcp"
    if tool in SEND_TOOLS or tool.startswith("send_"):
        return "send"
    if tool == "web_fetch" or tool.startswith("web_"):
        return "web"
    return None


def mcp_server(tool: str) -> str:
    """``mcp__<server>__<tool>`` -> server."""
    return tool.removeprefix("mcp__").split("__", 1)[0]


@dataclass(frozen=True)
class ApprovalPolicy:
    kinds: frozenset[str]  # the kinds above, and "mcp:<server>" entries
    approvers: frozenset[str]  # "id" (any channel) or "channel:id"
    timeout_s: float = 600.0

    @classmethod
    def parse(cls, approval: str, approvers: str = "", timeout_s: float = 600.0) -> "ApprovalPolicy":
        kinds: set[str] = set()
        entries = [e.strip().lower() for e in approval.split(",") if e.strip()]
        if entries in (["off"], ["none"], ["false"]):
            entries = []
        for entry in entries:
            if entry in KINDS or (entry.startswith("mcp:") and entry[4:].strip()):
                kinds.add(entry if entry in KINDS else "mcp:" + entry[4:].strip())
            else:
                raise ConfigError(f"TALON_APPROVAL: {entry!r} is not a kind of tool call (use shell, write, mcp, "
                                  "mcp:<server>, send, web, comma-separated; or off)", ["TALON_APPROVAL"])
        people = (a.strip() for a in approvers.replace(";", ",").split(","))
        return cls(frozenset(kinds), frozenset(p.lower() if p.startswith("@") else p for p in people if p), timeout_s)

    def kind_of(self, tool: str) -> str | None:
        """The kind a call of ``tool`` waits as, or None when it runs without asking."""
        kind = tool_kind(tool)
        if kind is None:
            return None
        if kind == "mcp" and ("mcp" in self.kinds or f"mcp:{mcp_server(tool).lower()}" in self.kinds):
            return kind
        return kind if kind in self.kinds else None

    def is_approver(self, channel: str, person: str, username: str | None = None) -> bool:
        named = username is not None and f"@{username.lstrip('@').lower()}" in self.approvers
        return named or person in self.approvers or f"{channel}:{person}" in self.approvers

    def may_decide(self, approval: Approval, channel: str, person: str, username: str | None = None) -> bool:
        return ((channel == approval.channel and person == approval.requester)
                or self.is_approver(channel, person, username))

    @property
    def timeout_words(self) -> str:
        minutes = self.timeout_s / 60
        return f"{minutes:g} minutes" if minutes >= 1 else f"{self.timeout_s:g} seconds"


def describe_call(call: ToolCall, kind: str) -> str:
    """What the agent wants to do, in a few lines a person can judge, cut to fit."""
    try:
        args = call.parsed_arguments()
    except ValueError:
        args = {"arguments": call.arguments}
    if kind == "shell" and isinstance(args.get("command"), str):
        text = f"run a shell command:\n{args['command']}"
    elif call.name == "write_file":
        content = args.get("content")
        size = f" ({len(content):,} characters)" if isinstance(content, str) else ""
        text = f"write the file {args.get('path', '?')}{size}"
    elif call.name == "edit_file":
        text = f"edit the file {args.get('path', '?')}"
    elif call.name == SEND_FILES_TOOL and isinstance(args.get("files"), list):
        text = f"send these files into the chat: {', '.join(str(f) for f in args['files'])}"
    elif kind == "web" and isinstance(args.get("url"), str):
        text = f"fetch {args['url']}"
    else:
        shown = call.name.removeprefix("mcp__").replace("__", " / ") if kind == "mcp" else call.name
        text = f"use the tool {shown} with:\n{json.dumps(args, ensure_ascii=False)}"
    return text if len(text) <= SUMMARY_CHARS else text[:SUMMARY_CHARS - 1] + "…"


class Prompter(Protocol):
    """How a channel shows an approval: ``ask`` sends the prompt (the id of the message it sent,
    when the platform can edit it later), ``settle`` shows the outcome."""

    async def ask_approval(self, approval: Approval, text: str) -> str | None: ...

    async def settle_approval(self, approval: Approval, text: str) -> None: ...


@dataclass(frozen=True)
class TurnOrigin:
    """The message whose turn asks: where to ask, and who asked."""

    channel: str
    chat_id: str  # the conversation
    platform_chat: str
    thread_id: str | None
    requester: str
    turn_id: str
    group: bool = False


@dataclass(frozen=True)
class Answer:
    """What became of a press or a reply."""

    outcome: Literal["decided", "refused", "already", "unknown"]
    approval: Approval | None = None
    note: str = ""  # a short text for the person (a Telegram toast)


OnDecision = Callable[[Approval], None]


class Approvals:
    def __init__(self, store: ApprovalStore, policy: ApprovalPolicy, *, poll_s: float = 1.0,
                 clock: Callable[[], float] = time.time, on_decision: OnDecision | None = None) -> None:
        self.store = store
        self.policy = policy
        self.poll_s = poll_s
        self.clock = clock
        self.on_decision = on_decision  # metrics
        self._decided: dict[str, asyncio.Event] = {}  # approval id -> set when decided here
        # The agent's tool names now (MCP servers may add some); None: assume every kind occurs.
        self.tool_names: Callable[[], Collection[str]] | None = None

    @property
    def enabled(self) -> bool:
        """Whether anything can wait for a yes here: a kind is named and a tool of it exists (or
        files, which any reply may attach). Off, yes/no replies are ordinary messages."""
        if not self.policy.kinds:
            return False
        if "send" in self.policy.kinds or self.tool_names is None:
            return True
        return any(self.policy.kind_of(name) for name in self.tool_names())

    # --- the turn's side -----------------------------------------------------------------------
    async def gate(self, call: ToolCall, origin: TurnOrigin, prompter: Prompter) -> str | None:
        """None when ``call`` may run (no approval needed, or approved); else the text the model
        gets instead of the call's result. Waits for the person, at most the timeout."""
        kind = self.policy.kind_of(call.name)
        if kind is None:
            return None
        if await self.store.always_allowed(origin.channel, origin.chat_id, call.name):
            log.info("approval: %s in %s:%s runs without asking (always allowed in this chat)",
                     call.name, origin.channel, origin.chat_id)
            return None
        now = self.clock()
        approval = await self.store.add(Approval(
            id=secrets.token_hex(6), channel=origin.channel, chat_id=origin.chat_id,
            platform_chat=origin.platform_chat, thread_id=origin.thread_id, requester=origin.requester,
            turn_id=origin.turn_id, call_id=call.id, tool=call.name, kind=kind,
            summary=describe_call(call, kind), created=now, expires=now + self.policy.timeout_s))
        if approval.status == "pending" and approval.prompt_id is None:
            prompt_id = await prompter.ask_approval(approval, self.prompt_text(approval, origin.group))
            if prompt_id is not None:
                await self.store.set_prompt(approval.id, prompt_id)
                approval = dataclasses.replace(approval, prompt_id=prompt_id)
            log.info("approval %s: %s in %s:%s waits for a decision", approval.id, approval.tool,
                     approval.channel, approval.chat_id)
        final = await self._wait(approval, prompter)
        return self.verdict(final)

    def prompt_text(self, approval: Approval, group: bool) -> str:
        who = " (the person who asked, or an approver, may answer)" if group else ""
        return (f"Approval needed: the agent wants to {approval.summary}\n\n"
                f"It waits up to {self.policy.timeout_words} for an answer{who}.")

    def verdict(self, approval: Approval) -> str | None:
        if approval.status == "approved":
            return None
        if approval.status == "denied":
            return ("Not run: denied by the user. Do not try it another way; ask the person or go on "
                    "without it.")
        if approval.status == "timeout":
            return f"Not run: no answer in {self.policy.timeout_words} (the person did not approve it)."
        return "Not run: the turn was stopped."

    async def _wait(self, approval: Approval, prompter: Prompter) -> Approval:
        """Until the approval is decided (here, on another worker, before a restart) or expires."""
        event = self._decided.setdefault(approval.id, asyncio.Event())
        try:
            while True:
                try:
                    current = await self.store.get(approval.id) or approval
                    if current.status != "pending":
                        return current
                    left = current.expires - self.clock()
                    if left <= 0:
                        if await self.store.decide(current.id, "timeout", "", self.clock()):
                            timed_out = current.decided("timeout", "", self.clock())
                            self._record(timed_out)
                            await self._settle(prompter, timed_out)
                            return timed_out
                        continue  # decided at the same moment: read that decision
                except StoreUnavailable as exc:
                    # The decision is in the store: a database that does not answer for a moment
                    # means asking again, not giving up on the person's answer.
                    log.warning("approval %s: the store did not answer (%s); asking again", approval.id, exc)
                    left = self.poll_s
                try:
                    await asyncio.wait_for(event.wait(), min(self.poll_s, left))
                except TimeoutError:
                    pass
        finally:
            self._decided.pop(approval.id, None)

    async def stop_turn(self, channel: str, chat_id: str, turn_id: str, prompter: Prompter) -> None:
        """/stop: the turn's waiting approvals are closed, and their prompts say so."""
        for approval in await self.store.pending(channel, chat_id):
            if approval.turn_id != turn_id:
                continue
            if await self.store.decide(approval.id, "stopped", "", self.clock()):
                stopped = approval.decided("stopped", "", self.clock())
                self._record(stopped)
                await self._settle(prompter, stopped)

    # --- the person's side ---------------------------------------------------------------------
    async def answer(self, approval_id: str, choice: Choice, channel: str, person: str, name: str,
                     username: str | None = None) -> Answer:
        """A press or a reply by ``person`` on ``channel``. The caller then shows the outcome
        (``settle``) once it has acknowledged the press."""
        approval = await self.store.get(approval_id)
        if approval is None:
            return Answer("unknown", note="This approval is no longer known.")
        if approval.status != "pending":
            return Answer("already", approval, note=f"Already {_status_words(approval)}.")
        if not self.policy.may_decide(approval, channel, person, username):
            log.info("approval %s: %s:%s (%s) may not decide it", approval.id, channel, person, name)
            return Answer("refused", approval,
                          note="Only the person who asked, or an approver, can answer this.")
        by = f"{channel}:{person} ({name})" if name else f"{channel}:{person}"
        status: Status = "denied" if choice == "deny" else "approved"
        if not await self.store.decide(approval.id, status, by, self.clock()):
            current = await self.store.get(approval_id) or approval
            return Answer("already", current, note=f"Already {_status_words(current)}.")
        if choice == "always":
            await self.store.allow_always(approval.channel, approval.chat_id, approval.tool, by, self.clock())
        decided = approval.decided(status, by, self.clock())
        self._record(decided, always=choice == "always")
        event = self._decided.get(approval.id)
        if event is not None:
            event.set()
        return Answer("decided", decided, note="Approved." if status == "approved" else "Denied.")

    async def answer_reply(self, channel: str, chat_id: str, person: str, name: str,
                           choice: Choice, username: str | None = None) -> Answer | None:
        """A yes/no reply in a conversation: it answers the oldest approval waiting there; None
        when none waits (the reply is then an ordinary message)."""
        pending = await self.store.pending(channel, chat_id)
        if not pending:
            return None
        mine = [a for a in pending if self.policy.may_decide(a, channel, person, username)]
        if not mine:
            return Answer("refused", pending[0], note="Only the person who asked, or an approver, can answer this.")
        return await self.answer(mine[0].id, choice, channel, person, name, username)

    async def settle(self, prompter: Prompter, approval: Approval) -> None:
        await self._settle(prompter, approval)

    async def _settle(self, prompter: Prompter, approval: Approval) -> None:
        try:
            await prompter.settle_approval(approval, self.outcome_text(approval))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the decision holds; only its display failed
            log.warning("approval %s: could not show the outcome: %s", approval.id, exc)

    def outcome_text(self, approval: Approval) -> str:
        head = f"The agent wanted to {approval.summary}"
        words = _status_words(approval)
        return f"{head}\n\n{words[:1].upper()}{words[1:]}."

    def _record(self, approval: Approval, *, always: bool = False) -> None:
        """Every decision is in the store (who, what, when); the log says it too."""
        log.info("approval %s: %s %s in %s:%s%s%s", approval.id, approval.tool, approval.status,
                 approval.channel, approval.chat_id, f" by {approval.decided_by}" if approval.decided_by else "",
                 " (always in this chat)" if always else "")
        if self.on_decision is not None:
            self.on_decision(approval)


def _status_words(approval: Approval) -> str:
    who = approval.decided_by.split(" (", 1)[-1].rstrip(")") if "(" in approval.decided_by else approval.decided_by
    if approval.status == "approved":
        return f"approved by {who}"
    if approval.status == "denied":
        return f"denied by {who}"
    if approval.status == "timeout":
        return "not run: no answer in time"
    if approval.status == "stopped":
        return "not run: the turn was stopped"
    return "waiting"
