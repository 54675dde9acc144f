"""Fitting outbound files to WhatsApp: re-encoded images stay upright even with odd EXIF blocks."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from channels.whatsapp.media import reencode_image
from talon.config import Limits
from talon.media import MarkdownMediaRef, outbound_channel_media
from tests.support.images import odd_exif as _odd_exif
def test_reencoded_image_with_odd_exif_is_upright(tmp_path: Path) -> None:
    pixels = np.zeros((200, 300, 3), dtype=np.uint8)
    pixels[:, :150] = (255, 0, 0)  # red on the left; orientation 6 puts it on top
    Image.fromarray(pixels).save(tmp_path / "odd.jpg", "JPEG", exif=_odd_exif(6))
    media = outbound_channel_media(MarkdownMediaRef(alt="", path="odd.jpg"), "", tmp_path)
    try:
        out = reencode_image(media, Limits())
    finally:
        media.close()
    im = Image.open(io.BytesIO(out.data)).convert("RGB")
    assert im.size == (200, 300)
    top = np.asarray(im)[20, 100]
    assert top[0] > 200 and top[2] < 60
