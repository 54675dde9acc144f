"""What the model got of a person's files, in lines the person can read.

The agent reads a notice for every file it cannot use (``build_inbound_text``); a chat app shows
the person nothing of that. The console shows them these lines instead, so a try-out makes
plain what the model saw: a photo a text-only model never saw, a voice note's transcript, a file
that could not be read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from talon.media.inbound import PreparedAttachment, _title
from talon.speech.transcribe import format_duration

# A transcript is shown whole up to this many characters (the model got it whole regardless).
_MAX_SHOWN_CHARS = 2000


@dataclass(frozen=True)
class ReceivedNote:
    text: str
    problem: bool  # the model did not get (all of) the file


def received_notes(attachments: Sequence[PreparedAttachment], *, vision: bool) -> list[ReceivedNote]:
    """One note per file the model did not see as sent, and per transcript it read instead."""
    notes: list[ReceivedNote] = []
    for att in attachments:
        title = _title(att)
        if att.failure is not None:
            verb = {"receive": "received", "read": "read", "transcribe": "transcribed"}[att.failure_stage]
            notes.append(ReceivedNote(f"{title} could not be {verb}: {att.failure} (the model was told so)", True))
        elif att.images and not vision:
            what = "its frames were" if att.has_frames else "it was"
            where = f"; it was told the file is saved at {att.path}" if att.path else ""
            notes.append(ReceivedNote(f"{title}: not seen by the model, {what} not shown because the model "
                                      f"takes no images{where}", True))
        elif att.kind == "sticker" and att.animated:
            notes.append(ReceivedNote(f"{title}: an animated sticker, not shown to the model", True))
        if att.transcript is not None:
            text = att.transcript.text.strip()
            if len(text) > _MAX_SHOWN_CHARS:
                text = text[:_MAX_SHOWN_CHARS - 3] + "..."
            damaged = ", damaged: only its start" if att.transcript.partial else ""
            notes.append(ReceivedNote(
                f"{title} ({format_duration(att.transcript.duration_s)}{damaged}), transcribed for the model: "
                f"{text or '(no speech heard)'}", False))
    return notes
