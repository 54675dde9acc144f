"""Discord channel on discord.py: the gateway in, the REST API out.

| module | job |
|---|---|
| ``channel.py`` | log in, the gateway connection, start, stop, health; live views; the ack reaction |
| ``api.py`` | ``DiscordApi``: where (``DISCORD_API_BASE_URL``), 429s and buckets, retries |
| ``intake.py`` | messages in: direct messages, channels, mentions, threads, attachments |
| ``downloads.py`` | attachments fetched from Discord's CDN only |
| ``delivery.py`` | replies out: Discord markdown, edits, attachments, notices |
| ``approvals.py`` | approval prompts with message components (buttons) |

Shared with the other channels: ``channels/reply_parts.py``, ``channels/edited_view.py``,
``channels/rooms.py``, ``channels/admission.py``, ``channels/outbound_files.py``,
``channels/send_budget.py``, ``channels/live_text.py``; rendering in ``talon/render/discord.py``.
"""

from channels.discord.channel import DiscordChannel

__all__ = ["DiscordChannel"]
