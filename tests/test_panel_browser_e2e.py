"""The web panel in a real browser: Debian's headless Chromium driven by Playwright for Python,
against Talon with the fake Bot API and the fake model.

One browser for the module (tests/support/browser.py); each test signs in in its own context.
Every page visited is searched for the secrets, must load with no JavaScript error (a CSP
violation is one) and no request to another origin, and is kept as a screenshot (a directory of
the pytest run, or ``TALON_UI_SCREENSHOTS``).
"""

from __future__ import annotations

import base64
import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from talon.envelope import InboundMessage
from tests.conftest import ALICE, TOKEN, settings_env
from tests.fakes.openai_server import FakeOpenAI, decode_data_url, image_urls, last_user_text
from tests.fakes.telegram import FakeTelegram
from tests.support.browser import BrowserThread, Tab, chromium_or_skip, shots_dir
from tests.support.panel import PASSWORD, base_url, panel_settings, running_panel

FIXTURES = Path(__file__).parent / "fixtures"
ALL_PAGES = ["/ui/", "/ui/chats", "/ui/chat", "/ui/approvals", "/ui/tasks", "/ui/usage", "/ui/access", "/ui/logs",
             "/ui/settings", "/ui/audit"]


@pytest.fixture(scope="module")
def chromium() -> Iterator[BrowserThread]:
    browser = BrowserThread(chromium_or_skip())
    yield browser
    browser.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shots_dir(tmp_path_factory)


def image_bytes(width: int, height: int, color: tuple[int, int, int], fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, fmt)
    return out.getvalue()


def secrets(settings: Any) -> list[str]:
    return [TOKEN, settings.openai_api_key, settings.ui_password_hash]


def sign_in(tab: Tab, password: str = PASSWORD) -> None:
    tab.visit("/ui/signin", "signin")
    tab.page.fill("input[name=password]", password)
    tab.page.click("form.signin button[type=submit]")
    tab.page.wait_for_load_state("load")


async def open_tab(chromium: BrowserThread, runtime: Any, shots: Path, settings: Any, name: str) -> Tab:
    folder = shots / name
    folder.mkdir(exist_ok=True)
    return await chromium.run(Tab, chromium, base_url(runtime), folder, secrets(settings))


async def test_sign_in_and_see_a_chat_with_its_photo_and_voice_note_and_the_reported_tokens(
        chromium: BrowserThread, shots: Path, tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = panel_settings(tmp_path, tg.base_url, llm.base_url, TALON_TRANSCRIBER="openai",
                              TALON_MODEL_VISION="true", TALON_VOICE_REPLIES="off")
    llm.transcription_text = "remind me to water the plants"
    llm.queue(FakeOpenAI.reply("Nice photo.", usage={"prompt_tokens": 1200, "completion_tokens": 34}),
              FakeOpenAI.reply("Noted.", usage={"prompt_tokens": 1300, "completion_tokens": 21}))
    async with running_panel(settings) as runtime:
        tg.push_update(tg.photo_message(ALICE, data=image_bytes(1280, 960, (20, 120, 200), "JPEG"),
                                        caption="my view", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: "Nice photo." in str(c.params.get("text")))
        tg.push_update(tg.voice_message(ALICE, data=(FIXTURES / "speech_fox.ogg").read_bytes(), duration=3,
                                        user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: "Noted." in str(c.params.get("text")))
        tab = await open_tab(chromium, runtime, shots, settings, "chat_and_usage")

        def look() -> dict[str, Any]:
            page = tab.page
            sign_in(tab, "not the password at all")
            assert "Wrong password." in page.inner_text("p.error")
            assert page.url.endswith("/ui/signin")
            # The refusal is a 401 (the browser logs it as a failed load): the one error expected.
            assert all("401" in e for e in tab.errors) and len(tab.errors) == 2, tab.errors
            tab.errors.clear()
            sign_in(tab)
            assert page.url.endswith("/ui/"), page.url
            tab.check("/ui/ after sign-in")
            page.click("nav a[href='/ui/chats']")
            page.wait_for_load_state("load")
            page.click(f"a[href='/ui/chats/telegram:{ALICE}']")
            page.wait_for_load_state("load")
            tab.check("the chat page")
            page.wait_for_function("() => [...document.querySelectorAll('img.thumb')].every(i => i.complete "
                                   "&& i.naturalWidth > 0)")
            box = page.locator("img.thumb").first.bounding_box()
            natural = page.evaluate("() => [document.querySelector('img.thumb').naturalWidth, "
                                    "document.querySelector('img.thumb').naturalHeight]")
            transcript = page.inner_text("q.transcript")
            tab.shot("chat")
            page.locator("img.thumb").first.dblclick()
            page.wait_for_selector("dialog#viewer[open]")
            tab.shot("chat_image_dialog")
            page.keyboard.press("Escape")
            page.wait_for_selector("dialog#viewer:not([open])", state="attached")
            # The stored object gone: the page shows a placeholder that tries again when clicked.
            sha = str(page.get_attribute("img.thumb", "src")).rsplit("/", 1)[1]
            held = {p: p.read_bytes() for p in (tmp_path / "data" / "attachments").rglob(f"*{sha}*") if p.is_file()}
            assert held
            for path in held:
                path.unlink()
            page.reload()
            page.wait_for_selector(".placeholder")
            placeholder = page.inner_text(".placeholder")
            tab.shot("chat_missing_image")
            assert tab.errors and all("503" in e for e in tab.errors), tab.errors  # the answer for it
            tab.errors.clear()
            for path, data in held.items():
                path.write_bytes(data)
            page.click(".placeholder")
            page.wait_for_function("() => { const i = document.querySelector('img.thumb'); "
                                   "return i && i.complete && i.naturalWidth > 0; }")
            return {"box": box, "natural": natural, "transcript": transcript, "placeholder": placeholder}

        seen = await chromium.run(look)
        # Live: a message that arrives while the page is open appears without a reload.
        llm.queue(FakeOpenAI.reply("Watered.", usage={"prompt_tokens": 1400, "completion_tokens": 5}))
        tg.push_update(tg.text_message(ALICE, "a message sent while the page is open", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: "Watered." in str(c.params.get("text")))

        def live_and_pages() -> dict[str, Any]:
            page = tab.page
            page.wait_for_selector("article.msg.user >> text=a message sent while the page is open")
            page.wait_for_selector("article.msg.assistant >> text=Watered.")
            tab.shot("chat_live")
            usage = ""
            for path in ALL_PAGES:
                tab.visit(path)
                if path == "/ui/usage":
                    usage = page.inner_text("main")
            tab.clean()
            return {"usage": usage}

        seen.update(await chromium.run(live_and_pages))
        await chromium.run(tab.close)
    assert seen["transcript"] == "remind me to water the plants"
    assert "image unavailable" in seen["placeholder"] and "retry" in seen["placeholder"]
    box, (width, height) = seen["box"], seen["natural"]
    assert box["width"] <= 240 and box["height"] <= 240
    assert abs(box["width"] / box["height"] - width / height) < 0.02  # the aspect is kept
    assert f"telegram:{ALICE}" in seen["usage"]
    assert f"{1200 + 34 + 1300 + 21 + 1400 + 5:,}" in seen["usage"]  # the tokens the model reported
    assert sorted(p.name for p in (shots / "chat_and_usage").glob("*.png")) != []


async def test_approve_a_shell_call_and_cancel_a_task_from_the_panel(
        chromium: BrowserThread, shots: Path, tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = panel_settings(tmp_path, tg.base_url, llm.base_url, TALON_SHELL_TOOL="true",
                              TALON_SHELL_UNSANDBOXED="true")

    def answer_with_output(request: dict[str, Any]) -> str:
        results = [str(m.get("content")) for m in request["messages"] if m.get("role") == "tool"]
        return f"The command said: {results[-1].strip()}"

    llm.queue(FakeOpenAI.tool_call("shell", {"command": "echo panel-$((6*7))"}), answer_with_output)
    async with running_panel(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "run the thing", user_id=ALICE))
        await tg.wait_for("sendMessage", lambda c: bool(c.params.get("reply_markup")))
        assert runtime.scheduler is not None
        origin = InboundMessage(channel="telegram", chat_id=str(ALICE), sender_id=str(ALICE), message_id="1",
                                sender_name="Alice")
        task = await runtime.scheduler.schedule(origin, "every 2 hours", "water the plants")
        tab = await open_tab(chromium, runtime, shots, settings, "approvals_tasks")

        def approve() -> str:
            sign_in(tab)
            tab.visit("/ui/approvals", "approvals_pending")
            assert "echo panel-$((6*7))" in tab.page.inner_text(".approval pre")
            tab.page.click(".approval button.approve")
            tab.page.wait_for_selector("p.note")
            tab.check("/ui/approvals after Approve")
            tab.shot("approvals_decided")
            return tab.page.inner_text("main")

        after = await chromium.run(approve)
        assert "Approved." in after and "approved" in after and "panel (operator" in after
        # The turn went on: the model got the command's output and answered with it.
        await tg.wait_for("sendMessage", lambda c: str(c.params.get("text")).startswith("The command said:")
                          and "panel-42" in str(c.params.get("text")))

        tg.push_update(tg.text_message(ALICE, "/tasks", user_id=ALICE))
        [listed] = await tg.wait_for("sendMessage", lambda c: task.id in str(c.params.get("text")))

        def cancel() -> str:
            tab.visit("/ui/tasks", "tasks_before")
            tab.page.click(f"tr[data-task='{task.id}'] form:has(input[value='cancel']) button")
            tab.page.wait_for_selector("p.note")
            tab.check("/ui/tasks after Cancel")
            tab.shot("tasks_after")
            tab.clean()
            return tab.page.inner_text("main")

        after = await chromium.run(cancel)
        assert f"Task {task.id}: cancel done." in after
        sent = len(await tg.wait_for("sendMessage"))
        tg.push_update(tg.text_message(ALICE, "/tasks", user_id=ALICE, message_id=9001))
        replies = await tg.wait_for("sendMessage", count=sent + 1)
        before = [line for line in str(listed.params["text"]).splitlines() if task.id in line]
        now = [line for line in str(replies[-1].params["text"]).splitlines() if task.id in line]
        assert before and not any("cancelled" in line for line in before)
        # Gone from the chat's scheduled tasks: listed only among the finished ones, as cancelled.
        assert now and all(line.endswith("cancelled") for line in now)
        assert "Scheduled tasks (" not in str(replies[-1].params["text"])
        await chromium.run(tab.close)


async def test_web_chat_takes_a_pasted_image_with_a_caption_and_refuses_what_it_must(
        chromium: BrowserThread, shots: Path, tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = panel_settings(tmp_path, tg.base_url, llm.base_url, TALON_MODEL_VISION="true")
    llm.queue("The picture is a wide orange rectangle, and that is all there is to it.")
    picture = image_bytes(600, 300, (250, 130, 20))
    async with running_panel(settings) as runtime:
        tab = await open_tab(chromium, runtime, shots, settings, "web_chat")

        def paste_and_send() -> None:
            page = tab.page
            sign_in(tab)
            tab.visit("/ui/chat", "chat_empty")
            page.evaluate("""([data, name]) => {
                const bytes = Uint8Array.from(atob(data), c => c.charCodeAt(0));
                const dt = new DataTransfer();
                dt.items.add(new File([bytes], name, {type: "image/png"}));
                document.getElementById("text").dispatchEvent(
                    new ClipboardEvent("paste", {clipboardData: dt, bubbles: true, cancelable: true}));
            }""", [base64.b64encode(picture).decode(), "orange.png"])
            page.wait_for_selector("#thumbs figure img")
            thumb = page.locator("#thumbs figure").first.bounding_box()
            assert thumb is not None and 70 <= thumb["width"] <= 76 and 70 <= thumb["height"] <= 76
            page.fill("#text", "what is in this picture?")
            tab.shot("chat_draft")
            # Watch the live answer as it is written (the page's own script fills #streaming).
            page.evaluate("""() => {
                window.streamed = [];
                const live = document.querySelector('#streaming .text');
                new MutationObserver(() => window.streamed.push(live.textContent))
                    .observe(live, {childList: true, characterData: true, subtree: true});
            }""")
            page.click("#send")
            page.wait_for_function("() => document.querySelector('#text').value === ''")
            page.wait_for_selector("article.msg.assistant >> text=wide orange rectangle", timeout=20000)
            tab.shot("chat_answered")
            return page.evaluate("() => window.streamed")

        streamed = await chromium.run(paste_and_send)
        answer = "The picture is a wide orange rectangle, and that is all there is to it."
        growing = [s for s in streamed if s]
        assert len(growing) >= 2 and growing[0] != answer and answer.startswith(growing[0]), streamed
        [request] = await llm.wait_for_requests(1)
        assert "what is in this picture?" in last_user_text(request)
        mime, data = decode_data_url(image_urls(request)[-1])
        with Image.open(io.BytesIO(data)) as got:
            assert got.size == (600, 300) and got.convert("RGB").getpixel((300, 150)) == (250, 130, 20)

        def reload_and_refuse() -> dict[str, Any]:
            page = tab.page
            page.reload()
            page.wait_for_load_state("load")
            tab.check("/ui/chat after reload")
            page.wait_for_function("() => { const i = document.querySelector('article.msg.user img.thumb'); "
                                   "return i && i.complete && i.naturalWidth > 0; }")
            box = page.locator("article.msg.user img.thumb").first.bounding_box()
            src = page.get_attribute("article.msg.user img.thumb", "src")
            tab.shot("chat_history")
            # An SVG dropped on the composer: refused there, never sent.
            page.fill("#text", "keep this draft")
            page.evaluate("""() => {
                const dt = new DataTransfer();
                dt.items.add(new File(['<svg xmlns="http://www.w3.org/2000/svg"></svg>'], "x.svg", {type: "image/svg+xml"}));
                const box = document.getElementById("composer");
                box.dispatchEvent(new DragEvent("dragover", {dataTransfer: dt, bubbles: true, cancelable: true}));
                window.highlighted = box.classList.contains("dragging");
                box.dispatchEvent(new DragEvent("drop", {dataTransfer: dt, bubbles: true, cancelable: true}));
            }""")
            highlighted = page.evaluate("() => window.highlighted && !document.getElementById('composer')"
                                        ".classList.contains('dragging')")
            page.wait_for_selector("#composer-error:not([hidden])")
            svg_error = page.inner_text("#composer-error")
            svg_thumbs = page.locator("#thumbs figure").count()
            # A 6 MiB PNG: the composer takes it, the server refuses the batch, the draft stays.
            page.evaluate("""() => {
                const head = Uint8Array.from([137, 80, 78, 71, 13, 10, 26, 10]);
                const big = new Uint8Array(6 * 1024 * 1024); big.set(head);
                const dt = new DataTransfer();
                dt.items.add(new File([big], "huge.png", {type: "image/png"}));
                document.getElementById("text").dispatchEvent(
                    new ClipboardEvent("paste", {clipboardData: dt, bubbles: true, cancelable: true}));
            }""")
            page.wait_for_selector("#thumbs figure")
            page.click("#send")
            page.wait_for_function("() => document.querySelector('#composer-error').textContent.includes('huge.png')")
            tab.shot("chat_refused")
            # The server's refusal is a 413 (logged by the browser as a failed load): expected.
            assert len(tab.errors) == 2 and all("413" in e for e in tab.errors), tab.errors
            tab.errors.clear()
            result = {"box": box, "src": src, "svg_error": svg_error, "svg_thumbs": svg_thumbs,
                      "big_error": page.inner_text("#composer-error"), "draft": page.input_value("#text"),
                      "thumbs": page.locator("#thumbs figure").count(), "highlighted": highlighted}
            # Each image in the draft can be removed.
            page.click("#thumbs figure button")
            result["after_remove"] = page.locator("#thumbs figure").count()
            tab.clean()  # nothing wrong so far
            # The CSP is what keeps every page to Talon: an image from elsewhere and an inline
            # script put into the page are both refused by the browser, and nothing leaves.
            with page.expect_event("requestfailed", lambda r: "example.org" in r.url):
                result["blocked"] = page.evaluate("""() => new Promise(done => {
                    const seen = [];
                    document.addEventListener("securitypolicyviolation", e => {
                        seen.push(e.violatedDirective);
                        if (seen.length === 2) done(seen.sort());
                    });
                    const img = document.createElement("img");
                    img.src = "https://example.org/tracker.png";
                    document.body.append(img);
                    const script = document.createElement("script");
                    script.textContent = "window.ran = true";
                    document.body.append(script);
                })""")
            result["ran"] = page.evaluate("() => window.ran === true")
            result["foreign"] = list(tab.foreign)
            result["refused"] = list(tab.blocked)
            # The two violations just provoked are logged as console errors: those, and nothing else.
            assert tab.errors and all("Content Security Policy" in e for e in tab.errors), tab.errors
            tab.errors.clear()
            tab.clean()
            return result

        seen = await chromium.run(reload_and_refuse)
        assert seen["box"]["width"] <= 240 and seen["box"]["height"] <= 240
        assert abs(seen["box"]["width"] / seen["box"]["height"] - 2.0) < 0.02
        assert "x.svg" in seen["svg_error"] and seen["svg_thumbs"] == 0
        assert "huge.png" in seen["big_error"] and "MiB" in seen["big_error"]
        assert seen["draft"] == "keep this draft" and seen["thumbs"] == 1 and seen["after_remove"] == 0
        assert seen["highlighted"]  # the drop target was highlighted while dragging, not after
        assert seen["blocked"] == ["img-src", "script-src-elem"] and not seen["ran"]
        assert seen["foreign"] == seen["refused"] == ["https://example.org/tracker.png"]  # refused, never sent
        assert len(llm.requests) == 1  # neither refusal reached the model

        # The image's URL answers nothing without a session.
        def stranger() -> tuple[int, bytes]:
            other = chromium.browser.new_context(base_url=tab.base)
            try:
                answer = other.request.get(seen["src"], max_redirects=0)
                return answer.status, answer.body()
            finally:
                other.close()

        status, body = await chromium.run(stranger)
        assert status == 401 and picture[:16] not in body
        await chromium.run(tab.close)


def test_talon_run_refuses_the_panel_on_a_network_address_without_a_password(tmp_path: Path) -> None:
    env = {**os.environ, **settings_env(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9"),
           "TALON_UI": "true", "TALON_HTTP_HOST": "0.0.0.0", "TALON_HTTP_PORT": "0",
           "PYTHONPATH": str(Path(__file__).parents[1])}
    env.pop("TALON_UI_PASSWORD_HASH", None)
    done = subprocess.run([sys.executable, "-m", "talon.cli", "run"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0
    assert "talon ui password" in done.stderr and "TALON_UI_PASSWORD_HASH" in done.stderr
