"""Inbound Telegram updates: private messages from allowed users, and group messages that address
the bot in listed groups (see ``channels/telegram/groups.py``), become ``InboundMessage``s (albums
are gathered into one); files are referenced by file_id and downloaded during the turn.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import logging
from dataclasses import dataclass, field

from telegram import Message as TgMessage
from telegram import Update
from telegram.error import TelegramError
from telegram.ext import ContextTypes

from talon.bounded import BoundedMap
from talon.content import InboundKind
from talon.envelope import InboundMessage, RemoteFile
from talon.errors import DeliveryError

from channels.base import BridgeHandle
from channels.telegram.api import CHANNEL, TelegramApi, _int_or_none, _send_target, _SendTarget
from channels.telegram.groups import (
    ADMIN_STATUSES,
    GROUP_TYPES,
    ChatterLog,
    addressed,
    anonymous_admin,
    command_word,
    conversation_of,
    describe_unaddressed,
    for_another_bot,
    from_bot,
    is_real_reply,
    label,
    sender_of,
    thread_of,
    topic_title,
)

log = logging.getLogger(__name__)

ALBUM_WAIT_S = 1.2
# Set while a webhook update is processed (webhook.py); the error handler records handler
# failures in it, so that the webhook answers 500 and Telegram sends the update again.
_webhook_errors: contextvars.ContextVar[list[BaseException] | None] = contextvars.ContextVar(
    "telegram_webhook_errors", default=None)


@dataclass
class Album:
    """An album being gathered: Telegram sends one message per item."""

    first: TgMessage
    files: list[RemoteFile] = field(default_factory=list)
    caption: str = ""
    timer: asyncio.TimerHandle | None = None
    submitted: asyncio.Event = field(default_factory=asyncio.Event)  # set when flushed
    addressed: bool = True  # in a group: whether any item speaks to the bot
    error: BaseException | None = None  # why submitting it failed


def _gathering(album: Album) -> bool:
    return not album.submitted.is_set()


class Intake:
    """Updates in: who may speak, groups, albums, and the InboundMessage handed to the bridge
    (given at start, ``bind``). ``allowed_chats`` are the groups served, ``chatter`` what was
    said in them that was not for the bot."""

    def __init__(self, api: TelegramApi, *, allowed_chats: set[int], chatter: ChatterLog) -> None:
        self.api = api
        self.allowed_chats = allowed_chats
        self.chatter = chatter
        self._bridge: BridgeHandle | None = None
        # Groups not served whose first message was logged (bounded, forgotten when idle).
        self._unlisted_logged: BoundedMap[int, bool] = BoundedMap("telegram_unlisted_groups")
        # Albums being gathered: each is flushed ALBUM_WAIT_S after its last item, and one not yet
        # submitted is never dropped (nothing lost), so the bound counts gathered ones only.
        self._albums: BoundedMap[str, Album] = BoundedMap("telegram_albums", in_use=_gathering)
        self._album_tasks: set[asyncio.Task[None]] = set()  # albums being stored

    def bind(self, bridge: BridgeHandle) -> None:
        self._bridge = bridge

    def serves_group(self, chat_id: str) -> bool:
        """Whether the group ``chat_id`` is one this intake takes messages from (listed)."""
        try:
            return int(chat_id) in self.allowed_chats
        except ValueError:
            return False

    @property
    def bound(self) -> bool:
        """Whether updates can be handed in yet (``start`` gave the bridge)."""
        return self._bridge is not None

    @property
    def bridge(self) -> BridgeHandle:
        if self._bridge is None:
            raise RuntimeError("the telegram channel has not been started")
        return self._bridge

    def album(self, chat_id: int, media_group_id: str) -> Album | None:
        """The album of that chat and group id while it is being gathered."""
        return self._albums.get(_album_key(chat_id, media_group_id))

    def albums_gathering(self) -> list[Album]:
        """The albums whose items are still arriving."""
        return list(self._albums.values())

    async def flush_albums(self) -> None:
        """At stop: submit what arrived of the albums still being gathered (the inbox keeps them
        for the next start) rather than dropping them."""
        await asyncio.gather(*self._album_tasks, return_exceptions=True)
        for key, album in list(self._albums.items()):
            if album.timer:
                album.timer.cancel()
            try:
                await self._flush_album(key)
            except Exception:
                log.exception("telegram: album %s could not be stored at stop", key)

    async def on_handler_error(self, update: object, context: ContextTypes.DEFAULT_TYPE) -> None:
        log.error("telegram: handler error: %s", context.error, exc_info=context.error)
        failures = _webhook_errors.get()
        if failures is not None and context.error is not None:
            failures.append(context.error)  # the webhook answers 500, so Telegram retries

    async def on_message(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        # An edited message comes the same way; its edit_date marks it (see _submit).
        msg = update.message or update.edited_message
        if msg is None or msg.from_user is None:
            return
        user = msg.from_user
        if msg.chat.type in GROUP_TYPES:
            await self._on_group_message(msg)
            return
        if msg.chat.type != "private":
            log.info("telegram: ignoring message in %s chat %s (only private chats and groups are served)",
                     msg.chat.type, msg.chat.id)
            return
        if user.is_bot:
            return  # bots do not talk to bots
        identities = [str(user.id)] + ([f"@{user.username}"] if user.username else [])
        if not await self.bridge.gate.allowed(CHANNEL, identities):
            handle = f" (@{user.username})" if user.username else ""
            pairing = await self.bridge.gate.request_pairing(
                CHANNEL, str(user.id), f"@{user.username}" if user.username else user.full_name)
            if pairing is None:
                log.warning(
                    "telegram: message from user %s%s denied; to allow them add %s to "
                    "TALON_TELEGRAM_ALLOWED_USERS", user.id, handle, user.id)
                return
            log.warning("telegram: message from user %s%s denied; to allow them run `talon pair %s` "
                        "(or add %s to TALON_TELEGRAM_ALLOWED_USERS)", user.id, handle, pairing.code, user.id)
            if pairing.reply is not None:
                try:
                    await self.api.bot.send_message(chat_id=msg.chat.id, text=pairing.reply)
                except TelegramError as exc:
                    log.warning("telegram: could not send the pairing code to user %s: %s", user.id, exc)
            return
        files = _remote_files(msg)
        if msg.media_group_id and msg.edit_date is None:
            self._collect_album(msg, files)
            return
        text = msg.text or msg.caption or ""
        if not text and not files:
            described = _described_content(msg)
            if described is None:
                # A service message (a pin, a timer change...): nobody said anything to answer.
                log.info("telegram: chat=%s: message %s has no text or media; nothing to answer",
                         msg.chat.id, msg.message_id)
                return
            text = described
        await self._submit(msg, text, files)

    async def _on_group_message(self, msg: TgMessage) -> None:
        """A group message: a turn when the group is listed and the message addresses the bot,
        chatter when it is listed but does not, nothing otherwise (channels/telegram/groups.py)."""
        chat = msg.chat
        if from_bot(msg):
            log.debug("telegram: chat=%s: message %s is from a bot; not a turn", chat.id, msg.message_id)
            return
        if chat.id not in self.allowed_chats:
            if msg.migrate_to_chat_id:
                log.warning("telegram: group %s (%r) became supergroup %s; to serve it add %s to "
                            "TALON_TELEGRAM_ALLOWED_CHATS", chat.id, chat.title, msg.migrate_to_chat_id,
                            msg.migrate_to_chat_id)
            elif chat.id not in self._unlisted_logged:
                self._unlisted_logged[chat.id] = True
                log.warning("telegram: message in %s %s (%r) ignored: the group is not listed; to serve it "
                            "add %s to TALON_TELEGRAM_ALLOWED_CHATS", chat.type, chat.id, chat.title, chat.id)
            else:
                log.debug("telegram: message in unlisted %s %s ignored", chat.type, chat.id)
            return
        files = _remote_files(msg)
        spoken_to = ((self.api.settings.telegram_group_trigger == "all"
                      and not for_another_bot(msg.text or msg.caption or "", self.api.bot.username))
                     or addressed(msg, self.api.bot.id, self.api.bot.username))
        if msg.media_group_id and msg.edit_date is None:
            self._collect_album(msg, files, addressed=spoken_to)
            return
        text = msg.text or msg.caption or ""
        if not text and not files:
            described = _described_content(msg)
            if described is None:
                return  # a service message (someone joined, a pin...)
            text = described
        if not spoken_to:
            if msg.edit_date is None:  # an edit that does not address the bot is not kept twice
                self.chatter.add(conversation_of(msg), label(msg), describe_unaddressed(text, len(files)))
            return
        if not files and not await self._group_command_allowed(msg, text):
            return
        word = command_word(text, self.api.bot.username) if not files else ""
        admin = word in ("/stop", "/jobs") and await self._is_admin(msg)
        await self._submit(msg, text, files, sender_admin=admin)

    async def _group_command_allowed(self, msg: TgMessage, text: str) -> bool:
        """``/new`` in a group wipes the context of everyone in it: only an administrator, or
        someone allowed in TALON_TELEGRAM_ALLOWED_USERS (or approved by pairing), may."""
        if command_word(text, self.api.bot.username) != "/new" or anonymous_admin(msg):
            return True
        user = msg.from_user
        assert user is not None
        identities = [str(user.id)] + ([f"@{user.username}"] if user.username else [])
        if await self.bridge.gate.allowed(CHANNEL, identities):
            return True
        try:
            member = await self.api.with_retries(
                lambda: self.api.bot.get_chat_member(chat_id=msg.chat.id, user_id=user.id), "getChatMember")
        except DeliveryError as exc:
            log.warning("telegram: chat=%s: cannot tell whether user %s is an administrator (%s); /new refused",
                        msg.chat.id, user.id, exc)
            refusal = ("I could not check whether you are an administrator of this group, so I did not "
                       "start a new conversation. Please try again.")
        else:
            if member.status in ADMIN_STATUSES:
                return True
            log.info("telegram: chat=%s: /new from user %s (%s, not an administrator) refused",
                     msg.chat.id, user.id, member.status)
            refusal = "Only an administrator of this group can start a new conversation here."
        token = _send_target.set(_SendTarget(thread_id=_int_or_none(thread_of(msg)), reply_to=msg.message_id))
        try:
            await self.api.send_plain(str(msg.chat.id), refusal)
        except DeliveryError as exc:
            log.warning("telegram: chat=%s: could not send the /new refusal: %s", msg.chat.id, exc)
        finally:
            _send_target.reset(token)
        return False

    async def _is_admin(self, msg: TgMessage) -> bool:
        """Whether the sender administers the group (for /stop and /jobs cancel); False when it cannot be told."""
        if anonymous_admin(msg):
            return True
        user = msg.from_user
        assert user is not None
        try:
            member = await self.api.with_retries(
                lambda: self.api.bot.get_chat_member(chat_id=msg.chat.id, user_id=user.id), "getChatMember")
        except DeliveryError as exc:
            log.warning("telegram: chat=%s: cannot tell whether user %s is an administrator (%s)",
                        msg.chat.id, user.id, exc)
            return False
        return member.status in ADMIN_STATUSES

    def _collect_album(self, msg: TgMessage, files: list[RemoteFile], *, addressed: bool = True) -> None:
        """Telegram sends an album as one message per item; gather them into one turn."""
        assert msg.media_group_id is not None
        key = _album_key(msg.chat.id, msg.media_group_id)
        album = self._albums.get(key)
        if album is None:
            album = self._albums[key] = Album(first=msg, addressed=addressed)
        else:
            album.addressed = album.addressed or addressed
            if album.timer:
                album.timer.cancel()
        album.files.extend(files)
        if msg.caption and not album.caption:
            album.caption = msg.caption
        loop = asyncio.get_running_loop()
        album.timer = loop.call_later(ALBUM_WAIT_S, self._flush_album_soon, key)

    def _flush_album_soon(self, key: str) -> None:
        task = asyncio.create_task(self._flush_album(key), name=f"album-{key}")
        self._album_tasks.add(task)
        task.add_done_callback(self._album_tasks.discard)

    async def _flush_album(self, key: str) -> None:
        album = self._albums.pop(key, None)
        if album is not None:
            try:
                if not album.addressed:  # a group album nobody asked the bot about
                    self.chatter.add(conversation_of(album.first), label(album.first),
                                     describe_unaddressed(album.caption, len(album.files)))
                    return
                await self._submit(album.first, album.caption, album.files)
            except Exception as exc:
                album.error = exc  # a webhook request waiting for the album answers 500
                raise
            finally:
                album.submitted.set()

    async def _submit(self, msg: TgMessage, text: str, files: list[RemoteFile], *,
                      sender_admin: bool = False) -> None:
        reply = msg.reply_to_message
        quoted = (reply.text or reply.caption) if reply is not None else None
        user = msg.from_user
        assert user is not None
        name, username = sender_of(msg)
        group = msg.chat.type in GROUP_TYPES
        # A command (/status, /new) is answered without the model: the chatter waits for a turn.
        command = not files and bool(command_word(text, self.api.bot.username))
        await self.bridge.submit(
            InboundMessage(
                channel=CHANNEL,
                chat_id=str(msg.chat.id),
                sender_id=str(msg.sender_chat.id if anonymous_admin(msg) and msg.sender_chat else user.id),
                sender_name=name,
                sender_username=username,
                message_id=str(msg.message_id),
                text=text,
                files=files,
                reply_to_text=quoted,
                chat_type=msg.chat.type,
                chat_title=msg.chat.title,
                thread_id=thread_of(msg) if group else None,
                thread_title=topic_title(msg) if group else None,
                chatter=self.chatter.take(conversation_of(msg)) if group and not command else [],
                reply_to_sender=self._replied_to(msg) if group else None,
                edited_at=_edit_stamp(msg, text),
                sender_admin=sender_admin,
            )
        )

    def _replied_to(self, msg: TgMessage) -> str | None:
        """Who wrote the message a group message replies to, as the model is told it."""
        root = msg.reply_to_message
        if root is None or not is_real_reply(msg):
            return None
        if root.from_user is not None and root.from_user.id == self.api.bot.id:
            return "you"
        return label(root)


def _album_key(chat_id: int, media_group_id: str) -> str:
    return f"{chat_id}:{media_group_id}"


def _edit_stamp(msg: TgMessage, text: str) -> str | None:
    """Which edit of a message this is (None: not an edit): its edit time and a digest of the
    text, so two edits within one second are still two."""
    if msg.edit_date is None:
        return None
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{int(msg.edit_date.timestamp())}-{digest}"


def _remote_files(msg: TgMessage) -> list[RemoteFile]:
    files: list[RemoteFile] = []
    if msg.photo:
        best = msg.photo[-1]
        files.append(RemoteFile(kind="photo", source=best.file_id, name=f"photo_{msg.message_id}.jpg",
                                mime="image/jpeg", size=best.file_size))
    if msg.animation:
        a = msg.animation
        files.append(RemoteFile(kind="animation", source=a.file_id, name=a.file_name,
                                mime=a.mime_type, size=a.file_size))
    elif msg.document:
        d = msg.document
        kind: InboundKind = "image" if (d.mime_type or "").startswith("image/") else "document"
        files.append(RemoteFile(kind=kind, source=d.file_id, name=d.file_name, mime=d.mime_type,
                                size=d.file_size))
    if msg.voice:
        v = msg.voice
        files.append(RemoteFile(kind="voice", source=v.file_id, name=f"voice_{msg.message_id}.ogg",
                                mime=v.mime_type or "audio/ogg", size=v.file_size))
    if msg.audio:
        au = msg.audio
        files.append(RemoteFile(kind="audio", source=au.file_id, name=au.file_name or f"audio_{msg.message_id}",
                                mime=au.mime_type, size=au.file_size))
    if msg.video:
        vi = msg.video
        files.append(RemoteFile(kind="video", source=vi.file_id, name=vi.file_name or f"video_{msg.message_id}.mp4",
                                mime=vi.mime_type or "video/mp4", size=vi.file_size))
    if msg.video_note:
        vn = msg.video_note
        files.append(RemoteFile(kind="video_note", source=vn.file_id, name=f"video_note_{msg.message_id}.mp4",
                                mime="video/mp4", size=vn.file_size))
    if msg.sticker:
        s = msg.sticker
        animated = bool(s.is_animated or s.is_video)
        files.append(RemoteFile(kind="sticker", source=s.file_id, name=f"sticker_{msg.message_id}.webp",
                                mime="image/webp", size=s.file_size, emoji=s.emoji, animated=animated))
    return files


def _described_content(msg: TgMessage) -> str | None:
    """Words for the agent about a message that carries neither text nor a file (a location, a
    contact...); None for a service message, which is not something a person said."""
    if msg.venue:
        v = msg.venue
        place = ", ".join(p for p in (v.title, v.address) if p)
        return f"[Shared a place: {v.location.latitude}, {v.location.longitude} ({place})]"
    if msg.location:
        return f"[Shared a location: {msg.location.latitude}, {msg.location.longitude}]"
    if msg.contact:
        c = msg.contact
        name = " ".join(p for p in (c.first_name, c.last_name) if p)
        return f"[Shared a contact: {name}, {c.phone_number}]"
    if msg.poll:
        options = "; ".join(o.text for o in msg.poll.options)
        return f"[Sent a poll: {msg.poll.question} (options: {options})]"
    if msg.dice:
        return f"[Rolled a {msg.dice.emoji}: {msg.dice.value}]"
    attachment = msg.effective_attachment
    if attachment:
        kind = type(attachment[0] if isinstance(attachment, tuple) else attachment).__name__
        return f"[Sent something Talon cannot show: a Telegram {kind}]"
    return None
