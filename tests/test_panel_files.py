"""Files the agent sends, in the panel (issue 29): in the web chat they are kept in the attachment
store and remembered in the panel store, so a reload, a restart or another worker shows and
serves them; in any chat's page, a file a reply refers to is downloadable from the chat's
workspace, to a signed-in session only, and nothing else is (attack tries kept here)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

from PIL import Image

from talon.content import Message, TextBlock
from talon.storage.sessions import ChatKey
from tests.conftest import ALICE
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram
from tests.support.panel import client_for, page_csrf, panel_settings, running_panel, sign_in


def png(width: int, height: int, color: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "PNG")
    return out.getvalue()


def reply(text: str) -> Message:
    return Message(role="assistant", content=[TextBlock(text=text)])  # type: ignore[arg-type]


async def test_a_file_sent_in_the_web_chat_shows_after_a_reload_and_a_restart_from_the_attachment_store(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = panel_settings(tmp_path, tg.base_url, llm.base_url)
    workspace = settings.workspace_dir("web", "operator")
    workspace.mkdir(parents=True, exist_ok=True)
    chart = png(30, 20, (10, 200, 10))
    (workspace / "chart.png").write_bytes(chart)
    (workspace / "notes.csv").write_bytes(b"a,b\n1,2\n")
    llm.queue("Here: ![chart](chart.png) and ![data](notes.csv)")
    async with running_panel(settings) as runtime, client_for(runtime) as client:
        csrf = page_csrf((await sign_in(client)).text)
        events: list[dict[str, object]] = []
        async with client.stream("GET", "/ui/api/chat/events?after=0") as stream:
            sent = await client.post("/ui/api/chat/send", data={"text": "draw me a chart"},
                                     headers={"Origin": str(client.base_url).rstrip("/"), "X-CSRF-Token": csrf})
            assert sent.status_code == 200, sent.text
            async for line in stream.aiter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
                    if events[-1]["type"] == "delivered":
                        break
        files = {str(e["name"]): str(e["sha"]) for e in events if e["type"] == "file"}
        assert set(files) == {"chart.png", "notes.csv"}
        page = await client.get("/ui/chat")
        assert f'src="/ui/attachments/web:operator/{files["chart.png"]}"' in page.text  # an image, inline
        assert f'href="/ui/attachments/web:operator/{files["notes.csv"]}" download' in page.text
    # The workspace copies are gone: what is shown now comes from the attachment store alone,
    # through a Talon that never delivered them (another worker, or after a restart).
    (workspace / "chart.png").unlink()
    (workspace / "notes.csv").unlink()
    async with running_panel(settings) as runtime, client_for(runtime) as client:
        assert (await client.get(f"/ui/attachments/web:operator/{files['chart.png']}")).status_code == 401
        await sign_in(client)
        page = await client.get("/ui/chat")
        assert f'src="/ui/attachments/web:operator/{files["chart.png"]}"' in page.text
        served = await client.get(f"/ui/attachments/web:operator/{files['chart.png']}")
        assert served.status_code == 200 and served.content == chart
        data = await client.get(f"/ui/attachments/web:operator/{files['notes.csv']}")
        assert data.status_code == 200 and data.content == b"a,b\n1,2\n"
        assert data.headers["Content-Disposition"].startswith("attachment")
        # The chat's page in /ui/chats shows them the same way.
        chat = await client.get("/ui/chats/web:operator")
        assert f'/ui/attachments/web:operator/{files["chart.png"]}' in chat.text
        # An object of the store another chat has never referenced is not served here.
        assert (await client.get(f"/ui/attachments/telegram:{ALICE}/{files['chart.png']}")).status_code == 404


async def test_files_the_agent_sent_on_another_channel_download_from_the_workspace_and_nothing_else_does(
        tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path) -> None:
    settings = panel_settings(tmp_path, tg.base_url, llm.base_url)
    alice, bob = ChatKey("telegram", str(ALICE)), ChatKey("telegram", "222")
    mine = settings.workspace_dir(alice.channel, alice.chat_id)
    theirs = settings.workspace_dir(bob.channel, bob.chat_id)
    for d in (mine, theirs):
        d.mkdir(parents=True, exist_ok=True)
    (mine / "out").mkdir()
    (mine / "out" / "report.pdf").write_bytes(b"%PDF-1.4 the report")
    (mine / "unsent.txt").write_text("never referenced")
    outside = tmp_path / "outside-secret.txt"
    outside.write_text("outside the workspace")
    (mine / "link.txt").symlink_to(outside)
    (mine / "hard.txt").write_text("x")
    os.link(mine / "hard.txt", tmp_path / "hard-elsewhere.txt")
    (theirs / "bob.txt").write_text("bob's file")
    async with running_panel(settings) as runtime, client_for(runtime) as client:
        await runtime.sessions.append(alice, reply(
            "Done: ![report](out/report.pdf) ![l](link.txt) ![h](hard.txt) ![up](../../outside-secret.txt) "
            f"![abs]({outside}) ![url](http://127.0.0.1:1/x) ![bob](../../telegram/222/bob.txt)"))
        await runtime.sessions.append(bob, reply("Yours: ![bob](bob.txt)"))
        url = f"/ui/files/telegram:{ALICE}"
        # No session: 401, nothing read.
        anonymous = await client.get(url, params={"path": "out/report.pdf"})
        assert anonymous.status_code == 401 and b"report" not in anonymous.content
        await sign_in(client)
        page = await client.get(f"/ui/chats/telegram:{ALICE}")
        assert f'href="{url}?path=out/report.pdf" download' in page.text
        got = await client.get(url, params={"path": "out/report.pdf"})
        assert got.status_code == 200 and got.content == b"%PDF-1.4 the report"
        assert got.headers["Content-Disposition"] == 'attachment; filename="report.pdf"'
        assert got.headers["Content-Type"].startswith("application/octet-stream")
        assert "sandbox" in got.headers["Content-Security-Policy"]
        refused = ["unsent.txt",  # in the workspace but no reply refers to it
                   "link.txt", "hard.txt", "../../outside-secret.txt", str(outside), "http://127.0.0.1:1/x",
                   "../../telegram/222/bob.txt",  # another chat's workspace, through ..
                   "out/../out/report.pdf", "out//report.pdf", "/etc/passwd", "", "x" * 2000]
        for path in refused:
            answer = await client.get(url, params={"path": path})
            assert answer.status_code == 404, path
            assert b"outside the workspace" not in answer.content and b"bob's file" not in answer.content
        # Bob's reference is served in Bob's chat, never through Alice's.
        assert (await client.get("/ui/files/telegram:222", params={"path": "bob.txt"})).content == b"bob's file"
        assert (await client.get(url, params={"path": "bob.txt"})).status_code == 404
        assert (await client.get("/ui/files/telegram:222", params={"path": "out/report.pdf"})).status_code == 404
