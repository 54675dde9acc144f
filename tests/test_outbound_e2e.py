"""Outbound files and formatting end to end: the agent's reply (from the fake model) goes through
the bridge's extractor and the real python-telegram-bot client to the fake Bot API, which records
every upload. The files are real media made in the media root for each test."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

from channels.console import ConsoleChannel
from channels.telegram import MediaPart, NoticePart, TelegramChannel, TextPart, plan_parts
from tests.pdfs import pdf_bytes
from talon.bridge import prepare_reply
from talon.config import Limits, Settings
from talon.envelope import OutboundReply
from talon.errors import DeliveryError
from talon.media import MarkdownMediaRef
from tests.conftest import ALICE
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import Call, FakeTelegram
from tests.conftest import running_telegram as running
from tests.support.images import png_file as png
from tests.support.telegram import root

UPLOADS = ("sendPhoto", "sendDocument", "sendVoice", "sendAudio", "sendVideo", "sendAnimation",
           "sendMediaGroup")


# --- real media ---------------------------------------------------------------------------------


def jpeg(path: Path, color: tuple[int, int, int] = (30, 90, 200)) -> bytes:
    Image.new("RGB", (80, 60), color).save(path, "JPEG", quality=90)
    return path.read_bytes()


def gif(path: Path) -> bytes:
    frames = [Image.new("P", (24, 24), i * 50) for i in range(3)]
    frames[0].save(path, "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    return path.read_bytes()


def pdf(path: Path) -> bytes:
    data = pdf_bytes([None])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data


def _tone(rate: int, seconds: float = 0.6) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (np.sin(2 * np.pi * 440 * t) * 9000).astype(np.int16).reshape(1, -1)


def audio(path: Path, container: str, codec: str, rate: int) -> bytes:
    with av.open(str(path), "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate)
        stream.layout = "mono"  # type: ignore[attr-defined]
        frame = av.AudioFrame.from_ndarray(_tone(rate), format="s16", layout="mono")
        frame.sample_rate = rate
        for packet in stream.encode(frame):  # type: ignore[attr-defined]
            out.mux(packet)
        for packet in stream.encode(None):  # type: ignore[attr-defined]
            out.mux(packet)
    return path.read_bytes()


def mp4(path: Path) -> bytes:
    with av.open(str(path), "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"  # type: ignore[attr-defined]
        for i in range(10):
            rgb = np.full((48, 64, 3), i * 20, dtype=np.uint8)
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p")
            for packet in stream.encode(frame):  # type: ignore[attr-defined]
                out.mux(packet)
        for packet in stream.encode(None):  # type: ignore[attr-defined]
            out.mux(packet)
    return path.read_bytes()


# --- helpers ------------------------------------------------------------------------------------


def to_alice(call: Call) -> bool:
    return str(call.params.get("chat_id")) == str(ALICE)


async def ask(tg: FakeTelegram, runtime, text: str = "go", turn: int = 1) -> None:  # type: ignore[no-untyped-def]
    """Send Alice's message and wait until the bridge has finished delivering the answer."""
    tg.push_update(tg.text_message(ALICE, text, user_id=ALICE))
    await tg.wait_for("sendChatAction", to_alice, count=turn, timeout=20)
    await runtime.bridge.idle()


# Calls that show progress, not the reply: typing, the live draft, the acknowledgement reaction.
COSMETIC = frozenset({"sendChatAction", "sendMessageDraft", "setMessageReaction"})


def sends(tg: FakeTelegram) -> list[Call]:
    """Every successful send to Alice, in order (typing pings left out)."""
    return [c for c in tg.sent(chat_id=ALICE) if c.method not in COSMETIC]


def texts(tg: FakeTelegram) -> list[str]:
    return [c.params["text"] for c in tg.sent("sendMessage", chat_id=ALICE)]


def upload(call: Call):  # type: ignore[no-untyped-def]
    [media] = call.media
    assert media.file is not None
    return media


# --- every kind arrives by its own method, with its bytes and name -----------------------------


async def test_chart_arrives_as_photo_with_its_bytes_name_and_short_caption(
    tg: FakeTelegram, llm: FakeOpenAI, settings: Settings
) -> None:
    data = png(root(settings) / "chart.png", (640, 480))
    llm.queue("Here is the **chart** you asked for.\n\n![chart](chart.png)")
    async with running(settings) as runtime:
        await ask(tg, runtime)
    [call] = sends(tg)
    assert call.method == "sendPhoto"
    photo = upload(call)
    assert photo.file.data == data
    assert photo.file.filename == "chart.png"
    assert photo.file.content_type == "image/png"
    # a short answer rides along as the photo's caption, formatted
    assert photo.caption == "Here is the <b>chart</b> you asked for."
    assert photo.parse_mode == "HTML"


async def test_each_kind_is_sent_by_its_method_in_order(
    tg: FakeTelegram, llm: FakeOpenAI, settings: Settings
) -> None:
    media = root(settings)
    (media / "out").mkdir()
    files = {
        "out/report.pdf": ("sendDocument", pdf(media / "out/report.pdf"), "application/pdf"),
        "note.ogg": ("sendVoice", audio(media / "note.ogg", "ogg", "libopus", 48000), "audio/ogg"),
        "song.mp3": ("sendAudio", audio(media / "song.mp3", "mp3", "libmp3lame", 44100), "audio/mpeg"),
        "clip.mp4": ("sendVideo", mp4(media / "clip.mp4"), "video/mp4"),
        "loop.gif": ("sendAnimation", gif(media / "loop.gif"), "image/gif"),
    }
    refs = "\n".join(f"- {Path(p).stem}: ![{Path(p).stem}]({p})" for p in files)
    llm.queue(f"Everything you asked for:\n\n{refs}")
    async with running(settings) as runtime:
        await ask(tg, runtime)
    calls = sends(tg)
    # several files: the text goes first, on its own, and the files carry no caption
    assert calls[0].method == "sendMessage" and "Everything you asked for" in calls[0].params["text"]
    assert [c.method for c in calls[1:]] == [method for method, _, _ in files.values()]
    for call, (path, (_, data, mime)) in zip(calls[1:], files.items()):
        sent = upload(call)
        assert sent.file.data == data, path
        assert sent.file.filename == Path(path).name
        assert sent.file.content_type == mime
        assert sent.caption is None


async def test_three_images_arrive_as_one_album(tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    media = root(settings)
    data = [png(media / "a.png", color=(255, 0, 0)), jpeg(media / "b.jpg"), png(media / "c.png", color=(0, 255, 0))]
    llm.queue("Three plots.\n\n![a](a.png)\n![b](b.jpg)\n![c](c.png)")
    async with running(settings) as runtime:
        await ask(tg, runtime)
    [call] = sends(tg)
    assert call.method == "sendMediaGroup"
    items = call.media
    assert [m.kind for m in items] == ["photo"] * 3
    assert [m.file.data for m in items if m.file] == data
    assert [m.file.filename for m in items if m.file] == ["a.png", "b.jpg", "c.png"]
    assert items[0].caption == "Three plots." and items[1].caption is None


async def test_album_member_that_cannot_be_resolved_is_reported_and_the_rest_go(
    tg: FakeTelegram, llm: FakeOpenAI, settings: Settings
) -> None:
    media = root(settings)
    png(media / "a.png")
    png(media / "c.png")
    llm.queue("![a](a.png) ![b](gone.png) ![c](c.png)")
    async with running(settings) as runtime:
        await ask(tg, runtime)
    calls = sends(tg)
    assert [c.method for c in calls] == ["sendMediaGroup", "sendMessage"]
    assert len(calls[0].media) == 2
    assert calls[1].params["text"] == "Could not attach gone.png: no such file in this chat's workspace"


async def test_refused_album_is_sent_image_by_image(tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    media = root(settings)
    data = [png(media / "a.png"), png(media / "b.png", color=(0, 0, 255))]
    tg.fail_next("sendMediaGroup", 400, "Bad Request: IMAGE_PROCESS_FAILED")
    llm.queue("Both.\n\n![a](a.png) ![b](b.png)")
    async with running(settings) as runtime:
        await ask(tg, runtime)
    calls = sends(tg)
    assert [c.method for c in calls] == ["sendPhoto", "sendPhoto"]
    assert [upload(c).file.data for c in calls] == data
    assert [upload(c).caption for c in calls] == ["Both.", None]


def test_part_plan_is_deterministic_and_albums_hold_2_to_10() -> None:
    limits = Limits()
    refs = [MarkdownMediaRef(alt=f"i{i}", path=f"img{i}.png") for i in range(12)]
    reply = OutboundReply(text="x" * 2000, media=[*refs, MarkdownMediaRef("r", "r.pdf"),
                                                   MarkdownMediaRef("one", "one.jpg")],
                          notices=["a notice"])
    parts = plan_parts(reply, limits)
    assert parts == plan_parts(reply, limits)  # resume relies on it
    assert isinstance(parts[0], TextPart)  # 2000 chars is over the caption limit: text first
    albums = [p for p in parts if isinstance(p, MediaPart)]
    assert [len(p.refs) for p in albums] == [6, 6, 1, 1]
    assert all(p.caption == "" for p in albums)
    assert parts[-1] == NoticePart("a notice")
    # one media part and a short text: the text is its caption and no message of its own
    short = plan_parts(OutboundReply(text="short", media=refs[:3]), limits)
    assert short == [MediaPart(tuple(refs[:3]), "short")]


# --- formatting -----------------------------------------------------------------------------


async def test_long_reply_with_code_block_arrives_in_messages_with_whole_blocks(
    tg: FakeTelegram, llm: FakeOpenAI, settings: Settings
) -> None:
    code = [f"    if x < {i} and y > {i}: total &= {i}  # step {i}" for i in range(160)]
    text = ("Intro paragraph with *emphasis*. " * 40 + "\n\n```python\ndef f(x, y):\n"
            + "\n".join(code) + "\n```\n\n" + "Closing words, nothing more. " * 60)
    assert len(text) >= 10_000
    llm.queue(text)
    async with running(settings) as runtime:
        await ask(tg, runtime)
    messages = [c.params for c in tg.sent("sendMessage", chat_id=ALICE)]
    assert len(messages) >= 3
    assert sum("<pre>" in m["text"] for m in messages) >= 2  # the long block was cut, and reopened
    for params in messages:
        html = params["text"]
        assert params["parse_mode"] == "HTML"
        assert html.count("<pre>") == html.count("</pre>")
        assert len(html.encode("utf-16-le")) // 2 <= 4096
    joined = "\n".join(m["text"] for m in messages)
    escaped = [line.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") for line in code]
    positions = [joined.index(line) for line in escaped]
    assert positions == sorted(positions)  # every code line arrives, in order
    # each line is inside a code block of its message
    for params in messages:
        outside = re.sub(r"<pre>.*?</pre>", "", params["text"], flags=re.S)
        assert "total &amp;=" not in outside


async def test_refused_html_is_resent_as_plain_text(tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    tg.fail_next("sendMessage", 400, "Bad Request: can't parse entities: unsupported start tag")
    llm.queue("Some **bold** words and `code`.")
    async with running(settings) as runtime:
        await ask(tg, runtime)
    [call] = tg.sent("sendMessage", chat_id=ALICE)
    assert "parse_mode" not in call.params
    assert call.params["text"] == "Some bold words and code."


async def test_refused_caption_html_is_resent_plain(tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    data = png(root(settings) / "chart.png")
    tg.fail_when("sendPhoto", lambda p: p.get("parse_mode") == "HTML",
                 description="Bad Request: can't parse entities: whatever")
    llm.queue("A **bold** caption.\n\n![c](chart.png)")
    async with running(settings) as runtime:
        await ask(tg, runtime)
    [call] = sends(tg)
    photo = upload(call)
    assert photo.file.data == data
    assert photo.caption == "A bold caption." and photo.parse_mode is None


async def test_media_inside_code_is_not_sent(tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    png(root(settings) / "chart.png")
    llm.queue("Write it like this:\n\n```markdown\n![chart](chart.png)\n```\n\nor inline `![chart](chart.png)`.")
    async with running(settings) as runtime:
        await ask(tg, runtime)
    assert not [c for c in sends(tg) if c.method in UPLOADS]
    [text] = texts(tg)
    assert text.count("![chart](chart.png)") == 2


async def test_caption_over_limit_goes_as_text_first(tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    data = png(root(settings) / "chart.png")
    long = "Explanation with emoji 😀 " * 45  # about 1100 UTF-16 units
    llm.queue(f"{long}\n\n![chart](chart.png)")
    async with running(settings) as runtime:
        await ask(tg, runtime)
    calls = sends(tg)
    assert [c.method for c in calls] == ["sendMessage", "sendPhoto"]
    assert "Explanation with emoji" in calls[0].params["text"]
    photo = upload(calls[1])
    assert photo.caption is None and photo.file.data == data


# --- containment and failures ---------------------------------------------------------------


async def test_path_escapes_and_missing_files_become_could_not_attach_lines(
    tg: FakeTelegram, llm: FakeOpenAI, settings: Settings, tmp_path: Path
) -> None:
    media = root(settings)
    outside = tmp_path / "secret"
    outside.mkdir()
    png(outside / "secret.png")
    (media / "link.png").symlink_to(outside / "secret.png")
    (media / "linked_dir").symlink_to(outside, target_is_directory=True)
    png(media / "ok.png")
    llm.queue("Files:\n\n![p](../../etc/passwd)\n\n![a](/etc/passwd)\n\n![l](link.png)\n\n"
              "![d](linked_dir/secret.png)\n\n![m](missing.pdf)\n\n![ok](ok.png)")
    async with running(settings) as runtime:
        await ask(tg, runtime)
    uploads = [c for c in sends(tg) if c.method in UPLOADS]
    # only the legitimate file went out; nothing from outside the root
    assert [(c.method, upload(c).file.filename) for c in uploads] == [("sendPhoto", "ok.png")]
    lines = "\n".join(texts(tg)).splitlines()
    failures = [line for line in lines if line.startswith("Could not attach")]
    assert failures == [
        "Could not attach passwd: paths with '..' are not allowed",
        "Could not attach passwd: it is outside this chat's workspace",
        "Could not attach link.png: it is outside this chat's workspace",
        "Could not attach secret.png: it is outside this chat's workspace",
        "Could not attach missing.pdf: no such file in this chat's workspace",
    ]
    everything = "\n".join(texts(tg))
    assert str(tmp_path) not in everything and "/etc" not in everything


async def test_big_photo_goes_as_document(tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    noise = Image.frombytes("RGB", (2000, 1900), os.urandom(2000 * 1900 * 3))
    path = root(settings) / "huge.png"
    noise.save(path, "PNG", compress_level=0)
    data = path.read_bytes()
    assert len(data) > 10_000_000
    llm.queue("![huge](huge.png)")
    async with running(settings) as runtime:
        await ask(tg, runtime)
    [call] = sends(tg)
    assert call.method == "sendDocument"
    assert upload(call).file.data == data and upload(call).file.filename == "huge.png"
    assert not tg.sent("sendPhoto", include_failed=True)


async def test_refused_photo_falls_back_to_document_with_its_caption(
    tg: FakeTelegram, llm: FakeOpenAI, settings: Settings
) -> None:
    data = png(root(settings) / "wide.png", (2000, 40))
    tg.fail_next("sendPhoto", 400, "Bad Request: PHOTO_INVALID_DIMENSIONS")
    llm.queue("A wide one.\n\n![wide](wide.png)")
    async with running(settings) as runtime:
        await ask(tg, runtime)
    assert len(tg.sent("sendPhoto", include_failed=True)) == 1  # a refusal is not retried
    [call] = sends(tg)
    assert call.method == "sendDocument"
    doc = upload(call)
    assert doc.file.data == data and doc.file.filename == "wide.png" and doc.caption == "A wide one."


async def test_refused_file_gives_a_line_and_the_rest_of_the_reply_goes_on(
    tg: FakeTelegram, llm: FakeOpenAI, settings: Settings
) -> None:
    media = root(settings)
    pdf(media / "report.pdf")
    voice = audio(media / "note.ogg", "ogg", "libopus", 48000)
    tg.fail_next("sendDocument", 400, "Bad Request: wrong file identifier/HTTP URL specified")
    llm.queue("Two files.\n\n![r](report.pdf)\n\n![n](note.ogg)")
    async with running(settings) as runtime:
        await ask(tg, runtime)
    calls = sends(tg)
    assert [c.method for c in calls] == ["sendMessage", "sendMessage", "sendVoice"]
    assert calls[1].params["text"] == ("Could not attach report.pdf: Telegram refused it "
                                       "(Wrong file identifier/http url specified)")
    assert upload(calls[2]).file.data == voice


async def test_file_over_upload_limit_is_a_notice(tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    with open(root(settings) / "dump.bin", "wb") as fh:
        fh.truncate(51_000_000)  # sparse: no real disk use
    llm.queue("The dump: ![dump](dump.bin)")
    async with running(settings) as runtime:
        await ask(tg, runtime)
    assert not [c for c in tg.calls if c.method in UPLOADS]
    assert texts(tg) == ["The dump:",
                         "Could not attach dump.bin: it is 51.0 MB, over Telegram's 50 MB upload limit for bots"]


# --- retries and resume -----------------------------------------------------------------------


async def test_rate_limit_on_photo_is_honoured_and_photo_arrives_once(
    tg: FakeTelegram, llm: FakeOpenAI, settings: Settings
) -> None:
    data = png(root(settings) / "chart.png")
    tg.fail_next("sendPhoto", 429, retry_after=1)
    llm.queue("![chart](chart.png)")
    async with running(settings) as runtime:
        await ask(tg, runtime)
    refused, ok = tg.sent("sendPhoto", include_failed=True)
    assert refused.status == 429 and ok.ok
    assert ok.time - refused.time >= 0.95
    [photo] = tg.media_sent(ALICE)
    assert photo.file is not None and photo.file.data == data  # the retry sent the whole file again


async def test_network_drop_is_retried(tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    data = png(root(settings) / "chart.png")
    tg.drop_connection_next("sendMessage")
    tg.drop_connection_next("sendPhoto")
    llm.queue("x " * 700 + "\n\n![chart](chart.png)")  # over the caption limit: text, then photo
    async with running(settings) as runtime:
        await ask(tg, runtime)
    assert [c.method for c in sends(tg)] == ["sendMessage", "sendPhoto"]
    assert len(tg.sent("sendMessage", include_failed=True)) == 2
    assert upload(tg.sent("sendPhoto")[0]).file.data == data


async def test_resume_after_crash_sends_only_the_remaining_parts(
    tg: FakeTelegram, llm: FakeOpenAI, settings: Settings
) -> None:
    media = root(settings)
    pdf(media / "a.pdf")
    audio(media / "b.ogg", "ogg", "libopus", 48000)
    reply = prepare_reply("Results below.\n\n![a](a.pdf)\n\n![b](b.ogg)")
    async with running(settings) as runtime:
        channel = runtime.channels[0]
        assert isinstance(channel, TelegramChannel)
        assert len(channel.reply_parts(reply)) == 3
        delivered: list[int] = []

        async def crash_after_first(parts: int) -> None:
            delivered.append(parts)
            raise SystemExit("process died")  # after part 1 was recorded

        with pytest.raises(SystemExit):
            await channel.deliver(str(ALICE), reply, on_part=crash_after_first)
        assert delivered == [1]

        async def record(parts: int) -> None:
            delivered.append(parts)

        await channel.deliver(str(ALICE), reply, skip_parts=delivered[-1], on_part=record)
    assert delivered == [1, 2, 3]
    assert [c.method for c in sends(tg)] == ["sendMessage", "sendDocument", "sendVoice"]


async def test_permanent_failure_mid_reply_then_resume_never_duplicates(
    tg: FakeTelegram, llm: FakeOpenAI, settings: Settings
) -> None:
    paragraphs = [f"Paragraph {i}: " + "word " * 700 for i in range(3)]
    reply = prepare_reply("\n\n".join(paragraphs))
    tg.fail_when("sendMessage", lambda p: "Paragraph 1:" in p.get("text", ""), 403,
                 "Forbidden: bot was blocked by the user")
    async with running(settings) as runtime:
        channel = runtime.channels[0]
        assert isinstance(channel, TelegramChannel)
        assert len(channel.reply_parts(reply)) == 3
        progress: list[int] = []

        async def record(parts: int) -> None:
            progress.append(parts)

        with pytest.raises(DeliveryError) as failed:
            await channel.deliver(str(ALICE), reply, on_part=record)
        assert failed.value.permanent and progress == [1]
        await channel.deliver(str(ALICE), reply, skip_parts=progress[-1], on_part=record)
    sent = texts(tg)
    for i in range(3):
        assert sum(f"Paragraph {i}:" in t for t in sent) == 1


async def test_bridge_resumes_an_interrupted_reply_after_restart(
    tg: FakeTelegram, llm: FakeOpenAI, settings: Settings
) -> None:
    media = root(settings)
    doc = pdf(media / "report.pdf")
    pic = png(media / "chart.png")
    llm.queue("Report and chart.\n\n![report](report.pdf)\n\n![chart](chart.png)")
    # Telegram asks for a wait longer than we accept: the delivery stops after the text.
    tg.fail_next("sendDocument", 429, retry_after=600)
    async with running(settings) as runtime:
        # No in-run retry: as if the process stopped before the bridge could try again.
        runtime.bridge.delivery_backoff_s = ()
        await ask(tg, runtime)
    assert [c.method for c in sends(tg)] == ["sendMessage"]
    async with running(settings) as runtime:  # restart: the pending message is picked up again
        await tg.wait_for("sendPhoto", to_alice, timeout=20)
        await runtime.bridge.idle()
    calls = sends(tg)
    assert [c.method for c in calls] == ["sendMessage", "sendDocument", "sendPhoto"]
    assert upload(calls[1]).file.data == doc and upload(calls[2]).file.data == pic
    assert len(llm.requests) == 1  # the answer was replayed from the session, not asked again


# --- console ----------------------------------------------------------------------------------


async def test_console_shows_media_kinds_and_paths(tmp_path: Path) -> None:
    media = tmp_path / "media_root"
    media.mkdir()
    png(media / "chart.png")
    pdf(media / "report.pdf")
    out = io.StringIO()
    console = ConsoleChannel(stdout=out, media_root=media)
    reply = prepare_reply("Done.\n\n![chart](chart.png)\n![r](report.pdf)\n![x](../secret.txt)")
    await console.deliver("local", reply)
    lines = out.getvalue().splitlines()
    assert lines[0] == "talon> Done."
    assert lines[1].startswith(f"[image] {media.resolve() / 'chart.png'} (image/png")
    assert lines[2].startswith(f"[document] {media.resolve() / 'report.pdf'} (application/pdf")
    assert lines[3] == "! Could not attach secret.txt: paths with '..' are not allowed"


async def test_file_the_agent_writes_arrives_in_the_chat(tg: FakeTelegram, llm: FakeOpenAI, settings: Settings) -> None:
    """The whole promise in one turn: the agent writes a file with its tool, references it, and the
    person receives exactly those bytes as a document."""
    csv = "city,temp\nOslo,-3\nLisbon,17\n"
    llm.queue(FakeOpenAI.tool_call("write_file", {"path": "out/weather.csv", "content": csv}))
    llm.queue("Here is the table.\n\n![weather](out/weather.csv)")
    async with running(settings):
        tg.push_update(tg.text_message(ALICE, "make me a csv", user_id=ALICE))
        [doc] = await tg.wait_for("sendDocument", to_alice, timeout=20)
    upload = doc.files["document"]
    assert upload.filename == "weather.csv"
    assert upload.data == csv.encode()
    assert doc.params.get("caption") == "Here is the table."
    tool_reply = [m for m in llm.requests[1].json["messages"] if m["role"] == "tool"][0]
    assert "weather.csv" in tool_reply["content"]


async def test_text_that_renders_to_nothing_does_not_stop_the_files(
    tg: FakeTelegram, llm: FakeOpenAI, settings: Settings
) -> None:
    # A bare "#" (an empty heading) renders to no text at all, which Telegram refuses to send.
    a = pdf(root(settings) / "a.pdf")
    b = pdf(root(settings) / "b.pdf")
    llm.queue("#\n\n![a](a.pdf)\n\n![b](b.pdf)")
    async with running(settings) as runtime:
        await ask(tg, runtime)
    docs = [upload(c).file.data for c in sends(tg) if c.method == "sendDocument"]
    assert docs == [a, b]
