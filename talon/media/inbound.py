"""The inbound normalizer: what a person sent -> the content blocks the agent sees.

Two steps, kept apart so the wording can be tested with plain values:

1. ``prepare_attachment`` (async, does the I/O): copies each file into the workspace so the agent's
   tools can open it, routes it by kind and by content (never by extension alone) to the image,
   document, speech or video module, and returns a ``PreparedAttachment`` — pure data holding
   image refs, document text, a transcript, or the reason it could not be used.
2. ``build_inbound_text`` / ``build_model_content`` (pure) turn the user's text plus those
   prepared attachments into one text block followed by image blocks.

``normalize_inbound`` is both steps. Every file comes out as something the agent can see: an image,
text, or a specific notice. Nothing is dropped silently.

CPU-heavy work (decoding, resizing, PDF parsing) runs in a bounded thread pool: the context's
executor, or by default one process-wide pool sized to the CPUs, so a burst of photos across many
chats cannot starve the event loop or oversubscribe the machine. Transcription has its own
bounded pool inside the ``Transcriber``.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import mimetypes
import os
import threading
import unicodedata
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Literal, TypeVar

from talon.storage.attachments import AttachmentStore
from talon.config import Limits
from talon.content import AttachmentRef, ContentBlock, ImageBlock, InboundFile, InboundKind, TextBlock
from talon.errors import AttachmentError, MediaError, TranscriptionError, UnsafePath
from talon.media.documents import (
    DocumentText,
    is_text_document,
    read_pdf_document,
    read_text_document,
    render_document,
)
from talon.media.markers import defang_untrusted
from talon.media.sniff import SNIFF_BYTES, sniff
from talon.safe_files import new_file_beneath
from talon.speech.transcribe import Transcriber, Transcript, format_duration, language_name, probe_duration

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_MAX_REASON_CHARS = 300
_MAX_NAME_BYTES = 180  # well under the 255-byte file name limit of common filesystems
_NAME_PUNCTUATION = set(" ._-()[]+,@=")

Route = Literal["image", "animated_sticker", "audio", "video", "pdf", "text", "binary"]
FailureStage = Literal["receive", "read", "transcribe"]


@dataclass
class InboundContext:
    """Everything the normalizer needs, passed in (no globals)."""

    store: AttachmentStore
    media_root: Path
    limits: Limits = field(default_factory=Limits)
    transcriber: Transcriber | None = None
    vision: bool = True
    # Where inbound files are copied, relative to media_root, e.g. "inbox/telegram-42".
    save_dir: str = "inbox"
    # Bounded pool for CPU-heavy work; None means the shared media pool.
    executor: Executor | None = None
    # Told of every voice note or audio file transcribed (voice replies use its language).
    on_transcript: Callable[[InboundKind, Transcript], None] | None = None
    # Told what became of the files, with the vision used (the console shows the person).
    on_prepared: Callable[[list["PreparedAttachment"], bool], None] | None = None


@dataclass(frozen=True)
class ShownImage:
    """An image block to show; ``timestamp_s`` is set for video frames."""

    ref: AttachmentRef
    timestamp_s: float | None = None


@dataclass(frozen=True)
class PreparedAttachment:
    """One inbound file after preparation: what to show and what to say about it."""

    kind: InboundKind
    name: str | None  # sanitized file name, if the file has one worth showing
    path: str | None = None  # the saved copy, relative to the media root
    size: int | None = None
    mime: str | None = None
    emoji: str | None = None
    images: tuple[ShownImage, ...] = ()
    dimensions: tuple[int, int] | None = None  # of the original, when an image or video
    duration_s: float | None = None
    document: DocumentText | None = None
    transcript: Transcript | None = None
    # Why the file (or, for a video, its audio) could not be used; ``stage`` says which step.
    failure: str | None = None
    failure_stage: FailureStage = "read"
    notes: tuple[str, ...] = ()
    animated: bool = False

    @property
    def has_frames(self) -> bool:
        return any(image.timestamp_s is not None for image in self.images)


# --- 1. preparation (async, I/O) -----------------------------------------------------------------


async def normalize_inbound(
    text: str, files: list[InboundFile], ctx: InboundContext
) -> list[ContentBlock]:
    """The user's message as content blocks: one text block, then image blocks."""
    # Copies are saved one at a time, in message order, so "photo.jpg", "photo-1.jpg"... follow
    # the order the person sent them; reading the files then runs concurrently.
    saved = [await _save_copy(f, ctx) for f in files]
    prepared = await asyncio.gather(*(_prepare(f, ctx, s) for f, s in zip(files, saved)))
    if ctx.on_prepared is not None and prepared:
        ctx.on_prepared(list(prepared), ctx.vision)
    return build_model_content(
        text, prepared, vision=ctx.vision, max_document_chars=ctx.limits.document_max_chars
    )


async def prepare_attachment(file: InboundFile, ctx: InboundContext) -> PreparedAttachment:
    """Save, route and read one file; any failure becomes the attachment's ``failure``."""
    return await _prepare(file, ctx, await _save_copy(file, ctx))


@dataclass(frozen=True)
class _Saved:
    path: str | None
    name: str
    error: str | None = None


async def _save_copy(file: InboundFile, ctx: InboundContext) -> _Saved | None:
    if file.ref is None:
        return None
    name = safe_file_name(file.name, _fallback_name(file))
    try:
        blob = await ctx.store.file_path(file.ref)
        path = await _run(ctx, lambda: save_inbound_copy(blob, ctx.media_root, ctx.save_dir, name))
    except (AttachmentError, OSError) as exc:
        # The store still has the bytes, so the file is still read; the agent is told it has no
        # workspace copy.
        log.warning("inbound %s could not be saved to the workspace: %s", name, exc)
        return _Saved(None, name, str(exc))
    return _Saved(path, name)


async def _prepare(file: InboundFile, ctx: InboundContext, saved: _Saved | None) -> PreparedAttachment:
    base = PreparedAttachment(
        kind=file.kind, name=_display_name(file), size=file.size, mime=file.mime,
        emoji=file.emoji, animated=file.animated,
    )
    if file.ref is None or saved is None:
        return replace(
            base, failure=file.notice or "the platform did not provide the file",
            failure_stage="receive",
        )
    base = replace(
        base, size=file.ref.bytes, mime=file.mime or file.ref.mime, path=saved.path,
        name=base.name or saved.name,
        notes=(f"it could not be saved to the workspace: {saved.error}",) if saved.error else (),
    )
    try:
        blob = await ctx.store.file_path(file.ref)
        head = await _run(ctx, lambda: _read_head(blob))
        route = choose_route(file, head)
        prepared = await _ROUTES[route](file, blob, base, ctx)
    except (MediaError, TranscriptionError, AttachmentError) as exc:
        stage: FailureStage = "transcribe" if isinstance(exc, TranscriptionError) else "read"
        return replace(base, failure=str(exc), failure_stage=stage)
    except Exception as exc:  # a bug or an unexpected library error must not lose the message
        log.exception("inbound %s %s could not be prepared", file.kind, file.name)
        return replace(base, failure=f"it could not be processed (internal error: {type(exc).__name__})")
    return prepared


def choose_route(file: InboundFile, head: bytes) -> Route:
    """Which reader takes the file: the platform's kind first, the content for documents."""
    if file.kind == "sticker":
        return "animated_sticker" if file.animated else "image"
    if file.kind in ("photo", "image"):
        return "image"
    if file.kind in ("voice", "audio"):
        return "audio"
    if file.kind in ("video", "video_note", "animation"):
        return "video"
    sniffed = sniff_media(head)
    if sniffed is not None:
        return sniffed
    if head and is_text_document(file.name, file.mime, head):
        return "text"
    return "binary"


def sniff_media(head: bytes) -> Literal["image", "audio", "video", "pdf"] | None:
    """The reader the first bytes call for (``talon.media.sniff``), or None for text and binaries."""
    sniffed = sniff(head)
    if sniffed is None:
        return None
    if sniffed.format == "pdf":
        return "pdf"
    if sniffed.family == "document":
        return None  # a ZIP or an SVG: read as text if it is text, else described as a file
    return sniffed.family


# Pillow and PyAV are imported with the first image or video, in the pool's thread (an import
# reads files: never on the event loop), not with Talon: most chats never send one.
def _images() -> ModuleType:
    from talon.media import images

    return images


def _video_frames() -> ModuleType:
    from talon.media import video

    return video


async def _image(file: InboundFile, blob: Path, base: PreparedAttachment, ctx: InboundContext) -> PreparedAttachment:
    prepared = await _run(
        ctx,
        lambda: _images().prepare_image(
            blob, store=ctx.store.blocking, limits=ctx.limits, name=base.name, source_ref=file.ref
        ),
    )
    ref = prepared.ref.model_copy(update={"path": base.path})
    return replace(
        base, images=(ShownImage(ref),),
        dimensions=(prepared.original_width, prepared.original_height),
    )


async def _animated_sticker(
    file: InboundFile, blob: Path, base: PreparedAttachment, ctx: InboundContext
) -> PreparedAttachment:
    return base  # the emoji says what it shows; the notice is worded by build_inbound_text


async def _audio(file: InboundFile, blob: Path, base: PreparedAttachment, ctx: InboundContext) -> PreparedAttachment:
    if ctx.transcriber is None or not ctx.transcriber.available:
        duration = await _run(ctx, lambda: probe_duration(blob))
        return replace(
            base, duration_s=duration, failure=_no_transcriber(ctx), failure_stage="transcribe"
        )
    transcript = await ctx.transcriber.transcribe(blob)
    if ctx.on_transcript is not None:
        ctx.on_transcript(file.kind, transcript)
    return replace(base, transcript=transcript, duration_s=transcript.duration_s)


async def _video(file: InboundFile, blob: Path, base: PreparedAttachment, ctx: InboundContext) -> PreparedAttachment:
    sample = await _run(
        ctx, lambda: _video_frames().sample_video(blob, store=ctx.store.blocking, limits=ctx.limits, name=base.name)
    )
    if not sample.has_video:
        # An audio-only MP4/WebM sent as a video or document: it is a recording.
        return await _audio(file, blob, replace(base, duration_s=sample.duration_s), ctx)
    frames = tuple(
        ShownImage(f.ref.model_copy(update={"path": base.path}), f.timestamp_s) for f in sample.frames
    )
    notes = list(base.notes) + list(sample.notes)
    prepared = replace(
        base, images=frames, duration_s=sample.duration_s,
        dimensions=(sample.width, sample.height) if sample.width and sample.height else None,
    )
    if sample.has_audio:
        if ctx.transcriber is not None and ctx.transcriber.available:
            try:
                transcript = await ctx.transcriber.transcribe(blob)
                prepared = replace(prepared, transcript=transcript)
            except TranscriptionError as exc:
                notes.append(f"its audio track was not transcribed: {exc}")
        else:
            notes.append(f"its audio track was not transcribed: {_no_transcriber(ctx)}")
    return replace(prepared, notes=tuple(notes))


def _no_transcriber(ctx: InboundContext) -> str:
    reason = ctx.transcriber.unavailable_reason if ctx.transcriber is not None else None
    return reason or "no transcriber is configured"


async def _pdf(file: InboundFile, blob: Path, base: PreparedAttachment, ctx: InboundContext) -> PreparedAttachment:
    doc = await _run(ctx, lambda: read_pdf_document(blob, max_chars=ctx.limits.document_max_chars))
    return replace(base, document=doc)


async def _text(file: InboundFile, blob: Path, base: PreparedAttachment, ctx: InboundContext) -> PreparedAttachment:
    doc = await _run(ctx, lambda: read_text_document(blob, max_chars=ctx.limits.document_max_chars))
    return replace(base, document=doc)


async def _binary(file: InboundFile, blob: Path, base: PreparedAttachment, ctx: InboundContext) -> PreparedAttachment:
    if blob.stat().st_size == 0:
        return replace(base, failure="the file is empty (0 bytes)")
    return base  # described (path, size, type) by build_inbound_text


_ROUTES = {
    "image": _image, "animated_sticker": _animated_sticker, "audio": _audio, "video": _video,
    "pdf": _pdf, "text": _text, "binary": _binary,
}


# --- saving into the workspace -------------------------------------------------------------------


def save_inbound_copy(blob: Path, media_root: Path, save_dir: str, name: str) -> str:
    """Copy ``blob`` to ``media_root/save_dir/name`` without overwriting; the relative path.

    A name that is taken gets ``-1``, ``-2``... before its extension. The copy is never a hard
    link to the store: the tools refuse files with more than one link, and the agent editing it
    must not corrupt a content-addressed blob. Where the file system can share blocks
    copy-on-write (a reflink: btrfs, XFS, bcachefs) the copy shares them with the blob, so the
    bytes are stored once and a later write to either copy separates them; elsewhere it is a
    plain copy.
    """
    parts = [p for p in save_dir.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise AttachmentError(f"the inbound folder {save_dir!r} is outside the media root")
    stem, dot, ext = name.rpartition(".")
    if not stem:
        stem, dot, ext = name, "", ""
    names = (name if n == 0 else f"{stem}-{n}{dot}{ext}" for n in range(10_000))
    # The folder is the agent's to change: it is walked and the file created without following
    # any link (talon.safe_files); a name taken by anything, a planted link included, is skipped.
    try:
        with new_file_beneath(media_root, parts, names, shown=save_dir) as (out, saved):
            if not reflink_copy(blob, out.fileno()):
                _copy_into(blob, out.fileno())
    except UnsafePath as exc:
        if exc.errno == errno.EEXIST:
            raise AttachmentError(f"too many files named {name!r} in {save_dir}") from exc
        raise
    return "/".join([*parts, saved])


def _copy_into(blob: Path, fd: int) -> None:
    """Copy ``blob`` into the open ``fd`` with sendfile: no bytes pass through Python."""
    with open(blob, "rb") as src:
        size = os.fstat(src.fileno()).st_size
        offset = 0
        while offset < size:
            sent = os.sendfile(fd, src.fileno(), offset, size - offset)
            if sent == 0:
                break
            offset += sent


_FICLONE = 0x40049409  # Linux ioctl: make the target share the source's blocks copy-on-write


def reflink_copy(source: Path, target_fd: int) -> bool:
    """Clone ``source`` into the open, empty ``target_fd``; False where the file system cannot."""
    try:
        import fcntl

        with open(source, "rb") as src:
            fcntl.ioctl(target_fd, _FICLONE, src.fileno())
    except (OSError, ImportError, ValueError):
        return False
    return True


def safe_file_name(name: str | None, fallback: str) -> str:
    """A file name that is safe to create: no directories, controls, leading dots or odd bytes."""
    base = (name or "").replace("\\", "/").rsplit("/", 1)[-1]
    base = unicodedata.normalize("NFC", base)
    cleaned = "".join(
        c if (c.isalnum() or c in _NAME_PUNCTUATION) and unicodedata.category(c)[0] != "C" else "_"
        for c in base
    )
    cleaned = " ".join(cleaned.split()).lstrip(". ").rstrip(" ")
    if not cleaned or set(cleaned) <= {"_", "."}:
        cleaned = fallback
    while len(cleaned.encode("utf-8")) > _MAX_NAME_BYTES:
        stem, dot, ext = cleaned.rpartition(".")
        cleaned = f"{stem[:-1]}.{ext}" if dot and len(ext) < 16 and stem else cleaned[:-1]
    return cleaned


def _fallback_name(file: InboundFile) -> str:
    short = file.ref.id[:10] if file.ref else "file"
    stem = file.kind.replace("_", "-")
    return f"{stem}-{short}{_extension(file)}"


def _extension(file: InboundFile) -> str:
    mime = (file.mime or (file.ref.mime if file.ref else "") or "").split(";")[0].strip().lower()
    known = {"image/jpeg": ".jpg", "audio/ogg": ".ogg", "audio/mpeg": ".mp3", "video/mp4": ".mp4",
             "image/webp": ".webp", "audio/mp4": ".m4a", "audio/amr": ".amr", "text/plain": ".txt"}
    if mime in known:
        return known[mime]
    defaults = {"photo": ".jpg", "voice": ".ogg", "video_note": ".mp4", "animation": ".mp4",
                "sticker": ".webp", "video": ".mp4"}
    guessed = mimetypes.guess_extension(mime) if mime else None
    return guessed or defaults.get(file.kind, ".bin")


def _display_name(file: InboundFile) -> str | None:
    return safe_file_name(file.name, "file") if file.name else None


def _read_head(blob: Path) -> bytes:
    with open(blob, "rb") as fh:
        return fh.read(SNIFF_BYTES)


# --- 2. wording (pure) ---------------------------------------------------------------------------


def build_inbound_text(
    text: str, attachments: Sequence[PreparedAttachment], *, vision: bool = True,
    max_document_chars: int = Limits.document_max_chars,
) -> str:
    """The text the agent reads: the user's words, then one section per attachment."""
    sections = [text.strip()] if text and text.strip() else []
    for att in attachments:
        sections.append(_describe(att, vision=vision, max_document_chars=max_document_chars))
    return "\n\n".join(s for s in sections if s)


def build_model_content(
    text: str, attachments: Sequence[PreparedAttachment], *, vision: bool = True,
    max_document_chars: int = Limits.document_max_chars,
) -> list[ContentBlock]:
    """One text block, then the image blocks (video frames each after a timestamp line)."""
    blocks: list[ContentBlock] = [
        TextBlock(text=build_inbound_text(
            text, attachments, vision=vision, max_document_chars=max_document_chars
        ))
    ]
    if not vision:
        return blocks
    for att in attachments:
        for image in att.images:
            if image.timestamp_s is not None:
                blocks.append(TextBlock(
                    text=f"[{_title(att)}, frame at {format_duration(image.timestamp_s)}]"
                ))
            blocks.append(ImageBlock(ref=image.ref))
    return blocks


def _describe(att: PreparedAttachment, *, vision: bool, max_document_chars: int) -> str:
    notes = [f"[{_title(att)}: {_bounded(note)}]" for note in att.notes]
    return "\n".join([_describe_main(att, vision=vision, max_document_chars=max_document_chars), *notes])


def _describe_main(att: PreparedAttachment, *, vision: bool, max_document_chars: int) -> str:
    if att.failure is not None:
        return _failure_line(att)
    if att.kind == "sticker" and att.animated:
        return f"[{_title(att)}: an animated sticker, not shown]"
    if att.transcript is not None and not att.images:
        return _transcript_line(att, att.transcript)
    if att.document is not None:
        return render_document(
            att.name or "document", att.document, path=att.path, size=att.size,
            max_chars=max_document_chars,
        )
    if att.images:
        return _images_line(att, vision=vision)
    # Binary (or an image route that produced nothing): say where it is so tools can look.
    facts = _facts(att, with_type=True)
    where = f" saved at {att.path}" if att.path else ""
    return (
        f"[File {att.name or 'file'} ({facts}){where}: its content is not shown here; "
        "use your file tools to inspect it]"
    )


def _images_line(att: PreparedAttachment, *, vision: bool) -> str:
    lines: list[str] = []
    where = f"saved at {att.path}" if att.path else "not saved"
    if att.has_frames:
        count = len(att.images)
        shown = (
            f"{count} frame{'s' if count != 1 else ''} shown below"
            if vision else f"{count} frame{'s' if count != 1 else ''} sampled but not shown "
            "(the current model does not take images)"
        )
        lines.append(f"[{_title(att)} ({_facts(att)}): {shown}; {where}]")
        if att.transcript is not None:
            lines.append(_transcript_line(att, att.transcript, of_video=True))
    else:
        shown_ref = att.images[0].ref
        if vision:
            resized = (
                f", shown below at {shown_ref.width}x{shown_ref.height}"
                if att.dimensions and shown_ref.width and max(att.dimensions) > max(
                    shown_ref.width, shown_ref.height or 0)
                else ", shown below"
            )
            lines.append(f"[{_title(att)} ({_facts(att)}){resized}; {where}]")
        else:
            lines.append(
                f"[{_title(att)} ({_facts(att)}) {where}; not shown: the current model does not "
                "take images]"
            )
    return "\n".join(lines)


def _transcript_line(att: PreparedAttachment, transcript: Transcript, *, of_video: bool = False) -> str:
    what = f"{_title(att)}, audio track" if of_video else _title(att)
    damaged = (
        "; the recording is damaged, only its readable start was transcribed"
        if transcript.partial else ""
    )
    spoken_in = language_name(transcript.language)
    language = f", in {spoken_in}" if spoken_in else ""
    return (
        f"[{what}, {format_duration(transcript.duration_s)}, machine transcription{language}{damaged}]: "
        f"{defang_untrusted(transcript.text)}"
    )


def _failure_line(att: PreparedAttachment) -> str:
    verb = {"receive": "received", "read": "read", "transcribe": "transcribed"}[att.failure_stage]
    where = f"; saved at {att.path}" if att.path else ""
    facts = _facts(att)
    subject = _title(att) if att.kind in ("voice", "video_note", "sticker") else (
        f"Attachment {att.name}" if att.name else _title(att)
    )
    return f"[{subject}{f' ({facts})' if facts else ''} could not be {verb}: {_bounded(att.failure or '')}{where}]"


def _title(att: PreparedAttachment) -> str:
    titles = {
        "photo": "Photo", "image": "Image", "document": "Document", "voice": "Voice note",
        "audio": "Audio", "video": "Video", "video_note": "Video note", "animation": "Animation",
        "sticker": "Sticker",
    }
    title = titles[att.kind]
    if att.kind == "sticker":
        return f"{title} {att.emoji}" if att.emoji else title
    if att.kind in ("voice", "video_note"):
        return title
    return f"{title} {att.name}" if att.name else title


def _facts(att: PreparedAttachment, *, with_type: bool = False) -> str:
    facts: list[str] = []
    if att.size is not None:
        facts.append(human_size(att.size))
    if with_type:
        facts.append(att.mime or "unknown type")
    if att.duration_s:
        facts.append(format_duration(att.duration_s))
    if att.dimensions:
        facts.append(f"{att.dimensions[0]}x{att.dimensions[1]}")
    return ", ".join(facts)


def human_size(size: int) -> str:
    """A byte count as people read it: 512 B, 12.3 KB, 4.5 MB (decimal units)."""
    if size < 1000:
        return f"{size} B"
    if size < 1_000_000:
        return f"{size / 1000:.1f} KB"
    return f"{size / 1_000_000:.1f} MB"


def _bounded(reason: str) -> str:
    reason = " ".join(reason.split())
    return reason if len(reason) <= _MAX_REASON_CHARS else reason[: _MAX_REASON_CHARS - 3] + "..."


# --- executor ------------------------------------------------------------------------------------

_shared_pool: ThreadPoolExecutor | None = None
_shared_pool_lock = threading.Lock()


def _media_pool() -> ThreadPoolExecutor:
    # Process-wide so the bound holds however many chats (and contexts) are active at once.
    global _shared_pool
    with _shared_pool_lock:
        if _shared_pool is None:
            workers = max(1, min(4, os.cpu_count() or 1))
            _shared_pool = ThreadPoolExecutor(workers, thread_name_prefix="talon-media")
        return _shared_pool


def _run(ctx: InboundContext, fn: Callable[[], _T]) -> asyncio.Future[_T]:
    return asyncio.get_running_loop().run_in_executor(ctx.executor or _media_pool(), fn)


__all__ = [
    "InboundContext",
    "PreparedAttachment",
    "ShownImage",
    "build_inbound_text",
    "build_model_content",
    "choose_route",
    "human_size",
    "normalize_inbound",
    "prepare_attachment",
    "safe_file_name",
    "save_inbound_copy",
    "sniff_media",
]
