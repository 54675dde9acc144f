"""Attachments a person sent, fetched during the turn from their CDN URL, streamed into the
attachment store under the download cap; refused before a byte is read when Discord already says
the file is too big. Only Discord's own hosts are fetched (``cdn.discordapp.com`` and
``media.discordapp.net`` for discord.com, else ``DISCORD_API_BASE_URL``'s host), over https for
the real platform; no token is sent (CDN links are signed) and redirects are not followed."""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx

from talon.config import Limits
from talon.content import InboundFile
from talon.envelope import RemoteFile
from talon.errors import DownloadError, DownloadTooLarge, MediaError
from talon.storage.attachments import AttachmentStore

from channels.base import store_response
from channels.discord.api import DiscordApi
from talon.tls import httpx_tls


def fetchable(url: str, api: DiscordApi) -> bool:
    parts = urlsplit(url)
    scheme = urlsplit(api.base_url).scheme
    return (parts.scheme == scheme and parts.netloc.lower() in api.media_hosts and "@" not in parts.netloc)


class Downloads:
    def __init__(self, api: DiscordApi) -> None:
        self.api = api
        self.http = httpx.AsyncClient(verify=httpx_tls(), timeout=httpx.Timeout(60.0, connect=10.0), follow_redirects=False)

    async def download(self, remote: RemoteFile, store: AttachmentStore, limits: Limits) -> InboundFile:
        base = InboundFile(kind=remote.kind, name=remote.name, mime=remote.mime, size=remote.size)
        name = remote.name or remote.kind
        if remote.size is not None and remote.size > limits.download_max_bytes:
            return base.model_copy(update={"notice": str(DownloadTooLarge(name, remote.size, limits.download_max_bytes))})
        if not fetchable(remote.source, self.api):
            return base.model_copy(update={"notice": f"{name} has an address Talon does not fetch"})
        try:
            async with self.http.stream("GET", remote.source) as resp:
                if resp.status_code != 200:
                    raise DownloadError(f"download of {name} failed: HTTP {resp.status_code}")
                ref = await store_response(resp, store, remote, limit=limits.download_max_bytes,
                                           mime=remote.mime or resp.headers.get("content-type")
                                           or "application/octet-stream")
        except httpx.HTTPError as exc:
            return base.model_copy(update={"notice": f"download of {name} failed: {type(exc).__name__}"})
        except MediaError as exc:
            return base.model_copy(update={"notice": str(exc)})
        return base.model_copy(update={"ref": ref, "size": ref.bytes})

    async def close(self) -> None:
        await self.http.aclose()
