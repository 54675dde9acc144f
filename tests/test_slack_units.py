"""The Slack channel's pieces on their own: mrkdwn, the request signature and its replay window,
which file addresses get the bot token, how events become turns, how Slack's errors are read."""

from __future__ import annotations

import time
from typing import Any

import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.socket_mode.aiohttp import SocketModeClient  # noqa: F401  (imported at collection, not in a test)
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from channels.reply_parts import FilePart, TextPart
from channels.slack import SlackChannel
from channels.slack.api import SlackApi, classify, file_hosts, slack_budget
from channels.slack.downloads import fetchable
from channels.slack.events import Verifier
from channels.slack.intake import Intake, command_text, unescape
from channels.rooms import ChatterLog
from talon.config import Settings
from talon.envelope import InboundMessage, OutboundReply
from talon.errors import ConfigError, DeliveryError, PlatformRateLimited
from talon.render.slack import SLACK_TEXT_LIMIT, markdown_to_mrkdwn, slack_plain, split_for_slack
from tests.fakes.slack import sign

SECRET = "s3cret"


def settings(**extra: Any) -> Settings:
    values: dict[str, Any] = {"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_SIGNING_SECRET": SECRET, **extra}
    return Settings(_env_file=None, **values)  # type: ignore[arg-type]


# --- mrkdwn ---------------------------------------------------------------------------------------

def test_mrkdwn_renders_the_dialect_and_escapes_what_would_ping_or_link() -> None:
    out = markdown_to_mrkdwn("# Plan\n**bold** _it_ ~~gone~~ `x<y` [docs](https://a.example/?q=1&r=2)\n- item")
    assert out == "*Plan*\n*bold* _it_ ~gone~ `x&lt;y` <https://a.example/?q=1&amp;r=2|docs>\n• item"
    hostile = markdown_to_mrkdwn("<!channel> <@U123> <https://evil.example|bank> [x](javascript:alert(1))")
    assert "<!" not in hostile and "<@" not in hostile and "<https://evil" not in hostile
    assert "javascript:" in hostile and "<javascript" not in hostile  # shown as text, never a link
    assert markdown_to_mrkdwn("[a|b](https://x.example/p>q)") == "a|b (https://x.example/p&gt;q)"


def test_a_code_block_keeps_its_text_escaped_and_the_plain_fallback_has_no_markup() -> None:
    assert markdown_to_mrkdwn("```py\nif a < b:\n    *x*\n```") == "```\nif a &lt; b:\n    *x*\n```"
    assert slack_plain("**bold** <!here>") == "bold &lt;!here&gt;"


def test_long_answers_are_cut_under_slacks_limit_once_rendered() -> None:
    pieces = split_for_slack("word & " * 3000)
    assert len(pieces) > 1 and all(len(markdown_to_mrkdwn(p)) <= SLACK_TEXT_LIMIT for p in pieces)


# --- the signature and the replay window ----------------------------------------------------------

def test_only_a_fresh_request_signed_with_the_secret_passes() -> None:
    verifier = Verifier(SECRET)
    body = b'{"type":"event_callback"}'
    good = sign(SECRET, body)
    assert verifier.ok(body, good["X-Slack-Request-Timestamp"], good["X-Slack-Signature"])
    bad = [
        (body + b" ", good["X-Slack-Request-Timestamp"], good["X-Slack-Signature"]),  # tampered body
        (body, *sign("other", body).values()),  # forged
        (body, *sign(SECRET, body, int(time.time()) - 301).values()),  # replayed after 5 minutes
        (body, *sign(SECRET, body, int(time.time()) + 301).values()),  # from the future
        (body, None, good["X-Slack-Signature"]), (body, good["X-Slack-Request-Timestamp"], None),
        (body, "12ab", good["X-Slack-Signature"]), (body, "-1", good["X-Slack-Signature"]),
        (body, "9" * 400, good["X-Slack-Signature"]), (body, good["X-Slack-Request-Timestamp"], "v1=" + "0" * 64),
    ]
    for args in bad:
        assert not verifier.ok(*args), args  # never raises either


# --- files only from Slack's host ------------------------------------------------------------------

def test_the_bot_token_goes_only_to_slacks_own_file_host() -> None:
    api = SlackApi(settings(), slack_budget())
    assert api.file_hosts == frozenset({"slack.com", "files.slack.com"})
    assert fetchable("https://files.slack.com/files-pri/T1-F1/download/a.png", api)
    for url in ("http://files.slack.com/files-pri/T1-F1/a.png",  # not the API's scheme
                "https://files.slack.com.evil.example/a.png", "https://slack.com@evil.example/a.png",
                "https://user:pw@files.slack.com/a.png", "https://169.254.169.254/latest/meta-data",
                "file:///etc/passwd", "https://evil.example/files.slack.com/a.png"):
        assert not fetchable(url, api), url
    assert file_hosts("http://127.0.0.1:8080/api/") == frozenset({"127.0.0.1:8080"})


# --- Slack's errors ----------------------------------------------------------------------------------

def _error(status: int, data: dict[str, Any], headers: dict[str, str] | None = None) -> SlackApiError:
    response = AsyncSlackResponse(client=None, http_verb="POST", api_url="x", req_args={}, data=data,
                                  headers=headers or {}, status_code=status)
    return SlackApiError("failed", response)


def test_a_429_names_its_wait_and_refusals_are_permanent() -> None:
    limited = classify(_error(429, {"ok": False, "error": "ratelimited"}, {"Retry-After": "7"}), "send")
    assert isinstance(limited, PlatformRateLimited) and limited.seconds == 7
    refused = classify(_error(200, {"ok": False, "error": "channel_not_found"}), "send")
    assert type(refused) is DeliveryError and refused.permanent and "channel_not_found" in str(refused)
    assert not classify(_error(503, {}), "send").permanent
    assert classify(_error(429, {}, {"Retry-After": "soon"}), "send").seconds == 1.0  # type: ignore[attr-defined]


# --- events into turns ---------------------------------------------------------------------------------

class _Gate:
    def __init__(self, allowed: set[str]) -> None:
        self.allowed_ids = allowed

    async def allowed(self, channel: str, identities: Any) -> bool:
        return bool(set(identities) & self.allowed_ids)

    async def request_pairing(self, channel: str, sender_id: str, name: str = "") -> None:
        return None


class _Bridge:
    def __init__(self, allowed: set[str]) -> None:
        self.gate = _Gate(allowed)
        self.control = None
        self.got: list[InboundMessage] = []

    async def submit(self, message: InboundMessage) -> bool:
        self.got.append(message)
        return True

    async def idle(self) -> None:
        return None


def _intake(allowed_users: set[str], channels: frozenset[str] = frozenset({"C1"})) -> tuple[Intake, _Bridge]:
    api = SlackApi(settings(), slack_budget())
    api.bot_user_id = "UBOT"
    intake = Intake(api, allowed_channels=channels, chatter=ChatterLog(5))
    bridge = _Bridge(allowed_users)
    intake.bind(bridge)  # type: ignore[arg-type]

    async def person(user: str) -> tuple[str, bool]:
        return user.lower(), False

    async def title(channel: str) -> str:
        return "general"

    intake.person = person  # type: ignore[method-assign]
    intake.title = title  # type: ignore[method-assign]
    return intake, bridge


def _message(**extra: Any) -> dict[str, Any]:
    return {"type": "message", "channel": "D1", "user": "UALICE", "text": "hi", "ts": "1700000000.000100",
            "channel_type": "im", **extra}


async def test_what_is_never_a_turn() -> None:
    intake, bridge = _intake({"UALICE"})
    for event in (_message(user="UBOT"), _message(bot_id="B1"), _message(subtype="channel_join"),
                  _message(subtype="bot_message"), _message(user="UMALLORY"), _message(ts="../../etc"),
                  _message(user="<script>"), _message(channel="C9", channel_type="channel", text="<@UBOT> hi"),
                  {"type": "reaction_added", "user": "UALICE"}):
        await intake.on_event(event)
    assert bridge.got == []


async def test_a_direct_message_a_thread_a_command_and_an_edit() -> None:
    intake, bridge = _intake({"UALICE"})
    await intake.on_event(_message(text="a &lt; b &amp;&amp; c &gt; d"))
    await intake.on_event(_message(text="!stop", ts="1700000000.000200"))
    await intake.on_event(_message(ts="1700000000.000300", thread_ts="1700000000.000100"))
    await intake.on_event(_message(ts="1700000000.000400", thread_ts="1700000000.000400"))  # a root: no thread
    await intake.on_event({"type": "message", "subtype": "message_changed", "channel": "D1", "channel_type": "im",
                           "message": {**_message(text="edited"), "edited": {"ts": "1700000001.000000"}}})
    texts = [m.text for m in bridge.got]
    assert texts == ["a < b && c > d", "/stop", "hi", "hi", "edited"]
    assert [m.thread_id for m in bridge.got] == [None, None, "1700000000.000100", None, None]
    assert bridge.got[-1].edited_at == "1700000001.000000"


async def test_in_a_channel_only_a_mention_is_a_turn_and_the_rest_is_chatter() -> None:
    intake, bridge = _intake(set())
    await intake.on_event(_message(channel="C1", channel_type="channel", user="UCAROL", text="lunch?"))
    await intake.on_event(_message(channel="C1", channel_type="channel", text="<@UBOT> which museum?",
                                   ts="1700000000.000500"))
    [turn] = bridge.got
    assert turn.text == "which museum?" and turn.is_group and turn.chat_title == "general"
    assert [c.text for c in turn.chatter] == ["lunch?"]
    # A slash command in a listed channel is a turn; an unknown one, or a forged form, is not.
    await intake.on_command({"command": "/stop", "user_id": "UALICE", "channel_id": "C1", "trigger_id": "t1"})
    await intake.on_command({"command": "/rm", "user_id": "UALICE", "channel_id": "C1", "trigger_id": "t2"})
    await intake.on_command({"command": "/stop", "user_id": "x y", "channel_id": "C1", "trigger_id": "t3"})
    assert [m.text for m in bridge.got][1:] == ["/stop"]


def test_commands_and_escapes() -> None:
    assert command_text("!stop") == "/stop" and command_text("!rm -rf") == "!rm -rf"
    assert unescape("&amp;lt;") == "&lt;"


# --- settings and parts ------------------------------------------------------------------------------------

def test_the_channel_needs_a_secret_or_an_app_token() -> None:
    with pytest.raises(ConfigError) as missing:
        SlackChannel(settings(SLACK_SIGNING_SECRET=""))
    assert "SLACK_SIGNING_SECRET" in str(missing.value) and "SLACK_APP_TOKEN" in str(missing.value)
    channel = SlackChannel(settings(SLACK_SIGNING_SECRET="", SLACK_APP_TOKEN="xapp-1"))
    assert channel.http is None  # Socket Mode: nothing listens
    assert settings(TALON_SLACK_ALLOWED_USERS="u1, U2").slack_allowlist == {"U1", "U2"}


def test_a_reply_is_planned_as_text_then_files() -> None:
    from talon.media import MarkdownMediaRef

    channel = SlackChannel(settings())
    parts = channel.reply_parts(OutboundReply(text="hello", media=[MarkdownMediaRef(path="a.txt", alt="a")]))
    assert isinstance(parts[0], TextPart) and isinstance(parts[1], FilePart)
