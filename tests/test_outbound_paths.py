"""Containment of outbound files: every escape is refused with its reason; races are caught."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from talon.errors import MediaPathError
from talon.media import open_checked_media, resolve_bounded_media_path
from talon.media.paths import check_media_path, open_checked


@pytest.fixture
def root(tmp_path: Path) -> Path:
    media = tmp_path / "media_root"
    (media / "plots").mkdir(parents=True)
    (media / "plots" / "chart.png").write_bytes(b"\x89PNG\r\n\x1a\nchart")
    (media / "top.png").write_bytes(b"top")
    (tmp_path / "secret.png").write_bytes(b"secret")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "x.png").write_bytes(b"outside")
    return media


# --- refused, each with its reason ----------------------------------------------------------

REFUSED = [
    ("parent", "../secret.png", {}, "'..'"),
    ("parent after descent", "plots/../../secret.png", {}, "'..'"),
    ("harmless-looking parent", "plots/../top.png", {}, "'..'"),
    ("backslash parent", "plots\\..\\top.png", {}, "'..'"),
    ("absolute when relative required", "/etc/passwd.png", {"require_relative": True}, "absolute"),
    ("absolute outside", "/etc/passwd", {}, "outside the media root"),
    ("home", "~/x.png", {}, "home-directory"),
    ("home of user", "~root/x.png", {}, "home-directory"),
    ("file url", "file:///x.png", {}, "URL (file:)"),
    ("http url", "http://x/y.png", {}, "URL (http:)"),
    ("https url", "HTTPS://x/y.png", {}, "URL (https:)"),
    ("data url", "data:image/png;base64,AAAA", {}, "URL (data:)"),
    ("network path", "//host/share/x.png", {}, "network path"),
    ("nul byte", "plots/chart.png\x00.txt", {}, "NUL byte"),
    ("empty", "", {}, "empty"),
    ("blank", "   ", {}, "empty"),
    ("missing", "nope.png", {}, "no such file"),
    ("missing in missing dir", "nodir/nope.png", {}, "no such file"),
    ("file used as dir", "top.png/x.png", {}, "no such file"),
    ("directory", "plots", {}, "a directory"),
    ("root itself", ".", {}, "a directory"),
]


@pytest.mark.parametrize("name, path, kwargs, reason", REFUSED, ids=[c[0] for c in REFUSED])
def test_refused(root: Path, name: str, path: str, kwargs: dict[str, bool], reason: str) -> None:
    with pytest.raises(MediaPathError, match=None) as info:
        resolve_bounded_media_path(path, root, **kwargs)
    assert reason in str(info.value)
    assert isinstance(info.value, ValueError)


def test_absolute_outside_root(root: Path, tmp_path: Path) -> None:
    with pytest.raises(MediaPathError, match="outside the media root"):
        resolve_bounded_media_path(str(tmp_path / "secret.png"), root)


def test_absolute_inside_root_allowed(root: Path) -> None:
    target = root / "plots" / "chart.png"
    assert resolve_bounded_media_path(str(target), root) == target.resolve()
    with pytest.raises(MediaPathError, match="absolute"):
        resolve_bounded_media_path(str(target), root, require_relative=True)


def test_relative_resolved_against_root(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the working directory must not matter
    assert resolve_bounded_media_path("plots/chart.png", root) == (root / "plots/chart.png").resolve()
    assert resolve_bounded_media_path(Path("top.png"), root) == (root / "top.png").resolve()


def test_symlink_inside_pointing_outside(root: Path, tmp_path: Path) -> None:
    (root / "leak.png").symlink_to(tmp_path / "secret.png")
    with pytest.raises(MediaPathError, match="outside the media root"):
        resolve_bounded_media_path("leak.png", root)


def test_dangling_symlink_outside_reports_outside_not_missing(root: Path, tmp_path: Path) -> None:
    (root / "ghost.png").symlink_to(tmp_path / "does-not-exist.png")
    with pytest.raises(MediaPathError, match="outside the media root"):
        resolve_bounded_media_path("ghost.png", root)


def test_symlinked_directory_escaping(root: Path, tmp_path: Path) -> None:
    (root / "linkdir").symlink_to(tmp_path / "outside", target_is_directory=True)
    with pytest.raises(MediaPathError, match="outside the media root"):
        resolve_bounded_media_path("linkdir/x.png", root)


def test_symlink_inside_pointing_inside_allowed(root: Path) -> None:
    (root / "latest.png").symlink_to(root / "plots" / "chart.png")
    (root / "alias").symlink_to(root / "plots", target_is_directory=True)
    assert resolve_bounded_media_path("latest.png", root) == (root / "plots/chart.png").resolve()
    assert resolve_bounded_media_path("alias/chart.png", root) == (root / "plots/chart.png").resolve()
    with open_checked_media("latest.png", root) as checked:
        assert checked.file.read() == b"\x89PNG\r\n\x1a\nchart"


def test_symlink_loop(root: Path) -> None:
    (root / "loop1").symlink_to(root / "loop2")
    (root / "loop2").symlink_to(root / "loop1")
    with pytest.raises(MediaPathError):
        resolve_bounded_media_path("loop1", root)


def test_root_given_through_a_symlink(root: Path, tmp_path: Path) -> None:
    link = tmp_path / "root_link"
    link.symlink_to(root, target_is_directory=True)
    assert resolve_bounded_media_path("top.png", link) == (root / "top.png").resolve()
    assert resolve_bounded_media_path(str(link / "top.png"), link) == (root / "top.png").resolve()


def test_missing_root(tmp_path: Path) -> None:
    with pytest.raises(MediaPathError, match="media root"):
        resolve_bounded_media_path("x.png", tmp_path / "no-root")


def test_fifo_refused_without_hanging(root: Path) -> None:
    os.mkfifo(root / "pipe.png")
    with pytest.raises(MediaPathError, match="FIFO"):
        resolve_bounded_media_path("pipe.png", root)
    with pytest.raises(MediaPathError, match="FIFO"):
        open_checked_media("pipe.png", root)


def test_open_checked_media_reads_the_file(root: Path) -> None:
    with open_checked_media("plots/chart.png", root) as checked:
        assert checked.name == "chart.png"
        assert checked.size == len(b"\x89PNG\r\n\x1a\nchart")
        assert checked.path == (root / "plots/chart.png").resolve()
        assert checked.file.read() == b"\x89PNG\r\n\x1a\nchart"
    assert checked.file.closed


# --- the race between check and open -------------------------------------------------------


def test_file_swapped_for_symlink_after_check(root: Path, tmp_path: Path) -> None:
    checked = check_media_path("top.png", root)
    (root / "top.png").unlink()
    (root / "top.png").symlink_to(tmp_path / "secret.png")
    with pytest.raises(MediaPathError, match="changed while it was being opened"):
        open_checked(checked)


def test_file_swapped_for_symlink_inside_root_after_check(root: Path) -> None:
    # Even a link to a file inside the root is not the file that was checked.
    checked = check_media_path("top.png", root)
    (root / "top.png").unlink()
    (root / "top.png").symlink_to(root / "plots" / "chart.png")
    with pytest.raises(MediaPathError):
        open_checked(checked)


def test_file_replaced_by_another_file_after_check(root: Path) -> None:
    checked = check_media_path("top.png", root)
    keep = root / "keep"  # hold the old inode so the new file cannot reuse its number
    os.link(root / "top.png", keep)
    (root / "top.png").unlink()
    (root / "top.png").write_bytes(b"different")
    with pytest.raises(MediaPathError, match="replaced"):
        open_checked(checked)


def test_directory_swapped_for_symlink_after_check(root: Path, tmp_path: Path) -> None:
    checked = check_media_path("plots/chart.png", root)
    (root / "plots").rename(root / "plots_old")
    (tmp_path / "outside" / "chart.png").write_bytes(b"evil")
    (root / "plots").symlink_to(tmp_path / "outside", target_is_directory=True)
    with pytest.raises(MediaPathError, match="changed while it was being opened"):
        open_checked(checked)


def test_file_swapped_for_fifo_after_check(root: Path) -> None:
    checked = check_media_path("top.png", root)
    (root / "top.png").unlink()
    os.mkfifo(root / "top.png")
    with pytest.raises(MediaPathError, match="FIFO"):
        open_checked(checked)


def test_unchanged_file_opens_after_check(root: Path) -> None:
    checked = check_media_path("top.png", root)
    with open_checked(checked) as opened:
        assert opened.file.read() == b"top"
