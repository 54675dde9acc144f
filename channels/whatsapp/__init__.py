"""WhatsApp channel through Twilio: signed webhooks in, the Messages REST API out.

One module per job, each a class given what it needs; ``WhatsAppChannel`` (``channel.py``) builds
one ``TwilioApi`` and the WhatsApp store and hands them to every part (composition, no mixins):

| module | job |
|---|---|
| ``channel.py`` | the parts, start, stop, health, and the core's ``Channel`` calls (deliver, approvals, /status) |
| ``config.py`` | what the settings must hold (fail closed) |
| ``api.py`` | ``TwilioApi``: how a message is created (body, media or template), retries, refusals in words |
| ``webhook.py`` | incoming messages and status callbacks: signatures, the gate, button presses |
| ``intake.py`` | Twilio's form read into an ``InboundMessage``, and an approval button's payload (pure) |
| ``downloads.py`` | files a person sent, fetched during the turn |
| ``parts.py`` | the parts of a reply, planned from the reply alone (pure), and their stored form |
| ``delivery.py`` | sending those parts: text, files, captions, fallbacks |
| ``media.py`` | fitting a file to WhatsApp's types and sizes |
| ``window.py`` | the 24-hour window, and the messages that wait for it |
| ``templates.py`` | the approved Content templates by purpose (settings) |
| ``status.py`` | delivery receipts: recorded, counted, a failed answer retried or reported |
| ``approvals.py`` | approval prompts, quick-reply buttons with one-time tokens, and their presses |

What is platform neutral lives outside the package: media links (``channels/media_links.py``), the
HTTP server (``channels/http.py``); the durable state is ``talon.storage.whatsapp``.
"""

from channels.whatsapp.channel import WhatsAppChannel
from channels.whatsapp.config import check_whatsapp_settings, whatsapp_address
from channels.whatsapp.downloads import MediaHosts
from channels.whatsapp.intake import checked_message_sid, parse_inbound
from channels.whatsapp.parts import MediaPart, NoticePart, Part, ReplyDocumentPart, TextPart, plan_parts

__all__ = ["MediaHosts", "MediaPart", "NoticePart", "Part", "ReplyDocumentPart", "TextPart", "WhatsAppChannel",
           "check_whatsapp_settings", "checked_message_sid", "parse_inbound", "plan_parts", "whatsapp_address"]
