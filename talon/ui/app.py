"""The panel's routes on Talon's HTTP server, under ``/ui/``, and the walls every one of them stands
behind (``Panel.route`` wraps each handler):

1. ``Host`` must be one Talon serves (``talon.ui.security.allowed_hosts``), else 421.
2. A POST must come from this origin: ``Origin`` equal to the request's own scheme and host (and no
   ``Sec-Fetch-Site: cross-site``), else 403. Then its CSRF token (form field ``csrf`` or header
   ``X-CSRF-Token``) must be the session's (before sign-in: the sign-in cookie's), else 403.
3. A signed-in session (cookie ``talon_ui``: HttpOnly, SameSite=Strict, Path=/ui/, Secure over
   HTTPS), touched on every request and gone after ``TALON_UI_SESSION_IDLE`` without one; without
   it a page redirects to ``/ui/signin`` and anything else (``/ui/api/``, attachments) gets 401.
4. Every answer carries the security headers (a CSP with no inline script and no other origin,
   ``X-Frame-Options: DENY``, ``Referrer-Policy: same-origin``, ``nosniff``), and every text
   answer is scrubbed of the secrets' values before it leaves.

State comes from the stores (``Stores.panel`` and the others), so with many workers on
PostgreSQL any worker serves any request; only ``/ui/logs`` is per worker (its own lines).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import mimetypes
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from aiohttp import web
from jinja2 import Environment, FileSystemLoader, select_autoescape

from talon.storage.panel import AuditEntry, PanelSession, PanelStore
from talon.storage.sessions import ChatKey
from talon.ui import security as sec
from talon.ui import views
from talon.ui.logs import LogRing, install as install_log_ring

if TYPE_CHECKING:
    from talon.runtime import Runtime

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
COOKIE = "talon_ui"
PRE_COOKIE = "talon_ui_pre"  # the sign-in form's CSRF token (no session yet)
NOTE_COOKIE = "talon_ui_note"  # what an action did, shown once on the page it redirects to
FAILURE_WINDOW_S = 900.0
MAX_FAILURES = 5  # failed sign-ins per address in FAILURE_WINDOW_S; then 429 until they age out
FAILURE_DELAY_S = 1.0  # every failed sign-in is answered this late
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; connect-src 'self'; "
       "font-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # "no-referrer" makes Chromium send Origin: null with forms
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SESSION = web.RequestKey("talon_ui_session", PanelSession)


def redirect(location: str) -> web.Response:
    """303 See Other: after a POST, the browser GETs ``location``."""
    return web.Response(status=303, headers={"Location": location})


class Panel:
    def __init__(self, runtime: "Runtime", store: PanelStore) -> None:
        self.runtime = runtime
        self.settings = runtime.settings
        self.store = store
        self.secrets = sec.secret_values(self.settings)
        self.hosts = sec.allowed_hosts(self.settings)
        self.started = time.time()
        self.logs: LogRing = install_log_ring(self.secrets)
        self.env = Environment(loader=FileSystemLoader(HERE / "templates"),
                               autoescape=select_autoescape(default=True, default_for_string=True))
        self.env.filters.update(when=views.when, ago=views.ago, number=views.number, chat_url=views.chat_url,
                                money=views.money)
        self.webchat: Any = None  # talon.ui.webchat.WebChat, when the panel serves one
        self.pages: Any = None  # talon.ui.pages.Pages, once installed
        self.failure_delay_s = FAILURE_DELAY_S
        self.closing = asyncio.Event()  # set when Talon stops: live streams end

    def close(self) -> None:
        self.closing.set()
        if self.webchat is not None:
            self.webchat.closing.set()

    # --- plumbing ------------------------------------------------------------------------------
    def route(self, method: str, path: str, handler: Handler, *, auth: bool = True, api: bool = False) -> None:
        assert self.runtime.http is not None
        self.runtime.http.add_route(method, path, self._guarded(handler, auth=auth, api=api))

    def _guarded(self, handler: Handler, *, auth: bool, api: bool) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            try:
                response = await self._checked(request, handler, auth=auth, api=api)
            except web.HTTPException as exc:  # answered as a plain response, with the headers below
                kept = {k: v for k, v in exc.headers.items() if k.lower() not in ("content-type", "content-length")}
                response = web.Response(status=exc.status, text=exc.text, headers=kept)
            for name, value in HEADERS.items():
                response.headers.setdefault(name, value)
            textual = response.content_type.startswith("text/") or response.content_type == "application/json"
            if isinstance(response, web.Response) and textual and response.text is not None and self.secrets:
                cleaned = sec.scrub(response.text, self.secrets)
                if cleaned != response.text:
                    response.text = cleaned
            return response

        return guarded

    async def _checked(self, request: web.Request, handler: Handler, *, auth: bool,
                       api: bool) -> web.StreamResponse:
        if sec.host_name(request.headers.get("Host", "")) not in self.hosts:
            log.warning("ui: %s %s refused: Host %r is not one Talon serves", request.method, request.path,
                        request.headers.get("Host", "")[:100])
            return web.Response(status=421, text="misdirected request: this Host is not served here\n")
        if request.method == "POST":
            refused = self._foreign(request)
            if refused:
                log.warning("ui: POST %s from %s refused: %s", request.path, self.address(request), refused)
                return web.Response(status=403, text=f"forbidden: {refused}\n")
        session: PanelSession | None = None
        if auth:
            session = await self.session_of(request)
            if session is None:
                if api or request.method != "GET":
                    return web.json_response({"error": "sign in first"}, status=401)
                return redirect("/ui/signin")
            if request.method == "POST" and not await self._csrf_ok(request, session.csrf):
                log.warning("ui: POST %s from %s refused: no valid CSRF token", request.path, self.address(request))
                return web.Response(status=403, text="forbidden: the form is stale or forged (CSRF token)\n")
            request[SESSION] = session
        elif request.method == "POST":
            pre = request.cookies.get(PRE_COOKIE, "")
            if not pre or not await self._csrf_ok(request, pre):
                return web.Response(status=403, text="forbidden: the sign-in form is stale or forged (CSRF token); "
                                                     "load /ui/signin again\n")
        return await handler(request)

    def _foreign(self, request: web.Request) -> str:
        origin = request.headers.get("Origin", "")
        if request.headers.get("Sec-Fetch-Site", "") == "cross-site":
            return "a cross-site request"
        if not origin:
            return "no Origin header"
        expected = f"{self.scheme(request)}://{request.headers.get('Host', '')}".lower()
        if origin.lower() != expected:
            return f"Origin {origin[:100]!r} is not this site"
        return ""

    async def _csrf_ok(self, request: web.Request, expected: str) -> bool:
        given = request.headers.get("X-CSRF-Token", "")
        # A multipart body (the web chat's images) is read by its handler as a stream: its token
        # comes in the header.
        if not given and request.content_type == "application/x-www-form-urlencoded":
            form = await request.post()
            given = str(form.get("csrf", ""))
        return bool(given) and hmac.compare_digest(given.encode(), expected.encode())

    def scheme(self, request: web.Request) -> str:
        if self.settings.ui_trust_proxy:
            forwarded = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
            if forwarded in ("http", "https"):
                return forwarded
        return "https" if request.secure else "http"

    def address(self, request: web.Request) -> str:
        if self.settings.ui_trust_proxy:
            forwarded = [a.strip() for a in request.headers.get("X-Forwarded-For", "").split(",") if a.strip()]
            if forwarded:
                return forwarded[-1][:64]  # the address the proxy saw
        return request.remote or "?"

    async def session_of(self, request: web.Request) -> PanelSession | None:
        token = request.cookies.get(COOKIE, "")
        if not token:
            return None
        digest = sec.token_hash(token)
        session = await self.store.session(digest)
        now = time.time()
        if session is None:
            return None
        if now - session.last_seen > self.settings.ui_session_idle_s:
            await self.store.end_session(digest)
            return None
        await self.store.touch_session(digest, now)
        return session

    def set_cookie(self, request: web.Request, response: web.StreamResponse, name: str, value: str,
                   max_age: int | None = None) -> None:
        response.set_cookie(name, value, path="/ui/", httponly=True, samesite="Strict",
                            secure=self.scheme(request) == "https", max_age=max_age)

    async def audit(self, request: web.Request, action: str, detail: str = "") -> None:
        session = request.get(SESSION)
        who = f"operator ({session.who})" if session is not None else "anonymous"
        await self.store.audit(AuditEntry(time.time(), who, action, sec.scrub(detail, self.secrets)[:500],
                                          self.address(request)))
        log.info("ui: %s %s %s", who, action, detail[:200])

    def noted(self, location: str, note: str) -> web.Response:
        """Redirect after an action; the page shows ``note`` once. It travels in a cookie, not in
        the URL, so a link made elsewhere cannot put words on a panel page."""
        response = redirect(location)
        response.set_cookie(NOTE_COOKIE, quote(note[:300], safe=""), path="/ui/", httponly=True, samesite="Strict",
                            max_age=60)
        return response

    def render(self, request: web.Request, template: str, status: int = 200, **values: Any) -> web.Response:
        session = request.get(SESSION)
        note = unquote(request.cookies.get(NOTE_COOKIE, ""))[:300] if session is not None else ""
        page = self.env.get_template(template).render(
            csrf=session.csrf if session is not None else values.pop("csrf", ""),
            signed_in=session is not None, path=request.path, note=note, **values)
        response = web.Response(text=page, content_type="text/html", status=status)
        if note:
            response.del_cookie(NOTE_COOKIE, path="/ui/")
        return response

    # --- the routes ----------------------------------------------------------------------------
    def install(self) -> None:
        from talon.ui import pages

        pages.install(self)

    # --- sign-in -------------------------------------------------------------------------------
    async def signin_page(self, request: web.Request, error: str = "", status: int = 200) -> web.Response:
        if await self.session_of(request) is not None and not error:
            return redirect("/ui/")
        pre = request.cookies.get(PRE_COOKIE) or sec.new_token()
        response = self.render(request, "signin.html", status=status, csrf=pre, error=error,
                               has_password=bool(self.settings.ui_password_hash))
        self.set_cookie(request, response, PRE_COOKIE, pre)
        return response

    async def _limited(self, request: web.Request) -> web.Response | None:
        address = self.address(request)
        if await self.store.failures(address, time.time() - FAILURE_WINDOW_S) >= MAX_FAILURES:
            log.warning("ui: sign-in from %s refused: too many failed attempts", address)
            response = await self.signin_page(request, f"Too many failed sign-ins from {address}; try again in "
                                                       f"{int(FAILURE_WINDOW_S // 60)} minutes.", status=429)
            response.headers["Retry-After"] = str(int(FAILURE_WINDOW_S))
            return response
        return None

    async def _failed(self, request: web.Request, what: str) -> web.Response:
        await self.store.add_failure(self.address(request), time.time())
        await self.audit(request, "sign-in refused", what)
        await asyncio.sleep(self.failure_delay_s)
        return await self.signin_page(request, "Wrong password." if what == "wrong password"
                                      else "This sign-in link is unknown, used or expired.", status=401)

    async def _signed_in(self, request: web.Request, how: str) -> web.Response:
        token = sec.new_token()
        now = time.time()
        session = PanelSession(sec.token_hash(token), sec.new_token(), how, self.address(request), now, now)
        await self.store.add_session(session)
        await self.store.prune_sessions(now - self.settings.ui_session_idle_s)
        request[SESSION] = session
        await self.audit(request, "signed in", f"by {how}")
        response = redirect("/ui/")
        self.set_cookie(request, response, COOKIE, token)
        response.del_cookie(PRE_COOKIE, path="/ui/")
        return response

    async def signin(self, request: web.Request) -> web.Response:
        limited = await self._limited(request)
        if limited is not None:
            return limited
        form = await request.post()
        password = str(form.get("password", ""))
        hashed = self.settings.ui_password_hash.strip()
        if not hashed:
            return await self.signin_page(request, "No password is set: sign in with a link from `talon ui link`.",
                                          status=401)
        if not password or not await asyncio.to_thread(sec.verify_password, hashed, password):
            return await self._failed(request, "wrong password")
        return await self._signed_in(request, "password")

    async def link_page(self, request: web.Request) -> web.Response:
        pre = request.cookies.get(PRE_COOKIE) or sec.new_token()
        response = self.render(request, "link.html", csrf=pre, token=request.query.get("token", "")[:200])
        self.set_cookie(request, response, PRE_COOKIE, pre)
        return response

    async def link_signin(self, request: web.Request) -> web.Response:
        limited = await self._limited(request)
        if limited is not None:
            return limited
        form = await request.post()
        token = str(form.get("token", ""))
        if not token or not await self.store.use_link(sec.token_hash(token), time.time()):
            return await self._failed(request, "unknown, used or expired link")
        return await self._signed_in(request, "link")

    async def signout(self, request: web.Request) -> web.Response:
        session: PanelSession = request[SESSION]
        await self.audit(request, "signed out")
        await self.store.end_session(session.token_hash)
        response = redirect("/ui/signin")
        response.del_cookie(COOKIE, path="/ui/")
        return response

    async def static(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        path = HERE / "static" / name
        if "/" in name or name.startswith(".") or not path.is_file():
            raise web.HTTPNotFound()
        data = await asyncio.to_thread(path.read_bytes)
        kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
        response = web.Response(body=data, content_type=kind)
        response.headers["Cache-Control"] = "private, max-age=300"
        return response

    # --- helpers for the pages -----------------------------------------------------------------
    def chat_key(self, request: web.Request) -> ChatKey:
        """A conversation's id in a path: ``<channel>:<chat>`` (``telegram:111``, ``telegram:-100:7``
        for a topic); channel names hold no colon."""
        channel, _, chat_id = request.match_info["key"].partition(":")
        if not channel or not chat_id:
            raise web.HTTPNotFound(text="no such chat: a chat is named <channel>:<id>")
        return ChatKey(channel, chat_id)

