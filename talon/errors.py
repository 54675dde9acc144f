"""One exception tree for Talon: every exception class Talon defines is here, under ``TalonError``.

    TalonError
    ├── ConfigError                 settings missing or invalid (names the settings)
    │   └── LocalModelError         the local llama.cpp server (TALON_MODEL=local:...) could not start
    ├── AttachmentError             the attachment store could not save or find bytes
    ├── MediaError                  media could not be used (each has a user-facing reason)
    │   ├── DownloadTooLarge        over the per-file cap, refused before or during download
    │   ├── DownloadError           the platform would not give us the file
    │   ├── ImageUnusable           an image that cannot be given to the model (talon.media.images)
    │   │   ├── NotAnImage          not a picture at all, whatever its name says
    │   │   ├── CorruptImage        a picture that cannot be decoded (bad header, truncated)
    │   │   └── ImageBomb           over the decoding pixel limit (possible decompression bomb)
    │   ├── DocumentError           a document whose text cannot be read (damaged, encrypted PDF)
    │   ├── VideoError              a video from which nothing could be taken
    │   ├── MediaTooLarge           an outbound file over WhatsApp's size limits even after fitting
    │   └── UploadRefused           the web chat will not take a message's images (``.status``, ``.file``)
    ├── MediaPathError (ValueError) an outbound path escapes the media root or is not a file
    ├── UnsafePath (OSError)        a path beneath a root (a workspace) that will not be used: a
    │   │                           symbolic link, changed while being opened, missing, or not a
    │   │                           usable file; refused, never followed (talon.safe_files)
    │   └── LinkedFile              a regular file with more than one hard link
    ├── TranscriptionError          a voice note could not be turned into text
    │   └── TranscriberUnavailable  no transcription backend can run here (off, not installed, no model)
    ├── SynthesisError              a reply could not be spoken (talon.speech.synthesize)
    │   └── SpeechUnavailable       no speech engine can run here (off, not installed, no voice)
    ├── ProviderError               the model could not answer (``.refusal``: what the server said)
    │   ├── ProviderUnavailable     network, timeout, 5xx: worth trying again later
    │   │   ├── RateLimited         429 / rate_limit_error (``.retry_after`` when the server says)
    │   │   └── ModelTimedOut       silent past TALON_MODEL_TIMEOUT, or past the whole-call cap
    │   ├── ContextOverflow         the request was longer than the model's window (``.window``)
    │   ├── ImageRejected           the model refused one image in the request (format, size)
    │   ├── ImagesUnsupported       the model takes no images at all
    │   ├── ToolsUnsupported        the server cannot call tools
    │   ├── ModelNotFound           the server has no model by that name
    │   ├── AuthRejected            the server refused our API key
    │   └── QuotaExceeded           out of credits or quota (not transient)
    ├── ProviderSignal              a provider attempt's word to its retry loop (talon.agent.providers.retries)
    │   ├── SendAgain               it adjusted itself to the server: send the request again now
    │   └── Retryable               a transient failure (``.error``): wait ``.delay`` and try again
    ├── ToolError                   a tool failure the agent reads and can act on (bad path...)
    │   └── SkillProblem            a skill that cannot be used (front matter, name, size; talon.agent.tools.skills)
    ├── ApprovalNotShown            a call waiting for approval could not be shown whole: it is refused
    ├── DeliveryError               a reply or file could not be delivered to the chat (``.permanent``)
    │   ├── UploadTimedOut          a Telegram upload timed out twice (it may have arrived)
    │   ├── PlatformRateLimited     a chat platform said "too many requests, wait ``.seconds``" (retried)
    │   └── TwilioRefused           Twilio answered with an error retrying will not fix
    ├── MalformedWebhook (ValueError) a webhook body that is not what the platform sends
    ├── StreamStopped               a live view asks to stop showing this turn (the reply still goes)
    ├── ScheduleError               a scheduled task cannot be made as asked (when, zone, limits)
    ├── JobError                    a background job cannot be started, found or cancelled as asked
    ├── StoreError                  a durable store could not do what was asked
    │   └── StoreUnavailable        the database did not answer in time, or refused to connect
    ├── PairingError                `talon pair`: no live request has that code
    ├── McpUnavailable              an MCP server is not running (failed to start, exited, hung)
    ├── WebFetchRefused             web_fetch will not fetch a URL (scheme, address rules, redirects)
    ├── ConversionCut               web_fetch's HTML-to-text worker hit its time or memory limit
    ├── SandboxUnavailable          no trustworthy bwrap sandbox can start here (says why)
    ├── CapReached                  a usage cap is reached: the model call is not made (``.scope``)
    └── BackupError                 `talon backup | restore`: a damaged or tampered archive, a target
                                    that is not empty, an archive from a newer Talon

One name per meaning: ``ImageRejected`` is the model refusing an image, ``ImageUnusable`` an
image Talon itself cannot use. This module is the bottom layer: it imports nothing from Talon or
its channels. ``Refusal`` (a model server's error, classified by ``talon.agent.providers.refusals``) lives
here too, as the data a ``ProviderError`` carries. ``tests/test_error_tree.py`` holds all of this
true: no exception class is defined anywhere else, and every class here is drawn above.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RefusalKind = Literal[
    "images_unsupported",
    "image_invalid",
    "context_overflow",
    "tools_unsupported",
    "stream_unsupported",
    "rate_limited",
    "quota",
    "overloaded",
    "model_not_found",
    "auth",
    "server_error",
    "bad_request",
]

TRANSIENT: frozenset[str] = frozenset({"rate_limited", "overloaded", "server_error"})


@dataclass(frozen=True)
class Refusal:
    """A model server's error, classified (``talon.agent.providers.refusals.classify``)."""

    kind: RefusalKind
    status: int | None
    message: str
    window: int | None = None  # the context window the server states, in tokens
    requested: int | None = None  # the tokens the server counted in the request
    retry_after: float | None = None  # seconds

    @property
    def transient(self) -> bool:
        return self.kind in TRANSIENT

    def short(self, limit: int = 300) -> str:
        text = " ".join(self.message.split())
        return text if len(text) <= limit else text[: limit - 1] + "…"


class TalonError(Exception):
    """Base of every error Talon raises on purpose."""


class ConfigError(TalonError):
    def __init__(self, message: str, missing: list[str] | None = None) -> None:
        super().__init__(message)
        self.missing = missing or []


class LocalModelError(ConfigError):
    """``TALON_MODEL=local:...``: llama.cpp could not load or serve the file; the message says why."""

    def __init__(self, message: str) -> None:
        super().__init__(message, [])


class AttachmentError(TalonError):
    pass


class MediaError(TalonError):
    """Media that cannot be used; ``str(exc)`` is a reason a person can act on."""


class DownloadTooLarge(MediaError):
    def __init__(self, name: str, size: int | None, limit: int) -> None:
        self.name = name
        self.size = size
        self.limit = limit
        size_txt = f"{size / 1_000_000:.1f} MB" if size is not None else "more than the limit"
        super().__init__(
            f"{name} is {size_txt}, over the {limit / 1_000_000:.0f} MB download limit; not downloaded"
        )


class DownloadError(MediaError):
    pass


class ImageUnusable(MediaError):
    """Base for images that cannot be given to the model; ``str()`` is the user-facing reason."""


class NotAnImage(ImageUnusable):
    pass


class CorruptImage(ImageUnusable):
    pass


class ImageBomb(ImageUnusable):
    def __init__(self, pixels: int, limit: int, size: tuple[int, int] | None = None) -> None:
        self.pixels = pixels
        self.limit = limit
        dims = f"{size[0]}x{size[1]} = " if size else ""
        super().__init__(
            f"the image is {dims}{pixels / 1e6:.1f} MP ({pixels:,} pixels), over the "
            f"{limit / 1e6:.0f} MP ({limit:,} pixels) safety limit for decoding "
            "(possible decompression bomb); not decoded"
        )


class DocumentError(MediaError):
    """A document whose text cannot be read; ``str()`` says why."""


class VideoError(MediaError):
    """A video from which nothing could be taken; ``str()`` says why."""


class MediaTooLarge(MediaError):
    """An outbound file over WhatsApp's size limits even after fitting; ``str()`` says which."""


class UploadRefused(MediaError):
    """Images sent in the panel's web chat that are refused as a batch (talon.ui.webchat): the HTTP
    ``status`` to answer (413, 415, 422), the ``file`` at fault, and a line the composer shows."""

    def __init__(self, status: int, message: str, file: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.file = file

    def body(self) -> dict[str, str]:
        return {"error": str(self), "file": self.file}


class MediaPathError(TalonError, ValueError):
    """An outbound media path that may not be sent, with the specific reason."""


class UnsafePath(TalonError, OSError):
    """A path beneath a root (a workspace) that will not be used: it would be followed through a
    symbolic link, changed while being opened, is missing, or is not a usable file. Refused, never
    followed. Built like an ``OSError``: ``UnsafePath(errno, message)``."""


class LinkedFile(UnsafePath):
    """A regular file with more than one hard link."""


class TranscriptionError(TalonError):
    pass


class TranscriberUnavailable(TranscriptionError):
    """No backend can run: turned off, not installed, or its model is not on this machine."""


class SynthesisError(TalonError):
    """Speech could not be made for a reply; ``str(exc)`` says why, in a line a person can read."""


class SpeechUnavailable(SynthesisError):
    """No engine can speak: turned off, not installed, or no voice on this machine."""


class ProviderError(TalonError):
    """The model server did not answer; ``refusal`` is its classified error, when it sent one."""

    def __init__(self, message: str, *, refusal: Refusal | None = None) -> None:
        super().__init__(message)
        self.refusal = refusal


class ProviderUnavailable(ProviderError):
    pass


class RateLimited(ProviderUnavailable):
    def __init__(self, message: str, *, retry_after: float | None = None,
                 refusal: Refusal | None = None) -> None:
        super().__init__(message, refusal=refusal)
        self.retry_after = retry_after


class ModelTimedOut(ProviderUnavailable):
    """The model server went silent too long, or the call outlasted its cap; never asked again."""


class ContextOverflow(ProviderError):
    """Too long for the model; ``window`` is the context window the server stated, if it did."""

    def __init__(self, message: str, *, window: int | None = None, refusal: Refusal | None = None) -> None:
        super().__init__(message, refusal=refusal)
        self.window = window


class ImageRejected(ProviderError):
    """The provider refused the request because of an image in it (bad format, too large...)."""


class ImagesUnsupported(ProviderError):
    """The model (or the server as started) takes no image input at all."""


class ToolsUnsupported(ProviderError):
    """The server cannot call tools (Ollama: "does not support tools", vLLM without a parser...)."""


class ModelNotFound(ProviderError):
    pass


class AuthRejected(ProviderError):
    pass


class QuotaExceeded(ProviderError):
    pass


class ProviderSignal(TalonError):
    """What a provider's single attempt tells its retry loop; never leaves ``talon.agent``."""


class SendAgain(ProviderSignal):
    """The provider adjusted itself to what the server can take; send the request again now."""


class Retryable(ProviderSignal):
    def __init__(self, error: ProviderError, delay: float | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.delay = delay


class ToolError(TalonError):
    """A tool failure the agent should read and can act on (bad path, missing file...)."""


class SkillProblem(ToolError):
    """A skill that cannot be used: its front matter, name or size (``talon.agent.tools.skills``)."""


class ApprovalNotShown(TalonError):
    """A channel could not show a call waiting for approval whole (too long for a message, and the
    file with all of it could not be sent): it cannot be approved (talon.control.approvals)."""


class DeliveryError(TalonError):
    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class UploadTimedOut(DeliveryError):
    """An upload that timed out twice: not tried a third time, since it may have arrived."""

    def __init__(self, message: str) -> None:
        super().__init__(message, permanent=True)


class PlatformRateLimited(DeliveryError):
    """A chat platform's "too many requests" (Matrix ``M_LIMIT_EXCEEDED``): wait ``seconds``, then
    try again; the channel's call loop does, within its bound."""

    def __init__(self, message: str, seconds: float) -> None:
        super().__init__(message)
        self.seconds = seconds


class TwilioRefused(DeliveryError):
    """Twilio answered with an error that retrying will not fix. ``chat_level``: the chat or the
    account cannot take messages now, so the rest of the reply would fail too (the channel decides,
    from the error code it knows)."""

    def __init__(self, message: str, *, status: int, code: int | None, detail: str, chat_level: bool) -> None:
        super().__init__(message, permanent=True)
        self.status = status
        self.code = code
        self.detail = detail
        self.chat_level = chat_level

    @property
    def reason(self) -> str:
        return f"Twilio refused it (error {self.code}: {self.detail})" if self.code else \
            f"Twilio refused it (HTTP {self.status})"


class MalformedWebhook(TalonError, ValueError):
    """A webhook body that is not what the platform sends (a Telegram update, a Twilio message);
    ``str(exc)`` says what is wrong, for the log."""


class StreamStopped(TalonError):
    """Raised by a live view's ``show`` callback: stop showing this turn (the final reply still goes)."""


class ScheduleError(TalonError):
    """A task cannot be scheduled as asked; ``str(exc)`` says why and what would work."""


class JobError(TalonError):
    """A background job request that cannot be done (talon.jobs); ``str(exc)`` says why."""


class StoreError(TalonError):
    """A durable store could not do what was asked; ``str(exc)`` names the store and why."""


class StoreUnavailable(StoreError):
    """The database did not answer within its time limit, or refused the connection: worth trying
    again later (a webhook answers 503, a turn waits), never a reason to drop a message."""


class PairingError(TalonError):
    """A pairing code that names no live request (mistyped, expired or dropped)."""


class McpUnavailable(TalonError):
    """An MCP server cannot take a call now; ``str(exc)`` says why and when Talon tries again."""


class WebFetchRefused(TalonError):
    """A URL ``web_fetch`` will not fetch; ``str(exc)`` names the rule (the host's own network...)."""


class ConversionCut(TalonError):
    """A fetched page was too large or complex to turn into text within the converter's limits
    (talon.agent.tools.html_worker); ``reason`` names the limit."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SandboxUnavailable(TalonError):
    """The shell's sandbox cannot start here: bwrap missing, untrusted, or refused by the kernel."""


class CapReached(TalonError):
    """A usage cap (TALON_LIMIT_*) is reached; ``str(exc)`` is the one line the person gets,
    naming the limit and when it resets. ``scope`` is person, chat or total."""

    def __init__(self, line: str, scope: str) -> None:
        super().__init__(line)
        self.scope = scope


class BackupError(TalonError):
    """A backup, verification or restore that cannot go on (talon.storage.backup); ``str(exc)``
    says what is wrong: a damaged or tampered archive, a target that is not empty, a newer schema."""
