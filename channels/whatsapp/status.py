"""Delivery receipts: Twilio's status callbacks for the messages Talon sent.

Every message carries a ``StatusCallback`` URL on Talon's server (``<webhook path>/status``). A
callback must carry a valid ``X-Twilio-Signature`` and our ``AccountSid`` exactly like an incoming
message (403 otherwise, nothing recorded). ``queued / sent / delivered / read / failed /
undelivered`` and Twilio's error code and words are recorded per message in the store (a late
callback never moves a message back; one for a MessageSid Talon did not send records nothing),
counted in ``/metrics`` (``talon_delivery_statuses``), and ``read`` marks the conversation read.

A ``failed`` / ``undelivered`` answer is never silently lost: refused for the 24-hour window
(63016, 63032) its text waits for the window (``window.py``); otherwise its text is sent once
more; when that fails too, or it cannot be sent again (a file), the failure is reported: an error
in the log with Twilio's words, the last failure in ``/status``, and a short note in the chat.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Mapping

from talon.errors import DeliveryError
from talon.storage.whatsapp import FAILED, STATUS_RANK, SentRecord, WhatsAppStore

from channels.whatsapp.api import WINDOW_CODES, TwilioApi, code_of, explain
from channels.whatsapp.parts import TextPart, part_of
from channels.whatsapp.window import Window

log = logging.getLogger("channels.whatsapp")

_SID = re.compile(r"(?:SM|MM)[0-9a-f]{32}")
ERROR_WORDS_MAX = 300
# A callback for a message not (yet) recorded is looked up again after these waits (seconds).
RECORD_WAITS_S = (0.05, 0.2, 0.5, 1.0)


class Receipts:
    def __init__(self, store: WhatsAppStore, api: TwilioApi, window: Window) -> None:
        self.store = store
        self.api = api
        self.window = window
        self.count: Callable[[str], None] | None = None  # counts a status in /metrics; set at start
        self._tasks: set[asyncio.Task[None]] = set()

    async def on_status(self, form: Mapping[str, str]) -> str:
        """Record one callback (already authenticated); what was done, for the log and tests."""
        sid = form.get("MessageSid") or form.get("SmsSid") or ""
        status = (form.get("MessageStatus") or form.get("SmsStatus") or "").strip().lower()
        if not _SID.fullmatch(sid) or status not in STATUS_RANK:
            log.warning("whatsapp: status callback ignored: MessageSid=%.40r MessageStatus=%.20r", sid, status)
            return "ignored"
        code = code_of(form.get("ErrorCode"))
        words = (form.get("ErrorMessage") or explain(code) or "")[:ERROR_WORDS_MAX]
        record = await self.store.record_status(sid, status, code, words, time.time())
        for delay in RECORD_WAITS_S:
            if record is not None:
                break
            # Twilio may call back before our own record of the message is written: look again.
            await asyncio.sleep(delay)
            record = await self.store.record_status(sid, status, code, words, time.time())
        if record is None:
            log.warning("whatsapp: status callback for %s, which Talon did not send (or long ago); ignored", sid)
            return "not ours"
        if self.count is not None:
            self.count(status)
        if status == "read":
            await self.store.mark_read(record.chat_id, time.time())
        if status in FAILED:
            log.error("whatsapp: chat=%s: message %s (%s) %s (Twilio error %s): %s", record.chat_id, sid, record.kind,
                      status, code if code is not None else "?", words or "no explanation given")
            task = asyncio.create_task(self._failed(record), name=f"whatsapp-failed-{sid}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            log.debug("whatsapp: chat=%s: message %s is %s", record.chat_id, sid, status)
        return status

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def idle(self) -> None:
        """Until the failures being handled now are handled (tests)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _failed(self, record: SentRecord) -> None:
        if record.kind not in ("answer", "retry"):
            return  # a template, a notice, a pairing code: the log line says it
        part = part_of(record.payload) if record.payload else None
        chat = record.chat_id
        if record.error_code in WINDOW_CODES:
            await self.window.refused(chat)
        if isinstance(part, TextPart) and record.error_code in WINDOW_CODES:
            async with self.window.lock(chat):
                await self.window.hold(chat, [part], why=f"Twilio reported error {record.error_code}")
            return
        if isinstance(part, TextPart) and record.kind == "answer" and await self.store.mark_retried(record.sid):
            log.info("whatsapp: chat=%s: sending %s once more", chat, record.sid)
            try:
                await self.api.send(chat, body=part.body, what="an answer, again", kind="retry", payload=record.payload)
                return
            except DeliveryError as exc:
                log.error("whatsapp: chat=%s: sending %s once more failed too: %s", chat, record.sid, exc)
        note = (f"A message to you could not be delivered (Twilio error {record.error_code}: "
                f"{record.error_message or record.status}).")
        log.error("whatsapp: chat=%s: an answer was not delivered and is reported: %s", chat, note)
        try:
            await self.api.send(chat, body=note, what="a delivery failure note", kind="notice")
        except DeliveryError as exc:
            log.error("whatsapp: chat=%s: the delivery failure note could not be sent either: %s", chat, exc)
