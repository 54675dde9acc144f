"""The loopback fake of Slack (tests/fakes/slack.py) checked against slack-sdk's own
expectations: the real ``AsyncWebClient`` and ``SocketModeClient`` drive it, and what they accept,
raise and retry is what Talon's Slack channel is built on."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from tests.fakes.slack import APP_TOKEN, BOT_TOKEN, BOT_USER, SIGNING_SECRET, FakeSlack, sign


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as fake:
        fake.add_channel("D0ALICE01", "alice", kind="im")
        fake.add_user("U0ALICE01", "alice")
        yield fake


def client(fake: FakeSlack, token: str = BOT_TOKEN) -> AsyncWebClient:
    return AsyncWebClient(token=token, base_url=fake.api_url)


async def test_the_web_api_answers_as_slack_sdk_expects(slack: FakeSlack) -> None:
    web = client(slack)
    me = await web.auth_test()
    assert me["user_id"] == BOT_USER and me.status_code == 200
    posted = await web.chat_postMessage(channel="D0ALICE01", text="*hi*")
    updated = await web.chat_update(channel="D0ALICE01", ts=posted["ts"], text="*hi* again")
    assert updated["ts"] == posted["ts"]
    await web.reactions_add(channel="D0ALICE01", timestamp=posted["ts"], name="eyes")
    with pytest.raises(SlackApiError) as twice:
        await web.reactions_add(channel="D0ALICE01", timestamp=posted["ts"], name="eyes")
    assert twice.value.response["error"] == "already_reacted"
    assert (await web.users_info(user="U0ALICE01"))["user"]["name"] == "alice"
    assert (await web.conversations_info(channel="D0ALICE01"))["channel"]["id"] == "D0ALICE01"
    assert slack.messages[("D0ALICE01", posted["ts"])].versions == ["*hi*", "*hi* again"]
    # Refusals are HTTP 200 with ok: false, raised by the SDK with Slack's error code.
    for call, error in ((web.chat_postMessage(channel="C0NOWHERE", text="x"), "channel_not_found"),
                        (web.chat_update(channel="D0ALICE01", ts="1.000001", text="x"), "message_not_found"),
                        (client(slack, "xoxb-wrong").auth_test(), "invalid_auth"),
                        (web.chat_postMessage(channel="D0ALICE01", text="x" * 40_001), "msg_too_long")):
        with pytest.raises(SlackApiError) as refused:
            await call
        assert refused.value.response.status_code == 200 and refused.value.response["error"] == error


async def test_a_429_carries_retry_after_which_the_sdks_own_retry_handler_honours(slack: FakeSlack) -> None:
    slack.rate_limit_next("chat.postMessage", retry_after=1)
    with pytest.raises(SlackApiError) as limited:
        await client(slack).chat_postMessage(channel="D0ALICE01", text="x")
    assert limited.value.response.status_code == 429
    assert limited.value.response.headers["Retry-After"] == "1"
    assert limited.value.response["error"] == "ratelimited"
    # slack-sdk's own rate-limit handler reads the same header and tries again.
    slack.rate_limit_next("chat.postMessage", retry_after=0)
    patient = AsyncWebClient(token=BOT_TOKEN, base_url=slack.api_url,
                             retry_handlers=[AsyncRateLimitErrorRetryHandler(max_retry_count=1)])
    assert (await patient.chat_postMessage(channel="D0ALICE01", text="y"))["ok"]
    assert [c.status for c in slack.calls if c.method == "chat.postMessage"] == [429, 429, 200]


async def test_files_upload_v2_runs_slacks_three_step_flow(slack: FakeSlack) -> None:
    thread = (await client(slack).chat_postMessage(channel="D0ALICE01", text="root"))["ts"]
    answer = await client(slack).files_upload_v2(channel="D0ALICE01", content=b"col\n1\n", filename="t.csv",
                                                 title="t.csv", thread_ts=thread, initial_comment="here")
    assert answer["file"]["name"] == "t.csv"
    steps = [c.method for c in slack.calls if c.method.startswith("files.")]
    assert steps == ["files.getUploadURLExternal", "files.completeUploadExternal"]
    [shared] = [m for m in slack.messages.values() if m.files]
    assert shared.thread_ts == thread and shared.text == "here"
    assert slack.files[shared.files[0]["id"]][0] == b"col\n1\n"


async def test_a_persons_file_is_served_only_with_the_bot_token(slack: FakeSlack) -> None:
    entry = slack.add_file(b"\x89PNG...", "cat.png", "image/png")
    async with aiohttp.ClientSession() as http:
        async with http.get(entry["url_private_download"]) as anonymous:
            assert anonymous.status == 403
        async with http.get(entry["url_private_download"], headers={"Authorization": f"Bearer {BOT_TOKEN}"}) as ok:
            assert ok.status == 200 and await ok.read() == b"\x89PNG..."


async def test_events_are_signed_as_slack_sdks_verifier_expects(slack: FakeSlack) -> None:
    body = b'{"type":"event_callback"}'
    headers = sign(SIGNING_SECRET, body)
    verifier = SignatureVerifier(SIGNING_SECRET)
    assert verifier.is_valid(body, headers["X-Slack-Request-Timestamp"], headers["X-Slack-Signature"])
    assert not verifier.is_valid(body + b" ", headers["X-Slack-Request-Timestamp"], headers["X-Slack-Signature"])


async def test_socket_mode_connects_through_apps_connections_open_and_envelopes_are_acked(
        slack: FakeSlack) -> None:
    got: list[SocketModeRequest] = []

    async def listener(sm: SocketModeClient, request: SocketModeRequest) -> None:
        got.append(request)
        await sm.send_socket_mode_response(SocketModeResponse(envelope_id=request.envelope_id))

    socket = SocketModeClient(app_token=APP_TOKEN, web_client=AsyncWebClient(base_url=slack.api_url))
    socket.socket_mode_request_listeners.append(listener)  # type: ignore[arg-type]
    await socket.connect()
    try:
        event = slack.message_event("D0ALICE01", "U0ALICE01", "hello <b>")
        await slack.push_socket("event", event)
        assert got[0].type == "events_api" and got[0].payload["event"]["text"] == "hello &lt;b&gt;"
    finally:
        await socket.close()
    # The app-level token is what opens a connection; the bot token does not.
    with pytest.raises(SlackApiError):
        await AsyncWebClient(base_url=slack.api_url).apps_connections_open(app_token=BOT_TOKEN)


async def test_doctor_checks_the_token_with_auth_test(slack: FakeSlack) -> None:
    from talon.config import Settings
    from talon.doctor_checks import slack_bot_row

    def row_for(token: str) -> Settings:
        return Settings(_env_file=None, SLACK_BOT_TOKEN=token, SLACK_SIGNING_SECRET="s",  # type: ignore[call-arg]
                        SLACK_API_BASE_URL=slack.api_url)

    ok = await slack_bot_row(row_for(BOT_TOKEN))
    refused = await slack_bot_row(row_for("xoxb-wrong-secret"))
    assert ok[1].startswith("ok:") and BOT_USER in ok[1] and BOT_TOKEN not in ok[1]
    assert refused[1].startswith("FAILED") and "invalid_auth" in refused[1] and "xoxb-wrong-secret" not in refused[1]
