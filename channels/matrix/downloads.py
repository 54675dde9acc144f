"""Files a person sent, fetched during the turn from the homeserver's authenticated media API
(``/_matrix/client/v1/media/download/{server}/{media id}``), streamed into the attachment store
under the download cap; refused before a byte is read when the event already says it is too big.

Only ``mxc://server/id`` URIs of plain characters are fetched, and only from the configured
homeserver (``MATRIX_HOMESERVER``): a hostile event cannot point the download elsewhere or
climb out of the media path. Redirects are not followed.
"""

from __future__ import annotations

import re

import httpx

from talon.config import Limits
from talon.content import InboundFile
from talon.envelope import RemoteFile
from talon.errors import DownloadError, DownloadTooLarge, MediaError
from talon.storage.attachments import AttachmentStore

from channels.base import store_response
from channels.matrix.api import MatrixApi

_MXC = re.compile(r"mxc://([A-Za-z0-9.:\-\[\]]{1,255})/([A-Za-z0-9_\-]{1,255})")


def media_path(mxc: str) -> str | None:
    match = _MXC.fullmatch(mxc)
    if match is None:
        return None
    return f"/_matrix/client/v1/media/download/{match.group(1)}/{match.group(2)}"


class Downloads:
    def __init__(self, api: MatrixApi) -> None:
        self.api = api

    async def download(self, remote: RemoteFile, store: AttachmentStore, limits: Limits) -> InboundFile:
        base = InboundFile(kind=remote.kind, name=remote.name, mime=remote.mime, size=remote.size)
        name = remote.name or remote.kind
        if remote.size is not None and remote.size > limits.download_max_bytes:
            return base.model_copy(update={"notice": str(DownloadTooLarge(name, remote.size, limits.download_max_bytes))})
        path = media_path(remote.source)
        if path is None:
            return base.model_copy(update={"notice": f"{name} has an address Talon does not fetch"})
        try:
            async with self.api.http.stream("GET", self.api.homeserver + path, headers=self.api.auth()) as resp:
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
