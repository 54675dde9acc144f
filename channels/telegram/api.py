"""How the Telegram channel calls the Bot API: where a send goes, pacing, retries.

- Groups: every send of a reply goes to its forum topic (``message_thread_id``), and the first
  part's sends reply to the message that asked.
- One send budget per chat (``channels/send_budget.py``), in two shares: the messages of a reply
  wait for room only under Telegram's own pace (about 20 messages a minute into a group,
  ``PRIVATE_WINDOW`` into a private chat); drafts, edits, typing pings and reactions spend their
  own share (``PRIVATE_COSMETIC``, half the group pace in groups) and are dropped when it is spent.
- Retries: a 429 blocks the chat's budget for the retry_after Telegram names (so drafts and edits
  stop and the next send waits it out) and the send is tried again then; network errors are
  retried with backoff (3 tries); refusals (400/403) are never retried.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import functools
import logging
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from telegram import ReplyParameters
from telegram.error import BadRequest, Forbidden, InvalidToken, NetworkError, RetryAfter, TelegramError, TimedOut
from telegram.ext import Application
from telegram.warnings import PTBDeprecationWarning

from talon.config import Limits, Settings
from talon.errors import DeliveryError, UploadTimedOut
from talon.render.chunking import split_markdown
from talon.render.telegram import utf16_len

from channels.send_budget import SendBudget, Window

log = logging.getLogger(__name__)

T = TypeVar("T")

SEND_TRIES = 3
# Uploads get time by their size: 30 s plus a second per 100 KB to send it (write) and to have
# Telegram process and answer (read). A timeout after the bytes went out may well have
# succeeded, so an upload that timed out is tried once more, never more (see TelegramApi.with_retries).
UPLOAD_BASE_TIMEOUT_S = 30.0
UPLOAD_BYTES_PER_S = 100_000
# The updates Talon asks for: messages, their edits (see intake.py), and presses of the approval
# buttons (approvals.py).
ALLOWED_UPDATES = ("message", "edited_message", "callback_query")
MAX_RETRY_AFTER_S = 120.0
# Telegram asks bots to stay near one message a second in a private chat (short bursts are
# tolerated): that, and nothing else, is what answers wait for there.
PRIVATE_WINDOW = Window(limit=30, seconds=30.0)
# The cosmetic calls' own share (typing, reactions, drafts, interim edits): on top of the
# answers', dropped when spent. A group's is half its answers' pace.
PRIVATE_COSMETIC = Window(limit=30, seconds=60.0)


@dataclass(frozen=True)
class _SendTarget:
    """Where in a chat the sends of the part being delivered go: a forum topic, and the message
    they answer (groups). Set around each part, so every send of it lands in the same place."""

    thread_id: int | None = None
    reply_to: int | None = None


_send_target: contextvars.ContextVar[_SendTarget | None] = contextvars.ContextVar(
    "telegram_send_target", default=None)


def _where() -> dict[str, Any]:
    """The Bot API parameters that put a send in the current target's topic, as its reply."""
    target = _send_target.get()
    kwargs: dict[str, Any] = {}
    if target is not None and target.thread_id is not None:
        kwargs["message_thread_id"] = target.thread_id
    if target is not None and target.reply_to is not None:
        # A deleted question must not cost the answer.
        kwargs["reply_parameters"] = ReplyParameters(message_id=target.reply_to,
                                                     allow_sending_without_reply=True)
    return kwargs


def is_group_chat(chat_id: str) -> bool:
    return chat_id.startswith("-")  # users have positive ids; groups negative


def telegram_budget(limits: Limits) -> SendBudget:
    """The per-chat budget: Telegram's pace into groups, about one call a second otherwise."""
    per_minute = limits.telegram_group_messages_per_minute
    group = Window(limit=per_minute, seconds=60.0)
    group_cosmetic = Window(limit=max(1, per_minute // 2), seconds=60.0)
    return SendBudget(lambda chat: group if is_group_chat(chat) else PRIVATE_WINDOW,
                      cosmetic_for=lambda chat: group_cosmetic if is_group_chat(chat) else PRIVATE_COSMETIC)


def _int_or_none(value: str | None) -> int | None:
    return int(value) if value is not None else None


def _retry_seconds(exc: RetryAfter) -> float:
    with warnings.catch_warnings():
        # PTB 22 warns that retry_after will become a timedelta; both forms are handled here.
        warnings.simplefilter("ignore", PTBDeprecationWarning)
        value = exc.retry_after
    return value.total_seconds() if isinstance(value, dt.timedelta) else float(value)


def _refused_markup(exc: DeliveryError) -> bool:
    text = str(exc).lower()
    return exc.permanent and ("parse" in text or "entit" in text)


def upload_timeouts(size: int) -> dict[str, float]:
    """Write and read timeouts for uploading ``size`` bytes (python-telegram-bot's kwargs)."""
    extra = size / UPLOAD_BYTES_PER_S
    return {"write_timeout": UPLOAD_BASE_TIMEOUT_S + extra, "read_timeout": UPLOAD_BASE_TIMEOUT_S + extra}


def _refusal_reason(exc: DeliveryError) -> str:
    if isinstance(exc, UploadTimedOut):
        return "the upload timed out twice (it may still arrive)"
    cause = exc.__cause__
    detail = cause.message if isinstance(cause, TelegramError) else str(exc)
    return f"Telegram refused it ({detail})"


CHANNEL = "telegram"  # the channel's name, in every InboundMessage and access check


class TelegramApi:
    """The one Bot API client every part of the channel is given: the python-telegram-bot
    application, the settings and limits, the per-chat send budget, and the one way a Bot API
    call is made (paced in groups, with retries). ``TelegramChannel`` builds it and hands it to
    intake, delivery, live views, reactions, polling, webhook, downloads and approval prompts."""

    def __init__(self, app: Application, settings: Settings, limits: Limits, budget: SendBudget) -> None:
        self.app = app
        self.settings = settings
        self.limits = limits
        self.budget = budget

    @property
    def bot(self) -> Any:
        # Any: the Bot API methods are called with keyword dicts (``_where``, upload timeouts)
        # that PTB's stubs cannot check; this stays inside the channel, never at the seam.
        return self.app.bot

    def paced(self, chat_id: str, call: Callable[[], Awaitable[T]], messages: int = 1) -> Callable[[], Awaitable[T]]:
        """``call``, waiting first for room in the chat's send budget (each try counts); a 429
        blocks the chat's budget for as long as Telegram asks."""

        async def paced() -> T:
            waited = await self.budget.acquire(chat_id, messages)
            if waited:
                log.info("telegram: chat=%s: waited %.1fs for the chat's send budget%s", chat_id, waited,
                         " (about 20 messages a minute into a group)" if is_group_chat(chat_id) else "")
            try:
                return await call()
            except RetryAfter as exc:
                self.budget.penalize(chat_id, _retry_seconds(exc))
                raise

        return paced

    async def with_retries(self, call: Callable[[], Awaitable[T]], what: str, *, upload: bool = False) -> T:
        """Honour 429 retry_after, retry network errors with backoff, never retry a refusal.

        An upload whose answer timed out may have arrived: it is retried once, logged, and a
        second timeout is ``UploadTimedOut`` (the file gets a "Could not attach" line, the rest
        of the reply goes on) instead of uploading the same file again and again.
        """
        network_failures = 0
        waited = 0.0
        timeouts = 0
        while True:
            try:
                return await call()
            except TimedOut as exc:
                if not upload:
                    network_failures += 1
                    if network_failures >= SEND_TRIES:
                        raise DeliveryError(f"{what}: timed out after {SEND_TRIES} tries") from exc
                    await asyncio.sleep(0.5 * 2 ** network_failures)
                    continue
                timeouts += 1
                if timeouts > 1:
                    log.error("telegram: %s timed out again; not uploading a third time (the file may "
                              "have arrived)", what)
                    raise UploadTimedOut(f"{what}: the upload timed out twice") from exc
                log.warning("telegram: %s timed out waiting for Telegram's answer; the upload may have "
                            "arrived; retrying once", what)
            except RetryAfter as exc:
                delay = _retry_seconds(exc)
                if waited + delay > MAX_RETRY_AFTER_S:
                    raise DeliveryError(f"{what}: Telegram asked us to wait {delay:.0f}s more") from exc
                log.warning("telegram: %s rate limited; retrying in %.1fs", what, delay)
                waited += delay
                await asyncio.sleep(delay)
            except (BadRequest, Forbidden, InvalidToken) as exc:
                raise DeliveryError(f"{what}: {exc.message}", permanent=True) from exc
            except NetworkError as exc:
                network_failures += 1
                if network_failures >= SEND_TRIES:
                    raise DeliveryError(f"{what}: network error after {SEND_TRIES} tries: {exc.message}") from exc
                delay = 0.5 * 2 ** network_failures
                log.warning("telegram: %s failed (%s); retry %d in %.1fs", what, exc.message,
                            network_failures, delay)
                await asyncio.sleep(delay)

    async def send_plain(self, chat_id: str, text: str) -> None:
        """``text`` as plain messages (split at the message limit), into the current target."""
        for chunk in split_markdown(text, self.limits.telegram_text_max, utf16_len):
            await self.with_retries(self.paced(
                chat_id, functools.partial(self.bot.send_message, chat_id=int(chat_id), text=chunk,
                                           disable_web_page_preview=True, **_where())),
                "sendMessage")
