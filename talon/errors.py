"""One exception tree for Talon.

    TalonError
    ├── ConfigError                 settings missing or invalid (names the settings)
    │   └── LocalModelError         the local llama.cpp server (TALON_MODEL=local:...) could not start
    ├── AttachmentError             the attachment store could not save or find bytes
    ├── MediaError                  inbound media could not be used (each has a user-facing reason)
    │   ├── DownloadTooLarge        over the per-file cap, refused before or during download
    │   └── DownloadError           the platform would not give us the file
    ├── MediaPathError (ValueError) an outbound path escapes the media root or is not a file
    ├── TranscriptionError          a voice note could not be turned into text
    ├── SynthesisError              a reply could not be spoken (talon.speech.synthesize)
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
    ├── DeliveryError               a reply or file could not be delivered to the chat
    ├── ScheduleError               a scheduled task cannot be made as asked (when, zone, limits)
    ├── StoreError                  a durable store could not do what was asked
    │   └── StoreUnavailable        the database did not answer in time, or refused to connect
    ├── PairingError                `talon pair`: no live request has that code
    ├── McpUnavailable              an MCP server is not running (failed to start, exited, hung)
    ├── WebFetchRefused             web_fetch will not fetch a URL (scheme, address rules, redirects)
    ├── SandboxUnavailable          no trustworthy bwrap sandbox can start here (says why)
    ├── UnsafePath (OSError)        a file Talon opens or writes in a workspace went through a
    │                               symbolic link or changed under it: refused, never followed
    └── CapReached                  a usage cap is reached: the model call is not made (``.scope``)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from talon.agent.refusals import Refusal


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
    """Inbound media that cannot be used; ``str(exc)`` is a reason a person can act on."""


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


class MediaPathError(TalonError, ValueError):
    """An outbound media path that may not be sent, with the specific reason."""


class TranscriptionError(TalonError):
    pass


class SynthesisError(TalonError):
    """Speech could not be made for a reply; ``str(exc)`` says why, in a line a person can read."""


class ProviderError(TalonError):
    """The model server did not answer; ``refusal`` is its classified error, when it sent one."""

    def __init__(self, message: str, *, refusal: "Refusal | None" = None) -> None:
        super().__init__(message)
        self.refusal = refusal


class ProviderUnavailable(ProviderError):
    pass


class RateLimited(ProviderUnavailable):
    def __init__(self, message: str, *, retry_after: float | None = None,
                 refusal: "Refusal | None" = None) -> None:
        super().__init__(message, refusal=refusal)
        self.retry_after = retry_after


class ModelTimedOut(ProviderUnavailable):
    """The model server went silent too long, or the call outlasted its cap; never asked again."""


class ContextOverflow(ProviderError):
    """Too long for the model; ``window`` is the context window the server stated, if it did."""

    def __init__(self, message: str, *, window: int | None = None, refusal: "Refusal | None" = None) -> None:
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


class DeliveryError(TalonError):
    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class ScheduleError(TalonError):
    """A task cannot be scheduled as asked; ``str(exc)`` says why and what would work."""


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


class SandboxUnavailable(TalonError):
    """The shell's sandbox cannot start here: bwrap missing, untrusted, or refused by the kernel."""


class UnsafePath(TalonError, OSError):
    """A path under a workspace that would be followed through a symbolic link (or that changed
    while being opened): refused. Built like an ``OSError``: ``UnsafePath(errno, message)``."""
class CapReached(TalonError):
    """A usage cap (TALON_LIMIT_*) is reached; ``str(exc)`` is the one line the person gets,
    naming the limit and when it resets. ``scope`` is person, chat or total."""

    def __init__(self, line: str, scope: str) -> None:
        super().__init__(line)
        self.scope = scope
