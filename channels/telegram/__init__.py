"""Telegram channel on python-telegram-bot: long polling (or a webhook) in, Bot API out.

One module per job, each a class given what it needs; ``TelegramChannel`` (``channel.py``) builds
one ``TelegramApi`` and hands it to every part (composition, no mixins):

| module | job |
|---|---|
| ``channel.py`` | the clients (python-telegram-bot, httpx), the parts, start, stop and health |
| ``api.py`` | ``TelegramApi``: how a Bot API call is made: where in the chat it goes, group pacing, retries |
| ``polling.py`` | getUpdates and the watchdog that restarts it |
| ``webhook.py`` | webhook mode: updates posted by Telegram, answered once they are in the inbox |
| ``intake.py`` | updates in: who may speak, albums, the ``InboundMessage`` handed to the bridge |
| ``groups.py`` | which group messages are turns, topics, the chatter log |
| ``downloads.py`` | files a person sent, fetched during the turn |
| ``parts.py`` | the parts of a reply, planned from the reply alone (pure) |
| ``delivery.py`` | sending those parts: text, files, albums, captions, fallbacks |
| ``streaming.py`` | the answer shown while it is written: drafts, or a message edited in place |
| ``reactions.py`` | the acknowledgement reaction on a message being answered |
| ``approvals.py`` | approval prompts with buttons, and the presses that answer them |

What is platform neutral lives outside the package: the per-chat send budget
(``channels/send_budget.py``) and the stream-to-updates logic (``channels/live_text.py``).
"""

from channels.telegram.channel import TelegramChannel
from channels.telegram.parts import MediaPart, NoticePart, Part, TextPart, plan_parts
from channels.telegram.webhook import SECRET_HEADER

__all__ = ["SECRET_HEADER", "MediaPart", "NoticePart", "Part", "TelegramChannel", "TextPart", "plan_parts"]
