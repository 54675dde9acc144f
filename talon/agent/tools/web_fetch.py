"""The ``web_fetch`` tool: one web page as readable text, unable to reach the host's own network.

Address rules (``check_url`` and ``GuardedResolver``), applied to the URL asked for and to every
redirect (at most 5):

- http and https only; no user name or password in the URL;
- the host name is resolved once, every address it resolves to is checked, and the connection is
  made to those checked addresses (the resolver hands them to aiohttp directly, so a second DNS
  answer cannot slip in between: no DNS rebinding). TLS still verifies the certificate for the
  host name, and the Host header is the name;
- refused: loopback, private, link-local, multicast, reserved, unspecified and every other
  address that is not globally routable, in IPv4 and IPv6, also when an IPv6 address carries an
  IPv4 one (mapped ``::ffff:a.b.c.d``, compatible ``::a.b.c.d``, 6to4 ``2002::/16``, NAT64
  ``64:ff9b::/96``, Teredo); ``localhost`` and ``*.localhost``; numbers written in other forms
  (``0x7f.1``, ``2130706433``, ``0177.0.0.1``, ``127.1``), which resolvers read differently;
- unless the host is listed in ``TALON_WEB_ALLOW_HOSTS`` (exact names or addresses), which
  lifts the address rules for that host only.

The body is read streamed up to ``TALON_WEB_MAX_BYTES`` and the whole fetch, redirects included,
is bounded by ``TALON_WEB_TIMEOUT``. Each fetch has a session of its own with no cookie jar, no
proxy from the environment and no credentials: nothing of Talon's is sent. HTML becomes readable
markdown through trafilatura (scripts, styles and navigation gone) in a worker process with CPU,
memory and time limits (``talon.agent.tools.html_worker``: ``TALON_WEB_CONVERT_SECONDS``,
``TALON_WEB_CONVERT_MEMORY``); a page cut by them is returned as the plain text of its start,
with an error saying which limit cut it. Other text is returned as is, images as images,
anything else as a notice. The result is marked untrusted web content.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from talon.agent.tools.html_worker import (PLAIN_PREFIX_BYTES, ConversionCut, ConvertLimits, HtmlConverter,
                                     html_to_text, plain_text_prefix)
from talon.agent.tools.registry import Tool, ToolContext, ToolResult
from talon.agent.tools.untrusted import cut, image_from_bytes, untrusted_block
from talon.storage.attachments import AttachmentStore
from talon.config import Limits
from talon.content import ContentBlock, TextBlock
from talon.errors import ToolError, WebFetchRefused

__all__ = ["GuardedResolver", "WebFetchTool", "address_problem", "check_url", "html_to_text"]

log = logging.getLogger(__name__)

MAX_REDIRECTS = 5
_REDIRECTS = {301, 302, 303, 307, 308}
_USER_AGENT = "Mozilla/5.0 (compatible; Talon web_fetch)"
_HOST = re.compile(r"[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?)*")
# A host made only of numbers (decimal, octal or hex parts): an IPv4 address, maybe in disguise.
_NUMERIC = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)(?:\.(?:0x[0-9a-f]*|[0-9]+)){0,3}")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_HTML = ("text/html", "application/xhtml+xml")
_TEXT_TYPES = ("application/json", "application/xml", "application/javascript", "application/ld+json",
               "application/rss+xml", "application/atom+xml", "application/x-yaml", "application/yaml")
_IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _kind(ip: Address) -> str | None:
    """What kind of non-public address ``ip`` is, or None for a globally routable one."""
    if ip.is_unspecified:
        return "an unspecified address"
    if ip.is_loopback:
        return "a loopback address (this machine)"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_reserved:
        return "a reserved address"
    if ip.is_private:
        return "a private address"
    if not ip.is_global:
        return "a special-purpose address that is not on the public internet"
    return None


def _embedded_v4(ip: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, str] | None:
    """The IPv4 address an IPv6 one carries, and how, where traffic could reach it."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped, "IPv4-mapped"
    packed = ip.packed
    if packed[:12] == bytes(12) and int(ip) > 1:
        return ipaddress.IPv4Address(packed[12:]), "IPv4-compatible"
    if ip.sixtofour is not None:
        return ip.sixtofour, "6to4"
    if ip in _NAT64:
        return ipaddress.IPv4Address(packed[12:]), "NAT64"
    if ip.teredo is not None:
        return ip.teredo[1], "Teredo"
    return None


def address_problem(ip: Address) -> str | None:
    """Why web_fetch may not connect to ``ip``, or None when it may."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id:
            return f"{ip} is an IPv6 address with a zone (a local interface)"
        embedded = _embedded_v4(ip)
        if embedded is not None:
            inner = _kind(embedded[0])
            if inner is not None:
                return f"{ip} is {inner} ({embedded[0]}, {embedded[1]})"
            if embedded[1] == "NAT64":
                return None  # the public IPv4 address it stands for, reached through the NAT64 gateway
    kind = _kind(ip)
    return f"{ip} is {kind}" if kind else None


@dataclass(frozen=True)
class Target:
    url: URL
    host: str  # ASCII (IDNA), lower case, no trailing dot
    allowed: bool  # listed in TALON_WEB_ALLOW_HOSTS: the address rules do not apply


def normalize_host(host: str) -> str:
    return host.strip().lower().rstrip(".").strip("[]")


def check_url(raw: str, allow_hosts: Iterable[str]) -> Target:
    """The URL parsed and checked before any connection; WebFetchRefused says which rule."""
    raw = raw.strip()
    try:
        url = URL(raw)
    except (ValueError, TypeError) as exc:
        raise WebFetchRefused(f"{raw[:200]!r} is not a valid URL ({exc})") from exc
    if url.scheme not in ("http", "https"):
        raise WebFetchRefused(f"only http:// and https:// URLs are fetched, not {url.scheme or 'a relative URL'!r}")
    if url.user is not None or url.password is not None:
        raise WebFetchRefused("URLs with a user name or password are not fetched (web_fetch sends no credentials)")
    if not url.raw_host:
        raise WebFetchRefused(f"{raw[:200]!r} has no host")
    host = normalize_host(url.raw_host)
    allowed = host in {normalize_host(h) for h in allow_hosts}
    if allowed:
        return Target(url, host, True)
    if ":" in host:  # an IPv6 literal
        if "%" in host:
            raise WebFetchRefused(f"{host} is an IPv6 address with a zone (a local interface)")
        try:
            ip6 = ipaddress.IPv6Address(host)
        except ValueError as exc:
            raise WebFetchRefused(f"{host!r} is not a valid IPv6 address") from exc
        _refuse_address(ip6, host)
        return Target(url, host, False)
    if _NUMERIC.fullmatch(host):
        try:
            ip4 = ipaddress.IPv4Address(host)
        except ValueError:
            ip4 = None
        if ip4 is None or str(ip4) != host:
            try:
                meant = ipaddress.IPv4Address(socket.inet_aton(host))
            except OSError:
                raise WebFetchRefused(f"{host!r} is not a valid address") from None
            problem = address_problem(meant)
            raise WebFetchRefused(
                f"{host!r} is a numeric address written in a non-standard form (it means {meant}"
                f"{', ' + problem.split(' is ', 1)[1] if problem else ''}); write addresses as four decimal numbers")
        _refuse_address(ip4, host)
        return Target(url, host, False)
    if host == "localhost" or host.endswith(".localhost"):
        raise WebFetchRefused(f"{host} is this machine (localhost)")
    if not _HOST.fullmatch(host) or len(host) > 253:
        raise WebFetchRefused(f"{url.raw_host!r} is not a valid host name")
    return Target(url, host, False)


def _refuse_address(ip: Address, host: str) -> None:
    problem = address_problem(ip)
    if problem:
        raise WebFetchRefused(f"{host}: {problem}; web_fetch reaches only the public internet "
                              "(TALON_WEB_ALLOW_HOSTS can list a host that is meant)")


class GuardedResolver(AbstractResolver):
    """aiohttp's resolver for web_fetch: one lookup per connection, every address checked, and
    the connection made to exactly those addresses."""

    def __init__(self, allow_hosts: Iterable[str]) -> None:
        self.allow = {normalize_host(h) for h in allow_hosts}

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        name = normalize_host(host)
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, family=family)
        except socket.gaierror as exc:
            raise WebFetchRefused(f"{host} could not be resolved ({exc.strerror})") from exc
        results: list[ResolveResult] = []
        for fam, _, proto, _, sockaddr in infos:
            address = str(sockaddr[0])
            if name not in self.allow:
                ip = ipaddress.ip_address(address.split("%", 1)[0])
                if isinstance(ip, ipaddress.IPv6Address) and len(sockaddr) > 3 and sockaddr[3]:
                    raise WebFetchRefused(f"{host} resolves to {address}, an address with a zone (a local interface)")
                problem = address_problem(ip)
                if problem:
                    raise WebFetchRefused(f"{host} resolves to {problem}; web_fetch reaches only the public "
                                          "internet (TALON_WEB_ALLOW_HOSTS can list a host that is meant)")
            results.append(ResolveResult(hostname=host, host=address, port=int(sockaddr[1]), family=fam,
                                         proto=proto, flags=socket.AI_NUMERICHOST | socket.AI_NUMERICSERV))
        if not results:
            raise WebFetchRefused(f"{host} has no address")
        return results

    async def close(self) -> None:
        return None


def _mime(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def _sniff(head: bytes) -> str:
    start = head[:512].lstrip().lower()
    if start.startswith((b"<!doctype html", b"<html")) or b"<body" in start:
        return "text/html"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    if b"\x00" not in head[:4096]:
        try:
            head[:4096].decode("utf-8")
            return "text/plain"
        except UnicodeDecodeError as exc:
            if exc.start > 4090:  # a character cut at the sniff's edge
                return "text/plain"
    return "application/octet-stream"


def _size(n: int) -> str:
    return f"{n:,} bytes" if n < 10_000 else (f"{n / 1000:.0f} KB" if n < 1_000_000 else f"{n / 1_000_000:.1f} MB")


@dataclass(frozen=True)
class _Body:
    """A fetched response, read: what ``_result`` turns into the tool's answer."""

    data: bytes
    mime: str
    url: str
    status: int
    reason: str
    charset: str | None
    hops: tuple[str, ...]
    truncated: bool


class WebFetchTool(Tool):
    name = "web_fetch"
    description = (
        "Fetch a web page (http or https) and return its readable text as markdown; plain text, JSON "
        "and XML as they are; images as images. Addresses of the host's own network are refused."
    )
    parameters = {
        "type": "object",
        "properties": {"url": {"type": "string", "description": "the http:// or https:// URL"}},
        "required": ["url"],
    }

    def __init__(self, *, store: AttachmentStore | None, limits: Limits, allow_hosts: Iterable[str] = (),
                 max_bytes: int = 5_000_000, timeout_s: float = 30.0,
                 convert: ConvertLimits | None = None) -> None:
        self.store = store
        self.limits = limits
        self.allow_hosts = tuple(h for h in (normalize_host(h) for h in allow_hosts) if h)
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.converter = HtmlConverter(convert)

    def time_limit(self, args: dict[str, Any], default: float) -> float:
        # Its own cap, then turning the page into text (the converter's own cap), then a margin.
        return self.timeout_s + self.converter.limits.seconds + 10.0

    async def run(self, args: dict[str, Any]) -> ToolResult:
        return await self.invoke(args, ToolContext())

    async def invoke(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        raw = args.get("url")
        if not isinstance(raw, str) or not raw.strip():
            raise ToolError("missing required argument 'url' (an http:// or https:// URL)")
        try:
            async with asyncio.timeout(self.timeout_s):
                fetched = await self._fetch(raw)
        except WebFetchRefused as exc:
            log.info("web_fetch refused %s: %s", raw[:200], exc)
            return ToolResult.text(f"Error: not fetched: {exc}", is_error=True)
        except TimeoutError:
            return ToolResult.text(f"Error: {raw[:200]} did not answer within {self.timeout_s:g}s (TALON_WEB_TIMEOUT)",
                                   is_error=True)
        except aiohttp.ClientError as exc:
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, WebFetchRefused):
                return ToolResult.text(f"Error: not fetched: {cause}", is_error=True)
            return ToolResult.text(f"Error: {raw[:200]} could not be fetched: {type(exc).__name__}: {exc}",
                                   is_error=True)
        return await self._result(fetched)

    async def _fetch(self, raw: str) -> _Body:
        target = check_url(raw, self.allow_hosts)
        hops: list[str] = []
        connector = aiohttp.TCPConnector(resolver=GuardedResolver(self.allow_hosts), use_dns_cache=False,
                                         limit=2, force_close=True)
        async with aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(),
                                         trust_env=False, headers={"User-Agent": _USER_AGENT}) as session:
            while True:
                async with session.get(target.url, allow_redirects=False,
                                       headers={"Accept": "text/html,text/plain;q=0.9,*/*;q=0.5"}) as resp:
                    if resp.status in _REDIRECTS and "Location" in resp.headers:
                        if len(hops) >= MAX_REDIRECTS:
                            raise WebFetchRefused(f"more than {MAX_REDIRECTS} redirects (from {raw[:200]})")
                        location = resp.headers["Location"]
                        try:
                            following = target.url.join(URL(location))
                        except ValueError as exc:
                            raise WebFetchRefused(f"{target.url} redirected to an invalid URL {location[:200]!r}") from exc
                        hops.append(str(target.url))
                        try:
                            target = check_url(str(following), self.allow_hosts)
                        except WebFetchRefused as exc:
                            raise WebFetchRefused(f"{hops[-1]} redirected to {str(following)[:200]}, which is "
                                                  f"refused: {exc}") from exc
                        continue
                    return await self._answer(resp, target, hops)

    async def _answer(self, resp: aiohttp.ClientResponse, target: Target, hops: list[str]) -> _Body:
        """The response's body, read up to TALON_WEB_MAX_BYTES (within the fetch's timeout)."""
        body = bytearray()
        truncated = False
        async for chunk in resp.content.iter_chunked(65536):
            room = self.max_bytes - len(body)
            if len(chunk) > room:
                body.extend(chunk[:room])
                truncated = True
                break
            body.extend(chunk)
        data = bytes(body)
        mime = _mime(resp.headers.get("Content-Type")) or _sniff(data)
        if mime in ("application/octet-stream", "binary/octet-stream"):
            mime = _sniff(data) if _sniff(data) != "application/octet-stream" else mime
        return _Body(data=data, mime=mime, url=str(resp.url), status=resp.status, reason=resp.reason or "",
                     charset=resp.charset, hops=tuple(hops), truncated=truncated)

    async def _result(self, page: _Body) -> ToolResult:
        """What the model gets: the page as text (HTML converted in a limited worker), an image
        or a notice."""
        started = time.monotonic()
        data, mime, url = page.data, page.mime, page.url
        attrs = {"url": url, "status": str(page.status), "type": mime}
        notes = [f"(redirected from {page.hops[0]})"] if page.hops else []
        if page.truncated:
            notes.append(f"(only the first {_size(self.max_bytes)} were read: TALON_WEB_MAX_BYTES)")
        is_error = page.status >= 400
        lead = ""
        content: list[ContentBlock] = []
        if mime in _IMAGE_TYPES:
            if page.truncated:
                return ToolResult.text(f"Error: the image at {url} is larger than {_size(self.max_bytes)} "
                                       "(TALON_WEB_MAX_BYTES); not shown", is_error=True)
            if self.store is None:
                return ToolResult.text(f"The image at {url} ({mime}, {_size(len(data))}) cannot be shown in this "
                                       "setup (no attachment store).", is_error=True)
            block, why = await image_from_bytes(data, name=URL(url).name or "web-image", store=self.store,
                                                limits=self.limits)
            if block is None:
                return ToolResult.text(f"Error: the image at {url} cannot be shown: {why}", is_error=True)
            text = f"Image from {url} ({mime}, {_size(len(data))}, {block.ref.width}x{block.ref.height})"
            return ToolResult(content=[TextBlock(text=" ".join([text, *notes])), block], is_error=is_error)
        if mime in _HTML:
            # Never in Talon's process: a worker with CPU, memory and time limits (html_worker).
            try:
                text = await self.converter.convert(data, page.charset, url)
            except ConversionCut as cut_short:
                shown = min(len(data), PLAIN_PREFIX_BYTES)
                text = await asyncio.to_thread(plain_text_prefix, data, page.charset)
                is_error = True
                whole = " (that is the whole page)" if shown == len(data) else ""
                lead = (f"Error: the page at {url} ({_size(len(data))}) was too large or complex to turn into "
                        f"readable text: {cut_short.reason}. Below is only the plain text of its first "
                        f"{_size(shown)}, without links or layout{whole}.")
                attrs["converted"] = "no (plain text of the start)"
        elif mime.startswith("text/") or mime in _TEXT_TYPES or mime.endswith(("+json", "+xml")):
            text = data.decode(page.charset or "utf-8", "replace")
        else:
            return ToolResult.text(
                f"{url} is {mime} ({_size(len(data))}{' or more' if page.truncated else ''}), which web_fetch does "
                "not turn into text (it reads web pages, plain text, JSON, XML and images).", is_error=is_error)
        text, omitted = cut(text)
        if omitted:
            notes.append(f"(the text was cut: {omitted:,} more characters)")
        attrs["chars"] = str(len(text))
        block_text = untrusted_block("WEB CONTENT", attrs, text or "(no text)", f"Content of the web page {url}")
        if page.status >= 400:
            block_text = f"HTTP {page.status} {page.reason} from {url}\n" + block_text
        if lead:
            block_text = f"{lead}\n{block_text}"
        content.append(TextBlock(text="\n".join([block_text, *notes])))
        log.info("web_fetch %s: %s, %s, %s in %.1fs", url, page.status, mime, _size(len(data)),
                 time.monotonic() - started)
        return ToolResult(content=content, is_error=is_error)

    async def aclose(self) -> None:
        """Stop the converter's worker processes (at shutdown)."""
        await self.converter.aclose()
