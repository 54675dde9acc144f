"""What the console tells the person the model got of their files (talon.media.received)."""

from __future__ import annotations

from talon.media.inbound import PreparedAttachment, ShownImage
from talon.media.received import received_notes
from talon.content import AttachmentRef
from talon.speech.transcribe import Transcript


def _image(**kw: object) -> PreparedAttachment:
    ref = AttachmentRef(id="a" * 64, mime="image/png", bytes=10, width=4, height=3)
    return PreparedAttachment(kind="photo", name="cat.png", path="inbox/cat.png",
                              images=(ShownImage(ref),), **kw)  # type: ignore[arg-type]


def test_an_image_a_text_only_model_did_not_see_is_said() -> None:
    [note] = received_notes([_image()], vision=False)
    assert note.problem
    assert note.text == ("Photo cat.png: not seen by the model, it was not shown because the model takes no "
                         "images; it was told the file is saved at inbox/cat.png")


def test_an_image_the_model_saw_needs_no_note() -> None:
    assert received_notes([_image()], vision=True) == []


def test_a_transcript_is_shown_as_the_model_got_it() -> None:
    voice = PreparedAttachment(kind="voice", name=None, path="inbox/voice.ogg",
                               transcript=Transcript(text=" Meet me at noon. ", duration_s=4.2))
    [note] = received_notes([voice], vision=True)
    assert not note.problem
    assert note.text == "Voice note (0:04), transcribed for the model: Meet me at noon."


def test_a_file_that_could_not_be_read_says_why() -> None:
    broken = PreparedAttachment(kind="document", name="report.pdf", failure="the PDF is encrypted")
    [note] = received_notes([broken], vision=True)
    assert note.problem and note.text == ("Document report.pdf could not be read: the PDF is encrypted "
                                          "(the model was told so)")
