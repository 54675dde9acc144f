"""The short line a person sees when an outbound file cannot be attached.

Every channel shows the same "Could not attach NAME: reason" line. It must never reveal the host's
file system: NAME is only the last component of the path the model wrote, and the reason is
chosen from a fixed set of phrases keyed on the ``MediaPathError`` (whose own message may quote
the full path, an absolute path outside the root, or an OS error naming a resolved path). The
full detail belongs in the log, not in the chat.
"""

from __future__ import annotations

import re

__all__ = ["attach_failure_line", "display_name", "path_refusal_reason"]

_NAME_MAX = 80
_SEPARATORS = re.compile(r"[\\/]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

# (substring of the MediaPathError message, what the person is told). First match wins, so the
# more specific phrases come before the ones they contain.
_PATH_REASONS: tuple[tuple[str, str], ...] = (
    ("NUL byte", "the path contains a NUL byte"),
    ("is a URL", "it is a URL, not a file in this chat's workspace"),
    ("network path", "network paths are not allowed"),
    ("home-directory", "home-directory paths (~) are not allowed"),
    ("is absolute", "absolute paths are not allowed"),
    ("'..' component", "paths with '..' are not allowed"),
    ("outside the media root", "it is outside this chat's workspace"),
    ("no such file", "no such file in this chat's workspace"),
    ("changed while", "the file changed while it was being opened"),
    ("replaced while", "the file changed while it was being opened"),
    ("is a directory", "it is a directory, not a file"),
    ("not a regular file", "it is not a regular file"),
    ("hard links", "it has more than one hard link (it may be a file from outside the media root)"),
    ("cannot be resolved", "the path cannot be resolved"),
    ("empty media path", "the path is empty"),
)
_READ_ERROR = re.compile(r"cannot be read: ([A-Za-z ,'-]{1,60})$")


def display_name(path: str) -> str:
    """The last component of a path as written, safe to show (no directories, no controls)."""
    parts = [p for p in _SEPARATORS.split(path) if p]
    name = _CONTROL.sub("", parts[-1] if parts else "").strip() or "file"
    return name if len(name) <= _NAME_MAX else name[: _NAME_MAX - 1] + "…"


def path_refusal_reason(exc: Exception) -> str:
    """A reason for a refused media path that names no host path."""
    message = str(exc)
    if message.startswith("media root"):
        return "the media root is not available"
    for needle, reason in _PATH_REASONS:
        if needle in message:
            return reason
    read = _READ_ERROR.search(message)
    if read:
        return f"it cannot be read ({read.group(1).strip().lower()})"
    return "it cannot be read"


def attach_failure_line(name: str, reason: str) -> str:
    return f"Could not attach {name}: {reason}"
