"""Files a person sent, fetched during the turn from the homeserver's authenticated media API
(``/_matrix/client/v1/media/download/{server}/{media id}``), streamed into the attachment store
under the download cap; refused before a byte is read when the event already says it is too big.

Only ``mxc://server/id`` URIs of plain characters are fetched, and only from the configured
homeserver (``MATRIX_HOMESERVER``): a hostile event cannot point the download elsewhere or
climb out of the media path. Redirects are not followed.
"""

from __future__ import annotations

import re

from talon.config import Limits
from talon.content import InboundFile
from talon.envelope import RemoteFile
from talon.storage.attachments import AttachmentStore

from channels.base import download_into_store
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
        path = media_path(remote.source)
        url = self.api.homeserver + path if path is not None else None
        return await download_into_store(self.api.http, url, remote, store, limits, headers=self.api.auth())
