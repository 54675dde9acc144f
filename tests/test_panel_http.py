"""The web panel's walls over plain HTTP (httpx against Talon's real server on loopback): what a
hostile page, a stranger on the network, or a forged form gets; the sign-in rules; the web chat's
checks of an image batch; and that no secret appears in anything the panel serves."""

from __future__ import annotations

import asyncio
import io
import time
from pathlib import Path

import httpx
import pytest
from PIL import Image

from talon.config import Settings
from talon.envelope import InboundMessage
from talon.storage.panel import PanelSession
from tests.conftest import ALICE, TOKEN
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram
from tests.support.panel import (PASSWORD, base_url, client_for, form_csrf, page_csrf, panel_settings,
                                 running_panel, sign_in)

PAGES = ["/ui/", "/ui/chats", "/ui/chat", "/ui/approvals", "/ui/tasks", "/ui/usage", "/ui/access", "/ui/logs",
         "/ui/settings", "/ui/audit"]


def png(width: int = 8, height: int = 8, color: tuple[int, int, int] = (200, 30, 40)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "PNG")
    return out.getvalue()


def secrets_of(settings: Settings) -> list[str]:
    return [TOKEN, settings.openai_api_key, settings.ui_password_hash]


def assert_no_secret(text: str, settings: Settings, where: str) -> None:
    for secret in secrets_of(settings):
        assert secret not in text, f"a secret appears in {where}"


def origin(client: httpx.AsyncClient) -> dict[str, str]:
    return {"Origin": str(client.base_url).rstrip("/")}


async def test_without_a_session_pages_redirect_to_sign_in_and_the_api_answers_401(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = panel_settings(tmp_path, tg.base_url, llm.base_url)
    async with running_panel(settings) as runtime, client_for(runtime) as client:
        for path in PAGES:
            page = await client.get(path)
            assert page.status_code == 303 and page.headers["Location"] == "/ui/signin", path
        for path in ("/ui/api/status", "/ui/api/logs", f"/ui/attachments/telegram:{ALICE}/{'a' * 64}",
                     "/ui/api/chat/events", f"/ui/api/chats/telegram:{ALICE}/messages"):
            answer = await client.get(path)
            assert answer.status_code == 401, path
            assert answer.json() == {"error": "sign in first"}
        # A POST with a good Origin but no session does nothing either.
        forged = await client.post("/ui/usage/grant", data={"person": f"telegram:{ALICE}", "amount": "100000"},
                                   headers=origin(client))
        assert forged.status_code == 401
        assert await runtime.stores.usage.granted("telegram", str(ALICE), "tokens", 0) == 0  # type: ignore[union-attr]


async def test_a_wrong_password_is_refused_and_the_right_one_opens_every_page_with_no_secret_in_it(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = panel_settings(tmp_path, tg.base_url, llm.base_url, TALON_TELEGRAM_WEBHOOK_SECRET="")
    async with running_panel(settings) as runtime, client_for(runtime) as client:
        runtime.panel.failure_delay_s = 0.0  # type: ignore[union-attr]
        refused = await sign_in(client, "not the password")
        assert refused.status_code == 401 and "Wrong password." in refused.text
        assert "talon_ui" not in client.cookies
        assert (await client.get("/ui/")).status_code == 303
        page = await sign_in(client)
        assert page.status_code == 200 and str(page.url).endswith("/ui/")
        cookie = page.history[0].headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui/" in cookie
        assert "Secure" not in cookie  # plain HTTP on loopback: a Secure cookie would never come back
        for path in PAGES + ["/ui/api/status", "/ui/api/logs?level=DEBUG", "/ui/signin"]:
            answer = await client.get(path, follow_redirects=True)
            assert answer.status_code == 200, path
            headers = answer.headers
            assert "script-src 'self'" in headers["Content-Security-Policy"]
            assert "unsafe-inline" not in headers["Content-Security-Policy"]
            assert headers["X-Frame-Options"] == "DENY" and headers["Referrer-Policy"] == "same-origin"
            assert_no_secret(answer.text, settings, path)
            assert "<script>" not in answer.text and " on" + "click=" not in answer.text
        settings_page = (await client.get("/ui/settings")).text
        assert "TELEGRAM_BOT_TOKEN" in settings_page and "OPENAI_API_KEY" in settings_page
        assert settings_page.count(">set<") >= 3  # token, key, password hash: said to be set, not shown


async def test_posts_need_the_csrf_token_and_this_origin_and_hosts_must_be_talons(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = panel_settings(tmp_path, tg.base_url, llm.base_url, TALON_LIMIT_PER_PERSON="1000 tokens/day")
    async with running_panel(settings) as runtime, client_for(runtime) as client:
        csrf = page_csrf((await sign_in(client)).text)
        usage = runtime.stores.usage  # type: ignore[union-attr]
        grant = {"person": f"telegram:{ALICE}", "amount": "5000"}
        # No token, a wrong token, no Origin, another site's Origin, a cross-site fetch: all 403.
        tries = [({**grant}, origin(client)),
                 ({**grant, "csrf": "forged"}, origin(client)),
                 ({**grant, "csrf": csrf}, {}),
                 ({**grant, "csrf": csrf}, {"Origin": "http://evil.example"}),
                 ({**grant, "csrf": csrf}, {"Origin": "null"}),
                 ({**grant, "csrf": csrf}, {**origin(client), "Sec-Fetch-Site": "cross-site"})]
        for data, headers in tries:
            answer = await client.post("/ui/usage/grant", data=data, headers=headers)
            assert answer.status_code == 403, (data.keys(), headers)
        assert await usage.granted("telegram", str(ALICE), "tokens", 0) == 0
        # A page of another site whose name was rebound to 127.0.0.1 (DNS rebinding) reaches nothing.
        port = runtime.http.port  # type: ignore[union-attr]
        for host in (f"evil.example:{port}", "attacker.test", f"127.0.0.1.nip.io:{port}"):
            assert (await client.get("/ui/", headers={"Host": host})).status_code == 421
            assert (await client.get("/ui/signin", headers={"Host": host})).status_code == 421
            post = await client.post("/ui/usage/grant", data={**grant, "csrf": csrf},
                                     headers={"Host": host, "Origin": f"http://{host}"})
            assert post.status_code == 421
        assert await usage.granted("telegram", str(ALICE), "tokens", 0) == 0
        # The same request, done right, works: the walls above were the reason.
        done = await client.post("/ui/usage/grant", data={**grant, "csrf": csrf}, headers=origin(client))
        assert done.status_code == 303
        assert await usage.granted("telegram", str(ALICE), "tokens", 0) == 5000
        # What an action did is shown once, on the page it leads to; a link cannot put words there.
        assert done.headers["Location"] == "/ui/usage"
        assert "Granted 5,000 tokens" in (await client.get("/ui/usage")).text
        assert "Granted 5,000 tokens" not in (await client.get("/ui/usage")).text
        assert "Your session expired" not in (await client.get("/ui/usage?note=Your+session+expired")).text
        audit = (await client.get("/ui/audit")).text
        assert "usage grant" in audit and f"telegram:{ALICE}" in audit and "signed in" in audit


async def test_failed_sign_ins_are_slowed_and_limited_per_address(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = panel_settings(tmp_path, tg.base_url, llm.base_url)
    async with running_panel(settings) as runtime, client_for(runtime) as client:
        panel = runtime.panel
        assert panel is not None
        panel.failure_delay_s = 0.2
        started = time.monotonic()
        assert (await sign_in(client, "wrong 1")).status_code == 401
        assert time.monotonic() - started >= 0.2  # the failure was answered late, not at once
        panel.failure_delay_s = 0.0
        for n in range(2, 6):
            assert (await sign_in(client, f"wrong {n}")).status_code == 401
        # The sixth try is not even checked: the right password is refused too, until they age out.
        limited = await sign_in(client, PASSWORD)
        assert limited.status_code == 429 and "Too many failed sign-ins" in limited.text
        assert "talon_ui" not in client.cookies
        # Another address is not held back by these failures.
        assert await panel.store.failures("10.9.8.7", 0) == 0


async def test_a_sign_in_link_works_once_and_sessions_end_on_sign_out_and_when_idle(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    from talon.ui.cli import make_link

    settings = panel_settings(tmp_path, tg.base_url, llm.base_url, TALON_UI_PASSWORD_HASH="")
    async with running_panel(settings) as runtime, client_for(runtime) as client:
        runtime.panel.failure_delay_s = 0.0  # type: ignore[union-attr]
        link = await make_link(settings.model_copy(update={"http_port": runtime.http.port}))  # type: ignore[union-attr]
        assert link.startswith(base_url(runtime) + "/ui/signin/link?token=")
        token = link.split("token=")[1]
        # Stored only as its hash: the database holds nothing that signs in.
        raw = (tmp_path / "data" / "control.sqlite3").read_bytes()
        assert token.encode() not in raw
        page = await client.get(link)
        assert page.status_code == 200
        answer = await client.post("/ui/signin/link", data={"csrf": form_csrf(page.text), "token": token},
                                   headers=origin(client), follow_redirects=True)
        assert str(answer.url).endswith("/ui/") and "Overview" in answer.text
        csrf = page_csrf(answer.text)
        # Used: a second browser with the same link gets nowhere.
        async with client_for(runtime) as other:
            again = await other.get(link)
            second = await other.post("/ui/signin/link", data={"csrf": form_csrf(again.text), "token": token},
                                      headers=origin(other))
            assert second.status_code == 401 and "unknown, used or expired" in second.text
        # Sign out: the cookie no longer opens anything.
        cookie = client.cookies["talon_ui"]
        out = await client.post("/ui/signout", data={"csrf": csrf}, headers=origin(client))
        assert out.status_code == 303
        async with client_for(runtime) as replay:
            replay.cookies.set("talon_ui", cookie, domain="127.0.0.1", path="/ui/")
            assert (await replay.get("/ui/")).status_code == 303
        # A session idle longer than TALON_UI_SESSION_IDLE is gone too.
        store = runtime.panel.store  # type: ignore[union-attr]
        from talon.ui.security import new_token, token_hash

        stale = new_token()
        old = time.time() - settings.ui_session_idle_s - 5
        await store.add_session(PanelSession(token_hash(stale), new_token(), "password", "127.0.0.1", old, old))
        async with client_for(runtime) as idle:
            idle.cookies.set("talon_ui", stale, domain="127.0.0.1", path="/ui/")
            assert (await idle.get("/ui/")).status_code == 303
            assert await store.session(token_hash(stale)) is None


def test_the_panel_on_a_network_address_without_a_password_is_refused_naming_the_fix(tmp_path: Path) -> None:
    from talon.errors import ConfigError
    from talon.preflight import _CHECKS
    from talon.ui.security import check_ui_settings, ui_enabled

    base = dict(TALON_UI="true", TALON_HTTP_HOST="0.0.0.0", TALON_DATA_DIR=str(tmp_path / "d"),
                TALON_MEDIA_ROOT=str(tmp_path / "m"))
    settings = Settings(_env_file=None, **base)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as refused:
        check_ui_settings(settings)
    assert "talon ui password" in str(refused.value)
    [(_, check)] = [(area, check) for area, check in _CHECKS if area == "web panel"]  # what run and doctor ask
    with pytest.raises(ConfigError):
        check(settings)
    # With a password, or on loopback, it may start; unset, it stays off beyond loopback without one.
    made = "$argon2id$v=19$m=65536,t=3,p=4$FuWFBjUwjaNzvgAtdH/67A$d1IJ/fdfjd2IvjvytVPWimpVM4F4+gdACRimCUsNp2I"
    check_ui_settings(Settings(_env_file=None, **{**base, "TALON_UI_PASSWORD_HASH": made}))  # type: ignore[arg-type]
    with pytest.raises(ConfigError):  # not an argon2 hash: a password pasted by mistake
        check_ui_settings(Settings(_env_file=None, **{**base, "TALON_UI_PASSWORD_HASH": "hunter2"}))  # type: ignore[arg-type]
    check_ui_settings(Settings(_env_file=None, **{**base, "TALON_HTTP_HOST": "127.0.0.1"}))  # type: ignore[arg-type]
    open_net = Settings(_env_file=None, **{**base, "TALON_UI": ""} | {"TALON_HTTP_HOST": "0.0.0.0"})  # type: ignore[arg-type]
    assert ui_enabled(open_net.model_copy(update={"ui": None}), http_runs=True) is False
    assert ui_enabled(open_net.model_copy(update={"ui": None, "http_host": "127.0.0.1"}), http_runs=True) is True


async def test_web_chat_checks_the_whole_batch_before_anything_is_stored_or_sent(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    llm.queue("I see a red square.")
    settings = panel_settings(tmp_path, tg.base_url, llm.base_url, TALON_MODEL_VISION="true")
    async with running_panel(settings) as runtime, client_for(runtime) as client:
        csrf = page_csrf((await sign_in(client)).text)
        headers = {**origin(client), "X-CSRF-Token": csrf}
        objects = tmp_path / "data" / "attachments"

        def stored() -> int:
            return sum(1 for p in objects.rglob("*") if p.is_file()) if objects.exists() else 0

        before = stored()
        svg = b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>'
        big = png(8, 8) + b"\0" * (6 * 1024 * 1024)  # 6 MiB: over the 5 MiB an image may be
        jpeg_declared_png = io.BytesIO()
        Image.new("RGB", (4, 4)).save(jpeg_declared_png, "JPEG")
        cases = [
            ([("image", ("a.svg", svg, "image/svg+xml"))], 415, "a.svg"),
            ([("image", ("ok.png", png(), "image/png")), ("image", ("big.png", big, "image/png"))], 413, "big.png"),
            ([("image", ("fake.png", jpeg_declared_png.getvalue(), "image/png"))], 422, "fake.png"),
            ([("image", ("broken.png", png()[:40], "image/png"))], 422, "broken.png"),
            ([("image", (f"{n}.png", png(), "image/png")) for n in range(11)], 413, "10.png"),
        ]
        for files, status, name in cases:
            answer = await client.post("/ui/api/chat/send", data={"text": "look"}, files=files, headers=headers)
            assert answer.status_code == status, (name, answer.text)
            assert answer.json()["file"] == name and answer.json()["error"]
        assert stored() == before and llm.requests == []
        # Without the header token, nothing either (a multipart form carries no CSRF field read).
        forged = await client.post("/ui/api/chat/send", data={"text": "hi", "csrf": csrf},
                                   files=[("image", ("ok.png", png(), "image/png"))], headers=origin(client))
        assert forged.status_code == 403 and llm.requests == []
        # A good batch: stored, then sent; the model gets the caption and the pixels.
        answer = await client.post("/ui/api/chat/send", data={"text": "what colour?"},
                                   files=[("image", ("red.png", png(16, 12), "image/png"))], headers=headers)
        assert answer.status_code == 200, answer.text
        [sha] = answer.json()["images"]
        [request] = await llm.wait_for_requests(1)
        user = [m for m in request.json["messages"] if m["role"] == "user"][-1]
        parts = user["content"]
        assert any(p.get("type") == "text" and "what colour?" in p["text"] for p in parts)
        [image] = [p for p in parts if p.get("type") == "image_url"]
        import base64

        data = base64.b64decode(image["image_url"]["url"].split(",", 1)[1])
        with Image.open(io.BytesIO(data)) as got:
            assert got.size == (16, 12) and got.convert("RGB").getpixel((3, 3)) == (200, 30, 40)
        # The image is served to this session (its conversation refers to it) and to nobody else.
        url = f"/ui/attachments/web:operator/{sha}"
        for _ in range(100):
            if (await client.get(url)).status_code == 200:
                break
            await asyncio.sleep(0.05)  # the turn writes the message to the session store
        served = await client.get(url)
        assert served.status_code == 200 and served.headers["Content-Type"] == "image/png"
        async with client_for(runtime) as stranger:
            assert (await stranger.get(url)).status_code == 401
        # Not referenced by another chat: not served through it.
        assert (await client.get(f"/ui/attachments/telegram:{ALICE}/{sha}")).status_code == 404
        # Its object gone from the store: a retryable answer (the page shows a placeholder), no crash.
        [blob] = [p for p in objects.rglob(f"*{sha}*") if p.is_file()]
        blob.unlink()
        gone = await client.get(url)
        assert gone.status_code == 503 and gone.headers["Retry-After"] == "5"


async def test_behind_a_trusted_https_proxy_the_cookie_is_secure_and_actions_reach_the_stores(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    from talon.storage.tasks import ACTIVE, CANCELLED, PAUSED

    settings = panel_settings(tmp_path, tg.base_url, llm.base_url, TALON_UI_TRUST_PROXY="true",
                              TALON_UI_HOSTS="talon.example.org", TALON_PAIRING="true")
    async with running_panel(settings) as runtime, client_for(runtime) as client:
        proxied = {"Host": "talon.example.org", "X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"}
        page = await client.get("/ui/signin", headers=proxied)
        assert "Secure" in page.headers["Set-Cookie"]
        # The browser behind the proxy sends the Secure sign-in cookie back (httpx keeps it off http).
        proxied["Cookie"] = f"talon_ui_pre={form_csrf(page.text)}"
        answer = await client.post("/ui/signin", data={"csrf": form_csrf(page.text), "password": PASSWORD},
                                   headers={**proxied, "Origin": "https://talon.example.org"})
        assert answer.status_code == 303
        assert "Secure" in answer.headers["Set-Cookie"] and "HttpOnly" in answer.headers["Set-Cookie"]
        # An http:// Origin is not this (https) site.
        wrong = await client.post("/ui/signin", data={"csrf": form_csrf(page.text), "password": PASSWORD},
                                  headers={**proxied, "Origin": "http://talon.example.org"})
        assert wrong.status_code == 403
        # Plain loopback from here on (httpx keeps Secure cookies off plain http): a fresh session.
        csrf = page_csrf((await sign_in(client)).text)
        post = origin(client)
        # Access: a pairing request rejected, another approved.
        gate = runtime.bridge.gate
        first = await gate.request_pairing("telegram", "555", "Eve")
        second = await gate.request_pairing("telegram", "666", "Dan")
        assert first is not None and second is not None
        assert first.code in (await client.get("/ui/access")).text
        await client.post("/ui/access/reject", data={"csrf": csrf, "code": first.code}, headers=post)
        await client.post("/ui/access/approve", data={"csrf": csrf, "code": second.code}, headers=post)
        assert await gate.allowed("telegram", ["666"]) and not await gate.allowed("telegram", ["555"])
        assert [p.sender_id for p in await gate.pending()] == []
        await client.post("/ui/access/revoke", data={"csrf": csrf, "channel": "telegram", "sender": "666"},
                          headers=post)
        assert not await gate.allowed("telegram", ["666"])
        # Tasks: pause, resume, run now (due at once), cancel.
        origin_message = InboundMessage(channel="telegram", chat_id=str(ALICE), sender_id=str(ALICE), message_id="1")
        assert runtime.scheduler is not None
        task = await runtime.scheduler.schedule(origin_message, "every 3 hours", "stretch")
        tasks = runtime.stores.tasks  # type: ignore[union-attr]
        for action, status in (("pause", PAUSED), ("resume", ACTIVE)):
            done = await client.post(f"/ui/tasks/{task.id}", data={"csrf": csrf, "action": action}, headers=post)
            assert done.status_code == 303 and (await tasks.get(task.id)).status == status
        before = time.time()
        await client.post(f"/ui/tasks/{task.id}", data={"csrf": csrf, "action": "run"}, headers=post)
        # Due now: the scheduler hands it to the inbox at its next look (or has already).
        current = await tasks.get(task.id)
        assert current.next_run is not None and (current.next_run <= time.time() or current.last_due is not None)
        assert current.last_due is None or current.last_due >= before - 1
        await client.post(f"/ui/tasks/{task.id}", data={"csrf": csrf, "action": "cancel"}, headers=post)
        assert (await tasks.get(task.id)).status == CANCELLED
        audit = (await client.get("/ui/audit")).text
        for action in ("access reject", "access approve", "access revoke", "task pause", "task resume",
                       "task run", "task cancel"):
            assert action in audit, action
        assert "203.0.113.9" in audit  # the address the proxy reported signed in


async def test_a_file_the_agent_sends_in_the_web_chat_arrives_live_and_is_served_to_the_session(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    import json

    settings = panel_settings(tmp_path, tg.base_url, llm.base_url)
    workspace = settings.workspace_dir("web", "operator")
    workspace.mkdir(parents=True, exist_ok=True)
    chart = png(30, 20, (10, 200, 10))
    (workspace / "chart.png").write_bytes(chart)
    llm.queue("Here is the chart: ![chart](chart.png)")
    async with running_panel(settings) as runtime, client_for(runtime) as client:
        csrf = page_csrf((await sign_in(client)).text)
        events: list[dict[str, object]] = []
        async with client.stream("GET", "/ui/api/chat/events?after=0") as stream:
            sent = await client.post("/ui/api/chat/send", data={"text": "draw me a chart"},
                                     files=[], headers={**origin(client), "X-CSRF-Token": csrf})
            assert sent.status_code == 200, sent.text
            async for line in stream.aiter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
                    if events[-1]["type"] == "delivered":
                        break
        kinds = [e["type"] for e in events]
        assert "sent" in kinds and "reply" in kinds and "file" in kinds, kinds
        [file] = [e for e in events if e["type"] == "file"]
        assert file["mime"] == "image/png" and file["name"] == "chart.png"
        served = await client.get(f"/ui/attachments/web:operator/{file['sha']}")
        assert served.status_code == 200 and served.content == chart
        async with client_for(runtime) as stranger:
            assert (await stranger.get(f"/ui/attachments/web:operator/{file['sha']}")).status_code == 401


async def test_talon_ui_password_prints_a_hash_the_panel_accepts(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from talon.cli import main
    from talon.ui.security import verify_password

    monkeypatch.setattr("sys.stdin", io.StringIO("too short\n"))
    assert main(["ui", "password"]) == 2
    monkeypatch.setattr("sys.stdin", io.StringIO("a long enough panel password\n"))
    assert main(["ui", "password"]) == 0
    made = capsys.readouterr().out.strip().splitlines()[-1]
    assert made.startswith("$argon2id$") and "a long enough panel password" not in made
    assert verify_password(made, "a long enough panel password") and not verify_password(made, "another one")
    settings = panel_settings(tmp_path, tg.base_url, llm.base_url, TALON_UI_PASSWORD_HASH=made)
    async with running_panel(settings) as runtime, client_for(runtime) as client:
        assert str((await sign_in(client, "a long enough panel password")).url).endswith("/ui/")


async def test_web_chat_is_a_channel_a_model_without_images_is_said_and_stop_stops(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    import json

    settings = panel_settings(tmp_path, tg.base_url, llm.base_url, TALON_MODEL_VISION="false")
    llm.queue("I cannot see pictures, but I read your words.")
    async with running_panel(settings) as runtime, client_for(runtime) as client:
        csrf = page_csrf((await sign_in(client)).text)
        headers = {**origin(client), "X-CSRF-Token": csrf}

        async def events_until(kind: str, after: int) -> list[dict[str, object]]:
            seen: list[dict[str, object]] = []
            async with client.stream("GET", f"/ui/api/chat/events?after={after}") as stream:
                async for line in stream.aiter_lines():
                    if line.startswith("data: "):
                        seen.append(json.loads(line[6:]))
                        if seen[-1]["type"] == kind:
                            return seen
            return seen

        waiting = asyncio.ensure_future(events_until("delivered", 0))
        sent = await client.post("/ui/api/chat/send", data={"text": "look at this"},
                                 files=[("image", ("red.png", png(), "image/png"))], headers=headers)
        assert sent.status_code == 200
        events = await asyncio.wait_for(waiting, 20)
        notices = [e for e in events if e["type"] == "notice"]
        assert notices and notices[0]["problem"] and "red.png" in str(notices[0]["text"])
        [request] = llm.requests
        assert "image_url" not in json.dumps(request.json) and "look at this" in json.dumps(request.json)
        # /stop ends a turn in the web chat as in any chat.
        llm.hang = True
        last = int(events[-1]["seq"])  # type: ignore[call-overload]
        await client.post("/ui/api/chat/send", data={"text": "write a long essay"}, headers=headers)
        await llm.wait_for_requests(2)
        waiting = asyncio.ensure_future(events_until("delivered", last))
        await client.post("/ui/api/chat/send", data={"text": "/stop"}, headers=headers)
        events = await asyncio.wait_for(waiting, 20)
        llm.hang = False
        replies = " ".join(str(e.get("text")) for e in events if e["type"] == "reply")
        assert "stop" in replies.lower(), events
