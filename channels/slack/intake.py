"""Slack events in: who may speak, channels, threads, files, and the ``InboundMessage`` handed to
the bridge.

- **Direct messages** (``channel_type: im``): the person must pass the access gate
  (``TALON_SLACK_ALLOWED_USERS`` or pairing); deny by default, a pairing code when pairing is on.
- **Channels** (public, private, group DMs): only those in ``TALON_SLACK_ALLOWED_CHANNELS``.
  There a message is a turn when it mentions the bot (``<@BOT>``, also as an ``app_mention``
  event: the inbox drops the second copy), replies in a thread the bot answered in, or is a
  ``!command``; every other message is chatter, handed to the next addressed turn.
  Administrators are the workspace's admins and owners (``users.info``).
- **Threads.** A message in a thread (``thread_ts`` other than its own ``ts``) belongs to the
  conversation of that thread, with its own session and workspace, as a Telegram topic.
- **Files** (``files[]``): fetched during the turn from ``url_private_download`` with the bot token
  (``downloads.py``); images, audio (voice clips), video, documents.
- **Commands.** Slack clients keep ``/`` for slash commands, so ``!stop`` is ``/stop``; the
  slash commands ``/stop``, ``/new``, ``/status``, ``/usage`` and ``/tasks`` (when the app
  declares them) arrive as commands too (``events.py``).
- **Never a turn:** the bot's own messages, other bots' (``bot_id``, ``bot_message``), joins and
  other subtypes; an edit (``message_changed``) becomes the message's new version.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from talon.bounded import BoundedMap
from talon.envelope import InboundMessage, RemoteFile, conversation_id
from talon.groups import speaker_label

from channels.admission import admit_direct
from channels.base import BridgeHandle
from channels.rooms import ChatterLog, describe_unaddressed
from channels.slack.api import CHANNEL, SlackApi

log = logging.getLogger(__name__)

_COMMAND = re.compile(r"^[!/]([a-z]+)\b", re.IGNORECASE)
_SLASH_COMMANDS = frozenset({"stop", "new", "status", "usage", "tasks", "help", "approve", "deny", "model"})
_TS = re.compile(r"\d{1,12}\.\d{1,9}")
_ID = re.compile(r"[A-Z0-9]{2,32}")
_SUBTYPES = frozenset({None, "file_share", "thread_broadcast", "me_message"})


def kind_of(mime: str) -> str:
    if mime.startswith("image/"):
        return "image"
    if mime.startswith("audio/"):
        return "audio"
    if mime.startswith("video/"):
        return "video"
    return "document"


def command_text(text: str) -> str:
    """``!stop`` -> ``/stop``."""
    stripped = text.lstrip()
    match = _COMMAND.match(stripped)
    if stripped.startswith("!") and match and match.group(1).lower() in _SLASH_COMMANDS:
        return "/" + stripped[1:]
    return text


class Intake:
    """Events in (see the module docstring); the bridge is given at start (``bind``)."""

    def __init__(self, api: SlackApi, *, allowed_channels: frozenset[str], chatter: ChatterLog) -> None:
        self.api = api
        self.allowed_channels = allowed_channels
        self.chatter = chatter
        self._bridge: BridgeHandle | None = None
        self.threads: BoundedMap[str, bool] = BoundedMap("slack_threads")  # threads the bot answered in
        self._people: BoundedMap[str, tuple[str, bool]] = BoundedMap("slack_people")  # id -> (name, admin)
        self._titles: BoundedMap[str, str] = BoundedMap("slack_channel_titles")
        self._unlisted_logged: BoundedMap[str, bool] = BoundedMap("slack_unlisted")

    def bind(self, bridge: BridgeHandle) -> None:
        self._bridge = bridge

    @property
    def bridge(self) -> BridgeHandle:
        if self._bridge is None:
            raise RuntimeError("the Slack channel has not been started")
        return self._bridge

    def serves_channel(self, channel: str) -> bool:
        return channel.upper() in self.allowed_channels

    # --- events ----------------------------------------------------------------------------------
    async def on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind not in ("message", "app_mention"):
            return
        subtype = event.get("subtype")
        edited_at: str | None = None
        if subtype == "message_changed":
            inner = event.get("message")
            if not isinstance(inner, dict) or not isinstance((inner.get("edited") or {}).get("ts"), str):
                return
            edited_at = str(inner["edited"]["ts"])
            event = {**inner, "channel": event.get("channel"), "channel_type": event.get("channel_type")}
            subtype = event.get("subtype")
        if subtype not in _SUBTYPES:
            return
        user, channel, ts = event.get("user"), event.get("channel"), event.get("ts")
        if not (isinstance(user, str) and _ID.fullmatch(user) and isinstance(channel, str)
                and _ID.fullmatch(channel) and isinstance(ts, str) and _TS.fullmatch(ts)):
            return
        if event.get("bot_id") or user == self.api.bot_user_id:
            return  # the bot's own messages and other bots' are never turns
        raw = event.get("text")
        text = unescape(raw if isinstance(raw, str) else "")
        files = self._files(event)
        thread = event.get("thread_ts")
        thread_id = str(thread) if isinstance(thread, str) and _TS.fullmatch(thread) and thread != ts else None
        direct = event.get("channel_type") == "im" or (channel.startswith("D") and kind == "message"
                                                       and event.get("channel_type") is None)
        if direct:
            await self._direct(channel, user, ts, str(text), files, thread_id, edited_at)
        else:
            await self._channel(channel, user, ts, str(text), files, thread_id, edited_at,
                                mentioned=kind == "app_mention")

    async def on_command(self, form: dict[str, str]) -> None:
        """A slash command (``/stop`` and the like) typed in a conversation the app is in."""
        command = form.get("command", "").lstrip("/").lower()
        user, channel = form.get("user_id", ""), form.get("channel_id", "")
        trigger = form.get("trigger_id", "")
        if command not in _SLASH_COMMANDS or not _ID.fullmatch(user) or not _ID.fullmatch(channel) or not trigger:
            return
        text = f"/{command} {form.get('text', '')}".strip()
        message_id = f"cmd-{trigger[:64]}"
        if channel.startswith("D"):
            await self._direct(channel, user, message_id, text, [], None, None)
        else:
            await self._channel(channel, user, message_id, text, [], None, None, mentioned=True)

    def _files(self, event: dict[str, Any]) -> list[RemoteFile]:
        out: list[RemoteFile] = []
        for item in event.get("files") or []:
            if not isinstance(item, dict):
                continue
            url = item.get("url_private_download") or item.get("url_private")
            if not isinstance(url, str):
                continue
            mime = str(item.get("mimetype") or "application/octet-stream")
            kind = kind_of(mime)
            if kind == "audio" and item.get("subtype") == "slack_audio":
                kind = "voice"
            size = item.get("size")
            name = str(item.get("name") or item.get("title") or f"{kind}_{item.get('id', '')}")[:200]
            out.append(RemoteFile(kind=kind, source=url, name=name, mime=mime,  # type: ignore[arg-type]
                                  size=size if isinstance(size, int) else None))
        return out

    async def person(self, user: str) -> tuple[str, bool]:
        """A member's display name and whether they administer the workspace (``users.info``)."""
        known = self._people.get(user)
        if known is not None:
            return known
        try:
            answer = await self.api.once("users.info", lambda: self.api.client.users_info(user=user))
            info = answer.get("user") or {}
            profile = info.get("profile") or {}
            name = str(profile.get("display_name") or profile.get("real_name") or info.get("real_name")
                       or info.get("name") or user)
            found = (name, bool(info.get("is_admin") or info.get("is_owner")))
        except Exception as exc:  # a name is nice to have: the id stands in
            log.info("slack: users.info %s failed: %s", user, exc)
            return user, False
        self._people[user] = found
        return found

    async def title(self, channel: str) -> str | None:
        known = self._titles.get(channel)
        if known is not None:
            return known
        try:
            answer = await self.api.once("conversations.info",
                                         lambda: self.api.client.conversations_info(channel=channel))
            name = str((answer.get("channel") or {}).get("name") or channel)
        except Exception as exc:
            log.info("slack: conversations.info %s failed: %s", channel, exc)
            return None
        self._titles[channel] = name
        return name

    async def _direct(self, channel: str, user: str, ts: str, text: str, files: list[RemoteFile],
                      thread: str | None, edited_at: str | None) -> None:
        name, _ = await self.person(user)

        async def tell(line: str) -> None:
            await self.api.once("pairing code", lambda: self.api.client.chat_postMessage(
                channel=channel, text=line, mrkdwn=False))

        if not await admit_direct(self.bridge.gate, CHANNEL, [user], name=name,
                                  allow_setting="TALON_SLACK_ALLOWED_USERS", tell=tell):
            return
        text = _without_mention(text, self.api.bot_user_id)
        if not text and not files:
            return
        await self.bridge.submit(InboundMessage(
            channel=CHANNEL, chat_id=channel, sender_id=user, message_id=ts, text=command_text(text),
            sender_name=name, files=files, thread_id=thread, edited_at=edited_at))

    async def _channel(self, channel: str, user: str, ts: str, text: str, files: list[RemoteFile],
                       thread: str | None, edited_at: str | None, *, mentioned: bool) -> None:
        if not self.serves_channel(channel):
            if channel not in self._unlisted_logged:
                self._unlisted_logged[channel] = True
                log.warning("slack: message in channel %s ignored: the channel is not listed; to serve it add %s "
                            "to TALON_SLACK_ALLOWED_CHANNELS", channel, channel)
            return
        conversation = conversation_id(channel, thread)
        me = self.api.bot_user_id
        addressed = mentioned or (me and f"<@{me}>" in text) or (thread is not None and conversation in self.threads)
        stripped = _without_mention(text, me)
        if _COMMAND.match(stripped.lstrip()):
            addressed = True
        name, admin = await self.person(user)
        if not addressed:
            if edited_at is None:
                self.chatter.add(conversation, speaker_label(name, user), describe_unaddressed(text, len(files)))
            return
        self.threads[conversation] = True
        await self.bridge.submit(InboundMessage(
            channel=CHANNEL, chat_id=channel, sender_id=user, message_id=ts, text=command_text(stripped),
            sender_name=name, files=files, chat_type="group", chat_title=await self.title(channel),
            thread_id=thread, sender_admin=admin, chatter=self.chatter.take(conversation), edited_at=edited_at))


def unescape(text: str) -> str:
    """Slack escapes ``&``, ``<`` and ``>`` in what people type (mentions and links stay ``<...>``)."""
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def _without_mention(text: str, me: str) -> str:
    if not me:
        return text
    return re.sub(rf"^\s*<@{re.escape(me)}(\|[^>]*)?>[:,]?\s*", "", text, count=1)
