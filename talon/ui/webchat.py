"""``/ui/chat``: a chat with the agent in the panel, a channel like the others (``web``).

The signed-in operator's messages go through the bridge as any chat's do: the same agent, tools,
approvals, caps, ``/stop`` and ``/new``; the answer streams to the page (server-sent events) and
is delivered as a reply. Its conversation is ``web:operator``.

Images (PNG, JPEG, WebP, GIF; pasted or dropped in the composer) come in one multipart POST, and
the whole batch is checked before anything is stored (``check_batch``): the declared type must be
what the bytes decode to (fully, with Pillow, off the event loop), at most
``TALON_UI_IMAGE_MAX_BYTES`` per image, ``TALON_UI_MAX_IMAGES`` images and
``TALON_UI_MESSAGE_MAX_BYTES`` per message, ``TALON_UI_IMAGE_MAX_PIXELS`` per image. A refusal is
a structured JSON error (``{"error", "file"}``, status 413 or 415 or 422) and nothing reaches the
store or the model. Accepted images go into the attachment store (content-addressed) before the
message is submitted; the message carries only their sha256. Files the agent sends go into the
same store, and the panel store remembers them (``PanelStore.note_sent``: the reply's reference,
the object's sha256), so any worker serves them and a reload shows them.

Live text is shown by the worker that runs the turn; with many workers the page shows the answer
once it is in the session store (it reloads the history when a turn ends or every few seconds).
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import BodyPartReader, web

from talon.config import Limits, Settings
from talon.content import AttachmentRef, InboundFile
from talon.envelope import InboundMessage, LiveReply, OutboundReply, RemoteFile
from talon.errors import MediaPathError, UploadRefused

from talon.media import MarkdownMediaRef, outbound_channel_media
from talon.media.received import ReceivedNote
from talon.storage.attachments import AttachmentStore
from talon.storage.sessions import ChatKey, SessionStore
from talon.ports import BridgeHandle, Channel, PartCallback

if TYPE_CHECKING:
    from talon.ui.app import Panel

log = logging.getLogger(__name__)

CHANNEL = "web"
CONVERSATION = "operator"
TEXT_MAX = 32_000
EVENTS_KEPT = 500
STREAM_MAX_S = 300.0
# Declared type -> the format Pillow must find when it decodes the bytes.
IMAGE_TYPES = {"image/png": "PNG", "image/jpeg": "JPEG", "image/webp": "WEBP", "image/gif": "GIF"}


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int
    max_images: int
    max_message_bytes: int
    max_pixels: int

    @classmethod
    def from_settings(cls, settings: Settings) -> "ImageLimits":
        return cls(settings.ui_image_max_bytes, settings.ui_max_images, settings.ui_message_max_bytes,
                   settings.ui_image_max_pixels)


@dataclass(frozen=True)
class Upload:
    name: str
    mime: str
    data: bytes
    width: int = 0
    height: int = 0


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):g} MiB"


def check_image(upload: Upload, limits: ImageLimits) -> Upload:
    """Blocking (decodes the whole image): the upload with its size, or ``UploadRefused``."""
    from PIL import Image, UnidentifiedImageError

    expected = IMAGE_TYPES.get(upload.mime)
    if expected is None:
        raise UploadRefused(415, f"{upload.name}: {upload.mime or 'this type'} is not an image the chat takes "
                           "(PNG, JPEG, WebP or GIF)", upload.name)
    try:
        with Image.open(io.BytesIO(upload.data)) as img:
            if img.format != expected:
                raise UploadRefused(422, f"{upload.name}: declared {upload.mime} but it is "
                                   f"{(img.format or 'something else').upper()}", upload.name)
            width, height = img.size
            if width * height > limits.max_pixels:
                raise UploadRefused(413, f"{upload.name}: {width} x {height} is {width * height / 1e6:.1f} megapixels; "
                                   f"at most {limits.max_pixels / 1e6:g} are taken", upload.name)
            frames = getattr(img, "n_frames", 1)
            for frame in range(min(frames, 1000)):  # every frame decoded: a truncated file shows here
                img.seek(frame)
                img.load()
    except UploadRefused:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise UploadRefused(422, f"{upload.name}: not a readable {expected} image ({exc})", upload.name) from None
    return Upload(upload.name, upload.mime, upload.data, width, height)


async def read_batch(request: web.Request, limits: ImageLimits) -> tuple[str, list[Upload]]:
    """The text and images of one multipart message, bounded while read: a part past its cap is
    refused before the rest of it is read."""
    reader = await request.multipart()
    text = ""
    uploads: list[Upload] = []
    total = 0
    while True:
        part = await reader.next()
        if part is None:
            break
        if not isinstance(part, BodyPartReader):
            raise UploadRefused(400, "nested multipart bodies are not taken")
        if part.name == "text":
            raw = await part.read(decode=False)
            if len(raw) > TEXT_MAX * 4:
                raise UploadRefused(413, f"the text is too long (at most {TEXT_MAX:,} characters)")
            text = raw.decode("utf-8", "replace")[:TEXT_MAX]
            continue
        if part.name != "image":
            await part.release()
            continue
        name = (part.filename or "image")[:120]
        if len(uploads) >= limits.max_images:
            raise UploadRefused(413, f"at most {limits.max_images} images per message", name)
        mime = (part.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if mime not in IMAGE_TYPES:
            raise UploadRefused(415, f"{name}: {mime or 'this type'} is not an image the chat takes (PNG, JPEG, WebP "
                               "or GIF)", name)
        data = bytearray()
        while True:
            chunk = await part.read_chunk(1 << 16)
            if not chunk:
                break
            data += chunk
            if len(data) > limits.max_bytes:
                raise UploadRefused(413, f"{name}: larger than {_mib(limits.max_bytes)} (the most one image may be)", name)
            if total + len(data) > limits.max_message_bytes:
                raise UploadRefused(413, f"the images are larger than {_mib(limits.max_message_bytes)} together "
                                   "(the most one message may carry)", name)
        total += len(data)
        uploads.append(Upload(name, mime, bytes(data)))
    return text, uploads


async def check_batch(uploads: list[Upload], limits: ImageLimits) -> list[Upload]:
    """Every image decoded and checked (off the loop) before any is stored."""
    return [await asyncio.to_thread(check_image, u, limits) for u in uploads]


class WebChat(Channel):
    name = CHANNEL
    gated = False  # the one person here is the signed-in operator

    def __init__(self, settings: Settings, store: AttachmentStore, sessions: SessionStore) -> None:
        self.settings = settings
        self.store = store
        self.sessions = sessions
        self.limits = ImageLimits.from_settings(settings)
        self.bridge: BridgeHandle | None = None
        self.events: deque[dict[str, Any]] = deque(maxlen=EVENTS_KEPT)
        self._seq = 0
        self._changed = asyncio.Event()
        self.running = False
        self.closing = asyncio.Event()  # Talon stops: the live streams end

    @property
    def media_root(self) -> Path:
        return self.settings.workspace_dir(CHANNEL, CONVERSATION)

    # --- the channel ---------------------------------------------------------------------------
    def serves(self, conversation: InboundMessage) -> str | None:
        return None

    async def start(self, bridge: BridgeHandle) -> None:
        self.bridge = bridge
        self.running = True

    async def stop(self) -> None:
        self.running = False
        self._emit({"type": "closed"})

    def _emit(self, event: dict[str, Any]) -> None:
        self._seq += 1
        self.events.append({"seq": self._seq, **event})
        self._changed.set()
        self._changed = asyncio.Event()

    def live_reply(self, message: InboundMessage, *, placed: Any = None, resume_id: str | None = None) -> LiveReply:
        async def on_text(delta: str) -> None:
            self._emit({"type": "delta", "text": delta})

        async def on_step(tools: bool) -> None:
            self._emit({"type": "step", "tools": tools})

        async def close() -> None:
            self._emit({"type": "end"})

        return LiveReply(on_text=on_text, on_step=on_step, close=close)

    def show_received(self, message: InboundMessage, notes: list[ReceivedNote]) -> None:
        """What the model got of the images (one it could not see is said here, as the console does)."""
        for note in notes:
            self._emit({"type": "notice", "text": note.text, "problem": note.problem})

    def reply_parts(self, reply: OutboundReply) -> list[str | MarkdownMediaRef]:
        parts: list[str | MarkdownMediaRef] = [reply.text] if reply.text.strip() else []
        parts += reply.media
        parts += [f"! {n}" for n in reply.notices]
        return parts

    async def deliver(self, chat_id: str, reply: OutboundReply, *, skip_parts: int = 0,
                      on_part: PartCallback | None = None) -> None:
        from channels.base import deliver_parts

        async def send(index: int, part: str | MarkdownMediaRef) -> None:
            if isinstance(part, str):
                self._emit({"type": "reply", "text": part})
                return
            self._emit(await self._file_event(part))

        await deliver_parts(self.reply_parts(reply), send, skip_parts=skip_parts, on_part=on_part)
        self._emit({"type": "delivered"})

    async def _file_event(self, ref: MarkdownMediaRef) -> dict[str, Any]:
        def put() -> dict[str, Any]:
            with outbound_channel_media(ref, ref.alt, self.media_root) as media:
                stored = self.store.blocking.put_chunks(iter(lambda: media.file.read(1 << 16), b""),
                                                        mime=media.mime, name=media.name,
                                                        limit=self.settings.telegram_upload_max_bytes)
                return {"type": "file", "kind": media.kind, "sha": stored.id, "mime": media.mime,
                        "name": media.name, "caption": media.caption}

        try:
            event = await asyncio.to_thread(put)
        except (MediaPathError, OSError, ValueError) as exc:
            log.warning("web chat: not attaching %r: %s", ref.path, exc)
            return {"type": "notice", "text": f"{ref.path}: not attached ({exc})"}
        panel = getattr(self, "panel", None)
        if panel is not None:  # remembered in the stores: a reload, or another worker, shows it
            from talon.storage.panel import SentFile

            await panel.store.note_sent(CHANNEL, CONVERSATION, SentFile(str(event["sha"]), str(event["mime"]),
                                                                        str(event["name"]), ref.path, time.time()))
        return event

    async def download(self, remote: RemoteFile, store: AttachmentStore, limits: Limits) -> InboundFile:
        """The image is in the store already (checked and stored when it was sent)."""
        ref = AttachmentRef(id=remote.source, mime=remote.mime or "application/octet-stream",
                            bytes=remote.size or 0, name=remote.name)
        if not await store.exists(remote.source):
            return InboundFile(kind=remote.kind, name=remote.name, mime=remote.mime, size=remote.size,
                               notice="the image is no longer in the attachment store")
        return InboundFile(kind=remote.kind, name=remote.name, mime=remote.mime, size=remote.size, ref=ref)

    # --- the routes ----------------------------------------------------------------------------
    def install(self, panel: "Panel") -> None:
        self.panel = panel
        panel.route("GET", "/ui/chat", self.page)
        panel.route("POST", "/ui/api/chat/send", self.send, api=True)
        panel.route("GET", "/ui/api/chat/events", self.stream, api=True)

    async def page(self, request: web.Request) -> web.Response:
        from talon.ui import views

        key = ChatKey(CHANNEL, CONVERSATION)
        messages = await self.sessions.load(key)
        stored = await self.panel.pages.stored_sent(key)
        return self.panel.render(request, "webchat.html", title="Chat",
                                 messages=views.shown_messages(messages, stored=stored),
                                 base=views.chat_url(key), count=len(messages), seq=self._seq, limits=self.limits)

    async def send(self, request: web.Request) -> web.Response:
        if self.bridge is None or not self.running:
            return web.json_response({"error": "the web chat is not running", "file": ""}, status=503)
        try:
            uploads: list[Upload] = []
            if request.content_type == "application/x-www-form-urlencoded":  # text alone
                text = str((await request.post()).get("text", ""))[:TEXT_MAX]
            elif request.content_type.startswith("multipart/"):
                text, uploads = await read_batch(request, self.limits)
            else:
                return web.json_response({"error": "send the message as a form", "file": ""}, status=400)
            checked = await check_batch(uploads, self.limits)
        except UploadRefused as exc:
            log.info("web chat: message refused: %s", exc)
            return web.json_response(exc.body(), status=exc.status)
        if not text.strip() and not checked:
            return web.json_response({"error": "the message is empty", "file": ""}, status=400)
        files = []
        for upload in checked:  # every image stored before the message is accepted
            ref = await self.store.put_bytes(upload.data, mime=upload.mime, name=upload.name,
                                             width=upload.width, height=upload.height)
            files.append(RemoteFile(kind="photo" if upload.mime != "image/gif" else "animation", source=ref.id,
                                    name=upload.name, mime=upload.mime, size=ref.bytes))
        message = InboundMessage(channel=CHANNEL, chat_id=CONVERSATION, sender_id="operator",
                                 message_id=uuid.uuid4().hex, text=text, sender_name="Operator", files=files,
                                 received_at=time.time())
        self._emit({"type": "sent", "text": text[:200], "images": len(files)})
        await self.bridge.submit(message)
        await self.panel.audit(request, "web chat message", f"{len(text)} characters, {len(files)} image(s)")
        return web.json_response({"ok": True, "images": [f.source for f in files]})

    async def stream(self, request: web.Request) -> web.StreamResponse:
        from talon.ui.pages import _headers

        try:
            after = int(request.query.get("after", "0"))
        except ValueError:
            after = 0
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
        _headers(response)
        await response.prepare(request)
        ends = time.monotonic() + STREAM_MAX_S
        try:
            while time.monotonic() < ends and not self.closing.is_set():
                fresh = [e for e in list(self.events) if e["seq"] > after]
                for event in fresh:
                    payload = json.dumps(event)
                    if self.panel.secrets:
                        from talon.ui.security import scrub

                        payload = scrub(payload, self.panel.secrets)
                    await response.write(f"data: {payload}\n\n".encode())
                    after = event["seq"]
                if not fresh:
                    await response.write(b": idle\n\n")
                    changed = asyncio.ensure_future(self._changed.wait())
                    closing = asyncio.ensure_future(self.closing.wait())
                    await asyncio.wait({changed, closing}, timeout=5.0, return_when=asyncio.FIRST_COMPLETED)
                    changed.cancel()
                    closing.cancel()
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        return response
