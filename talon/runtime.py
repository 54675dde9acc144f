"""Assembles Talon from settings: stores, provider, agent, bridge and channels."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from talon.agent.loop import DEFAULT_SYSTEM_PROMPT, Agent
from talon.agent.openai_provider import OpenAIProvider, data_url
from talon.agent.provider import Provider
from talon.agent.session import SessionStore
from talon.attachments import AttachmentStore
from talon.bridge import Bridge
from talon.config import Settings
from talon.content import ImageBlock
from talon.errors import ConfigError
from talon.inbox import Inbox

if TYPE_CHECKING:
    from channels.base import Channel

log = logging.getLogger(__name__)


def build_provider(settings: Settings, store: AttachmentStore) -> Provider:
    settings.check_model()

    def hydrate(block: ImageBlock) -> str:
        return data_url(block.ref.mime, store.read_bytes(block.ref))

    vision = settings.model_vision != "false"
    if settings.provider_name == "openai":
        return OpenAIProvider(
            settings.model_name,
            api_key=settings.openai_api_key,
            base_url=settings.openai_base_url or None,
            hydrate=hydrate,
            vision=vision,
            timeout_s=settings.model_timeout_s,
            max_retries=settings.model_max_retries,
        )
    raise ConfigError(f"provider {settings.provider_name!r} is not available", ["TALON_MODEL"])


@dataclass
class Runtime:
    settings: Settings
    store: AttachmentStore
    sessions: SessionStore
    inbox: Inbox
    agent: Agent
    bridge: Bridge
    channels: list["Channel"] = field(default_factory=list)

    async def start(self) -> None:
        for channel in self.channels:
            self.bridge.add_channel(channel)
        # Pending messages from an earlier run go first, before new ones can arrive.
        self.bridge.recover()
        for channel in self.channels:
            await channel.start(self.bridge)

    async def stop(self) -> None:
        for channel in self.channels:
            try:
                await channel.stop()
            except Exception:
                log.exception("stopping channel %s failed", channel.name)
        await self.bridge.stop()
        await self.agent.provider.aclose()
        self.inbox.close()


def build_runtime(settings: Settings, channels: list["Channel"] | None = None) -> Runtime:
    settings.ensure_dirs()
    store = AttachmentStore(settings.data_dir / "attachments")
    sessions = SessionStore(settings.data_dir)
    provider = build_provider(settings, store)
    agent = Agent(
        provider,
        sessions,
        system_prompt=settings.system_prompt or DEFAULT_SYSTEM_PROMPT,
        max_steps=settings.max_steps,
    )
    inbox = Inbox(settings.data_dir / "inbox.sqlite3")
    bridge = Bridge(
        agent=agent,
        inbox=inbox,
        store=store,
        limits=settings.limits(),
        media_root=settings.media_root,
        model_label=settings.model,
    )
    return Runtime(settings, store, sessions, inbox, agent, bridge, list(channels or []))


def configured_channels(settings: Settings) -> list["Channel"]:
    """Every platform channel whose settings are present."""
    channels: list[Channel] = []
    if settings.telegram_configured():
        from channels.telegram import TelegramChannel

        channels.append(TelegramChannel(settings))
    return channels


async def serve(runtime: Runtime, stop: asyncio.Event) -> None:
    try:
        await runtime.start()
        await stop.wait()
    finally:
        await runtime.stop()
