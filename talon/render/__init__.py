"""Render the agent's markdown for a platform, and cut it to the platform's message limit.

The media layer has already lifted file references; what reaches here is text only.
"""

from talon.render.telegram import (
    markdown_to_telegram_html,
    plain_text_fallback,
    split_markdown_for_telegram,
    utf16_len,
)
from talon.render.whatsapp import markdown_to_whatsapp, split_for_whatsapp

__all__ = [
    "markdown_to_telegram_html",
    "markdown_to_whatsapp",
    "plain_text_fallback",
    "split_for_whatsapp",
    "split_markdown_for_telegram",
    "utf16_len",
]
