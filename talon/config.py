"""Settings, read from the environment and a ``.env`` file (pydantic-settings).

Platform names (``TELEGRAM_*``, ``OPENAI_*``, ``TWILIO_*``...) are fixed; everything of Talon's
own is prefixed ``TALON_``. Every limit lives in one ``Limits`` value object that is passed down
to the stages that need it; nothing reads limits from module globals.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from talon.errors import ConfigError

if TYPE_CHECKING:
    from talon.agent.tools.mcp_config import McpServerConfig

MB = 1_000_000

# An environment variable only (a .env cannot name another .env): the .env file to read. Without
# it, ./.env, then .env in the user's config directory (talon.settings_source has the rule).
ENV_FILE_SETTING = "TALON_ENV_FILE"

# Telegram's rule for setWebhook's secret_token (sent back as X-Telegram-Bot-Api-Secret-Token).
_WEBHOOK_SECRET = re.compile(r"[A-Za-z0-9_-]{1,256}")


def _env(name: str) -> AliasChoices:
    return AliasChoices(name, name.lower())


@dataclass(frozen=True)
class Limits:
    """Every bound Talon applies, with its default. Built from ``Settings.limits()``.

    The platforms' own message sizes (Telegram text and caption, the WhatsApp body, Telegram's
    10 MB photo and WhatsApp's media sizes) are protocol facts, not preferences: they are fixed here.
    The upload cap is a setting because a self-hosted Bot API server accepts files up to 2 GB.
    """

    image_max_bytes: int = 5 * MB
    image_max_side: int = 2000
    image_max_pixels: int = 40_000_000
    document_max_chars: int = 100_000
    download_max_bytes: int = 20 * MB
    audio_max_bytes: int = 25 * MB
    audio_max_seconds: float = 15 * 60
    video_fps: float = 0.5
    video_max_frames: int = 16
    video_frame_max_side: int = 1280
    video_max_frame_bytes: int = 4 * MB
    video_decode_seconds: float = 60.0
    telegram_text_max: int = 4096
    telegram_caption_max: int = 1024
    telegram_photo_max_bytes: int = 10 * MB
    telegram_upload_max_bytes: int = 50 * MB
    telegram_group_messages_per_minute: int = 20
    whatsapp_body_max: int = 1600
    whatsapp_media_max_bytes: int = 16 * MB
    whatsapp_image_max_bytes: int = 5 * MB
    whatsapp_document_max_bytes: int = 100 * MB  # WhatsApp: documents up to 100 MB, other media 16 MB
    # A reply longer than this many messages goes as its head plus the whole text as reply.md.
    telegram_reply_max_messages: int = 8
    whatsapp_reply_max_messages: int = 5


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_file=".env", env_file_encoding="utf-8", extra="ignore", populate_by_name=True
    )

    # --- model -------------------------------------------------------------------------------
    model: str = Field(default="", validation_alias=_env("TALON_MODEL"))
    openai_api_key: str = Field(default="", validation_alias=_env("OPENAI_API_KEY"))
    openai_base_url: str = Field(default="", validation_alias=_env("OPENAI_BASE_URL"))
    anthropic_api_key: str = Field(default="", validation_alias=_env("ANTHROPIC_API_KEY"))
    anthropic_base_url: str = Field(default="", validation_alias=_env("ANTHROPIC_BASE_URL"))
    # Longest silence from the model server: between streamed chunks, or while it reads the
    # prompt before the first one. The whole call is capped by TALON_MODEL_TOTAL_TIMEOUT.
    model_timeout_s: float = Field(default=120.0, gt=0, validation_alias=_env("TALON_MODEL_TIMEOUT"))
    model_total_timeout_s: float = Field(default=600.0, gt=0, validation_alias=_env("TALON_MODEL_TOTAL_TIMEOUT"))
    model_max_retries: int = Field(default=2, ge=0, validation_alias=_env("TALON_MODEL_MAX_RETRIES"))
    model_stream: bool = Field(default=True, validation_alias=_env("TALON_MODEL_STREAM"))
    # Ask the server what it serves (window, images, tools) at start, on /status and in doctor.
    model_discovery: bool = Field(default=True, validation_alias=_env("TALON_MODEL_DISCOVERY"))
    model_discovery_timeout_s: float = Field(default=2.5, gt=0, le=30,
                                             validation_alias=_env("TALON_MODEL_DISCOVERY_TIMEOUT"))
    model_vision: Literal["auto", "true", "false"] = Field(
        default="auto", validation_alias=_env("TALON_MODEL_VISION")
    )
    model_tools: Literal["auto", "true", "false"] = Field(
        default="auto", validation_alias=_env("TALON_MODEL_TOOLS")
    )
    model_context_window: int | None = Field(default=None, validation_alias=_env("TALON_MODEL_CONTEXT_WINDOW"))
    model_max_output: int | None = Field(default=None, validation_alias=_env("TALON_MODEL_MAX_OUTPUT"))
    # TALON_MODEL=local:PATH.gguf (talon.agent.providers.local): the window in tokens (0: the model's
    # own), compute threads (0: llama.cpp's choice) and how long loading may take.
    local_context: int = Field(default=8192, ge=0, validation_alias=_env("TALON_LOCAL_CONTEXT"))
    local_threads: int = Field(default=0, ge=0, validation_alias=_env("TALON_LOCAL_THREADS"))
    local_start_timeout_s: float = Field(default=300.0, gt=0, validation_alias=_env("TALON_LOCAL_START_TIMEOUT"))
    summary_model: str = Field(default="", validation_alias=_env("TALON_SUMMARY_MODEL"))
    # Models tried in order when the one in use is down, times out, rate-limits or fails with a
    # server error after its retries (comma-separated, each in TALON_MODEL's form); a failed
    # model rests this many seconds before it is tried first again.
    model_fallbacks: str = Field(default="", validation_alias=_env("TALON_MODEL_FALLBACKS"))
    model_fallback_cooldown_s: float = Field(default=300.0, ge=0, validation_alias=_env("TALON_MODEL_FALLBACK_COOLDOWN"))
    turn_timeout_s: float = Field(default=900.0, gt=0, validation_alias=_env("TALON_TURN_TIMEOUT"))
    # The signs that a turn is under way (the acknowledgement reaction, the typing indicator, the
    # first live draft) wait this long: an answer ready sooner arrives without them.
    ack_delay_s: float = Field(default=1.0, ge=0, le=30, validation_alias=_env("TALON_ACK_DELAY"))
    max_steps: int = Field(default=12, validation_alias=_env("TALON_MAX_STEPS"))
    system_prompt: str = Field(default="", validation_alias=_env("TALON_SYSTEM_PROMPT"))
    # A message that arrives while its chat's turn runs: steer (joins the turn at its next model
    # step), queue (waits its turn) or interrupt (stops the turn and is answered instead).
    busy_mode: Literal["steer", "queue", "interrupt"] = Field(default="steer", validation_alias=_env("TALON_BUSY_MODE"))
    # People who may stop (and approve) anything in any chat: sender ids ("111", or "telegram:111",
    # "whatsapp:+1555...") or @usernames, comma-separated.
    approvers: str = Field(default="", validation_alias=_env("TALON_APPROVERS"))
    shell_tool: bool = Field(default=False, validation_alias=_env("TALON_SHELL_TOOL"))
    # Run the shell without bubblewrap when no sandbox can start (it then sees what Talon's user sees).
    shell_unsandboxed: bool = Field(default=False, validation_alias=_env("TALON_SHELL_UNSANDBOXED"))
    # Limits of each sandboxed shell command (talon.agent.tools.sandbox.SandboxLimits has the defaults).
    shell_max_procs: int = Field(default=256, ge=8, validation_alias=_env("TALON_SHELL_MAX_PROCS"))
    shell_max_memory: int = Field(default=4_000_000_000, ge=64 * MB, validation_alias=_env("TALON_SHELL_MAX_MEMORY"))
    shell_cpu_seconds: int = Field(default=300, ge=1, validation_alias=_env("TALON_SHELL_CPU_SECONDS"))
    shell_max_file_size: int = Field(default=1_000_000_000, ge=MB, validation_alias=_env("TALON_SHELL_MAX_FILE_SIZE"))
    # Disk space one workspace may use (talon.agent.tools.workspace): writes of the file tools past it
    # are refused, and the shell's commands are bounded by it; 0 = no limit.
    workspace_max: int = Field(default=1_000_000_000, ge=0, validation_alias=_env("TALON_WORKSPACE_MAX"))
    # Paths of a workspace the agent's file tools never write (comma-separated globs; a name
    # without "/" matches at any depth): .git by default, so a planted .git/config cannot make
    # git run a command.
    protected_paths: str = Field(default=".git", validation_alias=_env("TALON_PROTECTED_PATHS"))
    # Wall-clock limit of one tool call (the shell has its own timeout, up to 600 s, on top).
    tool_timeout_s: float = Field(default=60.0, gt=0, validation_alias=_env("TALON_TOOL_TIMEOUT"))

    # --- sub-agents (talon.agent.tools.delegate, docs/agent.md) -----------------------------------
    # The delegate tool: a child agent with a fresh context. Its model (empty: the one in use),
    # how deep delegation may go, children at once per chat, and one child's time limit.
    subagents_enabled: bool = Field(default=True, validation_alias=_env("TALON_SUBAGENT"))
    subagent_model: str = Field(default="", validation_alias=_env("TALON_SUBAGENT_MODEL"))
    subagent_depth: int = Field(default=1, ge=1, le=3, validation_alias=_env("TALON_SUBAGENT_DEPTH"))
    subagents: int = Field(default=3, ge=1, le=10, validation_alias=_env("TALON_SUBAGENTS"))
    subagent_timeout_s: float = Field(default=600.0, gt=0, validation_alias=_env("TALON_SUBAGENT_TIMEOUT"))

    # --- a lean prompt (talon.agent.tools.find_tools) ------------------------------------------------
    # Share of the model's window the tool definitions may take; past it only the most used are
    # sent, and find_tools finds the others.
    tools_budget: float = Field(default=0.15, gt=0, le=1, validation_alias=_env("TALON_TOOLS_BUDGET"))

    # --- skills (talon.agent.tools.skills, docs/skills.md) ---------------------------------------
    # Skill folders shared by every chat, read-only for the agent (outside the media root); each
    # chat's own live in its workspace under skills/.
    skills_dir: Path | None = Field(default=None, validation_alias=_env("TALON_SKILLS_DIR"))
    # Tokens the system prompt's list of skills (one line each) may take; the rest are named as left out.
    skills_budget: int = Field(default=2_000, ge=100, validation_alias=_env("TALON_SKILLS_BUDGET"))

    # --- MCP servers and web fetch (talon.agent.tools.mcp, talon.agent.tools.web_fetch) ---------------------
    # The mcpServers JSON file; unset: mcp.json in the working directory (beside .env), if any.
    mcp_config: Path | None = Field(default=None, validation_alias=_env("TALON_MCP_CONFIG"))
    mcp_timeout_s: float = Field(default=60.0, gt=0, validation_alias=_env("TALON_MCP_TIMEOUT"))
    mcp_start_timeout_s: float = Field(default=30.0, gt=0, validation_alias=_env("TALON_MCP_START_TIMEOUT"))
    # A per-chat server (one using ${WORKSPACE}) is stopped after this long without a call.
    mcp_idle_timeout_s: float = Field(default=600.0, gt=0, validation_alias=_env("TALON_MCP_IDLE_TIMEOUT"))
    # Per-chat server processes running at once (all servers, all chats); the least recently used
    # idle one is stopped to start another.
    mcp_per_chat_max: int = Field(default=8, ge=1, validation_alias=_env("TALON_MCP_PER_CHAT_MAX"))
    # Bytes of one message (one line) from a stdio server; past it the call fails and the server restarts.
    mcp_max_result: int = Field(default=4 * MB, ge=64 * 1024, validation_alias=_env("TALON_MCP_MAX_RESULT"))
    web_fetch: bool = Field(default=True, validation_alias=_env("TALON_WEB_FETCH"))
    # The full-text index of stored messages (search_conversations, /search; talon.storage.search).
    # Off: no index is written, and search says it is off (the logs are kept as always).
    search_index: bool = Field(default=True, validation_alias=_env("TALON_SEARCH_INDEX"))
    # Hosts web_fetch may reach although they are on a private network (exact names or addresses).
    web_allow_hosts: str = Field(default="", validation_alias=_env("TALON_WEB_ALLOW_HOSTS"))
    web_max_bytes: int = Field(default=5 * MB, gt=0, validation_alias=_env("TALON_WEB_MAX_BYTES"))
    web_timeout_s: float = Field(default=30.0, gt=0, validation_alias=_env("TALON_WEB_TIMEOUT"))
    # Turning a fetched HTML page into text runs in a worker process with these limits
    # (talon.agent.tools.html_worker): wall clock and CPU seconds per page, and the worker's memory.
    web_convert_seconds: float = Field(default=10.0, gt=0, le=300,
                                       validation_alias=_env("TALON_WEB_CONVERT_SECONDS"))
    web_convert_memory: int = Field(default=512 * MB, ge=128 * MB, validation_alias=_env("TALON_WEB_CONVERT_MEMORY"))

    # --- context management (shares of the model's window) ------------------------------------
    context_trigger: float = Field(default=0.85, gt=0.1, le=0.98,
                                   validation_alias=_env("TALON_CONTEXT_TRIGGER"))
    context_keep_tail: float = Field(default=0.10, gt=0.0, le=0.5,
                                     validation_alias=_env("TALON_CONTEXT_KEEP_TAIL"))
    context_image_turns: int = Field(default=3, ge=0, validation_alias=_env("TALON_CONTEXT_IMAGE_TURNS"))

    # --- storage -----------------------------------------------------------------------------
    media_root: Path = Field(default=Path("./media_root"), validate_default=True,
                             validation_alias=_env("TALON_MEDIA_ROOT"))
    data_dir: Path = Field(default=Path("./.talon"), validation_alias=_env("TALON_DATA_DIR"))

    @field_validator("ui", mode="before")
    @classmethod
    def _auto_ui(cls, value: object) -> object:
        """TALON_UI= (empty) or auto: decided by the rule in ``talon.ui.security.ui_enabled``."""
        return None if isinstance(value, str) and value.strip().lower() in ("", "auto") else value

    @field_validator("media_root")
    @classmethod
    def _absolute_media_root(cls, value: Path) -> Path:
        """The media root made absolute once, when the settings are read (at start): every part
        (the agent's tools, outbound checks, WhatsApp's media links) then joins paths to the same
        absolute root, never a relative one to a path already under it."""
        return Path(os.path.abspath(value.expanduser()))
    # chat: one workspace per conversation under the media root; shared: the media root for all.
    workspace: Literal["chat", "shared"] = Field(default="chat", validation_alias=_env("TALON_WORKSPACE"))
    # Many workers (talon.scaleout): unset keeps the embedded stores in TALON_DATA_DIR.
    database_url: str = Field(default="", validation_alias=_env("TALON_DATABASE_URL"))
    database_pool_size: int = Field(default=10, ge=1, validation_alias=_env("TALON_DATABASE_POOL_SIZE"))
    lease_s: float = Field(default=30.0, gt=0, validation_alias=_env("TALON_LEASE_SECONDS"))
    worker_id: str = Field(default="", validation_alias=_env("TALON_WORKER_ID"))

    # --- telegram ----------------------------------------------------------------------------
    telegram_bot_token: str = Field(default="", validation_alias=_env("TELEGRAM_BOT_TOKEN"))
    telegram_api_base_url: str = Field(
        default="https://api.telegram.org", validation_alias=_env("TELEGRAM_API_BASE_URL")
    )
    telegram_allowed_users: str = Field(default="", validation_alias=_env("TALON_TELEGRAM_ALLOWED_USERS"))
    telegram_poll_timeout_s: int = Field(default=30, validation_alias=_env("TALON_TELEGRAM_POLL_TIMEOUT"))
    # Groups (see channels/telegram/groups.py): which are served, when a message is a turn, and
    # how many unaddressed messages travel with the next turn as context.
    telegram_allowed_chats: str = Field(default="", validation_alias=_env("TALON_TELEGRAM_ALLOWED_CHATS"))
    telegram_group_trigger: Literal["mention", "all"] = Field(
        default="mention", validation_alias=_env("TALON_TELEGRAM_GROUP_TRIGGER")
    )
    telegram_group_context: int = Field(default=20, ge=0, le=200, validation_alias=_env("TALON_TELEGRAM_GROUP_CONTEXT"))
    # Live replies (channels/telegram/streaming.py): draft (private chats; groups are edited),
    # edit (a message edited in place everywhere) or off; at most one update per interval.
    telegram_streaming: Literal["draft", "edit", "off"] = Field(
        default="draft", validation_alias=_env("TALON_TELEGRAM_STREAMING")
    )
    telegram_stream_interval_s: float = Field(default=1.0, ge=0.2, le=60,
                                              validation_alias=_env("TALON_TELEGRAM_STREAM_INTERVAL"))
    # The reaction set on a message when its turn starts, cleared when answered; empty: none.
    telegram_ack_reaction: str = Field(default="\N{EYES}", validation_alias=_env("TALON_TELEGRAM_ACK_REACTION"))
    # Webhook mode: empty URL means long polling (the default).
    telegram_webhook_url: str = Field(default="", validation_alias=_env("TALON_TELEGRAM_WEBHOOK_URL"))
    telegram_webhook_secret: str = Field(default="", validation_alias=_env("TALON_TELEGRAM_WEBHOOK_SECRET"))
    telegram_webhook_path: str = Field(
        default="/telegram/webhook", validation_alias=_env("TALON_TELEGRAM_WEBHOOK_PATH")
    )

    # --- matrix (channels/matrix) --------------------------------------------------------------
    # The homeserver's client-API address (also where tests and self-hosted servers point it).
    matrix_homeserver: str = Field(default="", validation_alias=_env("MATRIX_HOMESERVER"))
    matrix_user_id: str = Field(default="", validation_alias=_env("MATRIX_USER_ID"))
    # One of the two: a token (preferred), or the password Talon logs in with at each start.
    matrix_access_token: str = Field(default="", validation_alias=_env("MATRIX_ACCESS_TOKEN"))
    matrix_password: str = Field(default="", validation_alias=_env("MATRIX_PASSWORD"))
    # People allowed in direct messages (@user:server), and rooms served (!room:server).
    matrix_allowed_users: str = Field(default="", validation_alias=_env("TALON_MATRIX_ALLOWED_USERS"))
    matrix_allowed_rooms: str = Field(default="", validation_alias=_env("TALON_MATRIX_ALLOWED_ROOMS"))
    matrix_room_context: int = Field(default=20, ge=0, le=200, validation_alias=_env("TALON_MATRIX_ROOM_CONTEXT"))
    # Live replies: the answer's message edited in place (m.replace) as it is written; at most one
    # edit per interval.
    matrix_streaming: bool = Field(default=True, validation_alias=_env("TALON_MATRIX_STREAMING"))
    matrix_stream_interval_s: float = Field(default=1.5, ge=0.2, le=60,
                                            validation_alias=_env("TALON_MATRIX_STREAM_INTERVAL"))
    matrix_ack_reaction: str = Field(default="\N{EYES}", validation_alias=_env("TALON_MATRIX_ACK_REACTION"))
    # End-to-end encrypted rooms (channels/matrix/crypto.py): "tofu" serves them, trusting each
    # device of a served room's members the first time it is seen (its keys then pinned); "off"
    # leaves them unserved (logged) and keeps no device keys.
    matrix_e2ee: Literal["tofu", "off"] = Field(default="tofu", validation_alias=_env("TALON_MATRIX_E2EE"))
    # Seconds a homeserver request may take before it is given up (a sync waits 30 s more).
    matrix_timeout_s: float = Field(default=30.0, gt=0, le=600, validation_alias=_env("TALON_MATRIX_TIMEOUT"))

    # --- slack (channels/slack) ----------------------------------------------------------------
    slack_bot_token: str = Field(default="", validation_alias=_env("SLACK_BOT_TOKEN"))  # xoxb-...
    # Events API over HTTP: requests are checked against this secret (and a 5-minute window).
    slack_signing_secret: str = Field(default="", validation_alias=_env("SLACK_SIGNING_SECRET"))
    # Socket Mode (no public URL needed): an app-level token (xapp-...) with connections:write.
    slack_app_token: str = Field(default="", validation_alias=_env("SLACK_APP_TOKEN"))
    # Slack's Web API address (tests and proxies point it elsewhere). Files are fetched only from
    # this host or its "files." neighbour (files.slack.com for slack.com).
    slack_api_base_url: str = Field(default="https://slack.com/api/", validation_alias=_env("SLACK_API_BASE_URL"))
    slack_events_path: str = Field(default="/slack/events", validation_alias=_env("TALON_SLACK_EVENTS_PATH"))
    # Member ids (U...) allowed in direct messages; channel ids (C.../G...) served.
    slack_allowed_users: str = Field(default="", validation_alias=_env("TALON_SLACK_ALLOWED_USERS"))
    slack_allowed_channels: str = Field(default="", validation_alias=_env("TALON_SLACK_ALLOWED_CHANNELS"))
    slack_channel_context: int = Field(default=20, ge=0, le=200, validation_alias=_env("TALON_SLACK_CHANNEL_CONTEXT"))
    slack_streaming: bool = Field(default=True, validation_alias=_env("TALON_SLACK_STREAMING"))
    slack_stream_interval_s: float = Field(default=1.5, ge=0.2, le=60,
                                           validation_alias=_env("TALON_SLACK_STREAM_INTERVAL"))
    # A reaction name (without colons) set while a message is being answered; empty for none.
    slack_ack_reaction: str = Field(default="eyes", validation_alias=_env("TALON_SLACK_ACK_REACTION"))
    slack_timeout_s: float = Field(default=30.0, gt=0, le=600, validation_alias=_env("TALON_SLACK_TIMEOUT"))

    # --- discord (channels/discord) --------------------------------------------------------------
    discord_bot_token: str = Field(default="", validation_alias=_env("DISCORD_BOT_TOKEN"))
    # Discord's REST API address (tests and proxies point it elsewhere); the gateway's address comes
    # from its GET /gateway/bot answer, as on the real platform.
    discord_api_base_url: str = Field(default="https://discord.com/api/v10",
                                      validation_alias=_env("DISCORD_API_BASE_URL"))
    # User ids allowed in direct messages; channel ids served (a thread is served when its parent is).
    discord_allowed_users: str = Field(default="", validation_alias=_env("TALON_DISCORD_ALLOWED_USERS"))
    discord_allowed_channels: str = Field(default="", validation_alias=_env("TALON_DISCORD_ALLOWED_CHANNELS"))
    discord_channel_context: int = Field(default=20, ge=0, le=200,
                                         validation_alias=_env("TALON_DISCORD_CHANNEL_CONTEXT"))
    discord_streaming: bool = Field(default=True, validation_alias=_env("TALON_DISCORD_STREAMING"))
    discord_stream_interval_s: float = Field(default=1.5, ge=0.2, le=60,
                                             validation_alias=_env("TALON_DISCORD_STREAM_INTERVAL"))
    discord_ack_reaction: str = Field(default="\N{EYES}", validation_alias=_env("TALON_DISCORD_ACK_REACTION"))

    # --- speech ------------------------------------------------------------------------------
    transcriber: Literal["auto", "whisper", "faster-whisper", "openai", "off"] = Field(
        default="auto", validation_alias=_env("TALON_TRANSCRIBER")
    )
    whisper_model: str = Field(default="bundled", validation_alias=_env("TALON_WHISPER_MODEL"))
    transcribe_concurrency: int = Field(default=1, validation_alias=_env("TALON_TRANSCRIBE_CONCURRENCY"))
    # faster-whisper's compute, threads and beam (talon.speech.transcribe.WhisperOptions; the
    # defaults are the fastest benchmarks/bench_voice.py measured at no worse word error rate).
    whisper_compute: Literal["int8", "int8_float32", "int16", "float32"] = Field(
        default="int8", validation_alias=_env("TALON_WHISPER_COMPUTE")
    )
    # 0: one per core Talon may run on.
    whisper_threads: int = Field(default=0, ge=0, le=64, validation_alias=_env("TALON_WHISPER_THREADS"))
    # 1: greedy decoding.
    whisper_beam: int = Field(default=5, ge=1, le=10, validation_alias=_env("TALON_WHISPER_BEAM"))
    # --- voice replies (talon.speech.synthesize, talon.speech.voice_replies) ---------------------
    voice_replies: Literal["mirror", "always", "off"] = Field(
        default="mirror", validation_alias=_env("TALON_VOICE_REPLIES")
    )
    tts: Literal["piper", "openai", "off"] = Field(default="piper", validation_alias=_env("TALON_TTS"))
    tts_voice: str = Field(default="bundled", validation_alias=_env("TALON_TTS_VOICE"))
    tts_model: str = Field(default="gpt-4o-mini-tts", validation_alias=_env("TALON_TTS_MODEL"))
    tts_max_seconds: float = Field(default=120.0, gt=0, le=900, validation_alias=_env("TALON_TTS_MAX_SECONDS"))
    tts_concurrency: int = Field(default=1, ge=1, validation_alias=_env("TALON_TTS_CONCURRENCY"))
    # Load the Whisper model and the voice in the background at start when voice replies are on.
    # Off by default: they load with the first voice note (docs/voice.md says what that costs),
    # and Talon at rest holds ~105 MB instead of ~440 MB.
    speech_warmup: bool = Field(default=False, validation_alias=_env("TALON_SPEECH_WARMUP"))
    # Minutes without a voice note or voice reply after which Whisper and the voice are let go
    # (their memory given back; the next note loads them again). 0 keeps them loaded.
    speech_idle_minutes: float = Field(default=30.0, ge=0, validation_alias=_env("TALON_SPEECH_IDLE"))

    # --- whatsapp / http server --------------------------------------------------------------
    twilio_account_sid: str = Field(default="", validation_alias=_env("TWILIO_ACCOUNT_SID"))
    twilio_auth_token: str = Field(default="", validation_alias=_env("TWILIO_AUTH_TOKEN"))
    twilio_whatsapp_from: str = Field(default="", validation_alias=_env("TWILIO_WHATSAPP_FROM"))
    twilio_api_base_url: str = Field(
        default="https://api.twilio.com", validation_alias=_env("TWILIO_API_BASE_URL")
    )
    twilio_media_hosts: str = Field(default="", validation_alias=_env("TALON_TWILIO_MEDIA_HOSTS"))
    whatsapp_allowed_numbers: str = Field(default="", validation_alias=_env("TALON_WHATSAPP_ALLOWED_NUMBERS"))
    whatsapp_webhook_path: str = Field(
        default="/twilio/whatsapp", validation_alias=_env("TALON_WHATSAPP_WEBHOOK_PATH")
    )
    whatsapp_insecure_no_signature: bool = Field(
        default=False, validation_alias=_env("TALON_WHATSAPP_INSECURE_NO_SIGNATURE")
    )
    # Approved Twilio Content templates for when WhatsApp's 24-hour window is closed: a Content SID
    # (HX...), optionally a space and a JSON object of fixed variables (channels/whatsapp/templates.py).
    whatsapp_template_reopen: str = Field(default="", validation_alias=_env("TALON_WHATSAPP_TEMPLATE_REOPEN"))
    whatsapp_template_reminder: str = Field(default="", validation_alias=_env("TALON_WHATSAPP_TEMPLATE_REMINDER"))
    whatsapp_template_approval: str = Field(default="", validation_alias=_env("TALON_WHATSAPP_TEMPLATE_APPROVAL"))
    # Messages waiting for the window are dropped (with a log line) after this many days.
    whatsapp_pending_days: float = Field(default=7.0, gt=0, validation_alias=_env("TALON_WHATSAPP_PENDING_DAYS"))
    public_base_url: str = Field(default="", validation_alias=_env("TALON_PUBLIC_BASE_URL"))
    http_host: str = Field(default="127.0.0.1", validation_alias=_env("TALON_HTTP_HOST"))
    http_port: int = Field(default=8080, validation_alias=_env("TALON_HTTP_PORT"))
    media_url_ttl_s: int = Field(default=600, validation_alias=_env("TALON_MEDIA_URL_TTL"))

    # --- limits (see Limits for what each does) ----------------------------------------------
    image_max_bytes: int = Field(default=Limits.image_max_bytes, validation_alias=_env("TALON_IMAGE_MAX_BYTES"))
    image_max_side: int = Field(default=Limits.image_max_side, validation_alias=_env("TALON_IMAGE_MAX_SIDE"))
    image_max_pixels: int = Field(default=Limits.image_max_pixels, validation_alias=_env("TALON_IMAGE_MAX_PIXELS"))
    document_max_chars: int = Field(
        default=Limits.document_max_chars, validation_alias=_env("TALON_DOCUMENT_MAX_CHARS")
    )
    download_max_bytes: int = Field(
        default=Limits.download_max_bytes, validation_alias=_env("TALON_DOWNLOAD_MAX_BYTES")
    )
    audio_max_bytes: int = Field(default=Limits.audio_max_bytes, validation_alias=_env("TALON_AUDIO_MAX_BYTES"))
    audio_max_seconds: float = Field(
        default=Limits.audio_max_seconds, validation_alias=_env("TALON_AUDIO_MAX_SECONDS")
    )
    video_max_frames: int = Field(default=Limits.video_max_frames, validation_alias=_env("TALON_VIDEO_MAX_FRAMES"))
    telegram_upload_max_bytes: int = Field(
        default=Limits.telegram_upload_max_bytes, validation_alias=_env("TALON_TELEGRAM_UPLOAD_MAX_BYTES")
    )
    video_fps: float = Field(default=Limits.video_fps, validation_alias=_env("TALON_VIDEO_FPS"))
    telegram_reply_max_messages: int = Field(
        default=Limits.telegram_reply_max_messages, ge=1,
        validation_alias=_env("TALON_TELEGRAM_REPLY_MAX_MESSAGES"),
    )
    whatsapp_reply_max_messages: int = Field(
        default=Limits.whatsapp_reply_max_messages, ge=1,
        validation_alias=_env("TALON_WHATSAPP_REPLY_MAX_MESSAGES"),
    )
    video_frame_max_side: int = Field(
        default=Limits.video_frame_max_side, validation_alias=_env("TALON_VIDEO_FRAME_MAX_SIDE")
    )
    video_max_frame_bytes: int = Field(
        default=Limits.video_max_frame_bytes, validation_alias=_env("TALON_VIDEO_MAX_FRAME_BYTES")
    )
    video_decode_seconds: float = Field(
        default=Limits.video_decode_seconds, validation_alias=_env("TALON_VIDEO_DECODE_SECONDS")
    )

    # --- access (see talon.storage.access) ---------------------------------------------------
    # Unknown senders get a pairing code the owner approves with `talon pair CODE`.
    pairing: bool = Field(default=False, validation_alias=_env("TALON_PAIRING"))

    # --- scheduled tasks (talon.scheduler) -----------------------------------------------------
    # A chat's time zone unless its person set their own (IANA name); cron tasks follow its DST.
    # Also where "day" and "month" begin for usage caps and /usage.
    timezone: str = Field(default="UTC", validation_alias=_env("TALON_TIMEZONE"))
    # A run missed while Talon was down still runs when it comes back if at most this late.
    task_misfire_grace_s: float = Field(default=3600.0, ge=0, validation_alias=_env("TALON_TASK_MISFIRE_GRACE"))
    tasks_per_chat: int = Field(default=50, ge=1, validation_alias=_env("TALON_TASKS_PER_CHAT"))
    # The shortest repeat a task may have.
    task_min_interval_s: float = Field(default=300.0, gt=0, validation_alias=_env("TALON_TASK_MIN_INTERVAL"))
    # How often each worker looks for due tasks: a run starts at most this late.
    task_poll_s: float = Field(default=5.0, gt=0, le=300, validation_alias=_env("TALON_TASK_POLL_INTERVAL"))
    # --- control (talon.control, docs/control.md) ---------------------------------------------
    # Tool calls that wait for a person's yes: shell, write, mcp (or mcp:<server>), send, web;
    # comma-separated; empty or "off": none.
    approval: str = Field(default="shell", validation_alias=_env("TALON_APPROVAL"))
    approval_timeout_s: float = Field(default=600.0, gt=0, validation_alias=_env("TALON_APPROVAL_TIMEOUT"))
    # Caps: "200000 tokens/day", "$2/day", "$20/month"; several comma-separated; empty: none.
    limit_per_person: str = Field(default="", validation_alias=_env("TALON_LIMIT_PER_PERSON"))
    limit_per_chat: str = Field(default="", validation_alias=_env("TALON_LIMIT_PER_CHAT"))
    limit_total: str = Field(default="", validation_alias=_env("TALON_LIMIT_TOTAL"))
    # Prices in US dollars per million tokens: "model=input/output[/cached]", comma-separated.
    prices: str = Field(default="", validation_alias=_env("TALON_PRICES"))
    # GET /metrics (Prometheus) on Talon's HTTP server.
    metrics: bool = Field(default=True, validation_alias=_env("TALON_METRICS"))

    # --- the web panel (talon.ui, docs/control-room.md) ------------------------------------------
    # Unset: on when Talon's HTTP server runs and either a password is set or the server listens on
    # loopback only. true: on (the HTTP server is started for it); false: off.
    ui: bool | None = Field(default=None, validation_alias=_env("TALON_UI"))
    # An argon2 hash made by `talon ui password`; without it, sign in with `talon ui link`.
    ui_password_hash: str = Field(default="", validation_alias=_env("TALON_UI_PASSWORD_HASH"))
    # A panel session ends after this long without a request.
    ui_session_idle_s: float = Field(default=1800.0, gt=0, validation_alias=_env("TALON_UI_SESSION_IDLE"))
    # Host names (besides loopback, TALON_HTTP_HOST and TALON_PUBLIC_BASE_URL's) the panel answers to.
    ui_hosts: str = Field(default="", validation_alias=_env("TALON_UI_HOSTS"))
    # Behind a reverse proxy: believe its X-Forwarded-For (the address sign-ins are limited by) and
    # X-Forwarded-Proto (https makes the session cookie Secure).
    ui_trust_proxy: bool = Field(default=False, validation_alias=_env("TALON_UI_TRUST_PROXY"))
    # Images sent in the panel's web chat: per image, per message, and the decoded size.
    ui_image_max_bytes: int = Field(default=5 * 1024 * 1024, gt=0, validation_alias=_env("TALON_UI_IMAGE_MAX_BYTES"))
    ui_max_images: int = Field(default=10, ge=1, validation_alias=_env("TALON_UI_MAX_IMAGES"))
    ui_message_max_bytes: int = Field(default=20 * 1024 * 1024, gt=0,
                                      validation_alias=_env("TALON_UI_MESSAGE_MAX_BYTES"))
    ui_image_max_pixels: int = Field(default=40_000_000, gt=0, validation_alias=_env("TALON_UI_IMAGE_MAX_PIXELS"))

    # --- logging -----------------------------------------------------------------------------
    log_level: str = Field(default="INFO", validation_alias=_env("TALON_LOG_LEVEL"))

    def limits(self) -> Limits:
        return Limits(
            image_max_bytes=self.image_max_bytes,
            image_max_side=self.image_max_side,
            image_max_pixels=self.image_max_pixels,
            document_max_chars=self.document_max_chars,
            download_max_bytes=self.download_max_bytes,
            audio_max_bytes=self.audio_max_bytes,
            audio_max_seconds=self.audio_max_seconds,
            video_max_frames=self.video_max_frames,
            telegram_upload_max_bytes=self.telegram_upload_max_bytes,
            video_fps=self.video_fps,
            video_frame_max_side=self.video_frame_max_side,
            video_max_frame_bytes=self.video_max_frame_bytes,
            video_decode_seconds=self.video_decode_seconds,
            telegram_reply_max_messages=self.telegram_reply_max_messages,
            whatsapp_reply_max_messages=self.whatsapp_reply_max_messages,
        )

    # --- derived -----------------------------------------------------------------------------
    @property
    def provider_name(self) -> str:
        return split_model(self.model)[0]

    @property
    def model_name(self) -> str:
        return split_model(self.model)[1]

    @property
    def telegram_allowlist(self) -> set[str]:
        return {_norm_tg(x) for x in _csv(self.telegram_allowed_users)}

    @property
    def whatsapp_allowlist(self) -> set[str]:
        return {normalize_whatsapp_number(x) for x in _csv(self.whatsapp_allowed_numbers)}

    @property
    def matrix_allowlist(self) -> set[str]:
        return {x.lower() for x in _csv(self.matrix_allowed_users)}

    @property
    def matrix_allowed_room_ids(self) -> frozenset[str]:
        """Room ids from ``TALON_MATRIX_ALLOWED_ROOMS``; ConfigError for an entry that is not one."""
        rooms = frozenset(_csv(self.matrix_allowed_rooms))
        for room in rooms:
            # Room versions before 12 add ":server"; from 12 on a room id is "!" and a hash.
            if not (room.startswith("!") and len(room) > 2 and " " not in room):
                raise ConfigError(f"TALON_MATRIX_ALLOWED_ROOMS: {room!r} is not a room id (room ids start with !, "
                                  "e.g. !AbCdEf:example.org; the log names the id of a room the bot was invited to)",
                                  ["TALON_MATRIX_ALLOWED_ROOMS"])
        return rooms

    @property
    def slack_allowlist(self) -> set[str]:
        return {x.upper() for x in _csv(self.slack_allowed_users)}

    @property
    def slack_allowed_channel_ids(self) -> frozenset[str]:
        return frozenset(x.upper() for x in _csv(self.slack_allowed_channels))

    def slack_configured(self) -> bool:
        return bool(self.slack_bot_token.strip())

    @property
    def slack_socket_mode(self) -> bool:
        return bool(self.slack_app_token.strip())

    @property
    def discord_allowlist(self) -> set[str]:
        return set(_csv(self.discord_allowed_users))

    @property
    def discord_allowed_channel_ids(self) -> frozenset[str]:
        """Channel ids from ``TALON_DISCORD_ALLOWED_CHANNELS``; ConfigError for one that is not an id."""
        ids = frozenset(_csv(self.discord_allowed_channels))
        for entry in ids:
            if not entry.isdigit():
                raise ConfigError(f"TALON_DISCORD_ALLOWED_CHANNELS: {entry!r} is not a channel id (a number: turn on "
                                  "Developer Mode, then right-click the channel, Copy Channel ID)",
                                  ["TALON_DISCORD_ALLOWED_CHANNELS"])
        return ids

    def discord_configured(self) -> bool:
        return bool(self.discord_bot_token.strip())

    def matrix_configured(self) -> bool:
        return bool(self.matrix_homeserver.strip() and self.matrix_user_id.strip())

    def approver_ids(self) -> frozenset[str]:
        """TALON_APPROVERS: ids as given, usernames as ``@name`` in lower case."""
        return frozenset(("@" + e.lstrip("@").lower()) if e.startswith("@") else e for e in _csv(self.approvers))

    @property
    def telegram_allowed_chat_ids(self) -> set[int]:
        """Group and supergroup ids from ``TALON_TELEGRAM_ALLOWED_CHATS``; ConfigError for an
        entry that is not one (group ids are negative integers)."""
        ids: set[int] = set()
        for entry in _csv(self.telegram_allowed_chats):
            try:
                value = int(entry)
            except ValueError:
                raise ConfigError(f"TALON_TELEGRAM_ALLOWED_CHATS: {entry!r} is not a numeric chat id (the log "
                                  "names the id of a group the bot was added to, e.g. -1001234567890)",
                                  ["TALON_TELEGRAM_ALLOWED_CHATS"]) from None
            if value >= 0:
                raise ConfigError(f"TALON_TELEGRAM_ALLOWED_CHATS: {entry} is not a group id (group and supergroup "
                                  "ids are negative); people go in TALON_TELEGRAM_ALLOWED_USERS",
                                  ["TALON_TELEGRAM_ALLOWED_CHATS"])
            ids.add(value)
        return ids

    def telegram_configured(self) -> bool:
        return bool(self.telegram_bot_token)

    @property
    def telegram_webhook_mode(self) -> bool:
        return bool(self.telegram_webhook_url.strip())

    def check_telegram_webhook(self) -> None:
        """In webhook mode, raise ConfigError naming the setting that is missing or invalid.

        Fails closed: without a secret token anyone who finds the URL could talk to the agent.
        """
        if not self.telegram_webhook_mode:
            return
        url = self.telegram_webhook_url.strip()
        parts = urlsplit(url)
        if parts.scheme != "https" or not parts.hostname or parts.fragment:
            raise ConfigError(f"TALON_TELEGRAM_WEBHOOK_URL={url!r} must be the public https URL Telegram "
                              "should post to, e.g. https://talon.example.com/telegram/webhook",
                              ["TALON_TELEGRAM_WEBHOOK_URL"])
        if not self.telegram_webhook_secret:
            raise ConfigError("TALON_TELEGRAM_WEBHOOK_URL is set but TALON_TELEGRAM_WEBHOOK_SECRET is not: "
                              "webhook mode needs a secret token (1-256 characters of A-Z, a-z, 0-9, _ "
                              "and -) so that only Telegram can post updates",
                              ["TALON_TELEGRAM_WEBHOOK_SECRET"])
        if not _WEBHOOK_SECRET.fullmatch(self.telegram_webhook_secret):
            raise ConfigError("TALON_TELEGRAM_WEBHOOK_SECRET must be 1-256 characters of A-Z, a-z, 0-9, _ "
                              "and - (Telegram's rule for secret tokens)",
                              ["TALON_TELEGRAM_WEBHOOK_SECRET"])
        if not self.telegram_webhook_path.startswith("/"):
            raise ConfigError("TALON_TELEGRAM_WEBHOOK_PATH must start with '/'", ["TALON_TELEGRAM_WEBHOOK_PATH"])

    def whatsapp_configured(self) -> bool:
        return bool(self.twilio_account_sid and self.twilio_whatsapp_from)

    @property
    def fallback_models(self) -> list[str]:
        """``TALON_MODEL_FALLBACKS`` as a list (a model without ``provider:`` uses TALON_MODEL's)."""
        return _csv(self.model_fallbacks)

    def check_fallbacks(self) -> None:
        """Raise ConfigError for a fallback model Talon could not call."""
        for spec in self.fallback_models:
            provider, name = split_model(spec) if ":" in spec else (self.provider_name, spec)
            where = ["TALON_MODEL_FALLBACKS"]
            if provider not in ("openai", "anthropic") or not name:
                raise ConfigError(f"TALON_MODEL_FALLBACKS: {spec!r} is not a model Talon can fall back to (use "
                                  "openai:NAME or anthropic:NAME; a local: model cannot be one)", where)
            if provider == "openai" and not (self.openai_api_key or self.openai_base_url):
                raise ConfigError(f"TALON_MODEL_FALLBACKS: {spec!r} needs OPENAI_API_KEY or OPENAI_BASE_URL", where)
            if provider == "anthropic" and not self.anthropic_api_key:
                raise ConfigError(f"TALON_MODEL_FALLBACKS: {spec!r} needs ANTHROPIC_API_KEY", where)

    def check_model(self) -> None:
        """Raise ConfigError naming what is missing for the configured model."""
        if not self.model:
            raise ConfigError(
                "no model configured: set TALON_MODEL (for example openai:gpt-4.1-mini, or local:bundled to "
                "try Talon with a tiny model it runs itself)",
                ["TALON_MODEL"],
            )
        provider, name = split_model(self.model)
        if provider not in ("openai", "anthropic", "local"):
            raise ConfigError(
                f"TALON_MODEL={self.model!r}: unknown provider {provider!r} (use openai:, anthropic: or local:)",
                ["TALON_MODEL"],
            )
        if not name:
            raise ConfigError(f"TALON_MODEL={self.model!r} names no model", ["TALON_MODEL"])
        if provider == "local":
            from talon.agent.providers.local import resolve_gguf

            resolve_gguf(name)
        if provider == "openai" and not (self.openai_api_key or self.openai_base_url):
            raise ConfigError(
                "the openai provider needs OPENAI_API_KEY (for OpenAI), or OPENAI_BASE_URL for a "
                "local OpenAI-compatible server (either one is enough)",
                ["OPENAI_API_KEY or OPENAI_BASE_URL"],
            )
        if provider == "anthropic" and not self.anthropic_api_key:
            raise ConfigError("the anthropic provider needs ANTHROPIC_API_KEY", ["ANTHROPIC_API_KEY"])

    def ensure_dirs(self) -> None:
        from talon.permissions import private_dir
        from talon.workspaces import check_dirs_apart

        check_dirs_apart(self.media_root, self.data_dir)
        self.media_root.mkdir(parents=True, exist_ok=True)
        private_dir(self.data_dir)

    def mcp_servers(self) -> "list[McpServerConfig]":
        """The servers of the MCP config file; ConfigError for a file that is named but missing,
        or invalid."""
        from talon.agent.tools.mcp_config import load_mcp_config

        return load_mcp_config(self.mcp_config_path, explicit=self.mcp_config is not None)

    @property
    def mcp_config_path(self) -> Path:
        return self.mcp_config if self.mcp_config is not None else Path("mcp.json")

    @property
    def web_allowlist(self) -> list[str]:
        return _csv(self.web_allow_hosts)

    @property
    def protected_globs(self) -> tuple[str, ...]:
        return tuple(_csv(self.protected_paths))
    @property
    def zone(self) -> ZoneInfo:
        """``TALON_TIMEZONE`` as a zone; ConfigError for a name the system does not know."""
        try:
            return ZoneInfo(self.timezone.strip() or "UTC")
        except (ZoneInfoNotFoundError, ValueError):
            raise ConfigError(f"TALON_TIMEZONE={self.timezone!r} is not a time zone name (use an IANA "
                              "name such as UTC or Europe/Berlin)", ["TALON_TIMEZONE"]) from None

    def workspace_dir(self, channel: str, conversation_id: str) -> Path:
        """The directory this conversation's agent works in (``TALON_WORKSPACE``)."""
        from talon.workspaces import workspace_root

        return workspace_root(self.media_root, self.workspace, channel, conversation_id)


def split_model(spec: str) -> tuple[str, str]:
    """``openai:gpt-4.1-mini`` -> (openai, gpt-4.1-mini); no prefix means OpenAI-compatible."""
    if ":" in spec:
        provider, _, name = spec.partition(":")
        return provider.strip().lower(), name.strip()
    return "openai", spec.strip()


def _csv(value: str) -> list[str]:
    return [part.strip() for part in value.replace(";", ",").split(",") if part.strip()]


def _norm_tg(entry: str) -> str:
    entry = entry.strip()
    return entry.lower() if entry.startswith("@") else entry


def normalize_whatsapp_number(value: str) -> str:
    """``whatsapp:+1 415-555`` and ``+1415555`` both become ``+1415555``."""
    value = value.strip()
    if value.lower().startswith("whatsapp:"):
        value = value[len("whatsapp:"):]
    digits = "".join(c for c in value if c.isdigit())
    return "+" + digits if digits else ""
