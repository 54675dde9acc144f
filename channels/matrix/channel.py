"""The Matrix channel: its client, start and stop, and the parts it is made of.

``MatrixChannel`` builds one ``MatrixApi`` (matrix-nio's client, the settings, the per-room send
budget) and gives it to each part: intake, sync, delivery, live views (``channels/edited_view.py``),
reactions, approval prompts and downloads. Start logs in (``MATRIX_ACCESS_TOKEN``, or
``MATRIX_PASSWORD``), checks who it is with ``whoami``, reads the homeserver's upload limit, and
starts the sync loop; a homeserver that cannot be reached is waited for (``health`` says why)
rather than failing the start, while a refused token or password is a ``ConfigError`` at once.
With many workers on one database (``share_updates``) only the holder of the account's sync lease
runs the loop (``channels/leader.py``); the others send replies and stand by.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from nio import LoginResponse, WhoamiResponse

from talon.config import Limits, Settings
from talon.content import InboundFile
from talon.envelope import InboundMessage, LiveReply, OutboundReply, RemoteFile
from talon.errors import ConfigError, DeliveryError, PlatformRateLimited, StreamStopped
from talon.render.matrix import split_for_matrix
from talon.storage.attachments import AttachmentStore

from channels.base import BridgeHandle, Channel, ChannelHealth, PartCallback
from channels.edited_view import EditedViews
from channels.leader import LeaseLeader
from channels.matrix.api import CHANNEL, MatrixApi, check, matrix_budget
from channels.matrix.approvals import ApprovalPrompts
from channels.matrix.crypto import E2ee
from channels.matrix.delivery import Delivery, edit_content, placed, text_content
from channels.matrix.downloads import Downloads
from channels.matrix.intake import Intake
from channels.matrix.reactions import Reactions
from channels.matrix.sync import Sync
from channels.reply_parts import Part
from channels.rooms import ChatterLog

if TYPE_CHECKING:
    from talon.storage.approvals import Approval
    from talon.storage.leases import Leases

log = logging.getLogger(__name__)


class MatrixChannel(Channel):
    name = CHANNEL
    typing_interval_s = 8.0

    def __init__(self, settings: Settings) -> None:
        if not settings.matrix_configured():
            raise ConfigError("MATRIX_HOMESERVER and MATRIX_USER_ID must both be set", ["MATRIX_HOMESERVER",
                                                                                         "MATRIX_USER_ID"])
        if not settings.matrix_access_token and not settings.matrix_password:
            raise ConfigError("set MATRIX_ACCESS_TOKEN (or MATRIX_PASSWORD) for the Matrix account",
                              ["MATRIX_ACCESS_TOKEN", "MATRIX_PASSWORD"])
        self.settings = settings
        self.api = MatrixApi(settings, settings.limits(), matrix_budget())
        self.intake = Intake(self.api, allowed_rooms=settings.matrix_allowed_room_ids,
                             chatter=ChatterLog(settings.matrix_room_context, "matrix_chatter"))
        self.live = EditedViews(CHANNEL, self.api.budget, post=self._live_post, edit=self._live_edit,
                                first_piece=_first_piece, interval_s=settings.matrix_stream_interval_s,
                                enabled=settings.matrix_streaming)
        self.delivery = Delivery(self.api, self.live, self.intake.sent)
        self.approvals = ApprovalPrompts(self.api, self.delivery)
        self.reactions = Reactions(self.api, settings.matrix_ack_reaction)
        self.downloads = Downloads(self.api)
        self.sync = Sync(self.api, settings.data_dir, on_invite=self.intake.on_invite,
                         on_event=self.intake.on_event, on_reaction=self.approvals.on_reaction)
        self.crypto = E2ee(self.api, settings.data_dir) if settings.matrix_e2ee != "off" else None
        if self.crypto is not None:  # encrypted rooms (crypto.py)
            self.sync.after_batch = self.crypto.after_sync
            self.intake.on_undecryptable = self.crypto.undecryptable
        self._task: asyncio.Task[None] | None = None
        self.leader: LeaseLeader | None = None
        self._leading: asyncio.Task[None] | None = None
        self._down: str | None = "not started"
        self.startup_retry_max_s = 30.0

    def serves(self, conversation: InboundMessage) -> str | None:
        if conversation.is_group and not self.intake.serves_room(conversation.chat_id):
            return f"the room {conversation.chat_id} is no longer served (not in TALON_MATRIX_ALLOWED_ROOMS)"
        return None

    def share_updates(self, leases: Leases) -> None:
        """Many workers: one ``/sync`` per account, by the holder of its lease; the token in the
        account data so that the next holder goes on from it (``sync.py``)."""
        self.sync.shared = True
        self.leader = LeaseLeader(leases, f"matrix:sync:{self.api.user_id}", start=self._start_sync,
                                  stop=self._stop_sync)

    async def start(self, bridge: BridgeHandle) -> None:
        self.intake.bind(bridge)
        self.approvals.bind(bridge)
        await self._retry_start(self._log_in)
        if self.leader is not None:
            self._leading = asyncio.create_task(self.leader.run(), name="matrix-sync-lease")
        else:
            await self._start_sync()
        self._down = None

    async def _start_sync(self) -> None:
        if self.crypto is not None:  # the sync's holder holds the key store (crypto.py)
            await self._retry_start(self.crypto.start)
        self._task = asyncio.create_task(self.sync.run(), name="matrix-sync")

    async def _stop_sync(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self.crypto is not None:
            self.crypto.stop()

    async def _log_in(self) -> None:
        client = self.api.client
        if not self.settings.matrix_access_token:
            if self.crypto is not None:  # the same device (and keys) as last time
                client.device_id = self.crypto.saved_device_id() or ""
            answer = await client.login(self.settings.matrix_password, device_name="Talon")
            if not isinstance(answer, LoginResponse):
                _refused(answer, "MATRIX_PASSWORD", self.api.homeserver)
        who = await client.whoami()
        if not isinstance(who, WhoamiResponse):
            _refused(who, "MATRIX_ACCESS_TOKEN", self.api.homeserver)
        assert isinstance(who, WhoamiResponse)
        client.device_id = who.device_id or client.device_id
        if who.user_id != self.api.user_id:
            raise ConfigError(f"MATRIX_USER_ID is {self.api.user_id}, but the token belongs to {who.user_id}",
                              ["MATRIX_USER_ID", "MATRIX_ACCESS_TOKEN"])
        resp = await self.api.http.get(f"{self.api.homeserver}/_matrix/client/v1/media/config", headers=self.api.auth())
        if resp.status_code == 200 and isinstance(resp.json().get("m.upload.size"), int):
            self.api.upload_max_bytes = int(resp.json()["m.upload.size"])
        profile = await client.get_displayname(self.api.user_id)
        self.api.display_name = str(getattr(profile, "displayname", "") or "")
        log.info("matrix: logged in as %s at %s (uploads up to %d bytes)", who.user_id, self.api.homeserver,
                 self.api.upload_max_bytes)

    async def _retry_start(self, step: Callable[[], Awaitable[None]]) -> None:
        delay = 1.0
        while True:
            try:
                await step()
                return
            except ConfigError:
                raise
            except Exception as exc:  # unreachable, hanging, 5xx: wait for it
                self._down = (f"cannot reach the homeserver {self.api.homeserver} ({type(exc).__name__}: "
                              f"{str(exc)[:120]}); retrying in {delay:.0f}s")
                log.warning("matrix: %s", self._down)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.startup_retry_max_s)

    def health(self) -> ChannelHealth:
        if self._down is not None:
            return ChannelHealth(False, self._down)
        if self.leader is not None and not self.leader.leading:
            return ChannelHealth(True, f"standing by: another worker syncs {self.api.user_id} (lease "
                                       f"{self.leader.name}); replies go out from here")
        if self._task is not None and self._task.done():
            return ChannelHealth(False, "the sync loop ended")
        return self.sync.health()

    async def stop(self) -> None:
        self._down = "stopped"
        if self._leading is not None:
            self._leading.cancel()
            await asyncio.gather(self._leading, return_exceptions=True)
        await self._stop_sync()
        await self.api.close()

    # --- live views -------------------------------------------------------------------------------
    async def _live_post(self, message: InboundMessage, markdown: str) -> str:
        reply_to = message.message_id if message.is_group else None
        content = placed(text_content(markdown), thread_id=message.thread_id, reply_to=reply_to)
        event_id = await self._live_call(message.chat_id, "m.room.message", content)
        self.intake.sent[event_id] = True
        return event_id

    async def _live_edit(self, message: InboundMessage, event_id: str, markdown: str) -> None:
        await self._live_call(message.chat_id, "m.room.message", edit_content(event_id, markdown))

    async def _live_call(self, room: str, kind: str, content: dict[str, Any]) -> str:
        try:
            answer = check(await self.api.client.room_send(room, kind, content), "live update")
        except PlatformRateLimited as exc:
            self.api.budget.penalize(room, exc.seconds)
            raise StreamStopped(f"the homeserver asked to wait {exc.seconds:.0f}s") from exc
        except DeliveryError as exc:
            raise StreamStopped(str(exc)) from exc
        return str(answer.event_id)

    # --- the Channel methods ---------------------------------------------------------------------
    def live_reply(self, message: InboundMessage, *, placed: Callable[[str], Awaitable[None]] | None = None,
                   resume_id: str | None = None) -> LiveReply | None:
        return self.live.live_reply(message, placed=placed, resume_id=resume_id)

    async def acknowledge(self, message: InboundMessage) -> None:
        await self.reactions.acknowledge(message)

    async def unacknowledge(self, message: InboundMessage) -> None:
        await self.reactions.unacknowledge(message)

    async def ask_approval(self, approval: Approval, text: str) -> str | None:
        return await self.approvals.ask_approval(approval, text)

    async def settle_approval(self, approval: Approval, text: str) -> None:
        await self.approvals.settle_approval(approval, text)

    def reply_parts(self, reply: OutboundReply) -> list[Part]:
        return self.delivery.reply_parts(reply)

    async def deliver(self, chat_id: str, reply: OutboundReply, *, skip_parts: int = 0,
                      on_part: PartCallback | None = None) -> None:
        await self.delivery.deliver(chat_id, reply, skip_parts=skip_parts, on_part=on_part)

    async def download(self, remote: RemoteFile, store: AttachmentStore, limits: Limits) -> InboundFile:
        return await self.downloads.download(remote, store, limits)

    async def send_typing(self, chat_id: str, thread_id: str | None = None) -> None:
        await self.delivery.send_typing(chat_id, thread_id)


def _first_piece(markdown: str) -> str:
    pieces = split_for_matrix(markdown)
    return pieces[0] if pieces else ""


def _refused(answer: object, setting: str, homeserver: str) -> None:
    code = getattr(answer, "status_code", None) or ""
    if code in ("M_UNKNOWN_TOKEN", "M_FORBIDDEN", "M_MISSING_TOKEN", "M_USER_DEACTIVATED"):
        raise ConfigError(f"the homeserver {homeserver} refused {setting} ({code}): check it", [setting])
    raise OSError(f"{homeserver} answered {answer}")
