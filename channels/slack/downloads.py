"""Files a person shared, fetched during the turn from their ``url_private_download`` with the
bot token (``Authorization: Bearer``), streamed into the attachment store under the download cap;
refused before a byte is read when the event already says the file is too big.

The token goes only to the configured API host (``SLACK_API_BASE_URL``) or its ``files.``
neighbour over the same scheme: an event naming any other address (a hostile or forged event, a
private address) is not fetched, so the bot token never leaves for somewhere else. Redirects are
not followed (a redirect could carry the token's request elsewhere).
"""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx

from talon.config import Limits
from talon.content import InboundFile
from talon.envelope import RemoteFile
from talon.storage.attachments import AttachmentStore

from channels.base import download_into_store
from channels.slack.api import SlackApi
from talon.tls import httpx_tls


def fetchable(url: str, api: SlackApi) -> bool:
    parts = urlsplit(url)
    base = urlsplit(api.base_url)
    return (parts.scheme == base.scheme and parts.netloc.lower() in api.file_hosts and not parts.username
            and not parts.password and "@" not in parts.netloc)


class Downloads:
    def __init__(self, api: SlackApi, timeout_s: float) -> None:
        self.api = api
        self.http = httpx.AsyncClient(verify=httpx_tls(),
                                      timeout=httpx.Timeout(timeout_s, connect=10.0), follow_redirects=False)

    async def download(self, remote: RemoteFile, store: AttachmentStore, limits: Limits) -> InboundFile:
        url = remote.source if fetchable(remote.source, self.api) else None
        return await download_into_store(self.http, url, remote, store, limits,
                                         headers={"Authorization": f"Bearer {self.api.token}"})

    async def close(self) -> None:
        await self.http.aclose()
