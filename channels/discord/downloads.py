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
from talon.storage.attachments import AttachmentStore

from channels.base import download_into_store
from channels.discord.api import DiscordApi
from talon.tls import httpx_tls


def fetchable(url: str, api: DiscordApi) -> bool:
    parts = urlsplit(url)
    scheme = urlsplit(api.base_url).scheme
    return (parts.scheme == scheme and parts.netloc.lower() in api.media_hosts and "@" not in parts.netloc)


class Downloads:
    def __init__(self, api: DiscordApi) -> None:
        self.api = api
        self.http = httpx.AsyncClient(verify=httpx_tls(),
                                      timeout=httpx.Timeout(60.0, connect=10.0), follow_redirects=False)

    async def download(self, remote: RemoteFile, store: AttachmentStore, limits: Limits) -> InboundFile:
        url = remote.source if fetchable(remote.source, self.api) else None
        return await download_into_store(self.http, url, remote, store, limits)

    async def close(self) -> None:
        await self.http.aclose()
