"""A Slack button press is decided before Slack is answered (issue 32, part 5): a worker killed
right after its 200 has still decided, and the restarted worker's turn goes on with the decision.
Hostile presses (another chat's or a made-up approval id, a flood of actions, an unsigned press)
decide nothing."""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack import BOT_TOKEN, SIGNING_SECRET, FakeSlack, sign

ALICE, CAROL = "U0ALICE01", "U0CAROL01"
DM = "D0ALICE01"


@pytest.fixture
def threaded() -> Iterator[tuple[FakeSlack, FakeOpenAI]]:
    with FakeSlack() as fake, FakeOpenAI() as llm:
        fake.add_channel(DM, "alice", kind="im")
        fake.add_user(ALICE, "alice")
        fake.add_user(CAROL, "carol")
        yield fake, llm


def _env(tmp_path: Path, slack: FakeSlack, llm: FakeOpenAI, port: int) -> dict[str, str]:
    return {
        "SLACK_BOT_TOKEN": BOT_TOKEN, "SLACK_SIGNING_SECRET": SIGNING_SECRET,
        "SLACK_API_BASE_URL": slack.api_url, "OPENAI_BASE_URL": llm.base_url, "OPENAI_API_KEY": "test-key",
        "TALON_MODEL": "openai:fake-model", "TALON_MEDIA_ROOT": str(tmp_path / "media_root"),
        "TALON_DATA_DIR": str(tmp_path / "data"), "TALON_MODEL_MAX_RETRIES": "0", "TALON_MODEL_TIMEOUT": "30",
        "TALON_ACK_DELAY": "0", "TALON_HTTP_HOST": "127.0.0.1", "TALON_HTTP_PORT": str(port),
        "TALON_SLACK_ALLOWED_USERS": ALICE, "TALON_MODEL_DISCOVERY": "false", "TALON_SLACK_STREAMING": "false",
        "TALON_SLACK_ACK_REACTION": "", "TALON_SHELL_TOOL": "true", "TALON_SHELL_UNSANDBOXED": "true",
    }


def _until_200(slack: FakeSlack, url: str, kind: str, body: dict[str, Any], proc: Any, log: Path) -> None:
    deadline = time.monotonic() + 60
    while slack.deliver_sync(url, kind, body, tries=1) != 200:  # Slack retries until answered; so does this
        assert time.monotonic() < deadline and proc.poll() is None, log.read_text()


def test_a_press_acknowledged_then_the_worker_killed_is_still_decided_and_the_restart_goes_on(
        tmp_path: Path, threaded: tuple[FakeSlack, FakeOpenAI]) -> None:
    from tests.support.process import start_talon, stop_talon
    slack, llm = threaded
    with socket.socket() as probe:  # a fixed port: Slack's Request URL stays the same across restarts
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = _env(tmp_path, slack, llm, port)
    url = f"http://127.0.0.1:{port}/slack/events"
    llm.queue(FakeOpenAI.tool_call("shell", {"command": "echo press-ran"}), "Done.")
    proc, log = start_talon(tmp_path, env, "first.log")
    try:
        _until_200(slack, url, "event", slack.message_event(DM, ALICE, "run it", ts="1700000000.000001"), proc, log)
        slack.wait_for_sync("chat.postMessage", lambda c: bool(c.params.get("blocks")), timeout=60)
        [prompt] = [m for m in slack.bot_messages(DM) if m.blocks]
        [approve] = [el["value"] for b in prompt.blocks or [] if b.get("type") == "actions" for el in b["elements"]
                     if el["action_id"] == "talon_approval_approve"]
        # Hostile presses first: a made-up id, and a flood of actions naming it; then carol's.
        forged = slack.button_press(DM, prompt.ts, "talon_approval_approve", ALICE)
        forged["actions"] = [{**forged["actions"][0], "value": "not-an-approval"}] * 500
        assert slack.deliver_sync(url, "interactive", forged, tries=1) == 200
        assert slack.deliver_sync(url, "interactive", slack.button_press(DM, prompt.ts, "talon_approval_approve",
                                                                         CAROL), tries=1) == 200
        unsigned = slack.button_press(DM, prompt.ts, "talon_approval_approve", ALICE)
        assert slack.deliver_sync(url, "interactive", unsigned, tries=1, headers={}) == 401
        assert len(llm.requests) == 1  # nothing above decided anything
        # Alice presses; the moment Slack has its 200 the worker dies.
        assert slack.deliver_sync(url, "interactive", slack.button_press(DM, prompt.ts, "talon_approval_approve",
                                                                         ALICE), tries=1) == 200
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    proc, log = start_talon(tmp_path, env, "second.log")
    try:
        slack.wait_for_sync("chat.postMessage", lambda c: c.params.get("text") == "Done.", timeout=90)
    finally:
        stop_talon(proc)
    assert "press-ran" in str(llm.requests[-1].json), log.read_text()
    prompts = [c for c in slack.sent("chat.postMessage", DM) if c.params.get("blocks")]
    assert len(prompts) == 1, slack.summary()  # the restarted turn found the decision: not asked again
    assert approve  # the button carried the approval's id
    assert not any("press-ran" in str(r.json) for r in llm.requests[:-1])


async def test_a_press_that_cannot_be_decided_is_not_acknowledged() -> None:
    from channels.slack.events import Dispatch, HttpDoor, Verifier

    async def nothing(_: Any) -> None:
        return None

    async def store_away(_: Any) -> None:
        raise RuntimeError("the database gave no connection")

    door = HttpDoor(Dispatch(on_event=nothing, on_action=store_away, on_command=nothing), Verifier(SIGNING_SECRET))
    app = web.Application()
    app.router.add_post("/slack/events", door.handle)
    body = FakeSlack.encode("interactive", {"type": "block_actions", "actions": []})[0]
    headers = {**sign(SIGNING_SECRET, body), "Content-Type": "application/x-www-form-urlencoded"}
    async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as session:
        async with session.post(server.make_url("/slack/events"), data=body, headers=headers) as resp:
            assert resp.status == 503  # not acknowledged: Slack tells the person it failed


async def test_over_socket_mode_a_press_is_decided_before_its_ack(tmp_path: Path) -> None:
    from channels.slack import SlackChannel
    from talon.config import Settings
    from talon.runtime import build_runtime
    from tests.fakes.slack import APP_TOKEN

    async with FakeSlack() as slack, FakeOpenAI() as llm:
        slack.add_channel(DM, "alice", kind="im")
        slack.add_user(ALICE, "alice")
        slack.add_user(CAROL, "carol")
        llm.queue(FakeOpenAI.tool_call("shell", {"command": "echo socket-ran"}), "Done.")
        env = {**_env(tmp_path, slack, llm, 0), "SLACK_APP_TOKEN": APP_TOKEN, "SLACK_SIGNING_SECRET": ""}
        settings = Settings(_env_file=None, **env)  # type: ignore[arg-type]
        runtime = build_runtime(settings, [SlackChannel(settings)])
        await runtime.start()
        try:
            await slack.push_socket("event", slack.message_event(DM, ALICE, "run it"))
            [prompt] = await slack.wait_until(lambda: [m for m in slack.bot_messages(DM) if m.blocks], "the prompt")
            approvals = runtime.stores.approvals  # type: ignore[union-attr]
            [pending] = await approvals.pending("slack", DM)
            await slack.push_socket("interactive", slack.button_press(DM, prompt.ts, "talon_approval_deny", CAROL))
            assert (await approvals.get(pending.id)).status == "pending"  # type: ignore[union-attr]
            await slack.push_socket("interactive", slack.button_press(DM, prompt.ts, "talon_approval_approve", ALICE))
            decided = await approvals.get(pending.id)  # read the moment the ack arrived
            await slack.wait_until(lambda: any(m.text == "Done." for m in slack.bot_messages(DM)), "the answer")
        finally:
            await runtime.stop()
    assert decided is not None and decided.status == "approved"
