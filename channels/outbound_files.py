"""Opening a file the agent referenced, for a channel that uploads it: contained in the
conversation's workspace (``talon.media.outbound_channel_media``), under the platform's size limit
and not empty; otherwise the "Could not attach NAME: reason" line the person sees (naming no host
path) and a log entry with the detail."""

from __future__ import annotations

import logging
from pathlib import Path

from talon.config import MB
from talon.errors import MediaPathError
from talon.media import MarkdownMediaRef, OutboundMedia, outbound_channel_media
from talon.media.failures import attach_failure_line, display_name, path_refusal_reason

log = logging.getLogger(__name__)


def open_for_upload(ref: MarkdownMediaRef, root: Path, *, limit: int, platform: str,
                    where: str) -> OutboundMedia | str:
    """The open file (the caller closes it), or the line to show instead. ``platform`` names the
    limit in that line ("the homeserver's 2 MB upload limit"); ``where`` is for the log."""
    name = display_name(ref.path)
    try:
        media = outbound_channel_media(ref, "", root)
    except MediaPathError as exc:
        log.warning("%s: not attaching %r: %s", where, ref.path, exc)
        return attach_failure_line(name, path_refusal_reason(exc))
    except OSError as exc:
        log.warning("%s: cannot read %r: %s", where, ref.path, exc)
        return attach_failure_line(name, "it cannot be read")
    reason = None
    if media.size > limit:
        reason = f"it is {media.size / MB:.1f} MB, over {platform}'s {limit / MB:.0f} MB upload limit"
    elif media.size == 0:
        reason = "the file is empty"
    if reason is not None:
        log.warning("%s: not attaching %s (%d bytes): %s", where, media.path, media.size, reason)
        media.close()
        return attach_failure_line(name, reason)
    return media
