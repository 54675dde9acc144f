"""Inbound video, round video notes and GIF animations: a few still frames the model can look at.

Frames are planned from the declared duration — one every ``1 / Limits.video_fps`` seconds, at
most ``video_max_frames``, spread evenly over the whole clip when there would be more — and reached
by seeking to the keyframe before each one, so a long video costs a handful of GOPs, not a full
decode. Each frame is a JPEG of at most ``video_frame_max_side`` px; the frames share one byte
budget (``video_max_frame_bytes``), so a frame is given what the earlier ones left, divided by
how many are still to come. Wall-clock time is bounded by ``video_decode_seconds``: what has been
sampled by then is kept, with a note.

The audio track is not decoded here: ``talon.speech.transcribe`` reads it straight from the same
file, so this module only reports whether there is one (``has_audio``).

Synchronous and CPU-bound; callers run it in a bounded executor.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
from PIL import Image

from talon.storage.attachments import BlockingAttachments
from talon.config import Limits
from talon.content import AttachmentRef
from talon.errors import VideoError
from talon.media.images import encode_to_fit
from talon.speech.transcribe import short_reason

log = logging.getLogger(__name__)

# Seeking lands on the keyframe before the target; for targets closer than this it is cheaper
# to keep decoding forward than to jump back to a keyframe and decode the same frames again.
_SEEK_MIN_GAP_S = 1.0
# A frame smaller than this is not worth showing: stop and say the byte budget ran out.
_MIN_FRAME_BYTES = 8_000
_ROTATIONS = {90: Image.Transpose.ROTATE_90, -90: Image.Transpose.ROTATE_270,
              180: Image.Transpose.ROTATE_180, -180: Image.Transpose.ROTATE_180}


@dataclass(frozen=True)
class VideoFrame:
    ref: AttachmentRef
    timestamp_s: float


@dataclass(frozen=True)
class VideoSample:
    frames: tuple[VideoFrame, ...]
    duration_s: float | None
    width: int | None
    height: int | None
    has_video: bool
    has_audio: bool
    # Why fewer frames than planned came out (time bound, byte budget, damage), for the agent.
    notes: tuple[str, ...] = ()


def plan_timestamps(duration_s: float | None, *, fps: float, max_frames: int) -> list[float] | None:
    """When to take frames; None when the duration is unknown (then sample while decoding)."""
    if duration_s is None or duration_s <= 0 or not math.isfinite(duration_s):
        return None
    step = 1.0 / fps
    # Frames strictly inside the clip: one at the very end may not exist.
    count = max(1, math.ceil(duration_s / step))
    if count > max_frames:
        # More frames than allowed at the nominal rate: spread them over the whole clip instead
        # of showing only its beginning.
        count = max_frames
        step = duration_s / count
    return [round(i * step, 3) for i in range(count)]


def sample_video(
    source: Path,
    *,
    store: BlockingAttachments,
    limits: Limits,
    name: str | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> VideoSample:
    """Sample still frames of the video at ``source`` into the store. Raises ``VideoError``."""
    try:
        container = av.open(str(source), metadata_errors="ignore")
    except (av.FFmpegError, OSError, ValueError) as exc:
        raise VideoError(f"the file is not a video that can be decoded ({short_reason(exc)})") from exc
    with container:
        has_audio = bool(container.streams.audio)
        duration = _duration(container)
        if not container.streams.video:
            if has_audio:
                return VideoSample((), duration, None, None, has_video=False, has_audio=True)
            raise VideoError("the file has no video or audio track")
        stream = container.streams.video[0]
        # Frame and slice threads: decoding is most of the cost and the codec parallelizes well.
        stream.thread_type = "AUTO"
        width, height = stream.codec_context.width, stream.codec_context.height
        if width and height and width * height > limits.image_max_pixels:
            raise VideoError(
                f"the video frame size {width}x{height} is over the "
                f"{limits.image_max_pixels / 1e6:.0f} MP safety limit"
            )
        sampler = _FrameSampler(store, limits, name or source.name, clock)
        plan = plan_timestamps(duration, fps=limits.video_fps, max_frames=limits.video_max_frames)
        try:
            if plan is None:
                sampler.take_sequential(container, stream)
            else:
                sampler.take_planned(container, stream, plan)
        except av.FFmpegError as exc:
            if not sampler.frames:
                raise VideoError(f"the video is truncated or corrupt ({short_reason(exc)})") from exc
            last = sampler.frames[-1].timestamp_s
            sampler.notes.append(f"the video is damaged after {_clock(last)}; later frames are missing")
        if not sampler.frames:
            if sampler.notes:
                raise VideoError("no frame could be extracted: " + "; ".join(sampler.notes))
            raise VideoError("the video contains no decodable frames")
        return VideoSample(
            tuple(sampler.frames), duration, width or None, height or None,
            has_video=True, has_audio=has_audio, notes=tuple(sampler.notes),
        )


class _FrameSampler:
    """Keeps the frames taken so far and the budgets (bytes, time) they draw on."""

    def __init__(
        self, store: BlockingAttachments, limits: Limits, name: str, clock: Callable[[], float]
    ) -> None:
        self.store = store
        self.limits = limits
        self.stem = name.rsplit(".", 1)[0] if "." in name else name
        self.clock = clock
        self.deadline = clock() + limits.video_decode_seconds
        self.frames: list[VideoFrame] = []
        self.notes: list[str] = []
        self.bytes_used = 0

    def take_planned(self, container: Any, stream: Any, plan: list[float]) -> None:
        frames: Iterator[Any] | None = None
        position = -math.inf  # time of the last decoded frame
        for index, target in enumerate(plan):
            if frames is None or target - position > _SEEK_MIN_GAP_S:
                frames = self._seek(container, stream, target) or frames or container.decode(stream)
                position = -math.inf
            chosen = None
            for frame in frames:
                if self._out_of_time(len(plan)):
                    return
                t = _frame_time(frame)
                position = t if t is not None else position
                if t is None or t >= target - 1e-3:
                    chosen = frame
                    break
            if chosen is None:
                break  # the stream ended before the declared duration: keep what we have
            if not self._keep(chosen, _frame_time(chosen) or target, len(plan) - index):
                return

    def take_sequential(self, container: Any, stream: Any) -> None:
        step = 1.0 / self.limits.video_fps
        target = 0.0
        for frame in container.decode(stream):
            if self._out_of_time(self.limits.video_max_frames):
                return
            t = _frame_time(frame)
            if t is None or t >= target - 1e-3:
                remaining = self.limits.video_max_frames - len(self.frames)
                if not self._keep(frame, t if t is not None else target, remaining):
                    return
                if len(self.frames) >= self.limits.video_max_frames:
                    return
                target = (t if t is not None else target) + step

    def _seek(self, container: Any, stream: Any, target: float) -> Iterator[Any] | None:
        if target <= 0 or stream.time_base is None:
            return None
        try:
            offset = int(target / stream.time_base) + (stream.start_time or 0)
            container.seek(offset, stream=stream, backward=True)
        except (av.FFmpegError, OverflowError, ValueError) as exc:
            # Some demuxers (GIF, raw streams) cannot seek: decoding forward still works.
            log.debug("seek to %.2fs failed (%s); decoding forward", target, exc)
            return None
        frames: Iterator[Any] = iter(container.decode(stream))
        return frames

    def _keep(self, frame: Any, timestamp: float, remaining: int) -> bool:
        budget = (self.limits.video_max_frame_bytes - self.bytes_used) // max(1, remaining)
        if budget < _MIN_FRAME_BYTES:
            self.notes.append(
                f"the {self.limits.video_max_frame_bytes / 1e6:.0f} MB frame budget was used up "
                f"after {len(self.frames)} frames"
            )
            return False
        image = frame.to_image()
        turn = _ROTATIONS.get(int(getattr(frame, "rotation", 0) or 0))
        if turn is not None:
            # Phones store portrait video sideways plus a display matrix; the model should see
            # what the person saw.
            image = image.transpose(turn)
        data, mime, size = encode_to_fit(
            image, max_side=self.limits.video_frame_max_side, max_bytes=budget
        )
        ref = self.store.put_bytes(
            data, mime=mime, name=f"{self.stem}-{timestamp:07.2f}s.jpg", width=size[0], height=size[1]
        )
        self.bytes_used += len(data)
        self.frames.append(VideoFrame(ref, round(timestamp, 2)))
        return True

    def _out_of_time(self, planned: int) -> bool:
        if self.clock() < self.deadline:
            return False
        self.notes.append(
            f"decoding stopped at the {self.limits.video_decode_seconds:.0f} s time limit "
            f"({len(self.frames)} of {planned} frames taken)"
        )
        return True


def _duration(container: Any) -> float | None:
    stream = container.streams.video[0] if container.streams.video else None
    if stream is not None and stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return float(container.duration / av.time_base)
    return None


def _frame_time(frame: Any) -> float | None:
    t = frame.time
    return float(t) if t is not None else None


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}"


__all__ = ["VideoFrame", "VideoSample", "plan_timestamps", "sample_video"]
