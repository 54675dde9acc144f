"""End-to-end encrypted rooms (``TALON_MATRIX_E2EE=tofu``, the default): Talon's own device, its
olm/megolm keys, the trust it gives other devices, encrypted text and files out, and what is done
with an event it cannot decrypt. matrix-nio does the cryptography (its ``e2e`` extra: vodozemac).

- **Device and key store.** One directory per account, ``TALON_DATA_DIR/matrix/e2ee-<digest>/``
  (0700): nio's SQLite store ``olm-<device id>.db`` (0600: the account's identity keys, the olm
  and megolm sessions, the devices seen and their trust), the pickle key that encrypts the keys
  inside it (``pickle.key``, 0600), and ``device_id``. The device is the access token's (``whoami``)
  or, with ``MATRIX_PASSWORD``, the one saved in ``device_id``, which each login asks for again:
  the same device across restarts, so the keys other people's clients encrypted for it still work.
  Its identity and one-time keys are uploaded when the store is new (or runs low).
- **Trust (TOFU).** After each ``/sync`` every device of every member of an encrypted room the
  bot is in (it joins only listed rooms and direct chats of allowed people) is trusted the first
  time it is seen, and its keys are pinned in the store: a device id that later shows other keys
  is refused by nio. Who may *speak* is unchanged: the allowlist and mention gating of
  ``intake.py`` apply to the decrypted event exactly as to a plain one.
- **In.** nio decrypts ``m.room.encrypted`` during the ``/sync`` (room keys arrive as to-device
  messages in the same batch), so ``intake.py`` sees the plain ``m.room.message``. An event that
  cannot be decrypted (no room key reached this device) is logged with its session and device, a
  key request is sent to the sender's devices, and, if its sender may speak in that room, the
  room is told once per session to send it again.
- **Out.** Every ``room_send`` goes through ``TalonClient``: into an encrypted room the room's
  members and their devices are brought up to date, trusted as above, and the content encrypted
  (megolm; ``m.relates_to`` stays in the clear as the spec says, so edits of live replies and
  threads work). Files are encrypted before the upload (AES-CTR, ``file`` instead of ``url``, as
  the spec's encrypted attachments). A worker without the store (many workers: not the sync lease
  holder) never sends in the clear into an encrypted room: the send fails (transient) instead.
- **Many workers.** The store is opened by the worker that holds the ``matrix:sync`` lease, when
  it takes it, and closed when it lets it go: one device's olm state must never be used by two
  processes at once. So the data dir that holds it must be the one the next holder opens (a shared
  volume), or encrypted rooms stop being served after a takeover (docs/channels.md).
"""

from __future__ import annotations

import dataclasses
import base64
import hashlib
import json
import logging
import os
import re
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from uuid import uuid4

from nio import AsyncClient, ErrorResponse, MegolmEvent, RoomSendResponse
from nio.api import Api
from nio.crypto.attachments import decrypt_attachment, encrypt_attachment
from nio.exceptions import EncryptionError, GroupEncryptionError, LocalProtocolError, OlmTrustError

from talon.bounded import BoundedMap
from talon.errors import DeliveryError

if TYPE_CHECKING:
    from channels.matrix.api import MatrixApi
    from channels.matrix.intake import Intake

log = logging.getLogger(__name__)

STORE_DIR_MODE = 0o700
STORE_FILE_MODE = 0o600
PLAIN_CHECK_S = 60.0  # a follower re-asks whether a room it saw plain has become encrypted
RESEND = ("I could not decrypt your message: no key for it reached my device ({device}). Please send it "
          "again; if this keeps happening, check that your client shares keys with unverified devices "
          "(or verify my device) and that it is online.")


def store_dir(data_dir: Path, homeserver: str, user_id: str) -> Path:
    digest = hashlib.sha256(f"{homeserver} {user_id}".encode()).hexdigest()[:16]
    return data_dir / "matrix" / f"e2ee-{digest}"


class TalonClient(AsyncClient):
    """nio's client, whose sends go through the room's encryption (see the module docstring)."""

    crypto: E2ee | None = None

    async def room_send(self, room_id: str, message_type: str, content: dict[Any, Any],
                        tx_id: str | None = None, ignore_unverified_devices: bool = False) -> Any:
        if self.crypto is not None and not await self.crypto.before_send(room_id):
            # A plain room nio has not synced yet (a reply resumed before the first /sync): nio's
            # own path would refuse a room it does not know once the key store is open.
            method, path, data = Api.room_send(self.access_token, room_id, message_type, content, tx_id or uuid4())
            return await self._send(RoomSendResponse, method, path, data, (room_id,))
        try:
            # Every device is trusted (TOFU) or refused by nio before this: none is left to ask about.
            return await super().room_send(room_id, message_type, content, tx_id, ignore_unverified_devices=True)
        except (LocalProtocolError, OlmTrustError, EncryptionError, GroupEncryptionError) as exc:
            raise DeliveryError(f"encrypting for {room_id}: {type(exc).__name__}: {exc}") from exc


class E2ee:
    """The device, its key store and the trust policy (see the module docstring)."""

    def __init__(self, api: MatrixApi, data_dir: Path) -> None:
        self.api = api
        self.client: TalonClient = api.client
        self.dir = store_dir(data_dir, api.homeserver, api.user_id)
        self.client.crypto = self
        self._plain: BoundedMap[str, float] = BoundedMap("matrix_plain_rooms")  # room -> checked at
        self._told: BoundedMap[str, bool] = BoundedMap("matrix_undecryptable_told")
        self.trusted = 0

    # --- the store ------------------------------------------------------------------------------
    @property
    def open(self) -> bool:
        return self.client.olm is not None

    def saved_device_id(self) -> str | None:
        try:
            return (self.dir / "device_id").read_text().strip() or None
        except FileNotFoundError:
            return None

    def _private(self, path: Path, text: str | None = None) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if text is not None else 0), STORE_FILE_MODE)
        try:
            if text is not None:
                os.write(fd, text.encode())
        finally:
            os.close(fd)
        os.chmod(path, STORE_FILE_MODE)

    def _pickle_key(self) -> str:
        path = self.dir / "pickle.key"
        try:
            key = path.read_text().strip()
        except FileNotFoundError:
            key = ""
        if not key:
            key = secrets.token_urlsafe(32)
            self._private(path, key)
        return key

    async def start(self) -> None:
        """Open the store of this device (made at the first start) and upload its keys if needed."""
        client = self.client
        if client.olm is not None:
            return
        device = client.device_id
        if not device:
            raise DeliveryError("matrix: the homeserver did not name this login's device")
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, STORE_DIR_MODE)
        name = "olm-" + re.sub(r"[^A-Za-z0-9_-]", "_", device) + ".db"
        db = self.dir / name
        self._private(db)  # created 0600 before SQLite opens it (its journal takes the same mode)
        client.config = dataclasses.replace(client.config, store_name=name, pickle_key=self._pickle_key())
        client.store_path = str(self.dir)
        client.load_store()
        if self.saved_device_id() != device:
            self._private(self.dir / "device_id", device)
        if client.should_upload_keys:
            answer = await client.keys_upload()
            if isinstance(answer, ErrorResponse) and client.olm is not None and not client.olm.account.shared:
                # The device already has keys on the homeserver, from a store that is not here
                # (lost, or another worker's data dir): this fresh one must not speak for it.
                log.error("matrix: device %s already has keys on the homeserver that this key store (%s) does not "
                          "hold (%s); encrypted rooms are not served from here. Share the data dir between "
                          "workers, or log in anew (a new device)", device, db, answer)
                self.stop()
                return
            if isinstance(answer, ErrorResponse):
                log.error("matrix: uploading the keys of device %s failed (%s)", device, answer)
        identity: dict[str, str] = client.olm.account.identity_keys if client.olm is not None else {}
        log.info("matrix: end-to-end encryption on, device %s (ed25519 %s), key store %s", device,
                 identity.get("ed25519", "?"), db)

    def stop(self) -> None:
        """Let the store go (this worker no longer holds the sync): another may open it."""
        client = self.client
        if client.store is not None:
            try:
                client.store.database.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        client.olm = None
        client.store = None

    # --- after each /sync -----------------------------------------------------------------------
    async def after_sync(self) -> None:
        client = self.client
        if client.olm is None:
            return
        for what, call in (("to-device", client.send_to_device_messages),):
            await self._quiet(what, call())
        if client.should_upload_keys:
            await self._quiet("keys upload", client.keys_upload())
        if client.should_query_keys:
            await self._quiet("keys query", client.keys_query())
        if client.should_claim_keys:
            await self._quiet("keys claim", client.keys_claim(client.get_users_for_key_claiming()))
        for room_id, room in list(client.rooms.items()):
            if room.encrypted:
                self.trust(room_id)

    async def _quiet(self, what: str, call: Any) -> None:
        try:
            answer = await call
        except Exception as exc:  # noqa: BLE001 - the next batch tries again
            log.warning("matrix: %s failed (%s: %s)", what, type(exc).__name__, exc)
            return
        if isinstance(answer, ErrorResponse):
            log.warning("matrix: %s failed (%s)", what, answer)

    def trust(self, room_id: str) -> None:
        """TOFU: every device of the room's members not yet trusted (nor refused) is trusted now."""
        client = self.client
        room = client.rooms.get(room_id)
        if client.olm is None or room is None:
            return
        for user in list(room.users):
            for device in client.device_store.active_user_devices(user):
                if device.verified or device.blacklisted or device.ignored:
                    continue
                client.verify_device(device)
                self.trusted += 1
                log.info("matrix: trusted on first use: %s's device %s (ed25519 %s) in %s", user, device.id,
                         device.ed25519, room_id)

    # --- out --------------------------------------------------------------------------------------
    async def before_send(self, room_id: str) -> bool:
        """Ready the room for a send; False for a plain room nio does not know (sent as it is)."""
        client = self.client
        if client.olm is None:
            if await self._encrypted_remote(room_id):
                raise DeliveryError(f"{room_id} is encrypted and this worker does not hold the key store (the "
                                    "worker holding the sync lease does); not sending in the clear")
            return True
        room = client.rooms.get(room_id)
        if room is None:
            if await self._encrypted_remote(room_id):
                raise DeliveryError(f"{room_id} is encrypted and not synced here yet; not sending in the clear")
            return False
        if not room.encrypted:
            return True
        if not room.members_synced:
            await self._quiet("joined members", client.joined_members(room_id))
        if client.should_query_keys:
            await self._quiet("keys query", client.keys_query())
        self.trust(room_id)
        return True

    def encrypts(self, room_id: str) -> bool:
        room = self.client.rooms.get(room_id)
        return self.client.olm is not None and room is not None and bool(room.encrypted)

    def encrypt_file(self, data: bytes) -> tuple[bytes, dict[str, Any]]:
        """The ciphertext to upload and the ``file`` object's keys (the spec's EncryptedFile)."""
        return encrypt_attachment(data)

    async def _encrypted_remote(self, room_id: str) -> bool:
        """Whether a room this worker has not synced is encrypted (its m.room.encryption state)."""
        checked = self._plain.get(room_id)
        if checked is not None and time.monotonic() - checked < PLAIN_CHECK_S:
            return False
        url = (f"{self.api.homeserver}/_matrix/client/v3/rooms/{quote(room_id, safe='')}/state/"
               "m.room.encryption/")
        try:
            resp = await self.api.http.get(url, headers=self.api.auth())
        except Exception as exc:  # noqa: BLE001 - unknown: not sent in the clear
            raise DeliveryError(f"cannot tell whether {room_id} is encrypted ({type(exc).__name__})") from exc
        if resp.status_code == 200:
            return True
        if resp.status_code == 404:
            self._plain[room_id] = time.monotonic()
            return False
        raise DeliveryError(f"cannot tell whether {room_id} is encrypted (HTTP {resp.status_code})")

    # --- in ---------------------------------------------------------------------------------------
    async def undecryptable(self, intake: Intake, room_id: str, event: dict[str, Any]) -> None:
        """An ``m.room.encrypted`` event nio could not decrypt: logged, its key asked for, and its
        sender (when they may speak here) asked to send it again, once per megolm session."""
        sender = str(event.get("sender", ""))
        raw = event.get("content")
        content: dict[str, Any] = raw if isinstance(raw, dict) else {}
        session = str(content.get("session_id", ""))
        device = str(content.get("device_id", ""))
        event_id = str(event.get("event_id", ""))
        if self.client.olm is None:
            log.warning("matrix: room=%s: encrypted event %s from %s not served (TALON_MATRIX_E2EE=off, or the key "
                        "store is not open on this worker)", room_id, event_id, sender)
            return
        log.warning("matrix: room=%s: cannot decrypt event %s from %s (device %s, session %s): no room key reached "
                    "device %s; asking the sender's devices for it and the sender to send it again", room_id,
                    event_id, sender, device or "?", session or "?", self.client.device_id)
        try:
            megolm = MegolmEvent.from_dict({**event, "room_id": room_id})
            if isinstance(megolm, MegolmEvent):
                megolm.room_id = room_id
                await self.client.request_room_key(megolm)
        except Exception as exc:  # noqa: BLE001 - a key request is a courtesy
            log.info("matrix: room=%s: key request for %s not sent (%s)", room_id, event_id, exc)
        if not await intake.may_speak(room_id, sender):
            log.info("matrix: room=%s: %s may not speak here; not answered", room_id, sender)
            return
        told = f"{room_id} {session or event_id}"
        if told in self._told:
            return
        self._told[told] = True
        name = intake.display(room_id, sender)
        await self.api.send(room_id, {"msgtype": "m.notice",
                                      "body": f"{name}: " + RESEND.format(device=self.client.device_id)},
                            "undecryptable notice")


# --- encrypted files in ------------------------------------------------------------------------------
def file_source(content: dict[str, Any]) -> str | None:
    """An encrypted file's ``mxc://`` URI with its keys in the fragment (``#e2ee=...``), so the
    download (``downloads.py``), which may run after a restart, can decrypt it; None when the
    event's ``file`` is not a well-formed EncryptedFile (v2, AES-CTR, with a SHA-256)."""
    file = content.get("file")
    if not isinstance(file, dict):
        return None
    url, key, iv, hashes = file.get("url"), file.get("key"), file.get("iv"), file.get("hashes")
    if not (isinstance(url, str) and url.startswith("mxc://") and isinstance(key, dict)
            and isinstance(key.get("k"), str) and isinstance(iv, str) and isinstance(hashes, dict)
            and isinstance(hashes.get("sha256"), str)):
        return None
    packed = json.dumps({"k": key["k"], "iv": iv, "sha256": hashes["sha256"]}, separators=(",", ":"))
    return f"{url}#e2ee={base64.urlsafe_b64encode(packed.encode()).decode()}"


def split_source(source: str) -> tuple[str, dict[str, str] | None]:
    """``(mxc URI, its keys or None)``; keys that cannot be read are an error (``ValueError``)."""
    mxc, sep, fragment = source.partition("#e2ee=")
    if not sep:
        return source, None
    keys = json.loads(base64.urlsafe_b64decode(fragment.encode()))
    if not isinstance(keys, dict) or not all(isinstance(keys.get(k), str) for k in ("k", "iv", "sha256")):
        raise ValueError("malformed keys")
    return mxc, {k: str(keys[k]) for k in ("k", "iv", "sha256")}


def decrypt_file(ciphertext: bytes, keys: dict[str, str]) -> bytes:
    """The plaintext of an encrypted attachment; its SHA-256 checked first (``EncryptionError``)."""
    return bytes(decrypt_attachment(ciphertext, keys["k"], keys["sha256"], keys["iv"]))
