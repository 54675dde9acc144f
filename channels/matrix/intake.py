"""Matrix events in: who may speak, rooms, threads, and the ``InboundMessage`` handed to the
bridge.

- **Direct messages.** A room of two (the bot and one person) that is not a listed room is a
  direct conversation: its person must pass the access gate (``TALON_MATRIX_ALLOWED_USERS`` or
  pairing); deny by default. An invitation is accepted only from someone the gate allows, or
  into a listed room; the log names the room id to list otherwise.
- **Rooms.** Only rooms in ``TALON_MATRIX_ALLOWED_ROOMS``; there every member may address the
  bot: a mention (``m.mentions`` naming the bot, or its user id or display name in the text), a
  reply to one of its messages, or a ``!command``/``/command``. Other messages are chatter, handed
  to the next addressed turn (``channels/rooms.py``). ``!stop`` is ``/stop`` (Matrix clients
  take ``/`` for their own commands). Administrators are members with power level 50 or more.
- **Threads.** A message in a thread (``m.relates_to`` of ``rel_type`` ``m.thread``) belongs to
  the conversation of its thread root: its own session and workspace, as a Telegram topic.
- **Files.** ``m.image``, ``m.file``, ``m.audio`` (a voice message when it carries
  ``org.matrix.msc3245.voice``) and ``m.video`` reference their ``mxc://`` URI, downloaded during
  the turn (``downloads.py``). Encrypted rooms: nio decrypts their events before they come here
  (``crypto.py``); one it could not decrypt goes to ``on_undecryptable``.
- **Edits** (``m.replace``) become the edited message's new version; reactions go to the approval
  prompts (``approvals.py``); the bot's own events and other bots' notices are never turns.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from talon.bounded import BoundedMap
from talon.envelope import InboundMessage, RemoteFile, conversation_id
from talon.groups import speaker_label

from channels.admission import admit_direct
from channels.base import BridgeHandle
from channels.matrix.api import CHANNEL, MatrixApi
from channels.matrix.crypto import file_source
from channels.rooms import ChatterLog, describe_unaddressed

log = logging.getLogger(__name__)

ADMIN_LEVEL = 50
_KINDS = {"m.image": "image", "m.file": "document", "m.audio": "audio", "m.video": "video"}
_COMMAND = re.compile(r"^[!/]([a-z]+)\b", re.IGNORECASE)


def relation(content: dict[str, Any]) -> dict[str, Any]:
    rel = content.get("m.relates_to")
    return rel if isinstance(rel, dict) else {}


def thread_of(content: dict[str, Any]) -> str | None:
    rel = relation(content)
    if rel.get("rel_type") == "m.thread" and isinstance(rel.get("event_id"), str):
        return str(rel["event_id"])
    return None


def replied_to(content: dict[str, Any]) -> str | None:
    reply = relation(content).get("m.in_reply_to")
    if isinstance(reply, dict) and isinstance(reply.get("event_id"), str) and not relation(content).get(
            "is_falling_back"):
        return str(reply["event_id"])
    return None


def strip_reply_fallback(body: str) -> str:
    """A reply's body starts with quoted lines (``> <@who> text``) of the message it answers."""
    lines = body.split("\n")
    while lines and lines[0].startswith("> "):
        lines.pop(0)
    if lines and not lines[0].strip():
        lines.pop(0)
    return "\n".join(lines)


class Intake:
    """Events in (see the module docstring); the bridge is given at start (``bind``)."""

    def __init__(self, api: MatrixApi, *, allowed_rooms: frozenset[str], chatter: ChatterLog) -> None:
        self.api = api
        self.allowed_rooms = allowed_rooms
        self.chatter = chatter
        self._bridge: BridgeHandle | None = None
        # Events the bot sent (to tell a reply to the bot), bounded and forgotten when idle.
        self.sent: BoundedMap[str, bool] = BoundedMap("matrix_sent_events")
        self._unlisted_logged: BoundedMap[str, bool] = BoundedMap("matrix_unlisted_rooms")
        # Set when encrypted rooms are served (crypto.py): an event nio could not decrypt.
        self.on_undecryptable: Callable[[Intake, str, dict[str, Any]], Awaitable[None]] | None = None

    def bind(self, bridge: BridgeHandle) -> None:
        self._bridge = bridge

    @property
    def bridge(self) -> BridgeHandle:
        if self._bridge is None:
            raise RuntimeError("the matrix channel has not been started")
        return self._bridge

    def serves_room(self, room_id: str) -> bool:
        return room_id in self.allowed_rooms

    def is_direct(self, room_id: str) -> bool:
        """A room of two that is not listed: a direct conversation."""
        if room_id in self.allowed_rooms:
            return False
        room = self.api.client.rooms.get(room_id)
        if room is None:
            return False
        return int(room.joined_count or len(room.users)) <= 2

    async def may_speak(self, room_id: str, sender: str) -> bool:
        """Whether ``sender`` is answered in ``room_id`` at all: a listed room's member, or the
        allowed person of a direct conversation."""
        if self.is_direct(room_id):
            return bool(await self.bridge.gate.allowed(CHANNEL, [sender]))
        return room_id in self.allowed_rooms

    def display(self, room_id: str, user: str) -> str:
        return self._name(room_id, user)

    # --- invitations ----------------------------------------------------------------------------
    async def on_invite(self, room_id: str, inviter: str | None) -> None:
        if room_id in self.allowed_rooms:
            await self._join(room_id)
            return
        if inviter and await self.bridge.gate.allowed(CHANNEL, [inviter]):
            await self._join(room_id)
            return
        log.warning("matrix: invitation to %s from %s ignored: the room is not in TALON_MATRIX_ALLOWED_ROOMS "
                    "and %s is not allowed to message the bot (TALON_MATRIX_ALLOWED_USERS, or `talon pair`)",
                    room_id, inviter, inviter)

    async def _join(self, room_id: str) -> None:
        try:
            await self.api.call(None, "join", lambda: self.api.client.join(room_id))
            log.info("matrix: joined %s", room_id)
        except Exception as exc:
            log.warning("matrix: could not join %s: %s", room_id, exc)

    # --- messages -------------------------------------------------------------------------------
    async def on_event(self, room_id: str, event: dict[str, Any]) -> None:
        """A timeline event of a joined room."""
        sender = str(event.get("sender", ""))
        if sender == self.api.user_id:
            return
        if event.get("type") == "m.room.encrypted":  # one nio could not decrypt (crypto.py)
            if self.on_undecryptable is not None:
                await self.on_undecryptable(self, room_id, event)
                return
            if room_id not in self._unlisted_logged:
                self._unlisted_logged[room_id] = True
                log.warning("matrix: room %s is encrypted; Talon does not serve encrypted rooms yet (use an "
                            "unencrypted room or direct message: docs/channels.md)", room_id)
            return
        if event.get("type") != "m.room.message":
            return
        content = event.get("content")
        if not isinstance(content, dict):
            return
        edited_at: str | None = None
        event_id = str(event.get("event_id", ""))
        rel = relation(content)
        if rel.get("rel_type") == "m.replace":
            new = content.get("m.new_content")
            if not isinstance(new, dict) or not isinstance(rel.get("event_id"), str):
                return
            edited_at, event_id = event_id, str(rel["event_id"])
            content = {**new, "m.relates_to": {}}
        msgtype = content.get("msgtype")
        if msgtype == "m.notice":
            return  # bots speak in notices: never a turn, so two bots cannot loop
        body = content.get("body") if isinstance(content.get("body"), str) else ""
        files: list[RemoteFile] = []
        if msgtype in _KINDS:
            remote = self._remote(content, event_id)
            if remote is None:
                log.info("matrix: room=%s: event %s carries a file Talon cannot fetch (an encrypted file?)",
                         room_id, event_id)
                body = f"[Sent a file Talon cannot open: {body or msgtype}]"
            else:
                files.append(remote)
                body = ""  # a file event's body is its name
        elif msgtype not in ("m.text", "m.emote"):
            return
        text = strip_reply_fallback(str(body)) if replied_to(content) else str(body)
        if msgtype == "m.emote":
            text = f"* {text}"
        thread = thread_of(content)
        if self.is_direct(room_id):
            await self._direct(room_id, sender, event_id, text, files, thread, edited_at, content)
        else:
            await self._room(room_id, sender, event_id, text, files, thread, edited_at, content)

    def _remote(self, content: dict[str, Any], event_id: str) -> RemoteFile | None:
        url = content.get("url")
        if "file" in content:  # an encrypted room's file: its keys travel with it (crypto.py)
            url = file_source(content)
        if not isinstance(url, str) or not url.startswith("mxc://"):
            return None
        raw_info = content.get("info")
        info: dict[str, Any] = raw_info if isinstance(raw_info, dict) else {}
        kind = _KINDS[str(content.get("msgtype"))]
        if kind == "audio" and "org.matrix.msc3245.voice" in content:
            kind = "voice"
        size = info.get("size")
        name = content.get("filename") or content.get("body") or f"{kind}_{event_id[-8:]}"
        return RemoteFile(kind=kind, source=url, name=str(name)[:200], mime=info.get("mimetype"),  # type: ignore[arg-type]
                          size=size if isinstance(size, int) else None)

    def _name(self, room_id: str, user: str) -> str:
        room = self.api.client.rooms.get(room_id)
        if room is not None:
            name = room.user_name(user)
            if name:
                return str(name)
        return user

    async def _direct(self, room_id: str, sender: str, event_id: str, text: str, files: list[RemoteFile],
                      thread: str | None, edited_at: str | None, content: dict[str, Any]) -> None:
        async def tell(line: str) -> None:
            await self.api.send(room_id, {"msgtype": "m.notice", "body": line}, "pairing code")

        if not await admit_direct(self.bridge.gate, CHANNEL, [sender], name=self._name(room_id, sender),
                                  allow_setting="TALON_MATRIX_ALLOWED_USERS", tell=tell):
            return
        if not text and not files:
            return
        await self.bridge.submit(InboundMessage(
            channel=CHANNEL, chat_id=room_id, sender_id=sender, message_id=event_id, text=_command(text),
            sender_name=self._name(room_id, sender), files=files, thread_id=thread, edited_at=edited_at))

    async def _room(self, room_id: str, sender: str, event_id: str, text: str, files: list[RemoteFile],
                    thread: str | None, edited_at: str | None, content: dict[str, Any]) -> None:
        if room_id not in self.allowed_rooms:
            if room_id not in self._unlisted_logged:
                self._unlisted_logged[room_id] = True
                log.warning("matrix: message in room %s ignored: the room is not listed; to serve it add %s to "
                            "TALON_MATRIX_ALLOWED_ROOMS", room_id, room_id)
            return
        name = self._name(room_id, sender)
        conversation = conversation_id(room_id, thread)
        spoken_to, text = self._addressed(content, text)
        if not spoken_to:
            if edited_at is None:
                self.chatter.add(conversation, speaker_label(name, sender), describe_unaddressed(text, len(files)))
            return
        text = _command(text)
        room = self.api.client.rooms.get(room_id)
        level = room.power_levels.get_user_level(sender) if room is not None else 0
        await self.bridge.submit(InboundMessage(
            channel=CHANNEL, chat_id=room_id, sender_id=sender, message_id=event_id, text=text, sender_name=name,
            files=files, chat_type="group", chat_title=(room.display_name if room is not None else None),
            thread_id=thread, sender_username=None, sender_admin=level >= ADMIN_LEVEL,
            reply_to_sender="you" if replied_to(content) in self.sent else None,
            chatter=self.chatter.take(conversation), edited_at=edited_at))

    def _addressed(self, content: dict[str, Any], text: str) -> tuple[bool, str]:
        """Whether a room message speaks to the bot, and its text without a leading mention."""
        me = self.api.user_id
        mentions = content.get("m.mentions")
        named = isinstance(mentions, dict) and me in (mentions.get("user_ids") or [])
        stripped = text
        for handle in filter(None, (me, self.api.display_name)):
            pattern = re.compile(rf"^\s*@?{re.escape(handle)}[:,]?\s*", re.IGNORECASE)
            if pattern.match(text):
                stripped = pattern.sub("", text, count=1)
                named = True
                break
            if handle.lower() in text.lower() and handle == me:
                named = True
        if replied_to(content) in self.sent:
            named = True
        if _COMMAND.match(stripped):
            named = True
        return named, stripped


def _command(text: str) -> str:
    """``!stop`` -> ``/stop``: Matrix clients keep ``/`` for their own commands."""
    stripped = text.lstrip()
    if stripped.startswith("!") and _COMMAND.match(stripped):
        return "/" + stripped[1:]
    return text
