"""The Slack channel: its client, start and stop, and the parts it is made of.

``SlackChannel`` builds one ``SlackApi`` (slack-sdk's ``AsyncWebClient`` on
``SLACK_API_BASE_URL``, the settings, the per-channel send budget) and gives it to each part:
intake, delivery, live views (``channels/edited_view.py``), approval prompts and downloads.
Requests arrive by the Events API on Talon's HTTP server (``SLACK_SIGNING_SECRET``) or by Socket
Mode (``SLACK_APP_TOKEN``), see ``events.py``.

Start checks the token with ``auth.test`` (which also names the bot's member id, used for
mentions): a refused token is a ``ConfigError`` at once; a Slack that cannot be reached is waited
for (``health`` says why). With the Events API every worker behind the public URL may take
requests; with Socket Mode each worker opens its own connection and Slack hands each event to one
of them: neither needs a lease.
"""

from __future__ import annotations

import logging

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from talon.bounded import BoundedMap
from talon.config import Settings
from talon.envelope import InboundMessage
from talon.errors import ConfigError, DeliveryError, PlatformRateLimited, StreamStopped
from talon.render.slack import SLACK_TEXT_LIMIT, markdown_to_mrkdwn, split_for_slack

from channels.base import ChannelHealth, PartsChannel
from channels.edited_view import EditedViews
from channels.http import HttpServer
from channels.lifecycle import PlatformLifecycle
from channels.rooms import ChatterLog
from channels.slack.api import CHANNEL, Call, SlackApi, slack_budget
from channels.slack.approvals import ApprovalPrompts
from channels.slack.delivery import Delivery
from channels.slack.downloads import Downloads
from channels.slack.events import Dispatch, HttpDoor, SocketDoor, Verifier
from channels.slack.intake import Intake

log = logging.getLogger(__name__)

_REFUSED_TOKEN = frozenset({"invalid_auth", "not_authed", "account_inactive", "token_revoked", "token_expired"})


class SlackChannel(PlatformLifecycle, PartsChannel):
    name = CHANNEL

    intake: Intake
    approvals: ApprovalPrompts
    delivery: Delivery
    downloads: Downloads

    def __init__(self, settings: Settings, http: HttpServer | None = None) -> None:
        if not settings.slack_configured():
            raise ConfigError("SLACK_BOT_TOKEN must be set for the Slack channel", ["SLACK_BOT_TOKEN"])
        if not settings.slack_socket_mode and not settings.slack_signing_secret.strip():
            raise ConfigError("set SLACK_SIGNING_SECRET (Events API over HTTP) or SLACK_APP_TOKEN (Socket Mode) "
                              "for the Slack channel", ["SLACK_SIGNING_SECRET", "SLACK_APP_TOKEN"])
        self.settings = settings
        self.api = SlackApi(settings, slack_budget())
        self.intake = Intake(self.api, allowed_channels=settings.slack_allowed_channel_ids,
                             chatter=ChatterLog(settings.slack_channel_context, "slack_chatter"))
        self.live = EditedViews(CHANNEL, self.api.budget, post=self._live_post, edit=self._live_edit,
                                first_piece=_first_piece, interval_s=settings.slack_stream_interval_s,
                                head_chars=4 * SLACK_TEXT_LIMIT,
                                enabled=settings.slack_streaming)
        self.delivery = Delivery(self.api, self.live, self.intake.threads)
        self.approvals = ApprovalPrompts(self.api, self.delivery, self.intake)
        self.downloads = Downloads(self.api, settings.slack_timeout_s)
        self.dispatch = Dispatch(on_event=self.intake.on_event, on_action=self.approvals.on_action,
                                 on_command=self.intake.on_command)
        self.ack_reaction = settings.slack_ack_reaction.strip().strip(":")
        self._reacted: BoundedMap[str, bool] = BoundedMap("slack_reactions")
        self.socket: SocketDoor | None = None
        self.door: HttpDoor | None = None
        self._owns_http = False
        self.http = http
        self.events_path = settings.slack_events_path.rstrip("/") or "/slack/events"
        if not settings.slack_socket_mode:
            self._owns_http = http is None
            self.http = http or HttpServer(settings.http_host, settings.http_port)
            self.door = HttpDoor(self.dispatch, Verifier(settings.slack_signing_secret.strip()))
            self.http.add_route("POST", self.events_path, self.door.handle)

    def serves(self, conversation: InboundMessage) -> str | None:
        if conversation.is_group and not self.intake.serves_channel(conversation.chat_id):
            return f"the channel {conversation.chat_id} is no longer served (not in TALON_SLACK_ALLOWED_CHANNELS)"
        return None

    # --- start, health and stop (channels/lifecycle.py) -------------------------------------------
    def _platform(self) -> str:
        return f"Slack at {self.api.base_url}"

    async def _receive(self) -> None:
        if self.settings.slack_socket_mode:
            self.socket = SocketDoor(self.dispatch, self.settings.slack_app_token.strip(), self.api.client)
            await self._retry_start(self.socket.connect)
        elif self._owns_http and self.http is not None:
            await self.http.start()

    async def _log_in(self) -> None:
        """``auth.test``: the token, and the bot's member id (for mentions)."""
        try:
            answer = await self.api.client.auth_test()
        except SlackApiError as exc:
            error = exc.response.data.get("error") if isinstance(exc.response.data, dict) else None
            if error in _REFUSED_TOKEN:
                raise ConfigError(f"Slack refused SLACK_BOT_TOKEN ({error}): check it", ["SLACK_BOT_TOKEN"]) from exc
            raise OSError(f"auth.test: {error or exc.response.status_code}") from exc
        self.api.bot_user_id = str(answer.get("user_id") or "")
        self.api.bot_id = str(answer.get("bot_id") or "")
        self.api.team = str(answer.get("team") or "")
        log.info("slack: signed in as %s (%s) in %s via %s; %s", answer.get("user"), self.api.bot_user_id,
                 self.api.team, self.api.base_url,
                 "Socket Mode" if self.settings.slack_socket_mode else f"Events API at {self.events_path}")

    def _health_up(self) -> ChannelHealth:
        if self.socket is not None:
            session = self.socket.client.current_session
            if session is None or session.closed:
                return ChannelHealth(False, "the Socket Mode connection is down (slack-sdk reconnects)")
            return ChannelHealth(True, f"Socket Mode connected as {self.api.bot_user_id}")
        if self.http is None or not self.http.running:
            return ChannelHealth(False, "Talon's HTTP server is not listening: Slack's events cannot arrive")
        return ChannelHealth(True, f"Events API at {self.events_path} as {self.api.bot_user_id}")

    async def stop(self) -> None:
        self._down = "stopped"
        if self.socket is not None:
            await self.socket.close()
        await self.dispatch.close()
        if self._owns_http and self.http is not None:
            await self.http.stop()
        await self.downloads.close()
        await self.api.close()

    # --- live views -------------------------------------------------------------------------------
    async def _live_post(self, message: InboundMessage, markdown: str) -> str:
        answer = await self._live(message, lambda: self.api.client.chat_postMessage(
            channel=message.chat_id, text=markdown_to_mrkdwn(markdown), thread_ts=message.thread_id,
            unfurl_links=False, unfurl_media=False))
        if message.thread_id is not None:
            self.intake.threads[message.conversation_id] = True
        return str(answer.get("ts"))

    async def _live_edit(self, message: InboundMessage, ts: str, markdown: str) -> None:
        await self._live(message, lambda: self.api.client.chat_update(
            channel=message.chat_id, ts=ts, text=markdown_to_mrkdwn(markdown)))

    async def _live(self, message: InboundMessage, call: Call) -> AsyncSlackResponse:
        """One live update, tried once: a 429 blocks the channel's budget and ends the view."""
        try:
            return await self.api.once("live update", call)
        except PlatformRateLimited as exc:
            self.api.budget.penalize(message.chat_id, exc.seconds)
            raise StreamStopped(f"Slack asked to wait {exc.seconds:.0f}s") from exc
        except DeliveryError as exc:
            raise StreamStopped(str(exc)) from exc

    # --- the Channel methods not forwarded to a part (channels/base.py) ----------------------------
    async def acknowledge(self, message: InboundMessage) -> None:
        if not self.ack_reaction or message.message_id.startswith("cmd-") or message.key in self._reacted:
            return
        if not self.api.budget.try_spend(message.chat_id, calls=2):
            return
        await self.api.once("reaction", lambda: self.api.client.reactions_add(
            channel=message.chat_id, timestamp=message.message_id, name=self.ack_reaction))
        self._reacted[message.key] = True

    async def unacknowledge(self, message: InboundMessage) -> None:
        if self._reacted.pop(message.key, None):
            await self.api.once("reaction", lambda: self.api.client.reactions_remove(
                channel=message.chat_id, timestamp=message.message_id, name=self.ack_reaction))


def _first_piece(markdown: str) -> str:
    pieces = split_for_slack(markdown)
    return pieces[0] if pieces else ""
