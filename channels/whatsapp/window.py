"""WhatsApp's 24-hour window, and the messages that wait for it.

A business number may send free-form messages only within 24 hours of the person's last message
(``WINDOW_S``). The store records each conversation's last inbound time (shared by workers), so the
channel knows before sending whether the window is open:

- open (the person wrote within 24 hours), or unknown (no message from them recorded yet, e.g.
  right after an upgrade): the message is sent; if Twilio refuses it with 63016 or 63032 anyway,
  it waits like below from the part that was refused, and the window counts as closed until the
  person writes again (so nothing is tried again in vain).
- closed: the message waits. Its parts go into the store, in order, behind any already waiting;
  when the chat had none waiting, a template goes out instead (the reminder template with a
  scheduled task's text, else the reopen template: ``templates.py``). Without a template the
  owner is told once (an error in the log, a row in ``talon doctor``, a line in ``/status``) and
  the message waits all the same: nothing is dropped.

Waiting parts are delivered, oldest first, as soon as the person writes again: the webhook records
the new message, then starts ``flush``; the answer to that message flushes first too (``deliver``
holds the chat's lock), so everything that waited arrives before the answer. With many workers one
claims a chat's waiting parts in the store (a claim that lapses if its worker dies) and the others
wait for it. A part is removed from the store only after Twilio took it, so a SIGKILL loses none
(at worst one part is sent twice). A sweep every ``SWEEP_S`` delivers what waits where the window
is open (after a restart, or a transient failure) and drops parts older than
``TALON_WHATSAPP_PENDING_DAYS`` with a log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Literal

from talon.errors import DeliveryError, StoreUnavailable, TwilioRefused
from talon.storage.whatsapp import WhatsAppStore

from channels.whatsapp.api import WINDOW_CODES, TwilioApi
from channels.whatsapp.delivery import Delivery
from channels.whatsapp.parts import ApprovalPart, Part, part_json, part_of
from channels.whatsapp.templates import Templates

log = logging.getLogger("channels.whatsapp")

WINDOW_S = 24 * 3600.0
CLAIM_S = 120.0  # how long one worker's claim on a chat's waiting parts holds without renewal
WAIT_POLL_S = 0.2
SWEEP_S = 60.0

State = Literal["open", "closed", "unknown"]
SendApproval = Callable[[str, ApprovalPart], Awaitable[None]]


class Window:
    def __init__(self, store: WhatsAppStore, api: TwilioApi, delivery: Delivery, templates: Templates, *,
                 holder: str, pending_days: float, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.api = api
        self.delivery = delivery
        self.templates = templates
        self.holder = holder
        self.pending_s = pending_days * 86400
        self.clock = clock
        self.send_approval: SendApproval | None = None  # set by the approvals part
        self._locks: dict[str, list[Any]] = {}  # chat -> [lock, users]
        self._told_missing = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None

    # --- state --------------------------------------------------------------------------------
    async def state(self, chat_id: str) -> State:
        last = await self.store.last_inbound(chat_id)
        refused = await self.store.last_refused(chat_id)
        if refused is not None and (last is None or refused >= last):
            return "closed"  # Twilio said so after the person's last message
        if last is None:
            return "unknown"
        return "open" if self.clock() - last < WINDOW_S else "closed"

    async def refused(self, chat_id: str) -> None:
        """Twilio refused a message for the window: closed until the person writes."""
        await self.store.refused(chat_id, self.clock())

    async def seen(self, chat_id: str, at: float | None = None) -> None:
        await self.store.seen(chat_id, self.clock() if at is None else at)

    @contextlib.asynccontextmanager
    async def lock(self, chat_id: str) -> AsyncIterator[None]:
        """One sender at a time per chat in this process (the store's claim orders workers)."""
        entry = self._locks.get(chat_id)
        if entry is None:
            entry = self._locks[chat_id] = [asyncio.Lock(), 0]
        entry[1] += 1
        try:
            async with entry[0]:
                yield
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                self._locks.pop(chat_id, None)

    async def status_lines(self, chat_id: str) -> list[str]:
        """For /status: the window, what waits, the last failed delivery, a missing template."""
        lines: list[str] = []
        last = await self.store.last_inbound(chat_id)
        state = await self.state(chat_id)
        if state == "open" and last is not None:
            left = WINDOW_S - (self.clock() - last)
            lines.append(f"WhatsApp window: open for {left / 3600:.1f} more hours")
        elif state == "closed":
            lines.append("WhatsApp window: closed (WhatsApp takes only templates until you write; "
                         "what waits is sent then)")
        waiting = await self.store.pending_count(chat_id)
        if waiting:
            lines.append(f"WhatsApp: {waiting} message part(s) waiting for the window")
        failure = await self.store.last_failure(chat_id)
        if failure is not None:
            lines.append(f"WhatsApp: last failed delivery {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(failure.updated))}"
                         f": {failure.status} (Twilio error {failure.error_code}: "
                         f"{failure.error_message or 'no words given'})")
        notice = self.templates.missing_notice()
        if notice:
            lines.append(f"WhatsApp: {notice}")
        return lines

    # --- waiting ------------------------------------------------------------------------------
    async def hold(self, chat_id: str, parts: Sequence[Part | ApprovalPart], *, reminder: str | None = None,
                   why: str) -> None:
        """Keep ``parts`` for when the window reopens; tell the person with a template if this is
        the first thing waiting (or a scheduled task's reminder)."""
        if not parts:
            return
        before = await self.store.pending_count(chat_id)
        await self.store.add_pending(chat_id, [part_json(p) for p in parts], self.clock())
        log.info("whatsapp: chat=%s: %d part(s) wait for the 24-hour window (%s); %d were waiting already",
                 chat_id, len(parts), why, before)
        if before and reminder is None:
            return  # the person was told when the first one began to wait
        chosen = self.templates.for_closed_window(reminder)
        if chosen is None:
            self.tell_missing(chat_id)
            return
        template, filled = chosen
        try:
            await self.api.send(chat_id, content=template.content(**filled), what=f"the {template.purpose} template",
                                kind="template")
        except TwilioRefused as exc:
            log.error("whatsapp: chat=%s: Twilio refused the %s template %s (%s); the message waits all the same "
                      "for the person to write", chat_id, template.purpose, template.sid, exc.detail or exc)
        except DeliveryError as exc:
            log.error("whatsapp: chat=%s: the %s template could not be sent (%s); the message waits all the same",
                      chat_id, template.purpose, exc)

    def tell_missing(self, chat_id: str) -> None:
        if self._told_missing:
            log.info("whatsapp: chat=%s: a message waits for the window (no template to tell the person)", chat_id)
            return
        self._told_missing = True
        log.error("whatsapp: chat=%s: a message waits for WhatsApp's 24-hour window and the person cannot be told: "
                  "%s. Create and approve a template in Twilio's Content Template Builder and set its SID "
                  "(see docs/channels.md). The message is kept for %g days.", chat_id,
                  self.templates.missing_notice(), self.pending_s / 86400)

    # --- delivering what waited ---------------------------------------------------------------
    def kick(self, chat_id: str) -> None:
        """Deliver what waits for ``chat_id`` in the background (the person just wrote)."""
        task = asyncio.create_task(self._flush_locked(chat_id), name=f"whatsapp-flush-{chat_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush_locked(self, chat_id: str) -> None:
        try:
            async with self.lock(chat_id):
                await self.flush(chat_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - what waits stays in the store; the sweep tries again
            log.warning("whatsapp: chat=%s: delivering the waiting messages failed (%s); they keep waiting",
                        chat_id, exc)

    async def flush(self, chat_id: str) -> bool:
        """Send what waits for ``chat_id``, in order (the caller holds the chat's lock). True when
        nothing waits any more: a new message may go."""
        if not await self.store.pending_count(chat_id):
            return True
        if await self.state(chat_id) == "closed":
            return False
        deadline = time.monotonic() + CLAIM_S
        while not await self.store.claim(chat_id, self.holder, self.clock() + CLAIM_S, self.clock()):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(WAIT_POLL_S)  # another worker is delivering them now: after it
        try:
            for waiting in await self.store.pending(chat_id):
                part = part_of(waiting.payload)
                if part is None:
                    log.error("whatsapp: chat=%s: a waiting part could not be read; dropped: %.200s", chat_id,
                              waiting.payload)
                else:
                    try:
                        await self._send_waiting(chat_id, part)
                    except TwilioRefused as exc:
                        if exc.code in WINDOW_CODES:
                            await self.refused(chat_id)
                        if exc.code in WINDOW_CODES or exc.chat_level:
                            log.info("whatsapp: chat=%s: the waiting messages still cannot go (%s)", chat_id, exc)
                            return False
                        log.error("whatsapp: chat=%s: a waiting part was refused and is dropped: %s", chat_id, exc)
                    except DeliveryError as exc:
                        log.warning("whatsapp: chat=%s: delivering a waiting part failed (%s); it keeps waiting",
                                    chat_id, exc)
                        return False
                await self.store.remove_pending(waiting.id)
                await self.store.claim(chat_id, self.holder, self.clock() + CLAIM_S, self.clock())  # renew
            log.info("whatsapp: chat=%s: the messages that waited for the window were delivered", chat_id)
            return not await self.store.pending_count(chat_id)
        finally:
            with contextlib.suppress(Exception):
                await self.store.release(chat_id, self.holder)

    async def _send_waiting(self, chat_id: str, part: Part | ApprovalPart) -> None:
        if isinstance(part, ApprovalPart):
            if self.send_approval is not None:
                await self.send_approval(chat_id, part)
            return
        await self.delivery.send_part(chat_id, part, kind="answer")

    # --- the sweep ----------------------------------------------------------------------------
    def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="whatsapp-window-sweep")

    async def stop(self) -> None:
        tasks = [*self._tasks] + ([self._sweeper] if self._sweeper is not None else [])
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._sweeper = None

    async def _sweep_forever(self) -> None:
        while True:
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except (StoreUnavailable, Exception) as exc:  # noqa: BLE001 - tried again at the next sweep
                log.warning("whatsapp: the sweep of waiting messages failed (%s)", exc)
            await asyncio.sleep(SWEEP_S)

    async def sweep(self) -> None:
        expired = await self.store.expire_pending(self.clock() - self.pending_s)
        for part in expired:
            log.warning("whatsapp: chat=%s: a message part waited more than %g days for the person to write "
                        "(TALON_WHATSAPP_PENDING_DAYS) and is dropped: %.120s", part.chat_id, self.pending_s / 86400,
                        _preview(part.payload))
        for chat_id in await self.store.chats_with_pending():
            if await self.state(chat_id) != "closed":
                await self._flush_locked(chat_id)


def _preview(payload: str) -> str:
    try:
        data = json.loads(payload)
        return str(data.get("body") or data.get("text") or data.get("path") or data.get("kind"))
    except (ValueError, AttributeError):
        return payload
