"""Inbound video: real MP4/GIF clips made with PyAV and Pillow; frames, timestamps and bounds."""

from __future__ import annotations

import io
import itertools
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

from talon.storage.embedded.attachments import FileBlobs
from talon.config import Limits
from talon.media.video import plan_timestamps, sample_video
from talon.errors import VideoError


def make_mp4(
    path: Path, *, seconds: float, fps: int = 10, size: tuple[int, int] = (320, 240),
    gop: int = 10, noisy: bool = False,
) -> Path:
    """An H.264 clip whose frame ``i`` is a flat gray of level ``i`` (so a frame tells its index)."""
    width, height = size
    rng = np.random.default_rng(0)
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.gop_size = gop
        stream.options = {"preset": "ultrafast"}
        for i in range(int(seconds * fps)):
            pixels = np.full((height, width, 3), i % 256, dtype=np.uint8)
            if noisy:
                pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path


def frame_level(store: FileBlobs, ref) -> float:  # type: ignore[no-untyped-def]
    return float(np.asarray(Image.open(io.BytesIO(store.read_bytes(ref))).convert("L")).mean())


@pytest.fixture
def store(tmp_path: Path) -> FileBlobs:
    return FileBlobs(tmp_path / "store")


def test_plan_timestamps() -> None:
    assert plan_timestamps(3.0, fps=0.5, max_frames=16) == [0.0, 2.0]
    assert plan_timestamps(0.4, fps=0.5, max_frames=16) == [0.0]
    spread = plan_timestamps(64.0, fps=0.5, max_frames=16)
    assert spread is not None and len(spread) == 16 and spread[1] == 4.0 and spread[-1] == 60.0
    assert plan_timestamps(None, fps=0.5, max_frames=16) is None


def test_three_second_clip_gives_timestamped_frames_within_limits(tmp_path: Path, store: FileBlobs) -> None:
    path = make_mp4(tmp_path / "clip.mp4", seconds=3)
    sample = sample_video(path, store=store, limits=Limits(), name="clip.mp4")
    assert sample.has_video and not sample.has_audio
    assert sample.duration_s == pytest.approx(3.0, abs=0.1)
    assert [f.timestamp_s for f in sample.frames] == [0.0, 2.0]
    assert (sample.width, sample.height) == (320, 240)
    for frame in sample.frames:
        assert frame.ref.mime == "image/jpeg" and max(frame.ref.width or 0, frame.ref.height or 0) <= 1280
        # The frame at t seconds is source frame t * fps (gray level == index).
        assert frame_level(store, frame.ref) == pytest.approx(frame.timestamp_s * 10, abs=3)
    assert sum(f.ref.bytes for f in sample.frames) <= Limits().video_max_frame_bytes
    assert not sample.notes


def test_long_clip_is_sampled_across_its_whole_length_by_seeking(tmp_path: Path, store: FileBlobs) -> None:
    path = make_mp4(tmp_path / "long.mp4", seconds=40, fps=5, size=(64, 48), gop=10)
    sample = sample_video(path, store=store, limits=Limits(), name="long.mp4")
    stamps = [f.timestamp_s for f in sample.frames]
    assert len(stamps) == 16 and stamps[0] == 0.0 and stamps[-1] == pytest.approx(37.5, abs=0.21)
    assert stamps == sorted(stamps)
    for frame in sample.frames:
        assert frame_level(store, frame.ref) == pytest.approx(frame.timestamp_s * 5, abs=3)


def test_big_frames_are_downscaled_and_share_the_byte_budget(tmp_path: Path, store: FileBlobs) -> None:
    path = make_mp4(tmp_path / "hd.mp4", seconds=8, fps=2, size=(1920, 1080), gop=2, noisy=True)
    limits = Limits(video_max_frame_bytes=300_000)
    sample = sample_video(path, store=store, limits=limits)
    assert len(sample.frames) == 4
    assert all(max(f.ref.width or 0, f.ref.height or 0) <= 1280 for f in sample.frames)
    assert sum(f.ref.bytes for f in sample.frames) <= 300_000


def test_decode_time_is_bounded(tmp_path: Path, store: FileBlobs) -> None:
    path = make_mp4(tmp_path / "slow.mp4", seconds=10, fps=5, size=(64, 48))
    ticks = itertools.count(0.0, 7.0)  # every clock read is 7 "seconds" later
    sample = sample_video(path, store=store, limits=Limits(video_decode_seconds=20), clock=lambda: next(ticks))
    assert 0 < len(sample.frames) < 5
    assert any("time limit" in note for note in sample.notes)


def test_gif_animation_gives_frames(tmp_path: Path, store: FileBlobs) -> None:
    frames = [Image.new("RGB", (120, 90), (level, level, level)) for level in range(0, 250, 10)]
    path = tmp_path / "loop.gif"
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=200, loop=0)
    sample = sample_video(path, store=store, limits=Limits())
    assert sample.has_video and len(sample.frames) >= 2
    assert sample.frames[0].timestamp_s == 0.0
    assert all(f.ref.mime == "image/jpeg" for f in sample.frames)


def test_garbage_and_audio_only_files(tmp_path: Path, store: FileBlobs) -> None:
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 20)
    with pytest.raises(VideoError, match="not a video|no video|corrupt"):
        sample_video(junk, store=store, limits=Limits())

    audio_only = tmp_path / "voice.m4a"
    with av.open(str(audio_only), "w", format="mp4") as out:
        stream = out.add_stream("aac", rate=44_100)
        stream.layout = "mono"
        tone = (0.1 * np.sin(np.arange(44_100) * 0.06)).astype(np.float32).reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(tone, format="flt", layout="mono")
        frame.sample_rate = 44_100
        resampler = av.AudioResampler(format="fltp", layout="mono", rate=44_100)
        for chunk in resampler.resample(frame) + resampler.resample(None):
            for packet in stream.encode(chunk):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    sample = sample_video(audio_only, store=store, limits=Limits())
    assert not sample.has_video and sample.has_audio and sample.frames == ()
