"""Sending the parts of a reply: text, files as media links, captions, and the fallbacks.

- Caption: with exactly one media reference named like an image or video and text that fits one
  caption (1024 characters), the text rides as that message's body. If the file turns out to be a
  document or audio (which carry no caption) the text goes as its own message first, and if the
  file cannot be sent at all the text still goes.
- Files go out as ``MediaUrl`` links to Talon's HTTP server (see ``channels.media_links``), after the
  media-root checks; ``media.py`` fits them to WhatsApp's types and sizes.
- A reference that cannot be sent becomes "Could not attach NAME: reason" in the chat, and a log
  line with the detail.
"""

from __future__ import annotations

import asyncio
import logging

from talon.config import Limits, Settings
from talon.errors import MediaError, MediaPathError, TwilioRefused
from talon.media import MarkdownMediaRef, OutboundMedia, outbound_channel_media
from talon.media.failures import attach_failure_line, display_name, path_refusal_reason
from talon.render.long_reply import REPLY_DOCUMENT_MIME, REPLY_DOCUMENT_NAME, reply_document

from channels.media_links import MediaLinks
from channels.whatsapp.api import TwilioApi
from channels.whatsapp.media import CAPTIONED_KINDS, WhatsAppMedia, fit_for_whatsapp, meant_as_voice
from channels.whatsapp.parts import MediaPart, Part, ReplyDocumentPart, TextPart, part_json

log = logging.getLogger("channels.whatsapp")

CHANNEL = "whatsapp"


class Delivery:
    def __init__(self, settings: Settings, api: TwilioApi, links: MediaLinks | None) -> None:
        self.settings = settings
        self.limits: Limits = settings.limits()
        self.api = api
        self.links = links

    async def send_part(self, chat_id: str, part: Part, *, kind: str = "answer") -> None:
        if isinstance(part, MediaPart):
            await self._send_media(chat_id, part, kind)
            return
        if isinstance(part, ReplyDocumentPart):
            assert self.links is not None  # planned only when files can be sent
            url = await self.links.add_bytes(reply_document(part.text), REPLY_DOCUMENT_NAME, REPLY_DOCUMENT_MIME)
            try:
                await self.api.send(chat_id, media_url=url, what=REPLY_DOCUMENT_NAME, kind=kind)
            except BaseException:
                await self.links.forget(url)
                raise
            return
        body = part.body if isinstance(part, TextPart) else part.text
        # A text part can be sent again as it is: a failed delivery of it is retried once.
        await self.api.send(chat_id, body=body, what=f"a {len(body)}-character message", kind=kind,
                            payload=part_json(part))

    async def _send_media(self, chat_id: str, part: MediaPart, kind: str) -> None:
        failures: list[str] = []
        caption = part.caption
        prepared = await self._prepare_media(chat_id, part.ref, failures)
        if prepared is not None:
            fitted, url = prepared
            body = caption if fitted.kind in CAPTIONED_KINDS else ""
            if caption and not body:  # documents and audio carry no caption on WhatsApp
                await self.api.send(chat_id, body=caption, what="caption", kind=kind)
                caption = ""
            sent = False
            try:
                await self.api.send(chat_id, body=body, media_url=url, what=f"{fitted.kind} {fitted.name}", kind=kind)
                sent = True
                caption = ""
            except TwilioRefused as exc:
                if exc.chat_level:
                    raise
                failures.append(attach_failure_line(fitted.name, exc.reason))
            finally:
                if not sent and self.links is not None:
                    await self.links.forget(url)  # nobody will fetch it: stop need not wait for it
        if caption:  # the file did not go out: the words still must
            await self.api.send(chat_id, body=caption, what="caption", kind=kind)
        if failures:
            await self.api.send(chat_id, body="\n".join(failures)[: self.limits.whatsapp_body_max],
                                what="attach failures", kind=kind)

    async def _prepare_media(self, chat_id: str, ref: MarkdownMediaRef,
                             failures: list[str]) -> tuple[WhatsAppMedia, str] | None:
        """Resolve, check, fit and link one reference, or record why it cannot be sent."""
        name = display_name(ref.path)
        workspace = self.settings.workspace_dir(CHANNEL, chat_id)
        try:
            media: OutboundMedia = await asyncio.to_thread(outbound_channel_media, ref, "", workspace)
        except MediaPathError as exc:
            log.warning("whatsapp: chat=%s: not attaching %r: %s", chat_id, ref.path, exc)
            failures.append(attach_failure_line(name, path_refusal_reason(exc)))
            return None
        except OSError as exc:
            log.warning("whatsapp: chat=%s: cannot read %r: %s", chat_id, ref.path, exc)
            failures.append(attach_failure_line(name, "it cannot be read"))
            return None
        try:
            if self.links is None:
                log.warning("whatsapp: chat=%s: cannot send %s: TALON_PUBLIC_BASE_URL is not set, so "
                            "Twilio cannot fetch files from Talon", chat_id, media.name)
                failures.append(attach_failure_line(media.name, "this server cannot send files "
                                                                "(it has no public URL)"))
                return None
            voice = meant_as_voice(media.name, ref.alt)
            fitted = await asyncio.to_thread(fit_for_whatsapp, media, self.limits, voice=voice)
            if fitted.note:
                log.info("whatsapp: chat=%s: %s %s", chat_id, media.name, fitted.note)
            if fitted.data is not None:
                url = await self.links.add_bytes(fitted.data, fitted.name, fitted.mime)
            else:
                url = await self.links.add_file(media.path, media.file, fitted.name, fitted.mime, root=workspace)
            return fitted, url
        except MediaError as exc:
            log.warning("whatsapp: chat=%s: not attaching %s (%s, %d bytes): %s", chat_id, media.path,
                        media.kind, media.size, exc)
            failures.append(attach_failure_line(media.name, str(exc)))
            return None
        finally:
            media.close()
