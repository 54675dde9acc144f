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
from typing import TYPE_CHECKING, Any

from nio import LoginResponse, WhoamiResponse

from talon.config import Settings
from talon.envelope import InboundMessage
from talon.errors import ConfigError, DeliveryError, PlatformRateLimited, StreamStopped
from talon.render.matrix import split_for_matrix

from channels.base import ChannelHealth, ForwardsReactions, ForwardsTyping, PartsChannel
from channels.edited_view import EditedViews
from channels.lifecycle import LeaseLedUpdates
from channels.matrix.api import CHANNEL, MatrixApi, check, matrix_budget
from channels.matrix.approvals import ApprovalPrompts
from channels.matrix.crypto import E2ee
from channels.matrix.delivery import Delivery, edit_content, placed, text_content
from channels.matrix.downloads import Downloads
from channels.matrix.intake import Intake
from channels.matrix.reactions import Reactions
from channels.matrix.sync import Sync
from channels.rooms import ChatterLog

if TYPE_CHECKING:
    from talon.storage.leases import Leases

log = logging.getLogger(__name__)


class MatrixChannel(LeaseLedUpdates, ForwardsReactions, ForwardsTyping, PartsChannel):
    name = CHANNEL
    typing_interval_s = 8.0
    lease_task_name = "matrix-sync-lease"

    intake: Intake
    approvals: ApprovalPrompts
    delivery: Delivery
    downloads: Downloads

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

    def serves(self, conversation: InboundMessage) -> str | None:
        if conversation.is_group and not self.intake.serves_room(conversation.chat_id):
            return f"the room {conversation.chat_id} is no longer served (not in TALON_MATRIX_ALLOWED_ROOMS)"
        return None

    def share_updates(self, leases: Leases) -> None:
        """Many workers: one ``/sync`` per account, by the holder of its lease; the token in the
        account data so that the next holder goes on from it (``sync.py``)."""
        self.sync.shared = True
        super().share_updates(leases)

    # --- start, health and stop (channels/lifecycle.py) -------------------------------------------
    def _platform(self) -> str:
        return f"the homeserver {self.api.homeserver}"

    def _lease_name(self) -> str:
        return f"matrix:sync:{self.api.user_id}"

    async def _open_updates(self) -> None:
        if self.crypto is not None:  # the sync's holder holds the key store (crypto.py)
            await self._retry_start(self.crypto.start)
        self._task = asyncio.create_task(self.sync.run(), name="matrix-sync")

    async def _close_updates(self) -> None:
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

    def _health_up(self) -> ChannelHealth:
        if self._standing_by():
            return ChannelHealth(True, f"standing by: another worker syncs {self.api.user_id} (lease "
                                       f"{self._lease_name()}); replies go out from here")
        if self._task is not None and self._task.done():
            return ChannelHealth(False, "the sync loop ended")
        return self.sync.health()

    async def stop(self) -> None:
        self._down = "stopped"
        await self._stop_receiving()
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


def _first_piece(markdown: str) -> str:
    pieces = split_for_matrix(markdown)
    return pieces[0] if pieces else ""


def _refused(answer: object, setting: str, homeserver: str) -> None:
    code = getattr(answer, "status_code", None) or ""
    if code in ("M_UNKNOWN_TOKEN", "M_FORBIDDEN", "M_MISSING_TOKEN", "M_USER_DEACTIVATED"):
        raise ConfigError(f"the homeserver {homeserver} refused {setting} ({code}): check it", [setting])
    raise OSError(f"{homeserver} answered {answer}")
