"""Very long replies: the head as messages, the whole text as a document.

A model can answer with a megabyte of text; split into messages that would be hundreds of
sends, flooding the chat and the platform's rate limits. Past a few messages (a setting per
channel) the channel sends the first message of the reply, a line saying what follows, and the
complete reply, unchanged, as ``reply.md``. The decision is a function of the reply alone, so a
delivery resumed after a crash plans the same parts.
"""

from __future__ import annotations

__all__ = ["REPLY_DOCUMENT_MIME", "REPLY_DOCUMENT_NAME", "long_reply_note", "reply_document"]

REPLY_DOCUMENT_NAME = "reply.md"
REPLY_DOCUMENT_MIME = "text/markdown"


def long_reply_note(total_chars: int, messages: int) -> str:
    return (f"(The reply is {total_chars:,} characters, about {messages} messages: the whole of it "
            f"is in {REPLY_DOCUMENT_NAME}.)")


def reply_document(text: str) -> bytes:
    return text.encode("utf-8")
