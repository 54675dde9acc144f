"""Envelopes that travel between channels and the bridge (vendor neutral, JSON-serializable).

An ``InboundMessage`` is what the durable inbox stores: it names its files by the platform's
own handle (``RemoteFile.source``) so that the download can happen inside the chat's turn, after
the message is safe on disk, and again after a restart.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from talon.content import InboundKind
from talon.media.outbound import MarkdownMediaRef


class RemoteFile(BaseModel):
    kind: InboundKind
    source: str  # Telegram file_id, Twilio media URL...
    name: str | None = None
    mime: str | None = None
    size: int | None = None
    emoji: str | None = None
    animated: bool = False


def conversation_id(chat_id: str, thread_id: str | None) -> str:
    """A chat's own conversation is its id; a forum topic's is ``<chat>:<topic>``."""
    return chat_id if thread_id is None else f"{chat_id}:{thread_id}"


class Chatter(BaseModel):
    """A group message the bot saw but that did not address it: context for the next turn."""

    speaker: str
    text: str


class ScheduledRun(BaseModel):
    """What makes an inbox message a run of a scheduled task rather than words of a person."""

    task_id: str
    due: float  # when the run was due (epoch seconds)
    task_text: str = ""  # what the task says, as its owner wrote it ("" in runs queued before it was kept)


class BackgroundJobRun(BaseModel):
    """What makes an inbox message a background delegation (``talon.jobs``) rather than words of a
    person: the bridge runs it as a sub-agent beside the chat's turns and delivers its answer as a
    message of its own, in the chat's order."""

    job_id: str
    # The message that delivers the job's answer, in the chat's order (the shared bridge runs the
    # job itself from a message in a lane of its own; ``talon.storage.inbox.inbox_lane``).
    answer: bool = False


class InboundMessage(BaseModel):
    channel: str
    chat_id: str
    sender_id: str
    message_id: str
    text: str = ""
    sender_name: str | None = None
    files: list[RemoteFile] = Field(default_factory=list)
    reply_to_text: str | None = None
    received_at: float = Field(default_factory=time.time)
    # Groups (all optional, so inbox rows stored before groups were served still load).
    chat_type: str = "private"  # private, group or supergroup
    chat_title: str | None = None
    thread_id: str | None = None  # a forum topic's message_thread_id; None outside topics
    thread_title: str | None = None
    sender_username: str | None = None
    reply_to_sender: str | None = None  # who wrote the message replied to ("you": the bot)
    chatter: list[Chatter] = Field(default_factory=list)  # unaddressed messages seen before this one
    # The sender administers this group, as the channel checked it (for /stop, which in a group
    # only the turn's starter, an administrator or an approver may use).
    sender_admin: bool = False
    # A person edited message ``message_id``; this is its new version (the platform's edit time,
    # so each edit is its own inbox row). None for a message as first sent.
    edited_at: str | None = None
    # Set when this is a run of a scheduled task (talon.scheduler): the text is the task's, the
    # sender its owner; it is answered like a message but replies to none.
    scheduled: ScheduledRun | None = None
    # Set when this is a background delegation (talon.jobs): the sender is who asked for it.
    job: BackgroundJobRun | None = None

    @property
    def is_group(self) -> bool:
        return self.chat_type in ("group", "supergroup")

    @property
    def conversation_id(self) -> str:
        """What a conversation (session, ordering, workspace) is keyed by: the chat, or the chat
        and topic for a forum topic. Sends still go to ``chat_id`` (with the thread)."""
        return conversation_id(self.chat_id, self.thread_id)

    @property
    def key(self) -> str:
        """Unique per platform message (and per edit of it): the dedup key of the inbox."""
        key = f"{self.channel}:{self.chat_id}:{self.message_id}"
        return key if self.edited_at is None else f"{key}:edit:{self.edited_at}"

    @property
    def original_key(self) -> str:
        """The key of the message as first sent (an edit's original)."""
        return f"{self.channel}:{self.chat_id}:{self.message_id}"


# The message whose turn is running, for tools that act for the person where they spoke
# (scheduling a task). The bridge sets it inside the turn's own asyncio task.
TURN_MESSAGE: ContextVar[InboundMessage | None] = ContextVar("talon_turn_message", default=None)


@dataclass(frozen=True)
class VoiceWish:
    """This answer should also go as a voice note (see talon.speech.voice_replies)."""

    language: str | None = None  # ISO 639-1; None: the default voice
    asked: bool = False  # the agent called the speak tool


@dataclass
class OutboundReply:
    """What the agent said, split into text and the media it referenced."""

    text: str
    media: list[MarkdownMediaRef] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    # Where in the chat it goes: a forum topic, and (in groups) the message it answers.
    thread_id: str | None = None
    reply_to_message_id: str | None = None
    # Set when the answer is also to be spoken; the bridge delivers the voice note after the text.
    voice: VoiceWish | None = None
    # The message that showed this answer while it was written (streamed, then edited): the
    # reply's first text part edits it instead of sending a new message.
    live_message_id: str | None = None
    # The text of the scheduled task this reply answers (None for a person's message): a channel
    # that may not speak first freely (WhatsApp outside its 24-hour window) puts it in a reminder.
    scheduled_task: str | None = None
    # The same for every delivery of this reply, the one after a restart included (the inbox item
    # and where its parts start): a platform that can refuse a send it has already taken
    # (Discord's enforced nonce) is given a key per part from it, so a part sent just before a
    # SIGKILL, and sent again after the restart, arrives once.
    delivery_key: str | None = None


@dataclass
class LiveReply:
    """Where a channel shows a reply while the model writes it (streamed text).

    ``on_text`` gets each text delta of the current model step; ``on_step`` hears when a step
    ended, True when it asked for tools (the text so far was a preamble; more follows). ``close``
    is called when the turn ended (answered, failed or stopped), before the final reply goes, so no
    update lands after it. The final reply is still delivered through ``Channel.deliver``; if the
    live view left a message that is to become the answer, the channel reported its id through
    the ``placed`` callback it was given, and the reply's ``live_message_id`` names it.
    """

    on_text: Callable[[str], Awaitable[None]]
    on_step: Callable[[bool], Awaitable[None]] | None = None
    close: Callable[[], Awaitable[None]] | None = None
