"""A loopback fake of the Telegram Bot API for driving the real python-telegram-bot client.

Point PTB at it with ``base_url=f"{tg.base_url}/bot"`` and
``base_file_url=f"{tg.base_url}/file/bot"``.

What it imitates, because Talon's behaviour depends on it:

- the wire formats PTB uses: urlencoded fields whose non-string values are JSON-encoded,
  multipart when a file is uploaded (``attach://`` references for media groups); JSON bodies and
  query strings are accepted too;
- Telegram's error shape ``{"ok": false, "error_code", "description", "parameters"}``; 401 for a
  wrong token, 404 for an unknown method;
- getUpdates offsets (confirming drops older updates), long polling and ``allowed_updates``;
- getFile limits ("file is too big") and file downloads streamed in chunks, optionally slowly;
- the limits a sender must respect: 4096 UTF-16 units of text, 1024 of caption, 2-10 media per
  group, no documents mixed with photos, and HTML that Telegram's parser would reject;
- groups: ``mention`` entities for every @username in a text or caption (as Telegram adds them),
  forum topics (``message_thread_id`` with ``is_topic_message``; a send into a topic of a chat
  that is not a forum is refused "message thread not found"), ``reply_parameters`` (a reply to a
  message the chat does not have is refused unless ``allow_sending_without_reply``), and
  getChatMember answering the statuses set with ``set_member_status`` ("member" otherwise);
- live replies: ``sendMessageDraft`` (private chats only, a non-zero ``draft_id``, the text limits
  of a message; the chat's draft is kept in ``drafts`` until the bot sends a message there),
  ``editMessageText`` (only the bot's own messages; "message is not modified" for the same text;
  every version kept in ``edit_history``), ``deleteMessage``, and ``setMessageReaction`` (only
  on a message the chat has, only Telegram's standard reaction emoji; the current reactions are
  in ``reactions`` and every change in ``reaction_log``). 429s on any method are scripted with
  ``fail_next``/``fail_when`` like everywhere else;
- inline keyboards: a ``reply_markup`` sent with a message is kept on it (``editMessageText``
  without one takes it away, as Telegram does; ``editMessageReplyMarkup`` replaces it);
  ``press_button`` makes the ``callback_query`` update of a person pressing one of its buttons
  (only a button the message has), and ``answerCallbackQuery`` accepts one answer per query, as
  Telegram does (``callback_answers``).

Everything received is recorded as a :class:`Call`; failures are scripted with ``fail_next``,
``fail_when`` and ``drop_connection_next``.
"""

from __future__ import annotations

import asyncio
import html
import io
import itertools
import json
import mimetypes
import re
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

from aiohttp import web

from tests.fakes import MAX_BODY_BYTES, LoopbackServer, UploadedFile, read_form

__all__ = ["Call", "FakeFile", "FakeTelegram", "SentMedia"]

TEXT_LIMIT = 4096
CAPTION_LIMIT = 1024
DOWNLOAD_CHUNK = 64 * 1024

# Free-text fields are kept as sent; every other urlencoded field is JSON-decoded when it parses
# to a non-string (PTB JSON-encodes ints, bools, lists and dicts but sends strings raw), so a user
# text of "123" never turns into a number.
_FREE_TEXT_FIELDS = frozenset(
    {"text", "caption", "title", "description", "short_description", "question", "explanation",
     "emoji", "name", "first_name", "last_name", "username", "query", "address", "performer",
     "file_name", "custom_title", "secret_token", "url"}
)

# Send method -> the media kind (and parameter name) it uploads.
_SEND_MEDIA = {
    "sendPhoto": "photo",
    "sendDocument": "document",
    "sendVoice": "voice",
    "sendAudio": "audio",
    "sendVideo": "video",
    "sendAnimation": "animation",
    "sendVideoNote": "video_note",
    "sendSticker": "sticker",
}

_ALWAYS_OK = (
    "deleteWebhook", "setMyCommands", "deleteMyCommands", "sendChatAction",
    "deleteMessages", "setMyDescription",
    "setMyShortDescription", "setMyName", "setChatMenuButton", "close", "logOut",
)

_ALL_METHODS = (
    "getMe", "getUpdates", "setWebhook", "getWebhookInfo", "getMyCommands", "sendMessage",
    "editMessageText", "editMessageCaption", "getFile", "sendMediaGroup", "getChatMember",
    "sendMessageDraft", "setMessageReaction", "deleteMessage", "answerCallbackQuery",
    "editMessageReplyMarkup", *_SEND_MEDIA, *_ALWAYS_OK,
)
# Telegram method names are case-insensitive; calls are recorded under the canonical spelling.
_CANONICAL = {name.lower(): name for name in _ALL_METHODS}

# Update types delivered when allowed_updates is empty or never set.
_OPT_IN_UPDATES = frozenset({"chat_member", "message_reaction", "message_reaction_count"})

# The reactions Telegram lets a bot set (its standard emoji reactions), a sample that covers the tests.
REACTION_EMOJI = frozenset("👍👎❤🔥🥰👏😁🤔🤯😱🤬😢🎉🤩🤮💩🙏👌🕊🤡🥱🥴😍🐳🌚🌭💯🤣⚡🍌🏆💔🤨😐🍓🍾💋🖕😈😴😭🤓👻👀🎃🙈😇😨🤝✍🤗🫡🎅🎄☃💅🤪🗿🆒💘🙉🦄😘💊🙊😎👾🤷😡")

_HTML_TAGS = frozenset(
    {"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "span", "tg-spoiler", "a",
     "tg-emoji", "code", "pre", "blockquote"}
)


@dataclass(frozen=True)
class Call:
    """One Bot API request as received, and what the fake answered."""

    method: str
    params: dict[str, Any]
    files: dict[str, UploadedFile]
    time: float  # time.monotonic() on arrival
    http_method: str = "POST"
    content_type: str = ""
    raw: dict[str, str] = field(default_factory=dict)  # urlencoded/multipart fields as strings
    status: int = 200  # HTTP status answered; 0 when the connection was dropped
    result: Any = None  # the "result" of a successful answer

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def media(self) -> list[SentMedia]:
        """The media this call sent (uploaded, or re-sent by file_id/URL), in order."""
        if self.method == "sendMediaGroup":
            items = self.params.get("media") or []
            return [self._media(item.get("type", ""), item.get("media"), item) for item in items]
        kind = _SEND_MEDIA.get(self.method)
        if kind is None:
            return []
        if kind in self.files:
            return [SentMedia(kind, self.files[kind], None, *_caption(self.params))]
        return [self._media(kind, self.params.get(kind), self.params)]

    def _media(self, kind: str, value: Any, source: dict[str, Any]) -> SentMedia:
        if isinstance(value, str) and value.startswith("attach://"):
            upload = self.files.get(value.removeprefix("attach://"))
            return SentMedia(kind, upload, None, *_caption(source))
        return SentMedia(kind, None, value, *_caption(source))


@dataclass(frozen=True)
class SentMedia:
    """One media item of a send call: the uploaded file, or the file_id/URL re-sent."""

    kind: str
    file: UploadedFile | None
    ref: str | None
    caption: str | None
    parse_mode: str | None


@dataclass
class FakeFile:
    """A downloadable file known to the fake."""

    file_id: str
    file_unique_id: str
    file_path: str
    data: bytes
    file_size: int  # what getFile reports; may deliberately differ from len(data)
    too_big: bool = False
    delay: float = 0.0  # seconds spread across the download's chunks


@dataclass
class _Failure:
    status: int
    description: str
    retry_after: int | None
    remaining: int | None  # None: every matching call
    predicate: Callable[[dict[str, Any]], bool] | None = None
    drop: bool = False


class _Reject(Exception):
    def __init__(self, status: int, description: str, retry_after: int | None = None) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        self.retry_after = retry_after


def _chat_key(chat_id: Any) -> int | str:
    """Chat ids arrive as ints or strings depending on the encoding; messages are keyed by int."""
    try:
        return int(chat_id)
    except (TypeError, ValueError):
        return str(chat_id)


def _caption(source: dict[str, Any]) -> tuple[str | None, str | None]:
    return source.get("caption"), source.get("parse_mode")


def _decode_field(name: str, value: str) -> Any:
    if name in _FREE_TEXT_FIELDS:
        return value
    try:
        decoded = json.loads(value)
    except ValueError:
        return value
    return value if isinstance(decoded, str) else decoded


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


class _HtmlChecker(HTMLParser):
    """Rejects the HTML Telegram's parser rejects: unknown tags, bad nesting, unclosed tags."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.text = text
        self.stack: list[str] = []
        self.error: str | None = None

    def _byte_offset(self) -> int:
        line, col = self.getpos()
        lines = self.text.split("\n")
        index = sum(len(part) + 1 for part in lines[: line - 1]) + col
        return len(self.text[:index].encode())

    def _fail(self, message: str) -> None:
        if self.error is None:
            self.error = message

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in _HTML_TAGS:
            self._fail(f'Unsupported start tag "{tag}" at byte offset {self._byte_offset()}')
        self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._fail(f'Unsupported start tag "{tag}" at byte offset {self._byte_offset()}')

    def handle_endtag(self, tag: str) -> None:
        if not self.stack:
            self._fail(f'Unexpected end tag at byte offset {self._byte_offset()}')
        elif self.stack[-1] != tag:
            self._fail(
                f"Unmatched end tag at byte offset {self._byte_offset()}, "
                f'expected "</{self.stack[-1]}>", found "</{tag}>"'
            )
        else:
            self.stack.pop()

    def check(self) -> str | None:
        self.feed(self.text)
        self.close()
        if self.error is None and self.stack:
            self.error = f'Can\'t find end tag corresponding to start tag "{self.stack[-1]}"'
        return self.error


_MD_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_MD_ESCAPE = re.compile(r"\\(.)")
_MD_MARKUP = re.compile(r"(?<!\\)[*_~|`]")


def visible_text(text: str, parse_mode: str | None) -> str:
    """The text Telegram would display, which is what its length limits count.

    HTML is exact enough; Markdown is approximated leniently (it may undercount, never overcount),
    so the fake never rejects a message Telegram would accept.
    """
    mode = (parse_mode or "").lower()
    if mode == "html":
        return html.unescape(re.sub(r"<[^>]*>", "", text))
    if mode in ("markdown", "markdownv2"):
        text = _MD_LINK.sub(r"\1", text)
        return _MD_ESCAPE.sub(r"\1", _MD_MARKUP.sub("", text))
    return text


def _image_size(data: bytes) -> tuple[int, int] | None:
    try:
        from PIL import Image

        with Image.open(io.BytesIO(data)) as image:
            return image.size
    except Exception:  # not an image Pillow knows; callers fall back to given dimensions
        return None


def _thumbnail(data: bytes, long_side: int) -> bytes | None:
    try:
        from PIL import Image

        with Image.open(io.BytesIO(data)) as image:
            small = image.convert("RGB")
        small.thumbnail((long_side, long_side))
        out = io.BytesIO()
        small.save(out, "JPEG", quality=80)
        return out.getvalue()
    except Exception:
        return None


class FakeTelegram(LoopbackServer):
    """A Bot API server for one bot token. See the module docstring."""

    def __init__(
        self,
        token: str = "123:abc",
        *,
        bot_username: str = "talon_test_bot",
        enforce_limits: bool = True,
    ) -> None:
        super().__init__()
        self.token = token
        self.enforce_limits = enforce_limits
        head = token.split(":", 1)[0]
        self.bot_user: dict[str, Any] = {
            "id": int(head) if head.isdigit() else 123456,
            "is_bot": True,
            "first_name": "Talon Test",
            "username": bot_username,
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
        }
        self.calls: list[Call] = []
        self.downloads: list[str] = []  # file paths served, in order
        self.messages: dict[tuple[int | str, int], dict[str, Any]] = {}  # (chat_id, message_id)
        self.webhook_url = ""
        self.webhook_secret: str | None = None  # setWebhook's secret_token, as sent
        self.webhook_allowed_updates: list[str] | None = None
        self.webhook_last_error: str | None = None  # getWebhookInfo's last_error_message, scripted
        self._updates: deque[dict[str, Any]] = deque()
        self._next_update_id = 1
        self._allowed_updates: frozenset[str] = frozenset()
        self._failures: dict[str, list[_Failure]] = {}
        self._files: dict[str, FakeFile] = {}
        self._files_by_path: dict[str, FakeFile] = {}
        self._file_seq = itertools.count(1)
        self._message_ids: dict[int | str, int] = {}
        self._chats: dict[int | str, dict[str, Any]] = {}
        # Seconds to hold a method's successful answer after the call was recorded (a slow API).
        self.response_delay: dict[str, float] = {}
        self._member_status: dict[tuple[int, int], str] = {}  # (chat_id, user_id) -> status
        self.drafts: dict[int | str, dict[str, Any]] = {}  # chat -> its current draft (draft_id, text)
        self.edit_history: dict[tuple[int | str, int], list[str]] = {}  # every text a message had
        self.reactions: dict[tuple[int | str, int], list[str]] = {}  # the bot's current reactions
        self.reaction_log: list[tuple[int | str, int, list[str]]] = []
        self.callback_answers: dict[str, dict[str, Any]] = {}  # callback query id -> its answer
        self._callback_queries: set[str] = set()  # ids of the queries pressed (press_button)

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT`` — the TELEGRAM_API_BASE_URL value."""
        return self.root_url

    @property
    def bot_base_url(self) -> str:
        return f"{self.root_url}/bot"

    @property
    def file_base_url(self) -> str:
        return f"{self.root_url}/file/bot"

    def _make_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_route("*", "/bot{token}/{method}", self._handle_method)
        app.router.add_get("/file/bot{token}/{file_path:.+}", self._handle_download)
        return app

    # -- scripting -------------------------------------------------------------------------

    def fail_next(
        self,
        method: str,
        status: int = 400,
        description: str | None = None,
        *,
        retry_after: int | None = None,
        times: int = 1,
    ) -> None:
        """Answer the next ``times`` calls of ``method`` with a Telegram error.

        A 429 carries ``parameters.retry_after`` (default 1), which PTB raises as RetryAfter.
        """
        self._add_failure(method, _Failure(status, *self._error_text(status, description,
                                                                     retry_after), times))

    def fail_when(
        self,
        method: str,
        predicate: Callable[[dict[str, Any]], bool],
        status: int = 400,
        description: str | None = None,
        *,
        retry_after: int | None = None,
        times: int | None = 1,
    ) -> None:
        """Fail calls of ``method`` whose decoded params satisfy ``predicate``.

        ``times`` counts matching calls only; ``None`` fails every matching call.
        Example: ``tg.fail_when("sendMessage", lambda p: p.get("parse_mode") == "HTML",
        description="Bad Request: can't parse entities: ...")``.
        """
        text, after = self._error_text(status, description, retry_after)
        self._add_failure(method, _Failure(status, text, after, times, predicate))

    def drop_connection_next(self, method: str, *, times: int = 1) -> None:
        """Close the connection without answering the next ``times`` calls (a network error)."""
        self._add_failure(method, _Failure(0, "", None, times, drop=True))

    @staticmethod
    def _error_text(
        status: int, description: str | None, retry_after: int | None
    ) -> tuple[str, int | None]:
        if status == 429:
            retry_after = 1 if retry_after is None else retry_after
            return description or f"Too Many Requests: retry after {retry_after}", retry_after
        defaults = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
                    404: "Not Found", 409: "Conflict", 500: "Internal Server Error",
                    502: "Bad Gateway"}
        return description or defaults.get(status, f"Error {status}"), retry_after

    def _add_failure(self, method: str, failure: _Failure) -> None:
        with self._cond:
            self._failures.setdefault(self._canonical(method), []).append(failure)

    def _take_failure(self, method: str, params: dict[str, Any]) -> _Failure | None:
        with self._cond:
            rules = self._failures.get(method, [])
            for rule in rules:
                if rule.predicate is not None and not rule.predicate(params):
                    continue
                if rule.remaining is not None:
                    rule.remaining -= 1
                    if rule.remaining <= 0:
                        rules.remove(rule)
                return rule
        return None

    # -- files -----------------------------------------------------------------------------

    def add_file(
        self,
        data: bytes,
        file_path: str | None = None,
        file_id: str | None = None,
        *,
        too_big: bool = False,
        delay: float = 0.0,
        file_size: int | None = None,
    ) -> str:
        """Register downloadable bytes; returns the file_id to put in an update.

        ``too_big`` makes getFile answer "file is too big" (Telegram's 20 MB bot limit);
        ``delay`` slows the download (spread across chunks, after the headers);
        ``file_size`` overrides the size getFile reports (default ``len(data)``).
        """
        n = next(self._file_seq)
        fake = FakeFile(
            file_id=file_id or f"file-{n}-{uuid.uuid4().hex[:10]}",
            file_unique_id=f"uniq-{n}",
            file_path=file_path or f"documents/file_{n}",
            data=data,
            file_size=len(data) if file_size is None else file_size,
            too_big=too_big,
            delay=delay,
        )
        with self._cond:
            self._files[fake.file_id] = fake
            self._files_by_path[fake.file_path] = fake
        return fake.file_id

    def file(self, file_id: str) -> FakeFile:
        with self._cond:
            return self._files[file_id]

    def _file_meta(self, file_id: str) -> dict[str, Any]:
        with self._cond:
            fake = self._files.get(file_id)
        if fake is None:
            return {"file_id": file_id, "file_unique_id": f"u-{file_id}"}
        return {"file_id": fake.file_id, "file_unique_id": fake.file_unique_id,
                "file_size": fake.file_size}

    def _register_or_use(self, file_id: str | None, data: bytes | None, folder: str,
                         ext: str) -> str:
        if file_id is not None:
            return file_id
        if data is None:
            raise ValueError("give either file_id (from add_file) or data")
        return self.add_file(data, f"{folder}/file_{next(self._file_seq)}{ext}")

    # -- updates ---------------------------------------------------------------------------

    def push_update(self, update: dict[str, Any], *, update_id: int | None = None) -> int:
        """Queue an update for getUpdates; returns its update_id (assigned unless given)."""
        update = dict(update)
        with self._cond:
            if update_id is None:
                update_id = self._next_update_id
            self._next_update_id = max(self._next_update_id, update_id + 1)
            update["update_id"] = update_id
            self._updates.append(update)
            if len(self._updates) > 1 and self._updates[-2]["update_id"] > update_id:
                self._updates = deque(sorted(self._updates, key=lambda u: u["update_id"]))
        self._notify()
        return update_id

    @property
    def pending_updates(self) -> list[dict[str, Any]]:
        """Updates not yet confirmed by a getUpdates offset."""
        with self._cond:
            return list(self._updates)

    def _new_message_id(self, chat_id: int | str) -> int:
        with self._cond:
            self._message_ids[chat_id] = self._message_ids.get(chat_id, 0) + 1
            return self._message_ids[chat_id]

    def _chat(self, chat_id: int | str) -> dict[str, Any]:
        with self._cond:
            known = self._chats.get(chat_id)
        if known is not None:
            return known
        if isinstance(chat_id, str):  # "@channelname"
            return {"id": -1000000000000 - abs(hash(chat_id)) % 10**9, "type": "channel",
                    "username": chat_id.lstrip("@")}
        if chat_id > 0:
            return {"id": chat_id, "type": "private", "first_name": "User"}
        return {"id": chat_id, "type": "supergroup" if str(chat_id).startswith("-100") else "group",
                "title": "Test group"}

    def text_message(
        self,
        chat_id: int,
        text: str,
        user_id: int | None = None,
        username: str | None = None,
        chat_type: str = "private",
        reply_to: int | dict[str, Any] | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """An Update with a text message. "/cmd ..." gets the bot_command entity Telegram adds.

        Every builder also takes ``message_id``, ``first_name``, ``date``, ``message_thread_id``
        and ``update_type`` (e.g. "edited_message"); ``reply_to`` is a message id (the stored
        message is embedded when the fake knows it) or a full message dict.
        """
        return self._incoming(chat_id, {"text": text}, user_id=user_id, username=username,
                              chat_type=chat_type, reply_to=reply_to, **extra)

    def photo_message(
        self,
        chat_id: int,
        file_id: str | None = None,
        *,
        data: bytes | None = None,
        sizes: list[dict[str, Any]] | None = None,
        width: int = 1280,
        height: int = 960,
        caption: str | None = None,
        media_group_id: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """An Update with a photo: a PhotoSize ladder (90/320/800 px thumbnails, largest last).

        The largest size is the registered file (``file_id`` from add_file, or ``data``). When it
        decodes as an image, thumbnails are real downscaled JPEGs and are downloadable too.
        """
        if sizes is None:
            main_id = self._register_or_use(file_id, data, "photos", ".jpg")
            sizes = self._photo_sizes(main_id, width, height)
        return self._incoming(chat_id, {"photo": sizes}, caption=caption,
                              media_group_id=media_group_id, **extra)

    def _photo_sizes(self, main_id: str, width: int, height: int) -> list[dict[str, Any]]:
        with self._cond:
            main = self._files.get(main_id)
        real = _image_size(main.data) if main is not None else None
        width, height = real or (width, height)
        long = max(width, height)
        sizes: list[dict[str, Any]] = []
        for side in (s for s in (90, 320, 800) if s < long):
            if main is None:  # an unregistered file_id: thumbnails are unregistered too
                thumb_id = f"{main_id}-{side}"
            else:
                thumb = (_thumbnail(main.data, side) if real else None) or main.data
                thumb_id = self.add_file(thumb, f"photos/file_{next(self._file_seq)}.jpg")
            sizes.append({**self._file_meta(thumb_id), "width": max(1, round(width * side / long)),
                          "height": max(1, round(height * side / long))})
        sizes.append({**self._file_meta(main_id), "width": width, "height": height})
        return sizes

    def document_message(
        self,
        chat_id: int,
        file_id: str | None = None,
        *,
        data: bytes | None = None,
        file_name: str = "file.bin",
        mime_type: str | None = None,
        caption: str | None = None,
        media_group_id: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        ext = "." + file_name.rsplit(".", 1)[1] if "." in file_name else ""
        fid = self._register_or_use(file_id, data, "documents", ext)
        doc = {**self._file_meta(fid), "file_name": file_name,
               "mime_type": mime_type or mimetypes.guess_type(file_name)[0]
               or "application/octet-stream"}
        return self._incoming(chat_id, {"document": doc}, caption=caption,
                              media_group_id=media_group_id, **extra)

    def voice_message(
        self,
        chat_id: int,
        file_id: str | None = None,
        *,
        data: bytes | None = None,
        duration: int = 1,
        mime_type: str = "audio/ogg",
        caption: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        fid = self._register_or_use(file_id, data, "voice", ".oga")
        voice = {**self._file_meta(fid), "duration": duration, "mime_type": mime_type}
        return self._incoming(chat_id, {"voice": voice}, caption=caption, **extra)

    def audio_message(
        self,
        chat_id: int,
        file_id: str | None = None,
        *,
        data: bytes | None = None,
        duration: int = 1,
        file_name: str = "audio.mp3",
        mime_type: str | None = None,
        title: str | None = None,
        performer: str | None = None,
        caption: str | None = None,
        media_group_id: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        ext = "." + file_name.rsplit(".", 1)[1] if "." in file_name else ".mp3"
        fid = self._register_or_use(file_id, data, "music", ext)
        audio: dict[str, Any] = {**self._file_meta(fid), "duration": duration,
                                 "file_name": file_name,
                                 "mime_type": mime_type or mimetypes.guess_type(file_name)[0]
                                 or "audio/mpeg"}
        if title is not None:
            audio["title"] = title
        if performer is not None:
            audio["performer"] = performer
        return self._incoming(chat_id, {"audio": audio}, caption=caption,
                              media_group_id=media_group_id, **extra)

    def video_message(
        self,
        chat_id: int,
        file_id: str | None = None,
        *,
        data: bytes | None = None,
        duration: int = 1,
        width: int = 640,
        height: int = 360,
        file_name: str = "video.mp4",
        mime_type: str = "video/mp4",
        caption: str | None = None,
        media_group_id: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        fid = self._register_or_use(file_id, data, "videos", ".mp4")
        video = {**self._file_meta(fid), "width": width, "height": height, "duration": duration,
                 "file_name": file_name, "mime_type": mime_type}
        return self._incoming(chat_id, {"video": video}, caption=caption,
                              media_group_id=media_group_id, **extra)

    def video_note_message(
        self,
        chat_id: int,
        file_id: str | None = None,
        *,
        data: bytes | None = None,
        duration: int = 1,
        length: int = 240,
        **extra: Any,
    ) -> dict[str, Any]:
        fid = self._register_or_use(file_id, data, "video_notes", ".mp4")
        note = {**self._file_meta(fid), "length": length, "duration": duration}
        return self._incoming(chat_id, {"video_note": note}, **extra)

    def animation_message(
        self,
        chat_id: int,
        file_id: str | None = None,
        *,
        data: bytes | None = None,
        duration: int = 1,
        width: int = 320,
        height: int = 240,
        file_name: str = "animation.mp4",
        mime_type: str = "video/mp4",
        caption: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """Telegram sends GIFs as MP4 animations and repeats them under ``document``."""
        fid = self._register_or_use(file_id, data, "animations", ".mp4")
        meta = {**self._file_meta(fid), "file_name": file_name, "mime_type": mime_type}
        animation = {**meta, "width": width, "height": height, "duration": duration}
        return self._incoming(chat_id, {"animation": animation, "document": meta},
                              caption=caption, **extra)

    def sticker_message(
        self,
        chat_id: int,
        emoji: str = "👍",
        is_animated: bool = False,
        is_video: bool = False,
        file_id: str | None = None,
        *,
        data: bytes | None = None,
        set_name: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        ext = ".tgs" if is_animated else ".webm" if is_video else ".webp"
        if file_id is None and data is None:
            data = b""
        fid = self._register_or_use(file_id, data, "stickers", ext)
        sticker: dict[str, Any] = {**self._file_meta(fid), "type": "regular", "width": 512,
                                   "height": 512, "is_animated": is_animated,
                                   "is_video": is_video, "emoji": emoji}
        if set_name is not None:
            sticker["set_name"] = set_name
        return self._incoming(chat_id, {"sticker": sticker}, **extra)

    def _incoming(
        self,
        chat_id: int,
        content: dict[str, Any],
        *,
        user_id: int | None = None,
        username: str | None = None,
        first_name: str | None = None,
        chat_type: str = "private",
        reply_to: int | dict[str, Any] | None = None,
        message_id: int | None = None,
        caption: str | None = None,
        media_group_id: str | None = None,
        date: int | None = None,
        message_thread_id: int | None = None,
        update_type: str = "message",
        last_name: str | None = None,
        is_bot: bool = False,
        chat_title: str | None = None,
        is_forum: bool = False,
        sender_chat: dict[str, Any] | None = None,
        entities: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        if user_id is None:
            user_id = chat_id if chat_type == "private" else 1001
        user: dict[str, Any] = {"id": user_id, "is_bot": is_bot,
                                "first_name": first_name or username or "User",
                                "language_code": "en"}
        if last_name is not None:
            user["last_name"] = last_name
        if username is not None:
            user["username"] = username
        if chat_type == "private":
            chat = {"id": chat_id, "type": "private", "first_name": user["first_name"]}
            if username is not None:
                chat["username"] = username
        else:
            chat = {"id": chat_id, "type": chat_type, "title": chat_title or f"Test {chat_type}"}
            if is_forum:
                chat["is_forum"] = True
        with self._cond:
            self._chats[chat_id] = chat
        message: dict[str, Any] = {
            "message_id": message_id or self._new_message_id(chat_id),
            "from": user,
            "chat": chat,
            "date": date or int(time.time()),
            **content,
        }
        if message_thread_id is not None:
            message["message_thread_id"] = message_thread_id
            if is_forum:
                message["is_topic_message"] = True
        if sender_chat is not None:
            message["sender_chat"] = sender_chat
        if caption is not None:
            message["caption"] = caption
        if media_group_id is not None:
            message["media_group_id"] = media_group_id
        for key in ("text", "caption"):
            found = _auto_entities(message.get(key))
            if key == ("text" if "text" in message else "caption") and entities is not None:
                found = entities
            if found:
                message["entities" if key == "text" else "caption_entities"] = found
        if reply_to is not None:
            message["reply_to_message"] = (
                reply_to if isinstance(reply_to, dict) else self._replied(chat, reply_to)
            )
        elif is_forum and message_thread_id is not None:
            # Telegram links every topic message to the service message that opened the topic.
            message["reply_to_message"] = {
                "message_id": message_thread_id, "chat": chat, "date": int(time.time()),
                "from": user, "message_thread_id": message_thread_id, "is_topic_message": True,
                "forum_topic_created": {"name": f"Topic {message_thread_id}", "icon_color": 7322096}}
        with self._cond:
            self.messages[(chat_id, message["message_id"])] = message
        return {update_type: message}

    def press_button(self, chat_id: int, message_id: int, data: str, *, user_id: int,
                     username: str | None = None, first_name: str | None = None) -> dict[str, Any]:
        """A ``callback_query`` Update: ``user_id`` pressed the inline button with callback data
        ``data`` on the bot's message ``message_id``. ValueError when the message has no such button
        (Telegram shows only the buttons a message has)."""
        with self._cond:
            message = self.messages.get((chat_id, message_id))
        if message is None:
            raise ValueError(f"no message {message_id} in chat {chat_id}")
        rows = (message.get("reply_markup") or {}).get("inline_keyboard") or []
        if data not in [b.get("callback_data") for row in rows for b in row]:
            raise ValueError(f"message {message_id} has no button with data {data!r} (it has {rows!r})")
        user: dict[str, Any] = {"id": user_id, "is_bot": False, "first_name": first_name or username or "User"}
        if username is not None:
            user["username"] = username
        query_id = str(uuid.uuid4().int % 10**18)
        with self._cond:
            self._callback_queries.add(query_id)
        return {"callback_query": {"id": query_id, "from": user, "message": message,
                                   "chat_instance": str(abs(hash(chat_id)) % 10**12), "data": data}}

    def edited_text_message(self, chat_id: int, message_id: int, text: str) -> dict[str, Any]:
        """An ``edited_message`` Update: a message the fake knows (sent by a person through
        ``text_message``), with its new text, fresh entities and an ``edit_date``."""
        with self._cond:
            original = self.messages[(chat_id, message_id)]
        message = {k: v for k, v in original.items() if k != "entities"}
        message.update(text=text, edit_date=int(time.time()))
        found = _auto_entities(text)
        if found:
            message["entities"] = found
        with self._cond:
            self.messages[(chat_id, message_id)] = message
        return {"edited_message": message}

    def _replied(self, chat: dict[str, Any], message_id: int) -> dict[str, Any]:
        with self._cond:
            known = self.messages.get((chat["id"], message_id))
        if known is not None:
            return {k: v for k, v in known.items() if k != "reply_to_message"}
        return {"message_id": message_id, "chat": chat, "date": int(time.time()),
                "from": self.bot_user, "text": ""}

    # -- recording -------------------------------------------------------------------------

    def sent(
        self, method: str | None = None, chat_id: int | str | None = None, *,
        include_failed: bool = False,
    ) -> list[Call]:
        """Recorded calls, filtered; only successfully answered ones unless include_failed."""
        with self._cond:
            calls = list(self.calls)
        return [c for c in calls if self._matches(c, method, chat_id, include_failed)]

    def texts(self, chat_id: int | str | None = None) -> list[str]:
        """Texts of the messages successfully sent with sendMessage, in order."""
        return [c.params.get("text", "") for c in self.sent("sendMessage", chat_id)]

    def media_sent(self, chat_id: int | str | None = None) -> list[SentMedia]:
        """Every media item successfully sent (single sends and media groups), in order."""
        return [m for c in self.sent(chat_id=chat_id) for m in c.media]

    def _matches(self, call: Call, method: str | None, chat_id: int | str | None,
                 include_failed: bool) -> bool:
        if method is not None and call.method != self._canonical(method):
            return False
        if chat_id is not None and str(call.params.get("chat_id")) != str(chat_id):
            return False
        return include_failed or call.ok

    async def wait_for(
        self,
        method: str,
        predicate: Callable[[Call], bool] | None = None,
        count: int = 1,
        timeout: float = 10.0,
        *,
        include_failed: bool = False,
    ) -> list[Call]:
        """Wait until ``count`` calls of ``method`` match; returns all matching calls.

        Raises TimeoutError listing the calls seen, which is usually the diagnosis.
        """
        check, describe = self._call_waiter(method, predicate, count, include_failed)
        return await self._wait_until(check, timeout, describe)

    def wait_for_sync(
        self,
        method: str,
        predicate: Callable[[Call], bool] | None = None,
        count: int = 1,
        timeout: float = 10.0,
        *,
        include_failed: bool = False,
    ) -> list[Call]:
        """Blocking ``wait_for`` for threads other than the fake's loop."""
        check, describe = self._call_waiter(method, predicate, count, include_failed)
        return self._wait_until_sync(check, timeout, describe)

    def _call_waiter(
        self, method: str, predicate: Callable[[Call], bool] | None, count: int,
        include_failed: bool,
    ) -> tuple[Callable[[], list[Call] | None], Callable[[], str]]:
        def check() -> list[Call] | None:
            found = [c for c in self.calls if self._matches(c, method, None, include_failed)
                     and (predicate is None or predicate(c))]
            return found if len(found) >= count else None

        def describe() -> str:
            return (f"waited for {count} x {method}; calls seen:\n" + self.summary())

        return check, describe

    def summary(self) -> str:
        """One line per recorded call, for assertion messages."""
        with self._cond:
            calls = list(self.calls)
        lines = []
        for c in calls:
            shown = {k: (v if len(repr(v)) < 80 else repr(v)[:77] + "...")
                     for k, v in c.params.items()}
            files = f" files={list(c.files)}" if c.files else ""
            lines.append(f"  {c.method} [{c.status}] {shown}{files}")
        return "\n".join(lines) or "  (none)"

    # -- HTTP ------------------------------------------------------------------------------

    @staticmethod
    def _canonical(method: str) -> str:
        return _CANONICAL.get(method.lower(), method)

    @staticmethod
    def _error(status: int, description: str, retry_after: int | None = None) -> web.Response:
        body: dict[str, Any] = {"ok": False, "error_code": status, "description": description}
        if retry_after is not None:
            body["parameters"] = {"retry_after": retry_after}
        return web.json_response(body, status=status)

    async def _handle_method(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["token"] != self.token:
            return self._error(401, "Unauthorized")
        arrival = time.monotonic()
        method = self._canonical(request.match_info["method"])
        raw, files, params, content_type = await self._read_params(request)

        def record(status: int, result: Any = None) -> None:
            call = Call(method, params, files, arrival, request.method, content_type, raw,
                        status, result)
            with self._cond:
                self.calls.append(call)
            self._notify()

        if method not in _ALL_METHODS:
            record(404)
            return self._error(404, "Not Found")
        failure = self._take_failure(method, params)
        if failure is not None and failure.drop:
            record(0)
            assert request.transport is not None
            request.transport.abort()
            # The client sees the connection reset; aiohttp discards this unsent response.
            return web.Response(status=500)
        if failure is not None:
            record(failure.status)
            return self._error(failure.status, failure.description, failure.retry_after)
        try:
            if method in _SEND_MEDIA:
                result = await self._send_media(_SEND_MEDIA[method], params, files)
            else:
                result = await getattr(self, f"_api_{method}", self._api_ok)(params, files)
        except _Reject as reject:
            record(reject.status)
            return self._error(reject.status, reject.description, reject.retry_after)
        except Exception as exc:  # a fake bug: fail the call visibly instead of a bare aiohttp 500
            record(500)
            return self._error(500, f"Internal Server Error: fake failed: {exc!r}")
        record(200, result)
        if self.response_delay.get(method):
            await asyncio.sleep(self.response_delay[method])
        return web.json_response({"ok": True, "result": result})

    @staticmethod
    async def _read_params(
        request: web.Request,
    ) -> tuple[dict[str, str], dict[str, UploadedFile], dict[str, Any], str]:
        content_type = request.content_type
        if content_type == "application/json":
            body = await request.json() if request.can_read_body else {}
            params = {**request.query, **(body or {})}
            return dict(request.query), {}, params, content_type
        raw, files = await read_form(request)
        return raw, files, {k: _decode_field(k, v) for k, v in raw.items()}, content_type

    async def _handle_download(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["token"] != self.token:
            return self._error(401, "Unauthorized")
        path = request.match_info["file_path"]
        with self._cond:
            fake = self._files_by_path.get(path)
            self.downloads.append(path)
        if fake is None or fake.too_big:
            return self._error(404, "Not Found")
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = len(fake.data)
        await response.prepare(request)
        chunks = [fake.data[i:i + DOWNLOAD_CHUNK]
                  for i in range(0, len(fake.data), DOWNLOAD_CHUNK)] or [b""]
        for chunk in chunks:
            if fake.delay:
                await asyncio.sleep(fake.delay / len(chunks))
            await response.write(chunk)
        await response.write_eof()
        return response

    # -- API methods -----------------------------------------------------------------------

    async def _api_ok(self, params: dict[str, Any], files: dict[str, UploadedFile]) -> Any:
        return True

    async def _api_getMe(self, params: dict[str, Any], files: dict[str, UploadedFile]) -> Any:
        return self.bot_user

    async def _api_getMyCommands(self, params: dict[str, Any],
                                 files: dict[str, UploadedFile]) -> Any:
        return []

    async def _api_setWebhook(self, params: dict[str, Any],
                              files: dict[str, UploadedFile]) -> Any:
        with self._cond:
            self.webhook_url = params.get("url", "")
            self.webhook_secret = params.get("secret_token")
            self.webhook_allowed_updates = params.get("allowed_updates")
        return True

    async def _api_deleteWebhook(self, params: dict[str, Any],
                                 files: dict[str, UploadedFile]) -> Any:
        with self._cond:
            self.webhook_url = ""
            self.webhook_secret = None
            if params.get("drop_pending_updates"):
                self._updates.clear()
        return True

    async def _api_getWebhookInfo(self, params: dict[str, Any],
                                  files: dict[str, UploadedFile]) -> Any:
        with self._cond:
            info: dict[str, Any] = {"url": self.webhook_url, "has_custom_certificate": False,
                                    "pending_update_count": len(self._updates)}
            if self.webhook_url and self.webhook_last_error:
                info.update(last_error_date=int(time.time()),
                            last_error_message=self.webhook_last_error)
            return info

    async def _api_getUpdates(self, params: dict[str, Any],
                              files: dict[str, UploadedFile]) -> Any:
        offset = int(params.get("offset") or 0)
        limit = max(1, min(100, int(params.get("limit") or 100)))
        timeout = float(params.get("timeout") or 0)
        with self._cond:
            if self.webhook_url:
                raise _Reject(409, "Conflict: can't use getUpdates method while webhook is "
                                   "active; use deleteWebhook to delete the webhook first")
            if "allowed_updates" in params:
                self._allowed_updates = frozenset(params["allowed_updates"] or ())
            self._updates = deque(u for u in self._updates if u["update_id"] >= offset)

        def deliverable() -> list[dict[str, Any]] | None:
            ready = [u for u in self._updates
                     if u["update_id"] >= offset and self._allowed(u)][:limit]
            return ready if ready or self._closing else None

        try:
            return await self._wait_until(deliverable, timeout, lambda: "")
        except TimeoutError:
            return []

    def _allowed(self, update: dict[str, Any]) -> bool:
        kind = next((k for k in update if k != "update_id"), "")
        if self._allowed_updates:
            return kind in self._allowed_updates
        return kind not in _OPT_IN_UPDATES

    async def _api_sendMessage(self, params: dict[str, Any],
                               files: dict[str, UploadedFile]) -> Any:
        text = self._checked_text(params.get("text"), params.get("parse_mode"), TEXT_LIMIT,
                                  "message is too long", "message text is empty")
        markup = {"reply_markup": params["reply_markup"]} if params.get("reply_markup") else {}
        return self._bot_message(params.get("chat_id"), params=params, text=text, **markup)

    async def _api_editMessageText(self, params: dict[str, Any],
                                   files: dict[str, UploadedFile]) -> Any:
        text = self._checked_text(params.get("text"), params.get("parse_mode"), TEXT_LIMIT,
                                  "message is too long", "message text is empty")
        edited = self._edit(params, "text", text)
        if isinstance(edited, dict):
            with self._cond:
                key = (edited["chat"]["id"], edited["message_id"])
                self.edit_history.setdefault(key, []).append(text)
                # An edit without reply_markup takes the inline keyboard away.
                edited = {k: v for k, v in edited.items() if k != "reply_markup"}
                if params.get("reply_markup"):
                    edited["reply_markup"] = params["reply_markup"]
                self.messages[key] = edited
        return edited

    async def _api_editMessageReplyMarkup(self, params: dict[str, Any],
                                          files: dict[str, UploadedFile]) -> Any:
        return self._edit(params, "reply_markup", params.get("reply_markup") or None)

    async def _api_answerCallbackQuery(self, params: dict[str, Any],
                                       files: dict[str, UploadedFile]) -> Any:
        query_id = str(params.get("callback_query_id", ""))
        with self._cond:
            if query_id not in self._callback_queries or query_id in self.callback_answers:
                raise _Reject(400, "Bad Request: query is too old and response timeout expired or query "
                                   "ID is invalid")
            self.callback_answers[query_id] = dict(params)
        return True

    async def _api_sendMessageDraft(self, params: dict[str, Any],
                                    files: dict[str, UploadedFile]) -> Any:
        chat_id = _chat_key(params.get("chat_id"))
        try:
            draft_id = int(str(params.get("draft_id")))
        except ValueError:
            raise _Reject(400, "Bad Request: invalid draft_id") from None
        if draft_id == 0:
            raise _Reject(400, "Bad Request: draft_id must be non-zero")
        if not isinstance(chat_id, int) or chat_id <= 0:
            raise _Reject(400, "Bad Request: message drafts can be sent only to private chats")
        text = self._checked_text(params.get("text"), params.get("parse_mode"), TEXT_LIMIT,
                                  "message is too long", "message text is empty")
        with self._cond:
            self.drafts[chat_id] = {"draft_id": draft_id, "text": text}
        return True

    async def _api_deleteMessage(self, params: dict[str, Any],
                                 files: dict[str, UploadedFile]) -> Any:
        chat_id = _chat_key(params.get("chat_id"))
        try:
            message_id = int(str(params.get("message_id")))
        except ValueError:
            raise _Reject(400, "Bad Request: message to delete not found") from None
        with self._cond:
            if self.messages.pop((chat_id, message_id), None) is None:
                raise _Reject(400, "Bad Request: message to delete not found")
        return True

    async def _api_setMessageReaction(self, params: dict[str, Any],
                                      files: dict[str, UploadedFile]) -> Any:
        chat_id = _chat_key(params.get("chat_id"))
        try:
            message_id = int(str(params.get("message_id")))
        except ValueError:
            raise _Reject(400, "Bad Request: message to react not found") from None
        reaction = params.get("reaction") or []
        if isinstance(reaction, str):
            reaction = json.loads(reaction)
        emojis = []
        for item in reaction:
            if not isinstance(item, dict) or item.get("type") != "emoji":
                raise _Reject(400, "Bad Request: REACTION_INVALID")
            if item.get("emoji") not in REACTION_EMOJI:
                raise _Reject(400, "Bad Request: REACTION_INVALID")
            emojis.append(item["emoji"])
        with self._cond:
            if (chat_id, message_id) not in self.messages:
                raise _Reject(400, "Bad Request: message to react not found")
            self.reactions[(chat_id, message_id)] = emojis
            self.reaction_log.append((chat_id, message_id, emojis))
        return True

    async def _api_editMessageCaption(self, params: dict[str, Any],
                                      files: dict[str, UploadedFile]) -> Any:
        caption = self._checked_caption(params)
        return self._edit(params, "caption", caption)

    def _edit(self, params: dict[str, Any], key: str, value: Any) -> Any:
        if "inline_message_id" in params:
            return True
        chat_id = _chat_key(params.get("chat_id"))
        try:
            message_id = int(str(params.get("message_id")))
        except (TypeError, ValueError):
            raise _Reject(400, "Bad Request: message to edit not found") from None
        with self._cond:
            message = self.messages.get((chat_id, message_id))
            if message is None or message.get("from", {}).get("id") != self.bot_user["id"]:
                raise _Reject(400, "Bad Request: message to edit not found")
            if message.get(key) == value:
                raise _Reject(400, "Bad Request: message is not modified: specified new message "
                                   "content and reply markup are exactly the same as a current "
                                   "content and reply markup of the message")
            message = {**message, key: value, "edit_date": int(time.time())}
            self.messages[(chat_id, message_id)] = message
            return message

    async def _api_getFile(self, params: dict[str, Any], files: dict[str, UploadedFile]) -> Any:
        with self._cond:
            fake = self._files.get(str(params.get("file_id", "")))
        if fake is None:
            raise _Reject(400, "Bad Request: invalid file_id")
        if fake.too_big:
            raise _Reject(400, "Bad Request: file is too big")
        return {"file_id": fake.file_id, "file_unique_id": fake.file_unique_id,
                "file_size": fake.file_size, "file_path": fake.file_path}

    async def _send_media(self, kind: str, params: dict[str, Any],
                          files: dict[str, UploadedFile]) -> Any:
        self._checked_caption(params)
        content = self._media_content(kind, params.get(kind), files, params)
        return self._bot_message(params.get("chat_id"), params=params, **content)

    async def _api_sendMediaGroup(self, params: dict[str, Any],
                                  files: dict[str, UploadedFile]) -> Any:
        media = params.get("media")
        if not isinstance(media, list) or not 2 <= len(media) <= 10:
            raise _Reject(400, 'Bad Request: parameter "media" must be an array of 2-10 items')
        kinds = {item.get("type") for item in media}
        for solo in ("document", "audio"):
            if solo in kinds and len(kinds) > 1:
                raise _Reject(400, f"Bad Request: {solo} can't be mixed with other media types")
        group_id = str(uuid.uuid4().int % 10**18)
        messages = []
        for item in media:
            self._checked_caption(item)
            content = self._media_content(item.get("type", ""), item.get("media"), files, item)
            messages.append(self._bot_message(params.get("chat_id"), params=params, media_group_id=group_id,
                                              **content))
        return messages

    def _checked_caption(self, source: dict[str, Any]) -> str | None:
        caption = source.get("caption")
        if caption is None:
            return None
        return self._checked_text(caption, source.get("parse_mode"), CAPTION_LIMIT,
                                  "message caption is too long", None)

    def _checked_text(self, text: Any, parse_mode: str | None, limit: int, too_long: str,
                      empty: str | None) -> str:
        text = "" if text is None else str(text)
        if not self.enforce_limits:
            return text
        if parse_mode and parse_mode.lower() == "html":
            error = _HtmlChecker(text).check()
            if error is not None:
                raise _Reject(400, f"Bad Request: can't parse entities: {error}")
        visible = visible_text(text, parse_mode)
        if empty is not None and not visible.strip():
            raise _Reject(400, f"Bad Request: {empty}")
        if utf16_len(visible) > limit:
            raise _Reject(400, f"Bad Request: {too_long}")
        return visible if parse_mode else text

    def _media_content(self, kind: str, value: Any, files: dict[str, UploadedFile],
                       source: dict[str, Any]) -> dict[str, Any]:
        upload: UploadedFile | None = None
        if kind in files and value is None:
            upload = files[kind]
        elif isinstance(value, str) and value.startswith("attach://"):
            upload = files.get(value.removeprefix("attach://"))
            if upload is None:
                raise _Reject(400, f"Bad Request: file {value} not found in the request")
        elif not value:
            raise _Reject(400, f"Bad Request: there is no {kind} in the request")

        if upload is not None:
            ext = mimetypes.guess_extension(upload.content_type or "") or ""
            file_id = self.add_file(upload.data, f"{kind}s/sent_{next(self._file_seq)}{ext}")
            meta = self._file_meta(file_id)
            mime = upload.content_type
            name = upload.filename
        else:
            meta = self._file_meta(str(value))
            mime, name = None, None

        content: dict[str, Any] = {}
        if kind == "photo":
            size = _image_size(upload.data) if upload is not None else None
            width, height = size or (1280, 960)
            content["photo"] = [{**meta, "width": width, "height": height}]
        elif kind in ("document", "animation"):
            doc = {**meta, **({"file_name": name} if name else {}),
                   **({"mime_type": mime} if mime else {})}
            content["document"] = doc
            if kind == "animation":
                content["animation"] = {**doc, "width": int(source.get("width") or 320),
                                        "height": int(source.get("height") or 240),
                                        "duration": int(source.get("duration") or 1)}
        elif kind in ("voice", "audio"):
            content[kind] = {**meta, "duration": int(source.get("duration") or 1),
                             **({"mime_type": mime} if mime else {})}
        elif kind == "video":
            content["video"] = {**meta, "width": int(source.get("width") or 640),
                                "height": int(source.get("height") or 360),
                                "duration": int(source.get("duration") or 1)}
        elif kind == "video_note":
            content["video_note"] = {**meta, "length": int(source.get("length") or 240),
                                     "duration": int(source.get("duration") or 1)}
        elif kind == "sticker":
            content["sticker"] = {**meta, "type": "regular", "width": 512, "height": 512,
                                  "is_animated": False, "is_video": False}
        else:
            raise _Reject(400, f"Bad Request: unsupported media type \"{kind}\"")
        caption = source.get("caption")
        if caption is not None:
            content["caption"] = caption
        return content

    def set_member_status(self, chat_id: int, user_id: int, status: str) -> None:
        """What getChatMember answers for a user: creator, administrator, member, restricted,
        left or kicked ("member" when never set)."""
        with self._cond:
            self._member_status[(chat_id, user_id)] = status

    async def _api_getChatMember(self, params: dict[str, Any],
                                 files: dict[str, UploadedFile]) -> Any:
        try:
            chat_id, user_id = int(str(params.get("chat_id"))), int(str(params.get("user_id")))
        except ValueError:
            raise _Reject(400, "Bad Request: invalid user_id specified") from None
        with self._cond:
            status = self._member_status.get((chat_id, user_id), "member")
        user = {"id": user_id, "is_bot": False, "first_name": "User"}
        member: dict[str, Any] = {"status": status, "user": user}
        if status == "creator":
            member["is_anonymous"] = False
        elif status == "administrator":
            member.update({name: name == "can_manage_chat" for name in (
                "can_be_edited", "is_anonymous", "can_manage_chat", "can_delete_messages",
                "can_manage_video_chats", "can_restrict_members", "can_promote_members",
                "can_change_info", "can_invite_users", "can_post_stories", "can_edit_stories",
                "can_delete_stories")})
        elif status == "restricted":
            member.update({"is_member": True, "until_date": 0, **{name: False for name in (
                "can_send_messages", "can_send_audios", "can_send_documents", "can_send_photos",
                "can_send_videos", "can_send_video_notes", "can_send_voice_notes", "can_send_polls",
                "can_send_other_messages", "can_add_web_page_previews", "can_change_info",
                "can_invite_users", "can_pin_messages", "can_manage_topics")}})
        elif status == "kicked":
            member["until_date"] = 0
        return member

    def _placement(self, chat_id: int | str, chat: dict[str, Any],
                   params: dict[str, Any]) -> dict[str, Any]:
        """The topic and reply a send asked for, checked as Telegram checks them."""
        placed: dict[str, Any] = {}
        thread = params.get("message_thread_id")
        if thread not in (None, ""):
            if not chat.get("is_forum"):
                raise _Reject(400, "Bad Request: message thread not found")
            placed.update(message_thread_id=int(thread), is_topic_message=True)
        reply = params.get("reply_parameters")
        if isinstance(reply, str):
            reply = json.loads(reply)
        if isinstance(reply, dict):
            with self._cond:
                target = self.messages.get((chat_id, int(reply.get("message_id", 0))))
            if target is None and not reply.get("allow_sending_without_reply"):
                raise _Reject(400, "Bad Request: message to be replied not found")
            if target is not None:
                placed["reply_to_message"] = {k: v for k, v in target.items() if k != "reply_to_message"}
        return placed

    def _bot_message(self, chat_id: Any, params: dict[str, Any] | None = None,
                     **content: Any) -> dict[str, Any]:
        if chat_id in (None, ""):
            raise _Reject(400, "Bad Request: chat_id is empty")
        chat_id = _chat_key(chat_id)
        chat = self._chat(chat_id)
        placed = self._placement(chat_id, chat, params or {})
        message = {"message_id": self._new_message_id(chat_id), "from": self.bot_user,
                   "chat": chat, "date": int(time.time()), **placed, **content}
        with self._cond:
            self.messages[(chat_id, message["message_id"])] = message
            self.drafts.pop(chat_id, None)  # a message sent replaces the draft
        return message


def _command_entity(text: str | None) -> dict[str, Any] | None:
    if not text or not text.startswith("/"):
        return None
    command = text.split(maxsplit=1)[0]
    return {"type": "bot_command", "offset": 0, "length": utf16_len(command)}


_MENTION = re.compile(r"(?<![\w@])@[A-Za-z][A-Za-z0-9_]{4,31}")  # usernames are 5-32 characters


def _auto_entities(text: str | None) -> list[dict[str, Any]]:
    """The entities Telegram adds by itself: a leading /command and each @username."""
    if not text:
        return []
    found = [e for e in (_command_entity(text),) if e is not None]
    for match in _MENTION.finditer(text):
        if found and found[0]["type"] == "bot_command" and match.start() < found[0]["length"]:
            continue  # /cmd@bot is one command entity, not a mention
        found.append({"type": "mention", "offset": utf16_len(text[:match.start()]),
                      "length": utf16_len(match.group(0))})
    return found
