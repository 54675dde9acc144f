"""One exception tree for Talon.

    TalonError
    ├── ConfigError                 settings missing or invalid (names the settings)
    ├── AttachmentError             the attachment store could not save or find bytes
    ├── MediaError                  inbound media could not be used (each has a user-facing reason)
    │   ├── DownloadTooLarge        over the per-file cap, refused before or during download
    │   └── DownloadError           the platform would not give us the file
    ├── MediaPathError (ValueError) an outbound path escapes the media root or is not a file
    ├── TranscriptionError          a voice note could not be turned into text
    ├── SynthesisError              a reply could not be spoken (talon.tts)
    ├── ProviderError               the model could not answer
    │   ├── ProviderUnavailable     network, timeout, 5xx, rate limit after retries
    │   ├── ContextOverflow         the request was longer than the model's window
    │   └── ImageRejected           the model refused an image in the request (400)
    ├── DeliveryError               a reply or file could not be delivered to the chat
    └── PairingError                `talon pair`: no live request has that code
"""

from __future__ import annotations


class TalonError(Exception):
    """Base of every error Talon raises on purpose."""


class ConfigError(TalonError):
    def __init__(self, message: str, missing: list[str] | None = None) -> None:
        super().__init__(message)
        self.missing = missing or []


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
    pass


class ProviderUnavailable(ProviderError):
    pass


class ContextOverflow(ProviderError):
    pass


class ImageRejected(ProviderError):
    """The provider refused the request because of an image in it (bad format, too large...)."""


class DeliveryError(TalonError):
    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class PairingError(TalonError):
    """A pairing code that names no live request (mistyped, expired or dropped)."""
