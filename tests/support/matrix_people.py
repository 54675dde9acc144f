"""People on a test homeserver (``tests/support/synapse.py``), talking through the real
client-server API with httpx: create rooms, invite, send text, files and reactions, and wait for
what the bot says (by reading the room's timeline until a condition holds, never a fixed sleep)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx

from tests.support.synapse import MatrixUser

Event = dict[str, Any]


class Person:
    def __init__(self, base_url: str, user: MatrixUser) -> None:
        self.user = user
        self.http = httpx.Client(base_url=base_url, timeout=30.0,
                                 headers={"Authorization": f"Bearer {user.access_token}"})

    @property
    def id(self) -> str:
        return self.user.user_id

    def close(self) -> None:
        self.http.close()

    def _ok(self, resp: httpx.Response) -> Any:
        if resp.status_code != 200:
            raise AssertionError(f"{resp.request.method} {resp.request.url.path}: {resp.status_code} {resp.text}")
        return resp.json()

    def create_room(self, invite: list[str], *, direct: bool = False, name: str | None = None) -> str:
        body: dict[str, Any] = {"invite": invite, "preset": "private_chat" if direct else "public_chat",
                                "is_direct": direct}
        if name:
            body["name"] = name
        return str(self._ok(self.http.post("/_matrix/client/v3/createRoom", json=body))["room_id"])

    def join(self, room: str) -> None:
        self._ok(self.http.post(f"/_matrix/client/v3/join/{quote(room)}", json={}))

    def invite(self, room: str, user: str) -> None:
        self._ok(self.http.post(f"/_matrix/client/v3/rooms/{quote(room)}/invite", json={"user_id": user}))

    def send(self, room: str, content: dict[str, Any], event_type: str = "m.room.message") -> str:
        txn = uuid.uuid4().hex
        return str(self._ok(self.http.put(
            f"/_matrix/client/v3/rooms/{quote(room)}/send/{event_type}/{txn}", json=content))["event_id"])

    def say(self, room: str, text: str, **extra: Any) -> str:
        return self.send(room, {"msgtype": "m.text", "body": text, **extra})

    def react(self, room: str, event_id: str, key: str) -> str:
        return self.send(room, {"m.relates_to": {"rel_type": "m.annotation", "event_id": event_id, "key": key}},
                         "m.reaction")

    def upload(self, data: bytes, mime: str, name: str) -> str:
        resp = self.http.post("/_matrix/media/v3/upload", params={"filename": name}, content=data,
                              headers={"Content-Type": mime})
        return str(self._ok(resp)["content_uri"])

    def download(self, mxc: str) -> bytes:
        server, media = mxc[len("mxc://"):].split("/", 1)
        resp = self.http.get(f"/_matrix/client/v1/media/download/{server}/{media}")
        assert resp.status_code == 200, resp.text
        return resp.content

    def members(self, room: str) -> list[str]:
        body = self._ok(self.http.get(f"/_matrix/client/v3/rooms/{quote(room)}/joined_members"))
        return list(body["joined"])

    def timeline(self, room: str, limit: int = 200) -> list[Event]:
        """The room's message and reaction events, oldest first."""
        body = self._ok(self.http.get(f"/_matrix/client/v3/rooms/{quote(room)}/messages",
                                      params={"dir": "b", "limit": limit}))
        events = [e for e in body["chunk"] if e.get("type") in ("m.room.message", "m.reaction")]
        return list(reversed(events))

    async def wait_for(self, room: str, condition: Callable[[list[Event]], Any], *, timeout: float = 60.0,
                       what: str = "the condition") -> Any:
        """Read the timeline (off the event loop, where Talon runs) until ``condition`` holds."""
        deadline = time.monotonic() + timeout
        while True:
            events = await asyncio.to_thread(self.timeline, room)
            found = condition(events)
            if found:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; the room has:\n"
                                     + "\n".join(f"{e['sender']}: {e['type']} {e.get('content')}" for e in events))
            await asyncio.sleep(0.1)  # the poll interval of a condition wait


def from_user(events: list[Event], user: str) -> list[Event]:
    return [e for e in events if e["sender"] == user and e["type"] == "m.room.message"]


def final_texts(events: list[Event], user: str) -> list[str]:
    """What ``user`` said, each message as it reads after its edits (edits themselves left out)."""
    latest: dict[str, str] = {}
    order: list[str] = []
    for e in from_user(events, user):
        content = e["content"]
        rel = content.get("m.relates_to") or {}
        if rel.get("rel_type") == "m.replace":
            latest[rel["event_id"]] = content["m.new_content"]["body"]
            continue
        order.append(e["event_id"])
        latest.setdefault(e["event_id"], content.get("body", ""))
    return [latest[i] for i in order]
