"""Files a person sent, fetched during the turn from Twilio's media URLs.

HTTP basic auth, streamed into the attachment store under the download cap, only from the allowed
media hosts. Redirects are followed by hand, each hop's host checked again, and the credentials go
only to the URL Twilio named on its API host (never to the CDN it redirects to).
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urljoin, urlsplit

import httpx

from talon.config import Limits
from talon.content import AttachmentRef, InboundFile
from talon.envelope import RemoteFile
from talon.errors import DownloadError, MediaError
from talon.storage.attachments import AttachmentStore

from channels.base import store_response
from talon.tls import httpx_tls

log = logging.getLogger("channels.whatsapp")

DOWNLOAD_TRIES = 3
MAX_REDIRECTS = 5
# Twilio's media URLs are on api.twilio.com and redirect to a short-lived URL on mms.twiliocdn.com
# (accounts with media authentication, now the rule) or s3-external-1.amazonaws.com (older ones).
TWILIO_API_HOST = "api.twilio.com"
DEFAULT_MEDIA_HOSTS = (TWILIO_API_HOST, "media.twiliocdn.com", "mms.twiliocdn.com",
                       "s3-external-1.amazonaws.com")


class MediaHosts:
    """Where inbound media may be downloaded from: exact host names or ``*.domain`` patterns.

    https only, except for the scheme and host of ``TWILIO_API_BASE_URL`` itself (a proxy, or the
    loopback fake in tests), which is always allowed. The account's credentials are only ever
    sent to Twilio's API host (or that of ``TWILIO_API_BASE_URL``), never to a CDN or storage host.
    """

    def __init__(self, configured: str, api_base_url: str) -> None:
        entries = [e.strip().lower() for e in configured.replace(";", ",").split(",") if e.strip()]
        self.entries = tuple(entries) if entries else DEFAULT_MEDIA_HOSTS
        api = urlsplit(api_base_url)
        self.api_scheme = api.scheme
        self.api_host = (api.hostname or "").lower()

    def allows(self, url: str) -> bool:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        if not host:
            return False
        if host == self.api_host and parts.scheme == self.api_scheme:
            return True
        if parts.scheme != "https":
            return False
        return any(host == e or (e.startswith("*.") and host.endswith(e[1:])) for e in self.entries)

    def takes_credentials(self, url: str) -> bool:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        return (host == self.api_host and parts.scheme == self.api_scheme) or \
            (host == TWILIO_API_HOST and parts.scheme == "https")



class Downloads:
    def __init__(self, account_sid: str, auth_token: str, media_hosts: MediaHosts, *,
                 retry_base_s: float = 1.0) -> None:
        self.account_sid = account_sid
        self.auth_token = auth_token
        self.media_hosts = media_hosts
        self.retry_base_s = retry_base_s
        self._client: httpx.AsyncClient | None = None

    def start(self) -> None:
        self._client = httpx.AsyncClient(verify=httpx_tls(),
                                         timeout=httpx.Timeout(30.0, connect=10.0), follow_redirects=False)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def download(self, remote: RemoteFile, store: AttachmentStore, limits: Limits) -> InboundFile:
        base = InboundFile(kind=remote.kind, name=remote.name, mime=remote.mime, size=remote.size)
        try:
            ref = await self._fetch(remote, store, limits)
        except MediaError as exc:
            return base.model_copy(update={"notice": str(exc)})
        return base.model_copy(update={"ref": ref, "size": ref.bytes})

    async def _fetch(self, remote: RemoteFile, store: AttachmentStore, limits: Limits) -> AttachmentRef:
        assert self._client is not None, "the channel is not started"
        name = remote.name or remote.kind
        url = remote.source
        for hop in range(MAX_REDIRECTS + 1):
            if not self.media_hosts.allows(url):
                host = urlsplit(url).hostname or "?"
                log.warning("whatsapp: not downloading %s from %s: the host is not an allowed media host "
                            "(allowed: %s and the host of TWILIO_API_BASE_URL; set TALON_TWILIO_MEDIA_HOSTS "
                            "to change this)", name, host, ", ".join(self.media_hosts.entries))
                raise DownloadError(f"{name} was not downloaded: it is hosted on {host}, which is not an "
                                    "allowed media host")
            # Credentials go only to the URL Twilio named, on Twilio's API host; where it redirects
            # to (a short-lived CDN URL) needs none and must never see the auth token.
            auth = (self.account_sid, self.auth_token) \
                if hop == 0 and self.auth_token and self.media_hosts.takes_credentials(url) else None
            result = await self._get(url, auth, store, remote, limits)
            if isinstance(result, AttachmentRef):
                return result
            url = result
        raise DownloadError(f"{name} was not downloaded: too many redirects")

    async def _get(self, url: str, auth: tuple[str, str] | None, store: AttachmentStore,
                   remote: RemoteFile, limits: Limits) -> AttachmentRef | str:
        """One hop: the stored file, or the URL a redirect points to."""
        assert self._client is not None
        name = remote.name or remote.kind
        for attempt in range(1, DOWNLOAD_TRIES + 1):
            try:
                async with self._client.stream("GET", url, auth=auth) as resp:
                    status = resp.status_code
                    if status in (301, 302, 303, 307, 308):
                        location = resp.headers.get("location")
                        if not location:
                            raise DownloadError(f"{name} was not downloaded: a redirect without a location")
                        return urljoin(url, location)
                    if status == 200:
                        mime = remote.mime or resp.headers.get("content-type", "").split(";")[0].strip() \
                            or "application/octet-stream"
                        return await store_response(resp, store, remote, mime=mime,
                                                    limit=limits.download_max_bytes)
                    if (status == 429 or status >= 500) and attempt < DOWNLOAD_TRIES:
                        log.warning("whatsapp: download of %s got HTTP %d; retry %d", name, status, attempt)
                    else:
                        log.warning("whatsapp: download of %s from %s failed: HTTP %d", name,
                                    urlsplit(url).hostname, status)
                        raise DownloadError(f"Twilio would not give us {name} (HTTP {status})")
            except httpx.HTTPError as exc:
                if attempt == DOWNLOAD_TRIES:
                    raise DownloadError(f"download of {name} failed: {type(exc).__name__}") from exc
                log.warning("whatsapp: download of %s failed (%s); retry %d", name, type(exc).__name__, attempt)
            await asyncio.sleep(self.retry_base_s * 2 ** (attempt - 1))
        raise DownloadError(f"download of {name} failed")

