"""Downloading what a person sent: getFile, then the file streamed into the attachment store under
the download cap (refused before a byte is read when Telegram already says it is too big).
"""

from __future__ import annotations

import asyncio

import httpx

from talon.storage.attachments import AttachmentStore
from talon.config import Limits
from talon.content import AttachmentRef, InboundFile
from talon.envelope import RemoteFile
from talon.errors import DeliveryError, DownloadError, DownloadTooLarge, MediaError

from channels.base import store_response
from channels.telegram.api import SEND_TRIES, TelegramApi


class Downloads:
    """Files a person sent, fetched during the turn: getFile, then a streamed, capped download
    over ``http`` (the channel's own client, which it closes)."""

    def __init__(self, api: TelegramApi, http: httpx.AsyncClient) -> None:
        self.api = api
        self._http = http

    async def download(self, remote: RemoteFile, store: AttachmentStore, limits: Limits) -> InboundFile:
        base = InboundFile(kind=remote.kind, name=remote.name, mime=remote.mime, size=remote.size,
                           emoji=remote.emoji, animated=remote.animated)
        name = remote.name or remote.kind
        if remote.kind == "sticker" and remote.animated:
            return base  # animated stickers are described by their emoji; nothing to fetch
        too_large = base.model_copy(
            update={"notice": str(DownloadTooLarge(name, remote.size, limits.download_max_bytes))})
        if remote.size is not None and remote.size > limits.download_max_bytes:
            return too_large
        try:
            tg_file = await self.api.with_retries(lambda: self.api.bot.get_file(remote.source), "getFile")
        except DeliveryError as exc:
            text = str(exc)
            if "too big" in text.lower():
                return too_large
            return base.model_copy(update={"notice": f"Telegram would not give us {name}: {text}"})
        url = tg_file.file_path
        try:
            ref = await self._stream(url, store, remote, limits)
        except MediaError as exc:
            return base.model_copy(update={"notice": str(exc)})
        return base.model_copy(update={"ref": ref, "size": ref.bytes})

    async def _stream(self, url: str, store: AttachmentStore, remote: RemoteFile,
                      limits: Limits) -> AttachmentRef:
        name = remote.name or remote.kind
        for attempt in range(1, SEND_TRIES + 1):
            try:
                async with self._http.stream("GET", url) as resp:
                    if resp.status_code != 200:
                        # The URL carries the bot token: never log or show it.
                        raise DownloadError(f"download of {name} failed: HTTP {resp.status_code}")
                    return await store_response(resp, store, remote, limit=limits.download_max_bytes,
                                                mime=remote.mime or "application/octet-stream")
            except httpx.HTTPError as exc:
                if attempt == SEND_TRIES:
                    raise DownloadError(f"download of {name} failed: {type(exc).__name__}") from exc
                await asyncio.sleep(0.5 * 2 ** attempt)
        raise DownloadError(f"download of {name} failed")
