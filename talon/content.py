"""The one vendor-neutral content language that crosses the bridge.

Media blocks never carry bytes: they carry an ``AttachmentRef`` into the content-addressed
attachment store. Base64 exists only on the wire to a model provider, made at request time.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field


class AttachmentRef(BaseModel):
    """A pointer into the attachment store (sha256 of the stored bytes)."""

    model_config = ConfigDict(frozen=True)

    id: str
    mime: str
    bytes: int
    name: str | None = None
    width: int | None = None
    height: int | None = None
    # Where the file also lives inside the media root (relative), so the agent's file tools can
    # look at it again. None when it is only in the store.
    path: str | None = None


class TextBlock(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ImageBlock(BaseModel):
    type: Literal["image"] = "image"
    ref: AttachmentRef


class AudioBlock(BaseModel):
    type: Literal["audio"] = "audio"
    ref: AttachmentRef
    transcript: str | None = None
    duration_s: float | None = None


class FileBlock(BaseModel):
    type: Literal["file"] = "file"
    ref: AttachmentRef


ContentBlock = Annotated[
    Union[TextBlock, ImageBlock, AudioBlock, FileBlock], Field(discriminator="type")
]

Role = Literal["user", "assistant", "tool"]

InboundKind = Literal[
    "photo", "image", "document", "voice", "audio", "video", "video_note", "animation", "sticker"
]


class InboundFile(BaseModel):
    """A file a person sent, as a channel hands it to the inbound normalizer.

    ``ref`` is the downloaded bytes in the attachment store; it is None when the channel could not
    fetch the file, and then ``notice`` says why (too large, platform refused...).
    """

    kind: InboundKind
    ref: AttachmentRef | None = None
    name: str | None = None
    mime: str | None = None
    size: int | None = None
    notice: str | None = None
    # stickers
    emoji: str | None = None
    animated: bool = False



class ToolCall(BaseModel):
    id: str
    name: str
    # JSON text exactly as the model produced it; parsed by the tool layer.
    arguments: str = "{}"

    def parsed_arguments(self) -> dict[str, Any]:
        try:
            value = json.loads(self.arguments or "{}")
        except json.JSONDecodeError as exc:
            raise ValueError(f"tool arguments are not valid JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise ValueError("tool arguments must be a JSON object")
        return value


class Message(BaseModel):
    """One turn of a conversation. ``meta`` is private bookkeeping and never reaches a model."""

    role: Role
    content: list[ContentBlock] = Field(default_factory=list)
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    tool_name: str | None = None
    meta: dict[str, Any] = Field(default_factory=dict)
    # When the message was received or sent (seconds since the epoch, UTC), stamped by the session
    # store as it is stored. None in lines written before stamps existed: they still load.
    at: float | None = None

    @classmethod
    def user(cls, text: str, **meta: Any) -> "Message":
        return cls(role="user", content=[TextBlock(text=text)], meta=meta)

    @classmethod
    def assistant(cls, text: str, **meta: Any) -> "Message":
        return cls(role="assistant", content=[TextBlock(text=text)] if text else [], meta=meta)

    @property
    def text(self) -> str:
        """All text blocks joined: what a person would read of this message."""
        return "\n".join(b.text for b in self.content if isinstance(b, TextBlock))

    def images(self) -> list[ImageBlock]:
        return [b for b in self.content if isinstance(b, ImageBlock)]

    def to_json(self) -> str:
        return self.model_dump_json(exclude_none=True)

    @classmethod
    def from_json(cls, line: str) -> "Message":
        return cls.model_validate_json(line)


__all__ = [
    "AttachmentRef",
    "AudioBlock",
    "ContentBlock",
    "FileBlock",
    "ImageBlock",
    "InboundFile",
    "InboundKind",
    "Message",
    "Role",
    "TextBlock",
    "ToolCall",
]
