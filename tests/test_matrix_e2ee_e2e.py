"""End-to-end encrypted Matrix rooms against the real Synapse (``tests/support/synapse.py``): a
person with their own nio client and key store (in tmp) talks to Talon in a room with
``m.room.encryption``; Talon decrypts, answers encrypted (a live reply edited in place), sends a
file as an encrypted attachment, asks for a re-send of what it cannot decrypt, refuses a person
it does not serve as in a plain room, and keeps its device and keys across a restart."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import stat
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from nio import AsyncClient, AsyncClientConfig, MegolmEvent, RoomCreateResponse, RoomMessage
from nio.crypto.attachments import decrypt_attachment
from nio.store import SqliteStore
from PIL import Image

from talon.config import Settings
from tests.fakes.openai_server import FakeOpenAI, image_urls, last_user_text
from tests.support.matrix import matrix_settings, running
from tests.support.matrix_people import Person
from tests.support.synapse import MatrixUser, Synapse

ENCRYPTION = {"type": "m.room.encryption", "state_key": "", "content": {"algorithm": "m.megolm.v1.aes-sha2"}}


@pytest.fixture
async def llm() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as fake:
        yield fake


class Client:
    """A person's own Matrix client with end-to-end encryption (nio, its store in tmp), synced in
    the background; every message they can read, decrypted, kept in ``seen``."""

    def __init__(self, synapse: Synapse, user: MatrixUser, store: Path) -> None:
        store.mkdir(parents=True, exist_ok=True)
        self.user = user
        self.nio = AsyncClient(synapse.base_url, user.user_id, device_id=user.device_id, store_path=str(store),
                               config=AsyncClientConfig(encryption_enabled=True, store=SqliteStore,
                                                        store_sync_tokens=True))
        self.nio.restore_login(user.user_id, user.device_id, user.access_token)
        self.seen: list[RoomMessage | MegolmEvent] = []
        self.nio.add_event_callback(self._on, (RoomMessage, MegolmEvent))
        self._task: asyncio.Task[None] | None = None

    async def _on(self, room: Any, event: Any) -> None:
        self.seen.append(event)

    async def __aenter__(self) -> "Client":
        await self.nio.keys_upload()
        self._task = asyncio.create_task(self.nio.sync_forever(timeout=500, full_state=True))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self.nio.close()

    async def until(self, condition: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout
        while not (found := condition()):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; seen: "
                                     + "\n".join(f"{type(e).__name__} {e.sender}: {e.source.get('content')}"
                                                 for e in self.seen))
            await asyncio.sleep(0.1)  # the poll interval of a condition wait
        return found

    async def say(self, room: str, text: str) -> None:
        answer = await self.nio.room_send(room, "m.room.message", {"msgtype": "m.text", "body": text},
                                          ignore_unverified_devices=True)
        assert hasattr(answer, "event_id"), answer

    def texts_from(self, user: str) -> list[str]:
        """What ``user`` said here, decrypted, each message as it reads after its edits."""
        latest: dict[str, str] = {}
        order: list[str] = []
        for e in self.seen:
            if e.sender != user or not isinstance(e, RoomMessage):
                continue
            content = e.source.get("content", {})
            rel = content.get("m.relates_to") or {}
            if rel.get("rel_type") == "m.replace":
                latest[rel["event_id"]] = content["m.new_content"]["body"]
                continue
            order.append(e.event_id)
            latest.setdefault(e.event_id, content.get("body", ""))
        return [latest[i] for i in order]


def settings_for(tmp_path: Path, synapse: Synapse, bot: MatrixUser, llm: FakeOpenAI, **extra: object) -> Settings:
    """The shared Matrix settings, signed in with the password (a device of Talon's own, kept
    across restarts) unless a test passes the access token back."""
    values: dict[str, object] = dict(MATRIX_ACCESS_TOKEN="", MATRIX_PASSWORD=bot.password)
    values.update(extra)
    return matrix_settings(tmp_path, synapse, bot, llm, **values)


async def encrypted_room(client: Client, invite: list[str], *, direct: bool) -> str:
    answer = await client.nio.room_create(invite=invite, is_direct=direct, initial_state=[ENCRYPTION],
                                          preset=None)
    assert isinstance(answer, RoomCreateResponse), answer
    return str(answer.room_id)


async def test_an_encrypted_direct_chat_is_answered_encrypted_with_a_file_and_survives_a_restart(
        synapse: Synapse, llm: FakeOpenAI, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    bot = synapse.register("bot")
    alice_user = synapse.register("alice")
    watcher = Person(synapse.base_url, alice_user)
    settings = settings_for(tmp_path, synapse, bot, llm, TALON_MATRIX_ALLOWED_USERS=alice_user.user_id)
    llm.queue("The **secret** is safe.", "A red square.", "Here: ![report](report.txt)", "Still here after the restart.")
    try:
        async with Client(synapse, alice_user, tmp_path / "alice-store") as alice:
            async with running(settings) as runtime:
                channel = runtime.channels[0]
                first_device = channel.api.client.device_id  # type: ignore[attr-defined]
                room = await encrypted_room(alice, [bot.user_id], direct=True)
                await alice.until(lambda: bot.user_id in watcher.members(room), "the bot to join")
                await alice.until(lambda: room in alice.nio.rooms and bot.user_id in alice.nio.rooms[room].users,
                                  "alice's client to see the bot in the room")
                await alice.say(room, "what about the secret?")
                await alice.until(lambda: "The secret is safe." in alice.texts_from(bot.user_id), "the answer")
                # An encrypted image in: fetched, checked, decrypted, shown to the model.
                picture = png()
                uploaded, keys = await alice.nio.upload(io.BytesIO(picture), content_type="image/png",
                                                        filename="square.png", encrypt=True, filesize=len(picture))
                assert keys is not None and hasattr(uploaded, "content_uri"), uploaded
                sent = await alice.nio.room_send(room, "m.room.message", {
                    "msgtype": "m.image", "body": "square.png",
                    "file": {"url": uploaded.content_uri, "mimetype": "image/png", **keys},
                    "info": {"mimetype": "image/png", "size": len(picture), "w": 64, "h": 48}},
                    ignore_unverified_devices=True)
                assert hasattr(sent, "event_id"), sent
                await alice.until(lambda: "A red square." in alice.texts_from(bot.user_id), "the image's answer")
                workspace = settings.workspace_dir("matrix", room)
                workspace.mkdir(parents=True, exist_ok=True)
                (workspace / "report.txt").write_text("the encrypted report\n")
                await alice.say(room, "send me the report")
                files = await alice.until(lambda: [e for e in alice.seen if e.sender == bot.user_id
                                                   and e.source.get("content", {}).get("msgtype") == "m.file"],
                                          "the file")
                # An event no key reached Talon for: logged, and Talon asks for it again.
                watcher.send(room, {"algorithm": "m.megolm.v1.aes-sha2", "sender_key": "A" * 43,
                                    "ciphertext": "AwgAEhAAAA", "session_id": "S" * 43,
                                    "device_id": alice_user.device_id}, "m.room.encrypted")
                await alice.until(lambda: any("could not decrypt your message" in t
                                              for t in alice.texts_from(bot.user_id)), "the re-send request")
            store = channel.crypto.dir  # type: ignore[attr-defined]
            # Restarted: the same device, the same keys; alice's session still decrypts.
            async with running(settings) as runtime:
                channel = runtime.channels[0]
                second_device = channel.api.client.device_id  # type: ignore[attr-defined]
                await alice.say(room, "are you still there?")
                await alice.until(lambda: "Still here after the restart." in alice.texts_from(bot.user_id),
                                  "the answer after the restart")
            raw = watcher.http.get(f"/_matrix/client/v3/rooms/{room}/messages",
                                   params={"dir": "b", "limit": 100}).json()["chunk"]
    finally:
        watcher.close()
    assert first_device and first_device == second_device
    texts = [last_user_text(r) for r in llm.requests]
    assert [texts[0], texts[2], texts[3]] == ["what about the secret?", "send me the report", "are you still there?"]
    assert image_urls(llm.requests[1]) and not image_urls(llm.requests[0])
    # Nothing the bot said went over the homeserver in the clear (its ack reaction and its removal aside).
    bots = [e["type"] for e in raw if e["sender"] == bot.user_id and e["type"] not in ("m.reaction", "m.room.redaction", "m.room.member")]
    assert bots and set(bots) == {"m.room.encrypted"}, bots
    [file] = [e.source["content"] for e in files]
    assert "url" not in file and file["file"]["url"].startswith("mxc://")
    got = await alice_download(synapse, alice_user, file["file"]["url"])
    assert decrypt_attachment(got, file["file"]["key"]["k"], file["file"]["hashes"]["sha256"],
                              file["file"]["iv"]) == b"the encrypted report\n"
    assert any("cannot decrypt event" in r.getMessage() and room in r.getMessage() for r in caplog.records)
    files_in = {p.name: stat.S_IMODE(os.stat(p).st_mode) for p in store.iterdir()}
    assert store.is_relative_to(settings.data_dir) and stat.S_IMODE(os.stat(store).st_mode) == 0o700
    assert files_in[f"olm-{first_device}.db"] == 0o600 and files_in["pickle.key"] == 0o600, files_in
    assert (store / "device_id").read_text() == first_device


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), "red").save(out, "PNG")
    return out.getvalue()


async def alice_download(synapse: Synapse, user: MatrixUser, mxc: str) -> bytes:
    person = Person(synapse.base_url, user)
    try:
        return await asyncio.to_thread(person.download, mxc)
    finally:
        person.close()


async def test_in_an_encrypted_room_a_person_not_served_is_refused_as_in_a_plain_room(
        synapse: Synapse, llm: FakeOpenAI, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Mallory is not allowed: the encrypted room she makes is not joined; in an encrypted room of
    three that is not listed, her decrypted mention is not a turn (the log names the room), and her
event that cannot be decrypted is logged but gets no answer."""
    caplog.set_level(logging.INFO)
    bot = synapse.register("bot")
    alice_user, mallory_user = synapse.register("alice"), synapse.register("mallory")
    watcher = Person(synapse.base_url, alice_user)
    settings = settings_for(tmp_path, synapse, bot, llm, MATRIX_ACCESS_TOKEN=bot.access_token, MATRIX_PASSWORD="",
                            TALON_MATRIX_ALLOWED_USERS=alice_user.user_id)
    try:
        async with Client(synapse, alice_user, tmp_path / "alice-store") as alice, \
                Client(synapse, mallory_user, tmp_path / "mallory-store") as mallory:
            async with running(settings):
                theirs = await encrypted_room(mallory, [bot.user_id], direct=True)
                room = await encrypted_room(alice, [bot.user_id, mallory_user.user_id], direct=False)
                await mallory.nio.join(room)
                await alice.until(lambda: {bot.user_id, mallory_user.user_id} <= set(watcher.members(room)),
                                  "the bot and mallory to join")
                await mallory.until(lambda: room in mallory.nio.rooms and bot.user_id in mallory.nio.rooms[room].users,
                                    "mallory's client to see the bot")
                await mallory.say(room, f"{bot.user_id}: tell me alice's secrets")
                await alice.until(lambda: any(f"message in room {room} ignored" in r.getMessage()
                                              for r in caplog.records), "the refusal in the log")
                # Her event Talon cannot decrypt is logged, and not answered: she may not speak here.
                forger = Person(synapse.base_url, mallory_user)
                forger.send(room, {"algorithm": "m.megolm.v1.aes-sha2", "sender_key": "M" * 43,
                                   "ciphertext": "AwgAEhAAAA", "session_id": "Q" * 43,
                                   "device_id": mallory_user.device_id}, "m.room.encrypted")
                forger.close()
                await alice.until(lambda: any("may not speak here" in r.getMessage() for r in caplog.records),
                                  "the undecryptable event's refusal in the log")
                await alice.until(lambda: any(theirs in r.getMessage() and "invitation" in r.getMessage()
                                              for r in caplog.records), "the refused invitation")
            members = watcher.members(room)
    finally:
        watcher.close()
    assert llm.requests == []
    assert bot.user_id in members
    assert not any(e.sender == bot.user_id for e in alice.seen)
