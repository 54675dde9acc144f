"""Is a webhook body an update Talon can take? Checked before python-telegram-bot sees it.

Telegram only ever posts well-formed updates, so a body that is not one comes from someone else
(or a broken proxy) and gets 400 with one log line. python-telegram-bot is lenient: it builds
objects with a string where a number belongs, and the handlers then fail far from the cause. So
the body is parsed here with bounds (size, nesting depth, no NaN, no lone surrogates, which
nothing downstream can encode) and the fields Talon reads are checked for their types; anything
else in the update is left to the library as usual.
"""

from __future__ import annotations

import json
from typing import Any
from talon.errors import MalformedWebhook

__all__ = ["parse_update"]

MAX_DEPTH = 48  # a real update nests a dozen levels at most (a reply's quoted message included)
_INT = "int"
_STR = "str"
_BOOL = "bool"

_USER = {"id": _INT, "is_bot": _BOOL, "first_name": _STR, "last_name": _STR, "username": _STR,
         "language_code": _STR}
_CHAT = {"id": _INT, "type": _STR, "title": _STR, "username": _STR, "is_forum": _BOOL}
_FILE = {"file_id": _STR, "file_unique_id": _STR, "file_size": _INT, "file_name": _STR,
         "mime_type": _STR, "width": _INT, "height": _INT, "duration": _INT, "emoji": _STR,
         "is_animated": _BOOL, "is_video": _BOOL}
_ENTITY = {"type": _STR, "offset": _INT, "length": _INT, "url": _STR, "user": _USER}
_MESSAGE: dict[str, Any] = {
    "message_id": _INT, "date": _INT, "edit_date": _INT, "chat": _CHAT, "from": _USER,
    "sender_chat": _CHAT, "text": _STR, "caption": _STR, "media_group_id": _STR,
    "message_thread_id": _INT, "is_topic_message": _BOOL,
    "entities": [_ENTITY], "caption_entities": [_ENTITY], "photo": [_FILE],
    "document": _FILE, "voice": _FILE, "audio": _FILE, "video": _FILE, "video_note": _FILE,
    "sticker": _FILE, "animation": _FILE,
}
_MESSAGE["reply_to_message"] = _MESSAGE
_MESSAGE_REQUIRED = ("message_id", "date", "chat")


def _reject_constant(name: str) -> Any:
    raise MalformedWebhook(f"the JSON holds {name}, which no update has")


def _walk(value: Any) -> None:
    """Depth bound and text that can be encoded, without recursion."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise MalformedWebhook(f"it is nested more than {MAX_DEPTH} levels deep")
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise MalformedWebhook("it holds a lone surrogate (text no one can encode)") from None
        elif isinstance(item, dict):
            for key, child in item.items():
                stack.append((key, depth + 1))
                stack.append((child, depth + 1))
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)


def _type_ok(value: Any, kind: str) -> bool:
    if kind == _INT:
        return isinstance(value, int) and not isinstance(value, bool) and -2**63 <= value < 2**63
    if kind == _STR:
        return isinstance(value, str)
    return isinstance(value, bool)


def _check(value: Any, spec: Any, where: str) -> None:
    if isinstance(spec, str):
        if not _type_ok(value, spec):
            raise MalformedWebhook(f"{where} is {type(value).__name__}, not {spec}")
    elif isinstance(spec, list):
        if not isinstance(value, list):
            raise MalformedWebhook(f"{where} is {type(value).__name__}, not a list")
        for index, item in enumerate(value):
            _check(item, spec[0], f"{where}[{index}]")
    else:
        if not isinstance(value, dict):
            raise MalformedWebhook(f"{where} is {type(value).__name__}, not an object")
        for key, sub in spec.items():
            if key in value and value[key] is not None:
                _check(value[key], sub, f"{where}.{key}")


def parse_update(raw: bytes) -> dict[str, Any]:
    """The update in ``raw``; ``MalformedWebhook`` says why it is not one."""
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        raise MalformedWebhook(f"it is nested more than {MAX_DEPTH} levels deep") from None
    except MalformedWebhook:
        raise
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise MalformedWebhook(f"it is not JSON ({exc})") from None
    if not isinstance(data, dict) or not _type_ok(data.get("update_id"), _INT):
        raise MalformedWebhook("it is not an update (no numeric update_id)")
    _walk(data)
    for kind in ("message", "edited_message"):
        if kind in data:
            message = data[kind]
            _check(message, _MESSAGE, kind)
            missing = [f for f in _MESSAGE_REQUIRED if message.get(f) is None]
            if missing:
                raise MalformedWebhook(f"{kind} has no {', '.join(missing)}")
    return data
