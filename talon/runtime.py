"""Assembles Talon from settings: stores, provider, agent, bridge and channels."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from talon.agent.context import ContextPolicy
from talon.agent.discovery import Discoverer
from talon.agent.learned import LearnedFacts
from talon.agent.loop import DEFAULT_SYSTEM_PROMPT, Agent
from talon.agent.profiles import settings_profile, split_summary_model
from talon.agent.provider import Provider, data_url
from talon.agent.session import SessionStore, safe_path_part
from talon.agent.workspace import Workspace
from talon.agent.workspace_tools import workspace_tools
from talon.attachments import AttachmentStore
from talon.bridge import Bridge, Normalizer
from talon.config import Settings
from talon.content import ContentBlock, ImageBlock, InboundFile
from talon.errors import ConfigError
from talon.envelope import InboundMessage
from talon.inbox import InboxStore
from talon.media import InboundContext, normalize_inbound
from talon.speech import Transcriber
from talon.tts import Synthesizer
from talon.voice_replies import SpeakTool, VoiceReplies
from talon.stores import Stores, open_stores

if TYPE_CHECKING:
    from channels.base import Channel
    from channels.http import HttpServer

log = logging.getLogger(__name__)


def build_provider(settings: Settings, store: AttachmentStore, model: str | None = None) -> Provider:
    """The provider for ``TALON_MODEL``, or for another model spec (the summary model).

    Its image and tool support come from the model profile (settings over the table; discovery
    updates them at start). The SDK of each provider is imported only when it is used.
    """
    settings.check_model()

    def hydrate(block: ImageBlock) -> str:
        return data_url(block.ref.mime, store.read_bytes(block.ref))

    if model is None:
        provider_name, model_name = settings.provider_name, settings.model_name
        profile = settings_profile(settings)
    else:
        provider_name, model_name = split_summary_model(model, settings.provider_name)
        profile = settings_profile(settings, model)
    # Each adapter (and its SDK) is imported only when its provider is used: `anthropic` alone
    # costs about a second of start-up.
    timeouts = dict(timeout_s=settings.model_timeout_s, total_timeout_s=settings.model_total_timeout_s,
                    max_retries=settings.model_max_retries, stream=settings.model_stream)
    if provider_name == "openai":
        from talon.agent.openai_provider import OpenAIProvider

        return OpenAIProvider(
            model_name,
            api_key=settings.openai_api_key,
            base_url=settings.openai_base_url or None,
            hydrate=hydrate,
            vision=profile.vision,
            tools=profile.tools,
            reasoning=profile.reasoning,
            **timeouts,  # type: ignore[arg-type]
        )
    if provider_name == "anthropic":
        from talon.agent.anthropic_provider import AnthropicProvider

        if not settings.anthropic_api_key:
            raise ConfigError("the anthropic provider needs ANTHROPIC_API_KEY", ["ANTHROPIC_API_KEY"])
        from talon.agent.anthropic_provider import AnthropicProvider

        return AnthropicProvider(
            model_name,
            api_key=settings.anthropic_api_key,
            base_url=settings.anthropic_base_url or None,
            hydrate=hydrate,
            vision=profile.vision,
            tools=profile.tools,
            **timeouts,  # type: ignore[arg-type]
        )
    raise ConfigError(f"provider {provider_name!r} is not available", ["TALON_MODEL"])


@dataclass
class Runtime:
    settings: Settings
    store: AttachmentStore
    sessions: SessionStore
    inbox: InboxStore
    agent: Agent
    bridge: Bridge
    channels: list["Channel"] = field(default_factory=list)
    transcriber: Transcriber | None = None
    http: "HttpServer | None" = None  # shared by the channels' webhooks; routes added already
    synthesizer: Synthesizer | None = None  # voice replies; None when they are off
    warmup: "asyncio.Task[None] | None" = None
    stores: Stores | None = None

    async def start(self) -> None:
        if self.stores is not None:
            await self.stores.start()
        # Bounded by TALON_MODEL_DISCOVERY_TIMEOUT and never fatal, except for a setting that
        # cannot fit what the server reports (ConfigError: Talon refuses to start).
        await self.agent.discover(strict=True)
        if self.settings.speech_warmup and self.synthesizer is not None:
            # In the background: the channels start now, and the first voice note finds the
            # models loaded instead of paying for the load.
            self.warmup = asyncio.create_task(self.warm_speech(), name="speech-warmup")
        for channel in self.channels:
            self.bridge.add_channel(channel, started=False)
        # Pending messages from an earlier run go first, before new ones can arrive; each chat's
        # messages are handled once its channel has started.
        self.bridge.recover()
        if self.stores is not None and self.stores.leases is not None:
            from channels.telegram_leader import PollLeader

            for channel in self.channels:
                if hasattr(channel, "poll_leader"):  # Telegram in polling mode: one worker polls
                    channel.poll_leader = PollLeader(self.stores.leases)
        if self.http is not None:
            from talon.health import add_health_route
            from talon.metrics import add_metrics_route

            add_health_route(self)
            if self.settings.metrics:
                add_metrics_route(self)
            # Listening before the channels start: a webhook that comes early gets 503 and is retried.
            await self.http.start()
        for channel in self.channels:
            await channel.start(self.bridge)
            self.bridge.channel_started(channel.name)

    async def warm_speech(self) -> None:
        """Load Whisper and the voice now; a failure is logged, and shows again at first use."""
        for name, part in (("transcription", self.transcriber), ("voice", self.synthesizer)):
            if part is None or not part.available:
                continue
            started = time.monotonic()
            try:
                await part.warm_up()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("warming the %s model failed: %s", name, exc)
            else:
                log.info("%s model ready in %.1fs", name, time.monotonic() - started)

    async def stop(self) -> None:
        if self.warmup is not None and not self.warmup.done():
            self.warmup.cancel()
        # Turns in flight first: they stop cleanly (pending in the inbox) instead of failing
        # against channels that are shutting down. What still arrives is stored, not started.
        await self.bridge.stop()
        if self.bridge.control is not None:
            await self.bridge.control.settled()  # usage of the calls made is in the store
        for channel in self.channels:
            try:
                await channel.drain()
            except Exception:
                log.exception("draining channel %s failed", channel.name)
        if self.http is not None:
            await self.http.stop()  # no new webhooks; those in flight finish first
        for channel in self.channels:
            try:
                await channel.stop()
            except Exception:
                log.exception("stopping channel %s failed", channel.name)
        await self.agent.aclose()
        if self.transcriber is not None:
            self.transcriber.close()
        if self.synthesizer is not None:
            self.synthesizer.close()
        if self.stores is not None:
            await self.stores.aclose()
        else:
            self.inbox.close()
            self.bridge.gate.close()


def build_runtime(settings: Settings, channels: list["Channel"] | None = None, *,
                  http: "HttpServer | None" = None, stores: Stores | None = None) -> Runtime:
    # Embedded (SQLite, JSONL, files) or PostgreSQL, after TALON_DATABASE_URL; the same interfaces.
    stores = stores or open_stores(settings)
    store = stores.attachments
    sessions = stores.sessions
    provider = build_provider(settings, store)
    workspace = Workspace(settings.media_root)
    summary_provider = (
        build_provider(settings, store, settings.summary_model)
        if settings.summary_model and settings.summary_model != settings.model else None
    )
    tools = workspace_tools(workspace, store=store, limits=settings.limits(), shell=settings.shell_tool,
                            shell_unsandboxed=settings.shell_unsandboxed)
    tools.timeout_s = settings.tool_timeout_s
    voice = voice_replies(settings)
    if voice is not None:
        tools.add(SpeakTool(voice.synthesizer))
    agent = Agent(
        provider,
        sessions,
        tools=tools,
        system_prompt=settings.system_prompt or DEFAULT_SYSTEM_PROMPT,
        max_steps=settings.max_steps,
        profile=settings_profile(settings),
        policy=ContextPolicy(
            trigger_ratio=settings.context_trigger,
            keep_tail_ratio=settings.context_keep_tail,
            image_keep_turns=settings.context_image_turns,
        ),
        summary_provider=summary_provider,
        summary_window=settings_profile(settings, settings.summary_model).context_window
        if summary_provider is not None else None,
        workspace=workspace,
        discoverer=model_discoverer(settings) if settings.model_discovery else None,
        learned=LearnedFacts(settings.data_dir / "model_facts.json", learned_key(settings)),
        workspaces=(lambda chat: settings.workspace_dir(chat.channel, chat.chat_id))
        if settings.workspace == "chat" else None,
    )
    inbox = stores.inbox
    transcriber = Transcriber.from_settings(settings)
    from talon.control import Control

    control = Control.from_settings(settings, stores.usage, stores.approvals)
    control.metrics.tool_names = control.approvals.tool_names = lambda: tools.tools
    bridge_kw = dict(
        agent=agent,
        inbox=inbox,
        store=store,
        limits=settings.limits(),
        media_root=settings.media_root,
        gate=stores.gate,
        normalize=inbound_normalizer(settings, store, transcriber, voice, lambda: agent.provider.vision),
        model_label=settings.model,
        turn_timeout_s=settings.turn_timeout_s,
        voice=voice,
        busy_mode=settings.busy_mode,
        control=control,
        metrics=control.metrics,
    )
    if stores.shared:
        from talon.scaleout import SharedBridge

        bridge: Bridge = SharedBridge(**bridge_kw, leases=stores.leases,  # type: ignore[arg-type]
                                      worker_id=stores.worker_id)
    else:
        bridge = Bridge(**bridge_kw)  # type: ignore[arg-type]
    return Runtime(settings, store, sessions, inbox, agent, bridge, list(channels or []), transcriber, http,
                   stores=stores, synthesizer=voice.synthesizer if voice is not None else None)


def voice_replies(settings: Settings) -> VoiceReplies | None:
    """Voice replies as configured; None when TALON_VOICE_REPLIES or TALON_TTS is off.

    A voice that cannot load (package missing, bad TALON_TTS_VOICE) still gives VoiceReplies: an
    answer to a voice note then says in one line why it has no voice note."""
    if settings.voice_replies == "off" or settings.tts == "off":
        return None
    return VoiceReplies(Synthesizer.from_settings(settings), settings.media_root,
                        mode=settings.voice_replies, max_seconds=settings.tts_max_seconds,
                        timeout_s=max(60.0, settings.tts_max_seconds),
                        workspace=lambda message: settings.workspace_dir(message.channel, message.conversation_id))


def learned_key(settings: Settings) -> str:
    """Which model on which server: what the server revealed is true of that pair."""
    base = settings.anthropic_base_url if settings.provider_name == "anthropic" else settings.openai_base_url
    return f"{settings.model} @ {base.rstrip('/') or 'default'}"


def model_discoverer(settings: Settings) -> Discoverer:
    """Discovery for ``TALON_MODEL``: its server's own facts, turned into a profile under the settings."""
    provider = settings.provider_name
    return Discoverer(
        provider,
        base_url=(settings.anthropic_base_url if provider == "anthropic" else settings.openai_base_url) or None,
        api_key=settings.anthropic_api_key if provider == "anthropic" else settings.openai_api_key,
        model=settings.model_name,
        timeout_s=settings.model_discovery_timeout_s,
        resolve=lambda facts: settings_profile(settings, facts=facts),
    )


def inbound_normalizer(settings: Settings, store: AttachmentStore, transcriber: Transcriber,
                       voice: VoiceReplies | None = None,
                       vision: Callable[[], bool] = lambda: True) -> Normalizer:
    """``vision`` says, per message, whether images go to the model as images or as a notice
    with their saved path (it changes when discovery or a refusal shows the model takes none)."""
    limits = settings.limits()

    async def normalize(message: InboundMessage, text: str, files: list[InboundFile]) -> list[ContentBlock]:
        # Inbound files go into the chat's own workspace (its "inbox/" folder); in a shared
        # workspace, into a folder per chat, so the agent can tell who sent what.
        shared = settings.workspace == "shared"
        ctx = InboundContext(
            store=store,
            media_root=settings.workspace_dir(message.channel, message.conversation_id),
            limits=limits,
            transcriber=transcriber,
            vision=vision(),
            save_dir=f"inbox/{safe_path_part(message.channel)}/{safe_path_part(message.conversation_id)}"
            if shared else "inbox",
            on_transcript=(lambda kind, transcript: voice.heard(message, kind, transcript))
            if voice is not None else None,
        )
        return await normalize_inbound(text, files, ctx)

    return normalize


def shared_http_server(settings: Settings) -> "HttpServer | None":
    """Talon's one HTTP server, when a configured channel takes webhooks (WhatsApp, or Telegram
    in webhook mode); the runtime starts it. None when nothing needs to listen."""
    # With Telegram long polling alone nothing needs to listen; naming TALON_HTTP_PORT asks for
    # the server anyway, for /metrics and /healthz.
    wanted = settings.metrics and "http_port" in settings.model_fields_set
    if wanted or settings.whatsapp_configured() or (settings.telegram_configured() and settings.telegram_webhook_mode):
        from channels.http import HttpServer

        return HttpServer(settings.http_host, settings.http_port)
    return None


def configured_channels(settings: Settings, http: "HttpServer | None" = None,
                        stores: Stores | None = None) -> list["Channel"]:
    """Every platform channel whose settings are present. Channels that take webhooks add their
    routes to ``http`` (see ``shared_http_server``); without it each brings its own server."""
    channels: list[Channel] = []
    if settings.telegram_configured():
        from channels.telegram import TelegramChannel

        # Raises ConfigError (naming the setting) when webhook mode lacks a valid secret.
        channels.append(TelegramChannel(settings, http=http))
    if settings.whatsapp_configured():
        from channels.whatsapp import WhatsAppChannel

        # Raises ConfigError (naming the settings) when webhooks could not be verified.
        channels.append(WhatsAppChannel(settings, http=http,
                                        links=stores.media_links() if stores is not None else None))
    return channels


async def serve(runtime: Runtime, stop: asyncio.Event) -> None:
    try:
        await runtime.start()
        await stop.wait()
    finally:
        await runtime.stop()
