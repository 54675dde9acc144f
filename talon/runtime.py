"""Assembles Talon from settings: stores, provider, agent, bridge and channels."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from talon.agent.context.pipeline import ContextPolicy
from talon.agent.providers.discovery import Discoverer
from talon.agent.providers.learned import LearnedFacts
from talon.agent.providers.local import LocalModelServer, local_model_server
from talon.agent.loop import DEFAULT_SYSTEM_PROMPT, Agent, ModelSlot
from talon.agent.providers.profiles import settings_profile, split_summary_model
from talon.agent.providers.base import Provider, data_url
from talon.agent.tools.sandbox import SandboxLimits
from talon.agent.tools.search import SearchConversationsTool
from talon.agent.tools.registry import ToolRegistry
from talon.agent.tools.find_tools import FindToolsTool, ToolBudget
from talon.agent.tools.skills import SHARED_SKILLS_MOUNT, LoadSkillTool, SkillCatalog, check_shared_dir
from talon.agent.tools.workspace import Workspace, WorkspacePolicy
from talon.agent.tools.workspace_tools import workspace_tools
from talon.bridge import Bridge, Normalizer
from talon.config import Settings
from talon.content import ContentBlock, ImageBlock, InboundFile
from talon.errors import ConfigError, ScheduleError
from talon.envelope import InboundMessage
from talon.jobs import Jobs
from talon.media import InboundContext, normalize_inbound
from talon.media.received import ReceivedNote, received_notes
from talon.scheduler import Scheduler, SchedulerSettings, scheduler_tools
from talon.speech.transcribe import Transcriber
from talon.speech.synthesize import Synthesizer
from talon.speech.voice_replies import SpeakTool, VoiceReplies
from talon.storage.attachments import AttachmentStore
from talon.storage.factory import Stores, open_stores
from talon.storage.inbox import InboxStore
from talon.storage.sessions import SessionStore, safe_path_part

if TYPE_CHECKING:
    from talon.ports import Channel
    from talon.agent.tools.mcp import McpManager
    from channels.http import HttpServer
    from talon.ui.app import Panel
    from talon.ui.webchat import WebChat
    from talon.ui.index import ChatIndexer

log = logging.getLogger(__name__)


def build_provider(settings: Settings, store: AttachmentStore, model: str | None = None, *,
                   local: LocalModelServer | None = None) -> Provider:
    """The provider for ``TALON_MODEL``, or for another model spec (the summary model).

    Its image and tool support come from the model profile (settings over the table; discovery
    updates them at start). The SDK of each provider is imported only when it is used. A
    ``local:`` model is an OpenAI-compatible one whose server is ``local`` (llama.cpp in Talon).
    """
    settings.check_model()

    async def hydrate(block: ImageBlock) -> str:
        return data_url(block.ref.mime, await store.read_bytes(block.ref))

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
    if provider_name in ("openai", "local"):
        from talon.agent.providers.openai import OpenAIProvider

        api_key, base_url = settings.openai_api_key, settings.openai_base_url or None
        if provider_name == "local":
            server = _local_server(settings, local)
            api_key, base_url, model_name = "", server.base_url, server.spec.alias
        return OpenAIProvider(
            model_name,
            api_key=api_key,
            base_url=base_url,
            hydrate=hydrate,
            vision=profile.vision,
            tools=profile.tools,
            reasoning=profile.reasoning,
            **timeouts,  # type: ignore[arg-type]
        )
    if provider_name == "anthropic":
        from talon.agent.providers.anthropic import AnthropicProvider

        if not settings.anthropic_api_key:
            raise ConfigError("the anthropic provider needs ANTHROPIC_API_KEY", ["ANTHROPIC_API_KEY"])
        from talon.agent.providers.anthropic import AnthropicProvider

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
    speech_idle: "asyncio.Task[None] | None" = None  # lets the speech models go when unused (TALON_SPEECH_IDLE)
    stores: Stores | None = None
    started: bool = False  # every channel started
    local: LocalModelServer | None = None  # TALON_MODEL=local:...: llama.cpp, started and stopped here
    mcp: "McpManager | None" = None  # the MCP servers' connections; None without any configured
    scheduler: Scheduler | None = None
    webchat: "WebChat | None" = None  # the web panel's chat channel (talon.ui.webchat), when the panel is on
    panel: "Panel | None" = None
    indexer: "ChatIndexer | None" = None  # the panel's chat index, written once a second

    async def start(self) -> None:
        if self.stores is not None:
            await self.stores.start()
        if self.local is not None:
            await self.local.start()  # before anything asks the model
        # Bounded by TALON_MODEL_DISCOVERY_TIMEOUT and never fatal, except for a setting that
        # cannot fit what the server reports (ConfigError: Talon refuses to start).
        await self.agent.discover(strict=True)
        if self.settings.speech_warmup and self.synthesizer is not None:
            # In the background: the channels start now, and the first voice note finds the
            # models loaded instead of paying for the load.
            self.warmup = asyncio.create_task(self.warm_speech(), name="speech-warmup")
        elif self.transcriber is not None and self.transcriber.available:
            # Without the warm-up: only the model's files, made once per installation (the
            # bundled base is joined from its two packages), so the first voice note pays for
            # loading the model and nothing more; no memory is kept.
            self.warmup = asyncio.create_task(self.prepare_speech_files(), name="speech-files")
        if self.settings.speech_idle_minutes > 0 and (self.transcriber is not None or self.synthesizer is not None):
            self.speech_idle = asyncio.create_task(self.unload_idle_speech(self.settings.speech_idle_minutes * 60),
                                                   name="speech-idle")
        if self.mcp is not None:
            await self.mcp.start()  # in the background: a server that fails does not stop Talon
        for channel in self.channels:
            self.bridge.add_channel(channel, started=False)
        # Pending messages from an earlier run go first, before new ones can arrive; each chat's
        # messages are handled once its channel has started.
        await self.bridge.recover()
        if self.stores is not None and self.stores.leases is not None:
            for channel in self.channels:  # Telegram in polling mode: one worker polls
                channel.share_updates(self.stores.leases)
        if self.http is not None:
            from talon.health import add_health_route
            from talon.metrics import add_metrics_route

            add_health_route(self)
            if self.settings.metrics:
                add_metrics_route(self)
            from talon.ui import add_ui_routes

            self.panel = add_ui_routes(self)
            # Listening before the channels start: a webhook that comes early gets 503 and is retried.
            await self.http.start()
        for channel in self.channels:
            await channel.start(self.bridge)
            self.bridge.channel_started(channel.name)
        if self.scheduler is not None:  # due runs go to channels that are running
            await self.scheduler.start()
        if self.indexer is not None:
            self.indexer.start()
        self.started = True

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

    async def prepare_speech_files(self) -> None:
        assert self.transcriber is not None
        try:
            await self.transcriber.prepare_files()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # shown again, with its reason, at the first voice note
            log.warning("preparing the transcription model's files failed: %s", exc)
        await asyncio.to_thread(give_memory_back)  # what the worker thread touched

    async def unload_idle_speech(self, idle_s: float) -> None:
        """Every so often, let go of Whisper and the voice when unused for ``idle_s``, and give
        their memory back to the system; the next voice note loads them again."""
        while True:
            await asyncio.sleep(min(60.0, max(0.5, idle_s / 4)))
            let_go = [name for name, part in (("Whisper", self.transcriber), ("the voice", self.synthesizer))
                      if part is not None and part.unload_if_idle(idle_s)]
            if let_go:
                await asyncio.to_thread(give_memory_back)
                log.info("%s unloaded after %g minutes unused", " and ".join(let_go), idle_s / 60)

    async def stop(self) -> None:
        if self.warmup is not None and not self.warmup.done():
            self.warmup.cancel()
        if self.speech_idle is not None:
            self.speech_idle.cancel()
            await asyncio.gather(self.speech_idle, return_exceptions=True)
        if self.scheduler is not None:
            await self.scheduler.stop()
        # Turns in flight first: they stop cleanly (pending in the inbox) instead of failing
        # against channels that are shutting down. What still arrives is stored, not started.
        await self.bridge.stop()
        if self.mcp is not None:
            await self.mcp.close()  # every server process ends with Talon
        if self.bridge.control is not None:
            await self.bridge.control.settled()  # usage of the calls made is in the store
        if self.indexer is not None:
            try:
                await self.indexer.stop()
            except Exception:
                log.exception("writing the chat index failed")
        for channel in self.channels:
            try:
                await channel.drain()
            except Exception:
                log.exception("draining channel %s failed", channel.name)
        if self.panel is not None:
            self.panel.close()  # its live streams end now, not at the server's shutdown timeout
        if self.http is not None:
            await self.http.stop()  # no new webhooks; those in flight finish first
        for channel in self.channels:
            try:
                await channel.stop()
            except Exception:
                log.exception("stopping channel %s failed", channel.name)
        await self.agent.aclose()
        for tool in list(self.agent.tools.tools.values()):
            closer = getattr(tool, "aclose", None)
            if closer is not None:  # e.g. web_fetch's converter processes
                await closer()
        if self.transcriber is not None:
            await self.transcriber.aclose()
        if self.synthesizer is not None:
            await self.synthesizer.aclose()
        if self.stores is not None:
            await self.stores.aclose()
        else:
            await self.inbox.close()
            await self.bridge.gate.close()
        if self.local is not None:
            await self.local.stop()


def give_memory_back() -> None:
    """Collect what was let go and return the freed heap to the system (glibc's ``malloc_trim``;
    elsewhere the collection alone). Blocking: run it in a thread."""
    import gc

    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def build_runtime(settings: Settings, channels: list["Channel"] | None = None, *,
                  http: "HttpServer | None" = None, stores: Stores | None = None) -> Runtime:
    # Embedded (SQLite, JSONL, files) or PostgreSQL, after TALON_DATABASE_URL; the same interfaces.
    stores = stores or open_stores(settings)
    store = stores.attachments
    sessions = stores.sessions
    local = local_model_server(settings)  # not started yet: Runtime.start does that
    provider = build_provider(settings, store, local=local)
    workspace = Workspace(settings.media_root, WorkspacePolicy(settings.workspace_max, settings.protected_globs))
    summary_provider = (
        build_provider(settings, store, settings.summary_model, local=local)
        if settings.summary_model and settings.summary_model != settings.model else None
    )
    tools = workspace_tools(workspace, store=store, limits=settings.limits(), shell=settings.shell_tool,
                            shell_unsandboxed=settings.shell_unsandboxed,
                            sandbox_limits=SandboxLimits(settings.shell_max_procs, settings.shell_max_memory,
                                                         settings.shell_cpu_seconds, settings.shell_max_file_size))
    tools.timeout_s = settings.tool_timeout_s
    mcp = outside_tools(settings, tools, store)
    voice = voice_replies(settings)
    if voice is not None:
        tools.add(SpeakTool(voice.synthesizer))
    scheduler = build_scheduler(settings, stores)
    for tool in scheduler_tools(scheduler):
        tools.add(tool)
    if settings.search_index:
        tools.add(SearchConversationsTool(sessions))  # this chat's own history (talon.storage.search)
    skills = skill_catalog(settings)
    tools.add(LoadSkillTool(skills, shell_path=shared_skills_in_shell(tools, skills)))
    settings.check_fallbacks()
    fallbacks = [ModelSlot(spec, build_provider(settings, store, spec), settings_profile(settings, spec))
                 for spec in settings.fallback_models]
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
        discoverer=model_discoverer(settings, local) if settings.model_discovery else None,
        learned=LearnedFacts(settings.data_dir / "model_facts.json", learned_key(settings)),
        workspaces=(lambda chat: settings.workspace_dir(chat.channel, chat.chat_id))
        if settings.workspace == "chat" else None,
        skills=skills,
        fallbacks=fallbacks,
        fallback_cooldown_s=settings.model_fallback_cooldown_s,
        model_label=settings.model,
        tool_budget=ToolBudget(settings.tools_budget),
    )
    assert agent.tool_budget is not None
    tools.add(FindToolsTool(tools.specs, agent.tool_budget, lambda chat: agent.sent_tools.get(chat, frozenset())))
    jobs: Jobs | None = None
    if settings.subagents_enabled:
        from talon.agent.tools.delegate import DelegateTool, SubAgentLimits

        child_model = (build_provider(settings, store, settings.subagent_model, local=local)
                       if settings.subagent_model and settings.subagent_model != settings.model else None)
        delegate = DelegateTool(agent, SubAgentLimits(settings.subagent_depth, settings.subagents,
                                                      settings.subagent_timeout_s), provider=child_model)
        tools.add(delegate)
        # Background delegation (talon.jobs): durable jobs through the inbox, /jobs in the chat.
        from talon.jobs import CancelJobTool, JobStatusTool

        jobs = Jobs(stores.jobs, max_per_chat=settings.subagents)
        jobs.delegate, delegate.jobs = delegate, jobs
        tools.add(JobStatusTool(jobs))
        tools.add(CancelJobTool(jobs))
    inbox = stores.inbox
    transcriber = Transcriber.from_settings(settings)
    from talon.control import Control

    control = Control.from_settings(settings, stores.usage, stores.approvals)
    control.metrics.tool_names = control.approvals.tool_names = lambda: tools.tools
    # mcp:<server> in TALON_APPROVAL is matched by the server a tool belongs to (McpTool.server).
    control.approvals.server_of = lambda name: getattr(tools.tools.get(name), "server", None)
    bridge_kw = dict(
        agent=agent,
        inbox=inbox,
        store=store,
        limits=settings.limits(),
        media_root=settings.media_root,
        gate=stores.gate,
        normalize=inbound_normalizer(settings, store, transcriber, voice, lambda: agent.provider.vision,
                                     shown=lambda message, notes: _show_received(bridge, message, notes)),
        model_label=settings.model + (f" ({local.describe()})" if local is not None else ""),
        turn_timeout_s=settings.turn_timeout_s,
        ack_delay_s=settings.ack_delay_s,
        voice=voice,
        busy_mode=settings.busy_mode,
        approvers=settings.approver_ids(),
        scheduler=scheduler,
        control=control,
        jobs=jobs,
        metrics=control.metrics,
    )
    if stores.shared:
        from talon.scaleout import SharedBridge

        bridge: Bridge = SharedBridge(**bridge_kw, leases=stores.leases,  # type: ignore[arg-type]
                                      worker_id=stores.worker_id)
    else:
        bridge = Bridge(**bridge_kw)  # type: ignore[arg-type]
    scheduler.attach(bridge)
    if jobs is not None:
        jobs.attach(bridge)
    channels = list(channels or [])
    webchat = None
    indexer = None
    if stores.panel is not None:
        from talon.ui.index import ChatIndexer

        indexer = ChatIndexer(stores.panel)
        bridge.observers.append(indexer.observe)
        bridge.answer_observers.append(indexer.observe_answer)
        from talon.ui import ui_enabled

        if http is not None and ui_enabled(settings, http_runs=True):
            from talon.ui.webchat import WebChat

            webchat = WebChat(settings, store, sessions)
            channels.append(webchat)
    return Runtime(settings, store, sessions, inbox, agent, bridge, channels, transcriber, http,
                   stores=stores, synthesizer=voice.synthesizer if voice is not None else None, local=local,
                   mcp=mcp, scheduler=scheduler, webchat=webchat, indexer=indexer)


def skill_catalog(settings: Settings) -> SkillCatalog:
    """The shared skills (``TALON_SKILLS_DIR``, outside the media root) and every chat's own."""
    if settings.skills_dir is not None:
        check_shared_dir(settings.skills_dir, settings.media_root)
    return SkillCatalog(settings.skills_dir, budget_tokens=settings.skills_budget)


def shared_skills_in_shell(tools: ToolRegistry, skills: SkillCatalog) -> str | None:
    """Where the shell sees the shared skills: read-only at /skills in its sandbox (their own path
    when it runs unsandboxed); None without a shell or shared skills."""
    from talon.agent.tools.workspace_tools import ShellTool

    shell = tools.tools.get("shell")
    if not isinstance(shell, ShellTool) or skills.shared_root is None:
        return None
    if not shell.sandboxed:
        return str(skills.shared_root)
    if not skills.shared_root.is_dir():
        return None  # bwrap cannot mount what is not there; the scan says so too
    shell.read_only_binds = ((str(skills.shared_root), SHARED_SKILLS_MOUNT),)
    return SHARED_SKILLS_MOUNT


def outside_tools(settings: Settings, tools: ToolRegistry, store: AttachmentStore) -> "McpManager | None":
    """Add ``web_fetch`` (unless TALON_WEB_FETCH=false) and the MCP servers' tools to ``tools``;
    the MCP manager, when any server is configured (ConfigError for an invalid MCP config)."""
    if settings.web_fetch:
        from talon.agent.tools.html_worker import ConvertLimits
        from talon.agent.tools.web_fetch import WebFetchTool

        tools.add(WebFetchTool(store=store, limits=settings.limits(), allow_hosts=settings.web_allowlist,
                               max_bytes=settings.web_max_bytes, timeout_s=settings.web_timeout_s,
                               convert=ConvertLimits(settings.web_convert_seconds, settings.web_convert_memory)))
    servers = settings.mcp_servers()
    if not servers:
        return None
    from talon.agent.tools.mcp import McpManager

    return McpManager(servers, tools, store=store, limits=settings.limits(), call_timeout_s=settings.mcp_timeout_s,
                      start_timeout_s=settings.mcp_start_timeout_s, idle_timeout_s=settings.mcp_idle_timeout_s,
                      per_chat_max=settings.mcp_per_chat_max, max_result=settings.mcp_max_result,
                      sandbox_limits=SandboxLimits(settings.shell_max_procs, settings.shell_max_memory,
                                                   settings.shell_cpu_seconds, settings.shell_max_file_size))


def build_scheduler(settings: Settings, stores: Stores) -> Scheduler:
    """Scheduled tasks on the stores' task store; ConfigError for a TALON_TIMEZONE that is no zone."""
    config = SchedulerSettings(misfire_grace_s=settings.task_misfire_grace_s, tasks_per_chat=settings.tasks_per_chat,
                               min_interval_s=settings.task_min_interval_s, timezone=settings.timezone,
                               poll_s=settings.task_poll_s)
    try:
        return Scheduler(stores.tasks, stores.gate, config)
    except ScheduleError as exc:
        raise ConfigError(f"TALON_TIMEZONE: {exc}", ["TALON_TIMEZONE"]) from None


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


def _local_server(settings: Settings, local: LocalModelServer | None) -> LocalModelServer:
    if local is None:  # a caller that forgot it: better an error than a request to another server
        raise ConfigError(f"TALON_MODEL={settings.model}: the local model server was not set up", [])
    return local


def learned_key(settings: Settings) -> str:
    """Which model on which server: what the server revealed is true of that pair."""
    if settings.provider_name == "local":
        # The file and its window are the model; the server's port changes every run.
        return f"{settings.model} @ local, context {settings.local_context}"
    base = settings.anthropic_base_url if settings.provider_name == "anthropic" else settings.openai_base_url
    return f"{settings.model} @ {base.rstrip('/') or 'default'}"


def model_discoverer(settings: Settings, local: LocalModelServer | None = None) -> Discoverer:
    """Discovery for ``TALON_MODEL``: its server's own facts, turned into a profile under the settings.
    A ``local:`` model is discovered like any llama.cpp server, at the address of ``local``."""
    provider = settings.provider_name
    base_url = (settings.anthropic_base_url if provider == "anthropic" else settings.openai_base_url) or None
    api_key = settings.anthropic_api_key if provider == "anthropic" else settings.openai_api_key
    model = settings.model_name
    if provider == "local":  # never the default OpenAI URL: the server is Talon's own
        server = _local_server(settings, local)
        provider, base_url, api_key, model = "openai", server.base_url, "", server.spec.alias
    return Discoverer(
        provider,
        base_url=base_url,
        api_key=api_key,
        model=model,
        timeout_s=settings.model_discovery_timeout_s,
        resolve=lambda facts: settings_profile(settings, facts=facts),
    )


def inbound_normalizer(settings: Settings, store: AttachmentStore, transcriber: Transcriber,
                       voice: VoiceReplies | None = None,
                       vision: Callable[[], bool] = lambda: True,
                       shown: Callable[[InboundMessage, list[ReceivedNote]], None] | None = None) -> Normalizer:
    """``vision`` says, per message, whether images go to the model as images or as a notice
    with their saved path (it changes when discovery or a refusal shows the model takes none).
    ``shown`` is told what the model got of the message's files (the console shows it)."""
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
            on_prepared=(lambda prepared, seen: shown(message, received_notes(prepared, vision=seen)))
            if shown is not None else None,
        )
        return await normalize_inbound(text, files, ctx)

    return normalize


def _show_received(bridge: Bridge, message: InboundMessage, notes: list[ReceivedNote]) -> None:
    channel = bridge.channels.get(message.channel)
    if channel is not None and notes:
        channel.show_received(message, notes)


def shared_http_server(settings: Settings) -> "HttpServer | None":
    """Talon's one HTTP server, when a configured channel takes webhooks (WhatsApp, or Telegram
    in webhook mode); the runtime starts it. None when nothing needs to listen."""
    # With Telegram long polling alone nothing needs to listen; naming TALON_HTTP_PORT asks for
    # the server anyway, for /metrics and /healthz.
    wanted = (settings.metrics and "http_port" in settings.model_fields_set) or settings.ui is True
    slack_events = settings.slack_configured() and not settings.slack_socket_mode
    if wanted or settings.whatsapp_configured() or slack_events or (
            settings.telegram_configured() and settings.telegram_webhook_mode):
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
                                        links=stores.links if stores is not None else None,
                                        state=stores.whatsapp if stores is not None else None,
                                        worker_id=stores.worker_id if stores is not None else ""))
    if settings.matrix_configured():
        from channels.matrix import MatrixChannel

        channels.append(MatrixChannel(settings))
    if settings.slack_configured():
        from channels.slack import SlackChannel

        channels.append(SlackChannel(settings, http=http))
    if settings.discord_configured():
        from channels.discord import DiscordChannel

        channels.append(DiscordChannel(settings))
    return channels


async def serve(runtime: Runtime, stop: asyncio.Event) -> None:
    """Start, run until ``stop`` is set, stop. A stop during start-up (a channel waiting for its
    platform, discovery waiting for the model server) cancels the start at once: what arrived is
    in the inbox, and the next start takes it up."""
    try:
        await until_stopped(stop, runtime.start())
        if stop.is_set() and not runtime.started:
            log.info("stop requested during start-up; stopping")
        await stop.wait()
    finally:
        await runtime.stop()


_T = TypeVar("_T")


async def until_stopped(stop: asyncio.Event, work: Awaitable[_T]) -> _T | None:
    """What ``work`` gives, or None as soon as ``stop`` is set: a coroutine is cancelled then
    (its cleanup runs to its end)."""
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        waiter.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)  # a coroutine's cleanup runs to its end
    return None
