"""Envelopes that travel between channels and the bridge (vendor neutral, JSON-serializable).

An ``InboundMessage`` is what the durable inbox stores: it names its files by the platform's
own handle (``RemoteFile.source``) so that the download can happen inside the chat's turn, after
the message is safe on disk, and again after a restart.
"""

from __future__ import annotations

import time
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

    @property
    def key(self) -> str:
        """Unique per platform message: the dedup key of the inbox."""
        return f"{self.channel}:{self.chat_id}:{self.message_id}"


@dataclass(frozen=True)
class VoiceWish:
    """This answer should also go as a voice note (see talon.voice_replies)."""

    language: str | None = None  # ISO 639-1; None: the default voice
    asked: bool = False  # the agent called the speak tool


@dataclass
class OutboundReply:
    """What the agent said, split into text and the media it referenced."""

    text: str
    media: list[MarkdownMediaRef] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    # Set when the answer is also to be spoken; the bridge delivers the voice note after the text.
    voice: VoiceWish | None = None
