"""Workspace tools: containment (incl. symlinks), every read_file kind, writes, search, shell."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pytest
from PIL import Image

from tests.pdfs import pdf_bytes
from talon.agent.tools.registry import ToolContext, ToolRegistry
from talon.agent.tools.workspace import Workspace
from talon.agent.tools.workspace_tools import workspace_tools
from talon.storage.embedded.attachments import FileAttachments, FileBlobs
from talon.config import Limits
from talon.content import ImageBlock, ToolCall
from tests.support.images import make_video


# --- helpers --------------------------------------------------------------------------------
def png_bytes(color: tuple[int, int, int] = (200, 30, 30), size: tuple[int, int] = (64, 48)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "media_root"
    root.mkdir()
    return root


@pytest.fixture
def tools(ws: Path, tmp_path: Path) -> ToolRegistry:
    store = FileAttachments(tmp_path / "data" / "attachments")
    return workspace_tools(Workspace(ws), store=store, limits=Limits())


async def call(tools: ToolRegistry, name: str, ctx: ToolContext | None = None, **args: object):
    import json

    return await tools.call(ToolCall(id="c1", name=name, arguments=json.dumps(args)), ctx)


# --- containment ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path, reason",
    [
        ("../secret.txt", "'..' is not allowed"),
        ("notes/../../secret.txt", "'..' is not allowed"),
        ("~/secret.txt", "'~'"),
        ("file:///etc/passwd", "is a URL"),
        ("https://example.com/x.png", "is a URL"),
        ("/etc/passwd", "outside the workspace"),
        ("a\x00b", "NUL"),
    ],
)
async def test_tools_refuse_paths_outside_the_workspace(tools: ToolRegistry, path: str, reason: str) -> None:
    for name, extra in (("read_file", {}), ("write_file", {"content": "x"}), ("ls", {})):
        result = await call(tools, name, path=path, **extra)
        assert result.is_error, (name, path)
        assert result.content[0].text.startswith("Error: ") and reason in result.content[0].text


async def test_symlinks_out_of_the_workspace_are_refused(tools: ToolRegistry, ws: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("TOP SECRET")
    (ws / "link.txt").symlink_to(outside / "secret.txt")
    (ws / "linkdir").symlink_to(outside, target_is_directory=True)
    (ws / "dangling.txt").symlink_to(outside / "new.txt")  # does not exist yet

    for name, args in [
        ("read_file", {"path": "link.txt"}),
        ("read_file", {"path": "linkdir/secret.txt"}),
        ("ls", {"path": "linkdir"}),
        ("write_file", {"path": "linkdir/planted.txt", "content": "x"}),
        ("write_file", {"path": "dangling.txt", "content": "x"}),
        ("edit_file", {"path": "link.txt", "old_string": "TOP", "new_string": "NOT"}),
        ("grep", {"pattern": "SECRET", "path": "linkdir"}),
    ]:
        result = await call(tools, name, **args)
        assert result.is_error, (name, args)
        assert "symbolic link" in result.content[0].text and "outside the workspace" in result.content[0].text
        assert "TOP SECRET" not in result.content[0].text
    assert not (outside / "new.txt").exists() and not (outside / "planted.txt").exists()
    assert (outside / "secret.txt").read_text() == "TOP SECRET"
    # Searching the whole workspace does not follow the links out either.
    found = await call(tools, "grep", pattern="SECRET")
    assert "TOP SECRET" not in found.content[0].text
    globbed = await call(tools, "glob", pattern="**/*.txt")
    assert "secret.txt" not in globbed.content[0].text


async def test_symlink_inside_the_workspace_is_fine(tools: ToolRegistry, ws: Path) -> None:
    (ws / "real.txt").write_text("hello\n")
    (ws / "alias.txt").symlink_to(ws / "real.txt")
    result = await call(tools, "read_file", path="alias.txt")
    assert not result.is_error and "hello" in result.content[0].text


async def test_read_only_roots_can_be_read_but_not_written(tools: ToolRegistry, tmp_path: Path) -> None:
    archive_dir = tmp_path / "data" / "sessions" / "telegram" / "1" / "context"
    archive_dir.mkdir(parents=True)
    (archive_dir / "main.archive.md").write_text("# archive\nthe word was pineapple\n")
    ctx = ToolContext(read_only_roots=(archive_dir,))
    read = await call(tools, "read_file", ctx, path=str(archive_dir / "main.archive.md"))
    assert not read.is_error and "pineapple" in read.content[0].text
    grep = await call(tools, "grep", ctx, pattern="pineapple", path=str(archive_dir))
    assert "main.archive.md:2:" in grep.content[0].text
    write = await call(tools, "write_file", ctx, path=str(archive_dir / "main.archive.md"), content="gone")
    assert write.is_error and "read-only" in write.content[0].text
    # Without the context the same path is simply outside the workspace.
    denied = await call(tools, "read_file", path=str(archive_dir / "main.archive.md"))
    assert denied.is_error and "outside the workspace" in denied.content[0].text


# --- read_file ------------------------------------------------------------------------------
async def test_read_text_with_line_numbers_offset_and_limit(tools: ToolRegistry, ws: Path) -> None:
    (ws / "notes.txt").write_text("".join(f"line {i}\n" for i in range(1, 101)))
    result = await call(tools, "read_file", path="notes.txt", offset=10, limit=3)
    text = result.content[0].text
    assert "notes.txt: lines 10-12 of 100" in text
    assert "    10\tline 10" in text and "    12\tline 12" in text and "line 13" not in text
    assert "continue with offset=13" in text
    past = await call(tools, "read_file", path="notes.txt", offset=500)
    assert past.is_error and "past the end" in past.content[0].text


async def test_read_text_is_bounded_by_the_context_budget(tools: ToolRegistry, ws: Path) -> None:
    (ws / "big.log").write_text("".join(f"{i:06d} " + "x" * 90 + "\n" for i in range(20_000)))
    result = await call(tools, "read_file", ToolContext(max_output_chars=5000), path="big.log")
    text = result.content[0].text
    assert len(text) < 5300
    assert "of 20,000" in text and "character limit of one read" in text


async def test_read_image_returns_an_image_block(tools: ToolRegistry, ws: Path, tmp_path: Path) -> None:
    (ws / "pics").mkdir()
    (ws / "pics" / "red.png").write_bytes(png_bytes())
    result = await call(tools, "read_file", path="pics/red.png")
    assert not result.is_error
    [note, image] = result.content
    assert "image 64x48" in note.text
    assert isinstance(image, ImageBlock) and image.ref.path == "pics/red.png" and image.ref.width == 64
    store = FileAttachments(tmp_path / "data" / "attachments")
    assert (await store.read_bytes(image.ref))[:8] == b"\x89PNG\r\n\x1a\n"


async def test_read_pdf_pages(tools: ToolRegistry, ws: Path) -> None:
    (ws / "doc.pdf").write_bytes(pdf_bytes(["Alpha page", "Bravo page", "Charlie page"]))
    result = await call(tools, "read_file", path="doc.pdf", offset=2, limit=1)
    text = result.content[0].text
    assert "PDF, pages 2-2 of 3" in text and "Bravo page" in text and "Alpha" not in text
    assert "continue with offset=3" in text


async def test_read_video_frames_over_a_window(tools: ToolRegistry, ws: Path) -> None:
    make_video(ws / "clip.mp4", seconds=6)
    result = await call(tools, "read_file", path="clip.mp4", offset=2, limit=3)
    assert not result.is_error, result.content[0].text
    header = result.content[0].text
    assert "video, 64x48, 6.0s long" in header and "from 2.0s to 5.0s" in header
    frames = [b for b in result.content if isinstance(b, ImageBlock)]
    assert 1 <= len(frames) <= 8 and all(f.ref.mime == "image/jpeg" for f in frames)
    assert "continue with offset=5" in header


async def test_binary_files_are_refused_with_a_reason(tools: ToolRegistry, ws: Path) -> None:
    (ws / "blob.bin").write_bytes(b"\x00\x01\x02" * 100)
    result = await call(tools, "read_file", path="blob.bin")
    assert result.is_error and "binary file" in result.content[0].text


# --- write, edit, search ---------------------------------------------------------------------
async def test_write_and_edit(tools: ToolRegistry, ws: Path) -> None:
    wrote = await call(tools, "write_file", path="out/report.md", content="# Report\nvalue: 1\nvalue: 1\n")
    assert not wrote.is_error and "![description](out/report.md)" in wrote.content[0].text
    assert (ws / "out" / "report.md").read_text() == "# Report\nvalue: 1\nvalue: 1\n"
    twice = await call(tools, "edit_file", path="out/report.md", old_string="value: 1", new_string="value: 2")
    assert twice.is_error and "occurs 2 times" in twice.content[0].text
    missing = await call(tools, "edit_file", path="out/report.md", old_string="nope", new_string="x")
    assert missing.is_error and "not found" in missing.content[0].text
    ok = await call(tools, "edit_file", path="out/report.md", old_string="# Report\nvalue: 1", new_string="# Report\nvalue: 3")
    assert not ok.is_error and "value: 3" in ok.content[0].text
    assert (ws / "out" / "report.md").read_text() == "# Report\nvalue: 3\nvalue: 1\n"
    allrep = await call(tools, "edit_file", path="out/report.md", old_string="value", new_string="v", replace_all=True)
    assert not allrep.is_error and (ws / "out" / "report.md").read_text() == "# Report\nv: 3\nv: 1\n"
    onto_dir = await call(tools, "write_file", path="out", content="x")
    assert onto_dir.is_error and "is a directory" in onto_dir.content[0].text


async def test_ls_glob_grep(tools: ToolRegistry, ws: Path) -> None:
    (ws / "a").mkdir()
    (ws / "a" / "one.py").write_text("def alpha():\n    return 1\n")
    time.sleep(0.01)
    (ws / "a" / "two.py").write_text("def beta():\n    return 2\n")
    (ws / "notes.md").write_text("Alpha notes\n")
    listing = (await call(tools, "ls")).content[0].text
    assert "a/" in listing and "notes.md" in listing
    globbed = (await call(tools, "glob", pattern="**/*.py")).content[0].text
    assert globbed.index("a/two.py") < globbed.index("a/one.py")  # newest first
    grep = (await call(tools, "grep", pattern="alpha", ignore_case=True, include="*.py")).content[0].text
    assert "a/one.py:1: def alpha():" in grep and "notes.md" not in grep
    bad = await call(tools, "grep", pattern="(")
    assert bad.is_error and "invalid regular expression" in bad.content[0].text
    escape = await call(tools, "glob", pattern="../*")
    assert escape.is_error


# --- shell ----------------------------------------------------------------------------------
async def test_shell_is_off_by_default(tools: ToolRegistry) -> None:
    assert "shell" not in tools.tools
    result = await call(tools, "shell", command="echo hi")
    assert result.is_error and "no tool named 'shell'" in result.content[0].text


async def test_shell_runs_in_the_workspace_without_secrets_times_out_and_caps(ws: Path, tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from talon.agent.tools.sandbox import find_sandbox
    from talon.errors import SandboxUnavailable

    try:
        find_sandbox()
    except SandboxUnavailable as exc:
        pytest.skip(f"no sandbox can start here: {exc}")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-very-secret")
    tools = workspace_tools(Workspace(ws), store=None, shell=True)
    here = await call(tools, "shell", command="pwd; echo key=${OPENAI_API_KEY:-none}; echo hi > made.txt")
    # The workspace is mounted at /workspace inside the sandbox; what it writes lands in ws.
    assert "/workspace" in here.content[0].text and "key=none" in here.content[0].text
    assert (ws / "made.txt").read_text() == "hi\n"
    assert here.content[0].text.startswith("[exit code 0]")

    started = time.monotonic()
    slow = await call(tools, "shell", command="sleep 300", timeout=0.5)
    assert time.monotonic() - started < 120  # killed at the timeout, not after the 300 s sleep
    assert slow.is_error and "timed out after 0.5s" in slow.content[0].text

    loud = await call(tools, "shell", ToolContext(max_output_chars=4000), command="yes 0123456789 | head -c 2000000")
    text = loud.content[0].text
    assert len(text) < 5000 and "bytes of output omitted" in text

    failing = await call(tools, "shell", command="echo oops >&2; exit 3")
    assert failing.is_error and "[exit code 3]" in failing.content[0].text and "oops" in failing.content[0].text
