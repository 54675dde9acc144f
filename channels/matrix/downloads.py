"""Files a person sent, fetched during the turn from the homeserver's authenticated media API
(``/_matrix/client/v1/media/download/{server}/{media id}``), streamed into the attachment store
under the download cap; refused before a byte is read when the event already says it is too big.

Only ``mxc://server/id`` URIs of plain characters are fetched, and only from the configured
homeserver (``MATRIX_HOMESERVER``): a hostile event cannot point the download elsewhere or
climb out of the media path. Redirects are not followed. An encrypted room's file carries its
keys after its URI (``crypto.file_source``): it is fetched whole under the cap, its SHA-256
checked, decrypted, then stored.
"""

from __future__ import annotations

import re

import httpx
from nio.exceptions import EncryptionError

from talon.config import Limits
from talon.content import InboundFile
from talon.envelope import RemoteFile
from talon.errors import DownloadError, DownloadTooLarge, MediaError
from talon.storage.attachments import AttachmentStore

from channels.base import download_into_store
from channels.matrix.crypto import decrypt_file, split_source
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
        try:
            mxc, keys = split_source(remote.source)
        except ValueError:
            mxc, keys = "", None
        path = media_path(mxc)
        if keys is not None and path is not None:  # an encrypted room's file
            base = InboundFile(kind=remote.kind, name=remote.name, mime=remote.mime, size=remote.size)
            name = remote.name or remote.kind
            if remote.size is not None and remote.size > limits.download_max_bytes:
                return base.model_copy(update={"notice": str(DownloadTooLarge(name, remote.size,
                                                                              limits.download_max_bytes))})
            return await self._encrypted(base, name, path, keys, remote, store, limits)
        url = self.api.homeserver + path if path is not None else None
        return await download_into_store(self.api.http, url, remote, store, limits, headers=self.api.auth())

    async def _encrypted(self, base: InboundFile, name: str, path: str, keys: dict[str, str], remote: RemoteFile,
                         store: AttachmentStore, limits: Limits) -> InboundFile:
        """An encrypted room's file: fetched whole under the cap, checked and decrypted
        (``crypto.py``), then stored."""
        limit = limits.download_max_bytes
        body = bytearray()
        try:
            async with self.api.http.stream("GET", self.api.homeserver + path, headers=self.api.auth()) as resp:
                if resp.status_code != 200:
                    raise DownloadError(f"download of {name} failed: HTTP {resp.status_code}")
                async for chunk in resp.aiter_bytes():
                    body += chunk
                    if len(body) > limit:
                        raise DownloadTooLarge(name, remote.size, limit)
            plain = decrypt_file(bytes(body), keys)
            ref = await store.put_bytes(plain, mime=remote.mime or "application/octet-stream", name=remote.name)
        except httpx.HTTPError as exc:
            return base.model_copy(update={"notice": f"download of {name} failed: {type(exc).__name__}"})
        except MediaError as exc:
            return base.model_copy(update={"notice": str(exc)})
        except EncryptionError:
            return base.model_copy(update={"notice": f"{name} could not be decrypted (its hash or keys do not match)"})
        return base.model_copy(update={"ref": ref, "size": ref.bytes})
