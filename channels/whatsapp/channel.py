"""``WhatsAppChannel``: builds the parts (``TwilioApi``, downloads, delivery, the window, receipts,
approvals, webhooks), hands each what it needs, and answers the core's ``Channel`` calls.

Outbound: a reply is an ordered list of parts (``parts.py``), derived from the reply alone so that
``skip_parts`` means the same thing after a restart; progress is reported after every part. Before
a reply's first part, what waited for the chat's 24-hour window goes (``window.py``); when the
window is closed, the reply's parts wait too (a template tells the person) and count as delivered
for the bridge: the store keeps them. Errors: 429, 5xx and network failures are retried with
backoff (3 tries) and then stop the delivery, so the bridge can resume it later from that part.
Refusals are not retried: 63016 / 63032 (the window) make the rest wait; others that concern the
chat end the delivery with a permanent ``DeliveryError`` (the bridge then closes the message); the
rest skip the one part.
"""

from __future__ import annotations

import logging


from talon.config import Limits, Settings
from talon.envelope import InboundMessage, OutboundReply
from talon.errors import TwilioRefused
from talon.storage.media_links import MediaLinkStore, MemoryMediaLinks
from talon.storage.whatsapp import WhatsAppStore

from channels.base import BridgeHandle, Channel, ChannelHealth, ForwardsApprovals, ForwardsDownloads, PartCallback
from channels.http import HttpServer
from channels.media_links import MediaLinks
from channels.whatsapp.api import WINDOW_CODES, TwilioApi
from channels.whatsapp.approvals import ApprovalPrompts
from channels.whatsapp.config import check_whatsapp_settings
from channels.whatsapp.delivery import Delivery
from channels.whatsapp.downloads import Downloads, MediaHosts
from channels.whatsapp.parts import Part, plan_parts
from channels.whatsapp.status import Receipts
from channels.whatsapp.templates import Templates
from channels.whatsapp.webhook import Webhooks
from channels.whatsapp.window import Window

log = logging.getLogger("channels.whatsapp")

# At stop, how long to keep serving files Twilio has not fetched yet (it does so within seconds).
MEDIA_DRAIN_S = 10.0


class WhatsAppChannel(ForwardsApprovals, ForwardsDownloads, Channel):
    name = "whatsapp"

    approvals: ApprovalPrompts
    downloads: Downloads

    def __init__(self, settings: Settings, *, http: HttpServer | None = None,
                 retry_base_s: float = 1.0, media_drain_s: float = MEDIA_DRAIN_S,
                 links: MediaLinkStore | None = None, state: WhatsAppStore | None = None,
                 worker_id: str = "") -> None:
        # ``links`` holds the table of media links and ``state`` the window, waiting messages and
        # receipts (both in PostgreSQL with many workers; by default in memory and in
        # TALON_DATA_DIR/whatsapp.sqlite3).
        check_whatsapp_settings(settings)
        self.settings = settings
        self.limits: Limits = settings.limits()
        self.allowlist = settings.whatsapp_allowlist
        self.public_base_url = settings.public_base_url.strip().rstrip("/")
        self.webhook_path = settings.whatsapp_webhook_path.rstrip("/") or "/"
        self.status_path = self.webhook_path.rstrip("/") + "/status"
        self.insecure = settings.whatsapp_insecure_no_signature
        self.media_drain_s = media_drain_s
        self.templates = Templates.from_settings(settings)
        self._owns_state = state is None
        if state is None:
            from talon.storage.embedded.whatsapp import SqliteWhatsAppStore

            settings.ensure_dirs()
            state = SqliteWhatsAppStore(settings.data_dir / "whatsapp.sqlite3")
        self.state = state
        self._owns_http = http is None
        self.http = http or HttpServer(settings.http_host, settings.http_port)
        self.links: MediaLinks | None = (
            MediaLinks(links or MemoryMediaLinks(), settings.media_root, self.public_base_url,
                       settings.media_url_ttl_s)
            if self.public_base_url else None
        )
        self.api = TwilioApi(settings, state, retry_base_s=retry_base_s,
                             status_url=self.public_base_url + self.status_path if self.public_base_url else None)
        self.media_hosts = MediaHosts(settings.twilio_media_hosts, settings.twilio_api_base_url)
        self.downloads = Downloads(self.api.account_sid, self.api.auth_token, self.media_hosts,
                                   retry_base_s=retry_base_s)
        self.delivery = Delivery(settings, self.api, self.links)
        self.window = Window(state, self.api, self.delivery, self.templates,
                             holder=worker_id or settings.worker_id or f"whatsapp-{id(self):x}",
                             pending_days=settings.whatsapp_pending_days)
        self.receipts = Receipts(state, self.api, self.window)
        self.approvals = ApprovalPrompts(self.api, self.window, state, self.templates, self.links, self.limits)
        self.webhooks = Webhooks(account_sid=self.api.account_sid, auth_token=self.api.auth_token,
                                 public_base_url=self.public_base_url, webhook_path=self.webhook_path,
                                 insecure=self.insecure, api=self.api, window=self.window,
                                 receipts=self.receipts, approvals=self.approvals)
        self.http.add_route("POST", self.webhook_path, self.webhooks.on_webhook)
        self.http.add_route("POST", self.status_path, self.webhooks.on_status)
        if self.links is not None:
            self.http.add_route("GET", MediaLinks.route, self.links.handle)
        self._state = "not started"  # "up" between start and stop (health)

    @property
    def sender(self) -> str:
        return self.api.sender

    def serves(self, conversation: InboundMessage) -> str | None:
        """Every WhatsApp conversation here is one person's (Twilio's WhatsApp has no groups); who
        may use the bot is the access gate's question (TALON_WHATSAPP_ALLOWED_NUMBERS, pairing)."""
        if conversation.is_group:
            return "WhatsApp group chats are not served"
        return None

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self, bridge: BridgeHandle) -> None:
        self.webhooks.bind(bridge)
        self.approvals.bind(bridge)
        self.receipts.count = lambda status: bridge.metrics.delivery_statuses.labels(self.name, status).inc()
        if self.insecure:
            log.warning(
                "whatsapp: TALON_WHATSAPP_INSECURE_NO_SIGNATURE=true: webhooks are accepted WITHOUT "
                "checking X-Twilio-Signature, so anyone who can reach %s can talk to the agent as any "
                "allowed number. Use this only for local experiments.", self.webhook_path)
            if not self.api.auth_token:
                log.warning("whatsapp: TWILIO_AUTH_TOKEN is not set: Twilio will refuse to send replies")
        if not self.allowlist and not self.settings.pairing:
            log.warning("whatsapp: TALON_WHATSAPP_ALLOWED_NUMBERS is empty: nobody can chat yet "
                        "(deny by default); add E.164 numbers such as +14155550123")
        if self.links is None:
            log.warning("whatsapp: TALON_PUBLIC_BASE_URL is not set: replies cannot carry files "
                        "(Twilio fetches them from Talon's public URL)")
        notice = self.templates.missing_notice()
        if notice:
            log.warning("whatsapp: %s (see docs/channels.md, \"The 24-hour window\")", notice)
        self.api.start()
        self.downloads.start()
        if self._owns_http:
            await self.http.start()
        self.window.start()
        log.info("whatsapp: webhook at %s%s (listening on %s:%s), sending as %s",
                 self.public_base_url or "<no public URL>", self.webhook_path, self.http.host,
                 self.http.port if self.http.running else self.http.requested_port, self.sender)
        self._state = "up"

    def health(self) -> ChannelHealth:
        if self._state != "up":
            return ChannelHealth(False, self._state)
        if not self.http.running:
            return ChannelHealth(False, "Talon's HTTP server is not listening: Twilio's webhooks cannot arrive")
        return ChannelHealth(True, f"ready: webhook {self.public_base_url or '<no public URL>'}{self.webhook_path}, "
                                   f"sending as {self.sender}")

    async def drain(self) -> None:
        if self.links is None or self.media_drain_s <= 0:
            return
        waiting = await self.links.wait_fetched(self.media_drain_s)
        if waiting:
            log.warning("whatsapp: stopping although Twilio has not fetched %d file(s) sent in the last "
                        "%gs; those will not arrive (Twilio reports error 11200)", waiting,
                        self.settings.media_url_ttl_s)

    async def stop(self) -> None:
        self._state = "stopped"
        if self._owns_http:
            await self.http.stop()
        await self.window.stop()
        await self.receipts.stop()
        await self.webhooks.stop()
        await self.api.close()
        await self.downloads.close()
        if self._owns_state:
            await self.state.close()

    async def status_lines(self, chat_id: str) -> list[str]:
        return await self.window.status_lines(chat_id)

    # --- outbound (downloads and approval prompts: ForwardsDownloads, ForwardsApprovals) -------
    def reply_parts(self, reply: OutboundReply) -> list[Part]:
        return plan_parts(reply, self.limits, can_attach=self.links is not None)

    async def deliver(self, chat_id: str, reply: OutboundReply, *, skip_parts: int = 0,
                      on_part: PartCallback | None = None) -> None:
        parts = self.reply_parts(reply)

        async def held(index: int, why: str) -> None:
            await self.window.hold(chat_id, parts[index:], reminder=reply.scheduled_task, why=why)
            if on_part is not None:
                await on_part(len(parts))  # kept in the store: the bridge may close the message

        async with self.window.lock(chat_id):
            clear = await self.window.flush(chat_id)  # what waited goes first
            if not clear:
                await held(skip_parts, "older messages wait for it")
                return
            if await self.window.state(chat_id) == "closed":
                await held(skip_parts, "no message from the person in 24 hours")
                return
            for index, part in enumerate(parts):
                if index < skip_parts:
                    continue
                try:
                    await self.delivery.send_part(chat_id, part)
                except TwilioRefused as exc:
                    if exc.code in WINDOW_CODES:
                        await self.window.refused(chat_id)
                        await held(index, f"Twilio refused it with error {exc.code}")
                        return
                    if exc.chat_level:
                        # Nothing more can reach this chat now. The bridge logs the refusal with the
                        # MessageSid it answers and closes the message: retrying cannot succeed.
                        log.error("whatsapp: chat=%s: %d of %d reply part(s) not delivered (Twilio error %s)",
                                  chat_id, len(parts) - index, len(parts), exc.code or exc.status)
                        raise
                    log.error("whatsapp: chat=%s: reply part %d of %d skipped: %s", chat_id, index + 1,
                              len(parts), exc)
                if on_part is not None:
                    await on_part(index + 1)



