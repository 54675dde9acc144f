"""The media layer: knows files and content blocks, nothing about models or platforms.

Outbound: ``extract_markdown_media`` lifts local ``![alt](path)`` references out of a reply,
``outbound_channel_media`` resolves one inside the media root, opens it race-free and decides how
it is sent. Inbound: turning what a person sent into model content (see the inbound names below).
"""

# --- outbound -------------------------------------------------------------------------------
from talon.errors import MediaPathError
from talon.media.kinds import OutboundMedia, outbound_channel_media
from talon.media.outbound import MarkdownMediaRef, extract_markdown_media
from talon.media.paths import open_checked_media, resolve_bounded_media_path

# --- inbound --------------------------------------------------------------------------------
from talon.media.markers import defang_untrusted
from talon.media.inbound import (
    InboundContext,
    PreparedAttachment,
    build_inbound_text,
    build_model_content,
    normalize_inbound,
)

__all__ = [
    # outbound
    "MarkdownMediaRef",
    "MediaPathError",
    "OutboundMedia",
    "extract_markdown_media",
    "open_checked_media",
    "outbound_channel_media",
    "resolve_bounded_media_path",
    # inbound
    "InboundContext",
    "PreparedAttachment",
    "build_inbound_text",
    "build_model_content",
    "normalize_inbound",
    # every untrusted block
    "defang_untrusted",
]
