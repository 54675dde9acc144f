"""Telegram groups and supergroups: which messages become turns, and what travels with them.

- **Which groups.** Only chats listed in ``TALON_TELEGRAM_ALLOWED_CHATS``; in a listed group every
  member may address the bot. A message from an unlisted group is dropped (the log names the chat
  id and title to add, once per chat and run). Pairing codes are never posted in a group.
- **Only when addressed** (``TALON_TELEGRAM_GROUP_TRIGGER=mention``, the default): an @mention of
  the bot (a ``mention`` entity with its username, or a ``text_mention`` of its user), a reply to
  one of its messages, or a command that is not meant for another bot (``/new``,
  ``/new@this_bot``; not ``/new@other_bot``). Captions count like text. In a forum topic every
  message "replies" to the topic's creation message; that is not a reply to the bot. ``all``
  makes every message a turn, except a command for another bot (``/new@other_bot``).
- **Bots.** Messages from bots (other bots, and the bot itself) are never turns and never
  chatter, so two bots cannot talk each other into a loop. An anonymous administrator posts as
  the group itself (``sender_chat`` is the chat) and is a person for this purpose.
- **Chatter.** Messages the bot sees that do not address it are kept, per conversation, up to
  ``TALON_TELEGRAM_GROUP_CONTEXT`` of them, and handed to the next addressed turn (then
  forgotten); a command (``/status``) is answered without the model and leaves them in place. They live in memory only: after a restart the group's context starts empty. With
  BotFather's privacy mode on (the default), Telegram does not send them at all.
- **Topics.** In a forum supergroup a message with ``is_topic_message`` belongs to topic
  ``message_thread_id``: its own conversation. Other messages (the General topic, ordinary
  groups) belong to the chat.
"""

from __future__ import annotations

import logging

from telegram import Message as TgMessage
from telegram import MessageEntity

from talon.envelope import conversation_id
from talon.groups import speaker_label

# Shared with the other channels (channels/rooms.py); the intake imports them from here.
from channels.rooms import ChatterLog, describe_unaddressed  # noqa: F401

log = logging.getLogger(__name__)

GROUP_TYPES = frozenset({"group", "supergroup"})
ADMIN_STATUSES = frozenset({"creator", "administrator"})


def thread_of(msg: TgMessage) -> str | None:
    """The forum topic a message belongs to, or None (General topic, ordinary groups)."""
    if msg.is_topic_message and msg.message_thread_id is not None:
        return str(msg.message_thread_id)
    return None


def topic_title(msg: TgMessage) -> str | None:
    """A topic's name, when the message shows it (Telegram links each topic message to the
    service message that created the topic)."""
    root = msg.reply_to_message
    if thread_of(msg) is not None and root is not None and root.forum_topic_created is not None:
        return root.forum_topic_created.name
    return None


def conversation_of(msg: TgMessage) -> str:
    return conversation_id(str(msg.chat.id), thread_of(msg))


def anonymous_admin(msg: TgMessage) -> bool:
    """Posted by an administrator who hides behind the group's name."""
    return msg.sender_chat is not None and msg.sender_chat.id == msg.chat.id


def from_bot(msg: TgMessage) -> bool:
    if anonymous_admin(msg):
        return False
    if msg.sender_chat is not None:  # a linked channel's post, another chat speaking
        return True
    return msg.from_user is None or bool(msg.from_user.is_bot)


def sender_of(msg: TgMessage) -> tuple[str, str | None]:
    """(display name, username) of who speaks."""
    if anonymous_admin(msg):
        return f"an administrator of {msg.chat.title or 'the group'}", None
    if msg.sender_chat is not None:  # a linked channel (only ever quoted, never a turn)
        return msg.sender_chat.title or "a channel", msg.sender_chat.username
    user = msg.from_user
    return (user.full_name, user.username) if user is not None else ("someone", None)


def is_real_reply(msg: TgMessage) -> bool:
    root = msg.reply_to_message
    if root is None:
        return False
    return not (root.forum_topic_created is not None
                or (msg.is_topic_message and root.message_id == msg.message_thread_id))


def replies_to_bot(msg: TgMessage, bot_id: int) -> bool:
    root = msg.reply_to_message
    return (is_real_reply(msg) and root is not None and root.from_user is not None
            and root.from_user.id == bot_id)


def addressed(msg: TgMessage, bot_id: int, bot_username: str) -> bool:
    """Whether a group message speaks to this bot (see the module docstring)."""
    if replies_to_bot(msg, bot_id):
        return True
    mine = "@" + bot_username.lower()
    entities = msg.parse_entities() if msg.text else msg.parse_caption_entities()
    for entity, text in entities.items():
        if entity.type == MessageEntity.MENTION and text.lower() == mine:
            return True
        if entity.type == MessageEntity.TEXT_MENTION and entity.user is not None and entity.user.id == bot_id:
            return True
        if entity.type == MessageEntity.BOT_COMMAND and entity.offset == 0:
            _, _, target = text.partition("@")
            if not target or target.lower() == bot_username.lower():
                return True
    return False


def command_word(text: str, bot_username: str) -> str:
    """``/new@this_bot extra`` -> ``/new``; "" when the text is not a command for this bot."""
    word = text.strip().split(maxsplit=1)[0] if text.strip() else ""
    if not word.startswith("/"):
        return ""
    name, _, target = word.partition("@")
    if target and target.lower() != bot_username.lower():
        return ""
    return name.lower()


def for_another_bot(text: str, bot_username: str) -> bool:
    """``/cmd@other_bot``: a command meant for someone else, never a turn of ours."""
    word = text.strip().split(maxsplit=1)[0] if text.strip() else ""
    return word.startswith("/") and "@" in word and not command_word(text, bot_username)


def label(msg: TgMessage) -> str:
    name, username = sender_of(msg)
    return speaker_label(name, username)
