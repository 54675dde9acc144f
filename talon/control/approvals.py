"""Approvals: risky tool calls wait for a person's yes.

``TALON_APPROVAL`` names the kinds that wait (see ``kind_of``; ``mcp:<server>`` names a configured
MCP server, matched by the server a tool belongs to, never guessed from the tool's name). When such
a call comes, the chat gets a prompt (Telegram: inline buttons; elsewhere: reply yes or no) and the
turn waits.

An approval is for the exact call shown: it carries ``call_digest`` (sha256 of the tool's name and
its full, canonical arguments) and a decision applies only to a call with that digest, never to a
call id the model chose. The prompt shows the whole call (``describe_call``), with runs of
whitespace and control, zero-width and bidirectional characters made visible (``visible``); a
channel that cannot show it whole sends it as a file, and when it can do neither it raises
``ApprovalNotShown`` and the call is refused without asking (nothing can be approved unseen).

The approval is in the store before the prompt is sent, so a restart loses nothing: the resumed
turn asks for the same (turn, call, digest) again, finds it and waits on; a press after the restart
decides it. Deciding is a compare-and-set in the store, so with many workers the press may land on
any of them: the waiting turn reads the decision from the store.

Who may decide: the person whose message started the turn (in a private chat, its person), or
anyone listed in ``TALON_APPROVERS``. "Always in this chat" (calls of that tool run unasked from
then on) is granted only by the chat's owner: in a private chat its person, in a group an
administrator of the group (the channel tells: ``admin``) or one of ``TALON_APPROVERS``. The
``/approvals`` chat command lists the standing grants; ``/approvals revoke <n|all>`` ends them.
A denial or a timeout is given to the model as the call's result; the prompt is edited (or
answered) to say what happened and who decided.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import re
import secrets
import time
import unicodedata
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Literal, Protocol

from talon.bounded import BoundedMap
from talon.content import ToolCall
from talon.errors import ApprovalNotShown, ConfigError, StoreUnavailable
from talon.storage.approvals import Approval, ApprovalStore, Grant, Status

log = logging.getLogger(__name__)

KINDS = ("shell", "write", "mcp", "send", "web")
WRITE_TOOLS = frozenset({"write_file", "edit_file"})
SEND_TOOLS = frozenset({"speak"})  # plus every send_* tool
SEND_FILES_TOOL = "send_files"  # the files a reply attaches (talon.control.files)
OUTCOME_CHARS = 300  # of the call, in the line that says how an approval ended (the prompt showed it all)
LONG_CALL_CHARS = 1000  # past this the prompt says how long the call is

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


def call_digest(name: str, arguments: str) -> str:
    """sha256 of the tool's name and its full arguments, canonical (keys sorted): the identity of
    the exact call a person approves. Arguments that are not a JSON object count as their text."""
    try:
        args: object = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        args = arguments
    canonical = json.dumps([name, args], sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


# Letters that draw nothing (fillers), shown like the format characters.
_INVISIBLE = frozenset("\u115f\u1160\u3164\uffa0\u2800\u034f\u17b4\u17b5\u180e")
_SPACE_RUN = 3  # a run of this many plain spaces or more is shown as a count
_BREAK_RUN = 3  # the same for line breaks


def _visible_char(ch: str) -> str:
    if ch == "\t":
        return "⟨tab⟩"
    if ch == "\r":
        return "⟨CR⟩"
    if ch == "\n":
        return "⏎\n"
    category = unicodedata.category(ch)
    if (category[0] in "CZ" and ch != " ") or ch in _INVISIBLE or 0xFE00 <= ord(ch) <= 0xFE0F \
            or 0xE0100 <= ord(ch) <= 0xE01EF:
        return f"⟨U+{ord(ch):04X}⟩"
    return ch


_RUNS = re.compile(r" {%d,}|\n{%d,}" % (_SPACE_RUN, _BREAK_RUN))


def visible(text: str) -> str:
    """``text`` with nothing hidden: runs of spaces and of line breaks shown as their count
    (``⟨700 spaces⟩``), tabs, carriage returns, line breaks (``⏎``), control characters (ANSI
    escapes among them), zero-width, bidirectional and other invisible characters shown as
    ``⟨tab⟩``, ``⟨CR⟩``, ``⟨U+202E⟩``... Everything else is unchanged."""
    out: list[str] = []
    pos = 0
    for run in _RUNS.finditer(text):
        out.extend(_visible_char(ch) for ch in text[pos:run.start()])
        count = len(run.group())
        out.append(f"⟨{count:,} spaces⟩" if run.group()[0] == " " else f"⟨{count:,} line breaks⟩\n")
        pos = run.end()
    out.extend(_visible_char(ch) for ch in text[pos:])
    return "".join(out)


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

    def kind_of(self, tool: str, server: str | None = None) -> str | None:
        """The kind a call of ``tool`` waits as, or None when it runs without asking. ``server``:
        the configured MCP server the tool belongs to (its key in the servers file). An MCP tool
        whose server is not known waits whenever any ``mcp:<server>`` is named: its name cannot
        tell (dots, ``__`` and long names are changed in it)."""
        kind = tool_kind(tool)
        if kind is None:
            return None
        if kind == "mcp" and "mcp" not in self.kinds:
            if server is not None:
                return kind if f"mcp:{server.strip().lower()}" in self.kinds else None
            return kind if any(k.startswith("mcp:") for k in self.kinds) else None
        return kind if kind in self.kinds else None

    def is_approver(self, channel: str, person: str, username: str | None = None) -> bool:
        named = username is not None and f"@{username.lstrip('@').lower()}" in self.approvers
        return named or person in self.approvers or f"{channel}:{person}" in self.approvers

    def may_decide(self, approval: Approval, channel: str, person: str, username: str | None = None) -> bool:
        return ((channel == approval.channel and person == approval.requester)
                or self.is_approver(channel, person, username))

    def may_grant_always(self, approval: Approval, channel: str, person: str, username: str | None = None,
                         admin: bool = False) -> bool:
        """"Always in this chat" is the chat owner's to give: in a private chat its person (the one
        who asked), in a group an administrator of the group (``admin``, told by the channel) or
        one of TALON_APPROVERS; never a plain member of a group."""
        if self.is_approver(channel, person, username):
            return True
        if channel != approval.channel:
            return False
        # An approval stored before approvals knew their chat kind (no digest) counts as a group's.
        return admin if approval.in_group or not approval.digest else person == approval.requester

    @property
    def timeout_words(self) -> str:
        minutes = self.timeout_s / 60
        return f"{minutes:g} minutes" if minutes >= 1 else f"{self.timeout_s:g} seconds"


def _value(value: object) -> str:
    return visible(value) if isinstance(value, str) else visible(json.dumps(value, ensure_ascii=False,
                                                                             sort_keys=True))


def _rest(args: dict[str, object], *shown: str) -> str:
    """The arguments not shown in the headline, one per line: nothing of the call is left out."""
    return "".join(f"\n{visible(name)}: {_value(value)}" for name, value in sorted(args.items())
                   if name not in shown)


def describe_call(call: ToolCall, kind: str) -> str:
    """The whole call, as a person can judge it: the command, the file and its content, the URL
    or every argument, never cut, with hidden characters made visible (``visible``)."""
    try:
        parsed = call.parsed_arguments()
    except ValueError:
        parsed = {"arguments": call.arguments}
    args: dict[str, object] = dict(parsed)
    if kind == "shell" and isinstance(args.get("command"), str):
        return f"run a shell command:\n{_value(args['command'])}{_rest(args, 'command')}"
    if call.name == "write_file" and isinstance(args.get("content"), str):
        content = str(args["content"])
        return (f"write the file {_value(args.get('path', '?'))} ({len(content):,} characters):\n"
                f"{visible(content)}{_rest(args, 'path', 'content')}")
    if call.name in WRITE_TOOLS:
        return f"{call.name.split('_')[0]} the file {_value(args.get('path', '?'))} with:{_rest(args, 'path')}"
    files = args.get("files")
    if call.name == SEND_FILES_TOOL and isinstance(files, list):
        return (f"send these files into the chat: {', '.join(_value(f) for f in files)}"
                f"{_rest(args, 'files')}")
    if kind == "web" and isinstance(args.get("url"), str):
        return f"fetch {_value(args['url'])}{_rest(args, 'url')}"
    shown = call.name.removeprefix("mcp__").replace("__", " / ") if kind == "mcp" else call.name
    return f"use the tool {visible(shown)} with:{_rest(args) or ' no arguments'}"


def _short(summary: str) -> str:
    return summary if len(summary) <= OUTCOME_CHARS else summary[:OUTCOME_CHARS - 1] + "…"


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


def _undecided(event: asyncio.Event) -> bool:
    return not event.is_set()


class Approvals:
    def __init__(self, store: ApprovalStore, policy: ApprovalPolicy, *, poll_s: float = 1.0,
                 clock: Callable[[], float] = time.time, on_decision: OnDecision | None = None) -> None:
        self.store = store
        self.policy = policy
        self.poll_s = poll_s
        self.clock = clock
        self.on_decision = on_decision  # metrics
        # approval id -> set when decided here; removed when its wait ends, bounded all the same.
        self._decided: BoundedMap[str, asyncio.Event] = BoundedMap("approval_waits", in_use=_undecided)
        # The agent's tool names now (MCP servers may add some); None: assume every kind occurs.
        self.tool_names: Callable[[], Collection[str]] | None = None
        # The configured MCP server a tool belongs to (``McpTool.server``), for ``mcp:<server>``.
        self.server_of: Callable[[str], str | None] = lambda name: None

    @property
    def enabled(self) -> bool:
        """Whether anything can wait for a yes here: a kind is named and a tool of it exists (or
        files, which any reply may attach). Off, yes/no replies are ordinary messages."""
        if not self.policy.kinds:
            return False
        if "send" in self.policy.kinds or self.tool_names is None:
            return True
        return any(self.policy.kind_of(name, self.server_of(name)) for name in self.tool_names())

    # --- the turn's side -----------------------------------------------------------------------
    async def gate(self, call: ToolCall, origin: TurnOrigin, prompter: Prompter) -> str | None:
        """None when ``call`` may run (no approval needed, or approved); else the text the model
        gets instead of the call's result. Waits for the person, at most the timeout."""
        kind = self.policy.kind_of(call.name, self.server_of(call.name))
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
            summary=describe_call(call, kind), created=now, expires=now + self.policy.timeout_s,
            digest=call_digest(call.name, call.arguments), in_group=origin.group))
        if approval.status == "pending" and approval.prompt_id is None:
            try:
                prompt_id = await prompter.ask_approval(approval, self.prompt_text(approval, origin.group))
            except ApprovalNotShown as exc:
                return await self._not_shown(approval, prompter, str(exc))
            if prompt_id is not None:
                await self.store.set_prompt(approval.id, prompt_id)
                approval = dataclasses.replace(approval, prompt_id=prompt_id)
            log.info("approval %s: %s in %s:%s waits for a decision", approval.id, approval.tool,
                     approval.channel, approval.chat_id)
        final = await self._wait(approval, prompter)
        return self.verdict(final)

    async def _not_shown(self, approval: Approval, prompter: Prompter, why: str) -> str:
        """The call could not be shown whole: refused at once, and the chat is told why."""
        log.warning("approval %s: %s in %s:%s refused: it could not be shown whole (%s)", approval.id,
                    approval.tool, approval.channel, approval.chat_id, why)
        if await self.store.decide(approval.id, "denied", "Talon (the call could not be shown whole)", self.clock()):
            denied = approval.decided("denied", "Talon (the call could not be shown whole)", self.clock())
            self._record(denied)
            await self._settle(prompter, denied, f"The agent wanted to {_short(approval.summary)}\n\n"
                               f"Not run: the call ({len(approval.summary):,} characters) could not be shown "
                               f"here whole ({why}), so it could not be approved.")
        return (f"Not run: the call is too long to show to the person for approval ({len(approval.summary):,} "
                f"characters; {why}). Nothing can be approved unseen: make the call shorter (e.g. write a "
                "script file first and run that).")

    def prompt_text(self, approval: Approval, group: bool) -> str:
        who = " (the person who asked, or an approver, may answer)" if group else ""
        size = (f" (the call is {len(approval.summary):,} characters; all of it is shown)"
                if len(approval.summary) > LONG_CALL_CHARS else "")
        return (f"Approval needed: the agent wants to {approval.summary}\n\n"
                f"It waits up to {self.policy.timeout_words} for an answer{who}{size}.")

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
                     username: str | None = None, *, admin: bool = False) -> Answer:
        """A press or a reply by ``person`` on ``channel`` (``admin``: the channel found them an
        administrator of the group). The caller then shows the outcome (``settle``) once it has
        acknowledged the press."""
        approval = await self.store.get(approval_id)
        if approval is None:
            return Answer("unknown", note="This approval is no longer known.")
        if approval.status != "pending":
            return Answer("already", approval, note=f"Already {_status_words(approval)}.")
        if choice == "always":
            # The chat owner's to give (see ApprovalPolicy.may_grant_always); an administrator who
            # gives it answers this call too.
            if not self.policy.may_grant_always(approval, channel, person, username, admin):
                log.info("approval %s: %s:%s (%s) may not allow %s always in %s:%s", approval.id, channel,
                         person, name, approval.tool, approval.channel, approval.chat_id)
                return Answer("refused", approval, note=(
                    "Only an administrator of this group or an approver can allow this always in this chat. "
                    "Press Approve to allow just this call." if approval.in_group else
                    "Only the person of this chat or an approver can allow this always here."))
        elif not self.policy.may_decide(approval, channel, person, username):
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

    async def answer_as_operator(self, approval_id: str, choice: Choice, by: str) -> Answer:
        """A decision from the web panel: its signed-in operator may decide any approval (as an
        approver may). The same compare-and-set as a press in the chat, so the turn goes on the
        same way (here at once, on another worker at its next look at the store)."""
        approval = await self.store.get(approval_id)
        if approval is None:
            return Answer("unknown", note="This approval is no longer known.")
        status: Status = "denied" if choice == "deny" else "approved"
        if approval.status != "pending" or not await self.store.decide(approval.id, status, by, self.clock()):
            current = await self.store.get(approval_id) or approval
            return Answer("already", current, note=f"Already {_status_words(current)}.")
        decided = approval.decided(status, by, self.clock())
        self._record(decided)
        event = self._decided.get(approval.id)
        if event is not None:
            event.set()
        return Answer("decided", decided, note="Approved." if status == "approved" else "Denied.")

    async def get(self, approval_id: str) -> Approval | None:
        """The approval as stored now (a channel checks a button's binding against it)."""
        return await self.store.get(approval_id)

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

    async def _settle(self, prompter: Prompter, approval: Approval, text: str | None = None) -> None:
        try:
            await prompter.settle_approval(approval, text or self.outcome_text(approval))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the decision holds; only its display failed
            log.warning("approval %s: could not show the outcome: %s", approval.id, exc)

    def outcome_text(self, approval: Approval) -> str:
        head = f"The agent wanted to {_short(approval.summary)}"
        words = _status_words(approval)
        return f"{head}\n\n{words[:1].upper()}{words[1:]}."

    # --- /approvals ---------------------------------------------------------------------------
    async def grants_command(self, channel: str, chat_id: str, text: str) -> str:
        """``/approvals``: the conversation's standing "always" grants, numbered;
        ``/approvals revoke <n|all>`` ends one or all of them (anyone in the chat may: revoking
        only makes Talon ask again)."""
        words = text.split()[1:]
        grants = await self.store.grants(channel, chat_id)
        if not words:
            if not grants:
                return "No standing approvals in this chat: every gated call asks first."
            lines = ["Always allowed in this chat (these tools run without asking):"]
            lines += [f"{n}. {_grant_words(g)}" for n, g in enumerate(grants, 1)]
            lines.append("/approvals revoke <number> ends one; /approvals revoke all ends them all.")
            return "\n".join(lines)
        if words[0].lower() != "revoke" or len(words) != 2:
            return "Use /approvals to list the standing approvals, /approvals revoke <number|all> to end them."
        target = words[1].lower()
        if target == "all":
            gone = await self.store.revoke(channel, chat_id)
            log.info("approvals: every standing grant in %s:%s revoked (%d)", channel, chat_id, gone)
            return (f"Revoked {gone} standing approval{'s' if gone != 1 else ''}: every gated call asks first again."
                    if gone else "There were no standing approvals in this chat.")
        if not target.isdigit() or not 1 <= int(target) <= len(grants):
            return (f"There is no standing approval number {words[1]} here (see /approvals)." if grants
                    else "There are no standing approvals in this chat.")
        grant = grants[int(target) - 1]
        await self.store.revoke(channel, chat_id, grant.tool)
        log.info("approvals: the standing grant of %s in %s:%s revoked", grant.tool, channel, chat_id)
        return f"Revoked: {_tool_words(grant.tool)} asks first again."

    def _record(self, approval: Approval, *, always: bool = False) -> None:
        """Every decision is in the store (who, what, when); the log says it too."""
        log.info("approval %s: %s %s in %s:%s%s%s", approval.id, approval.tool, approval.status,
                 approval.channel, approval.chat_id, f" by {approval.decided_by}" if approval.decided_by else "",
                 " (always in this chat)" if always else "")
        if self.on_decision is not None:
            self.on_decision(approval)


def _tool_words(tool: str) -> str:
    if tool.startswith("mcp__"):
        return f"the tool {tool.removeprefix('mcp__').replace('__', ' / ')}"
    return "the shell" if tool == "shell" else f"the tool {tool}"


def _grant_words(grant: Grant) -> str:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(grant.at))
    who = grant.decided_by or "?"
    return f"{_tool_words(grant.tool)} (allowed by {who}, {when})"


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
