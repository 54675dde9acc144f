"""The panel's pages and their actions (the paths are part of the interface: docs/control-room.md).

Every action is a POST behind the walls of ``talon.ui.app.Panel.route``, does what the chat
command or the ``talon`` command of the same name does, through the same code, and is written to
the audit log (``/ui/audit``) with who, what and from where.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from talon.errors import ConfigError, PairingError
from talon.storage.sessions import ChatKey
from talon.ui import views

from talon.ui.app import SESSION, redirect

if TYPE_CHECKING:
    from talon.ui.app import Panel

log = logging.getLogger(__name__)

DAYS_CHARTED = 14
LIVE_POLL_S = 1.0  # how often a live page's stream looks for news in the stores
LIVE_MAX_S = 300.0  # a stream ends after this long (the browser reconnects): no stream lives for ever


def install(panel: "Panel") -> None:
    p = Pages(panel)
    panel.pages = p
    r = panel.route
    r("GET", "/ui", p.to_root, auth=False)
    r("GET", "/ui/", p.overview)
    r("GET", "/ui/signin", panel.signin_page, auth=False)
    r("POST", "/ui/signin", panel.signin, auth=False)
    r("GET", "/ui/signin/link", panel.link_page, auth=False)
    r("POST", "/ui/signin/link", panel.link_signin, auth=False)
    r("POST", "/ui/signout", panel.signout)
    r("GET", "/ui/static/{name}", panel.static, auth=False)
    r("GET", "/ui/chats", p.chats)
    r("GET", "/ui/search", p.search)
    r("GET", "/ui/chats/{key}", p.chat)
    r("GET", "/ui/api/chats/{key}/messages", p.chat_messages, api=True)
    r("GET", "/ui/api/chats/{key}/events", p.chat_events, api=True)
    r("GET", "/ui/attachments/{key}/{sha}", p.attachment, api=True)
    r("GET", "/ui/files/{key}", p.workspace_file, api=True)
    r("GET", "/ui/approvals", p.approvals)
    r("POST", "/ui/approvals/{id}", p.decide)
    r("GET", "/ui/tasks", p.tasks)
    r("POST", "/ui/tasks/{id}", p.task_action)
    r("GET", "/ui/usage", p.usage)
    r("POST", "/ui/usage/grant", p.grant)
    r("GET", "/ui/access", p.access)
    r("POST", "/ui/access/{action}", p.access_action)
    r("GET", "/ui/logs", p.logs)
    r("GET", "/ui/api/logs", p.logs_since, api=True)
    r("GET", "/ui/settings", p.settings_page)
    r("GET", "/ui/audit", p.audit)
    r("GET", "/ui/api/status", p.status, api=True)
    if panel.webchat is not None:
        panel.webchat.install(panel)


class Pages:
    def __init__(self, panel: "Panel") -> None:
        self.panel = panel
        self.runtime = panel.runtime
        self.store = panel.store

    async def to_root(self, request: web.Request) -> web.Response:
        return redirect("/ui/")

    # --- overview ------------------------------------------------------------------------------
    async def overview(self, request: web.Request) -> web.Response:
        from talon.health import health_checks

        runtime = self.runtime
        checks, per_day, pending, tasks, chats = await asyncio.gather(
            health_checks(runtime), self.store.per_day(time.time() - 86400 * DAYS_CHARTED),
            self.store.pending_approvals(limit=50), self._tasks(), self.store.chat_count())
        workers = "1 (embedded stores)"
        stores = runtime.stores
        if stores is not None and stores.leases is not None:
            summary = await stores.leases.summary()
            workers = f"{max(summary.holders, 1)} holding leases (PostgreSQL); this one is {stores.worker_id}"
        failing = [t for t in tasks if t.failures or t.last_status == "failed"]
        profile = runtime.agent.profile
        return self.panel.render(
            request, "overview.html", title="Overview", checks=checks, model=runtime.settings.model,
            window=profile.context_window, vision=profile.vision, workers=workers,
            uptime=views.ago(self.panel.started).replace(" ago", ""), bars=views.day_bars(dict(per_day), DAYS_CHARTED),
            pending=pending, failing=failing, chats=chats)

    # --- chats ---------------------------------------------------------------------------------
    async def chats(self, request: web.Request) -> web.Response:
        query = request.query.get("q", "")[:200]
        rows = await self.store.chats(query, limit=500)
        return self.panel.render(request, "chats.html", title="Chats", rows=rows, q=query)

    async def search(self, request: web.Request) -> web.Response:
        """Full-text search over every chat's stored messages (the operator's; a chat's own
        ``/search`` and tool see only that chat). The query is words, never engine syntax."""
        from talon.storage.search import MAX_LIMIT, query_words, snippet

        query = request.query.get("q", "")[:200]
        words = query_words(query)
        sessions = self.runtime.sessions
        enabled = sessions.search_enabled
        hits = await sessions.search_all(query, MAX_LIMIT) if words and enabled else []
        rows = [{"chat": h.chat, "when": h.at, "who": "assistant" if h.role == "assistant" else (h.sender or "user"),
                 "text": snippet(h.text, words), "thread": h.thread} for h in hits if h.chat is not None]
        return self.panel.render(request, "search.html", title="Search", q=query, words=" ".join(words), rows=rows,
                                 enabled=enabled)

    async def _messages(self, key: ChatKey) -> list[Any]:
        return await self.runtime.sessions.load(key)

    async def stored_sent(self, key: ChatKey) -> dict[str, tuple[str, str]]:
        """Reference path -> (sha256, mime) of the files the agent sent here that are in the
        attachment store (the web chat's; newest wins when a path was sent more than once)."""
        sent = await self.store.sent_files(key.channel, key.chat_id)
        stored: dict[str, tuple[str, str]] = {}
        for f in sent:  # newest first
            stored.setdefault(f.path, (f.sha, f.mime))
        return stored

    async def chat(self, request: web.Request) -> web.Response:
        key = self.panel.chat_key(request)
        row, messages, stored = await asyncio.gather(self.store.chat(key.channel, key.chat_id),
                                                     self._messages(key), self.stored_sent(key))
        if row is None and not messages:
            raise web.HTTPNotFound(text="no such chat")
        return self.panel.render(request, "chat.html", title=row.title if row and row.title else str(key),
                                 key=key, row=row, messages=views.shown_messages(messages, stored=stored),
                                 count=len(messages), base=views.chat_url(key))

    async def chat_messages(self, request: web.Request) -> web.Response:
        """The messages after ``after`` as an HTML fragment (the live page appends them)."""
        key = self.panel.chat_key(request)
        after = _int(request.query.get("after"), 0)
        messages, stored = await asyncio.gather(self._messages(key), self.stored_sent(key))
        page = self.panel.env.get_template("messages.html").render(
            messages=views.shown_messages(messages, first=after, stored=stored), base=views.chat_url(key))
        response = web.Response(text=page, content_type="text/html")
        response.headers["X-Talon-Count"] = str(len(messages))
        return response

    async def chat_events(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: ``count`` whenever the conversation's log grows."""
        key = self.panel.chat_key(request)
        seen = _int(request.query.get("count"), 0)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
        _headers(response)
        await response.prepare(request)
        ends = time.monotonic() + LIVE_MAX_S
        try:
            while time.monotonic() < ends and not self.panel.closing.is_set():
                count = len(await self._messages(key))
                if count != seen:
                    seen = count
                    await response.write(f"event: count\ndata: {count}\n\n".encode())
                else:
                    await response.write(b": idle\n\n")
                try:
                    await asyncio.wait_for(self.panel.closing.wait(), LIVE_POLL_S)
                except TimeoutError:
                    pass
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        return response

    async def attachment(self, request: web.Request) -> web.StreamResponse:
        """An attachment's bytes, to a signed-in session, only when the chat refers to it."""
        from talon.storage.attachments import check_sha

        key = self.panel.chat_key(request)
        sha = request.match_info["sha"]
        try:
            check_sha(sha)
        except Exception:
            raise web.HTTPNotFound(text="no such attachment") from None
        refs = views.referenced(await self._messages(key))
        refs.update({f.sha: f.mime for f in await self.store.sent_files(key.channel, key.chat_id)})
        if sha not in refs:
            raise web.HTTPNotFound(text="no such attachment in this chat")
        unreadable = web.Response(status=503, text="the attachment could not be read; try again\n",
                                  headers={"Retry-After": "5"})
        tag = f'"{sha}"'  # content-addressed: the bytes behind a name never change
        if request.headers.get("If-None-Match") == tag:
            # The browser has the bytes; it asks again each time, so a lost object is noticed.
            return web.Response(status=304, headers={"ETag": tag}) if await self.runtime.store.exists(sha) \
                else unreadable
        try:
            data = await self.runtime.store.read_bytes(sha)
        except Exception as exc:
            log.warning("ui: attachment %s of %s could not be read: %s", sha[:12], key, exc)
            return unreadable
        mime = refs[sha]
        inline = mime in ("image/png", "image/jpeg", "image/webp", "image/gif")
        response = web.Response(body=data, content_type=mime if inline else "application/octet-stream")
        response.headers["Content-Disposition"] = "inline" if inline else f'attachment; filename="{sha[:16]}"'
        response.headers["Cache-Control"] = "private, no-cache"
        response.headers["ETag"] = tag
        response.headers["Content-Security-Policy"] = "default-src 'none'; sandbox"
        return response

    async def workspace_file(self, request: web.Request) -> web.StreamResponse:
        """A file the agent sent in a conversation (``![alt](path)`` in a reply), from the chat's
        workspace: to a signed-in session, only for a path a reply of this chat refers to, and
        only a regular file inside the workspace (``talon.media.paths``: no ``..``, no URL, no
        symlink or hard link out of it, not replaced while opened), always as a download."""
        from talon.errors import MediaPathError
        from talon.media.paths import open_checked_media

        key = self.panel.chat_key(request)
        path = request.query.get("path", "")
        if not path or len(path) > 1000 or path not in views.sent_paths(await self._messages(key)):
            raise web.HTTPNotFound(text="no such file in this chat's replies")
        root = self.runtime.settings.workspace_dir(key.channel, key.chat_id)
        limit = self.runtime.settings.telegram_upload_max_bytes

        def read() -> tuple[str, bytes]:
            with open_checked_media(path, root) as opened:
                if opened.size > limit:
                    raise MediaPathError(f"{opened.name!r} is larger than {limit:,} bytes")
                return opened.name, opened.file.read(limit + 1)[:limit]

        try:
            name, data = await asyncio.to_thread(read)
        except (MediaPathError, OSError) as exc:
            log.warning("ui: file %r of %s not served: %s", path[:200], key, exc)
            raise web.HTTPNotFound(text="the file is not in this chat's workspace (moved, removed or refused)") \
                from None
        await self.panel.audit(request, "file download", f"{key}: {name}")
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:120] or "file"
        response = web.Response(body=data, content_type="application/octet-stream")
        response.headers["Content-Disposition"] = f'attachment; filename="{safe}"'
        response.headers["Content-Security-Policy"] = "default-src 'none'; sandbox"
        return response

    # --- approvals -----------------------------------------------------------------------------
    async def approvals(self, request: web.Request) -> web.Response:
        pending, decided = await asyncio.gather(self.store.pending_approvals(), self.store.decided_approvals())
        return self.panel.render(request, "approvals.html", title="Approvals", pending=pending, decided=decided)

    async def decide(self, request: web.Request) -> web.Response:
        control = self.runtime.bridge.control
        if control is None:
            raise web.HTTPNotFound(text="approvals are off")
        form = await request.post()
        choice = str(form.get("decision", ""))
        if choice not in ("approve", "deny"):
            raise web.HTTPBadRequest(text="decision must be approve or deny")
        approval_id = request.match_info["id"]
        by = f"panel (operator, {request[SESSION].who}, from {self.panel.address(request)})"
        answer = await control.approvals.answer_as_operator(approval_id, "deny" if choice == "deny" else "approve", by)
        if answer.outcome == "decided" and answer.approval is not None:
            channel = self.runtime.bridge.channels.get(answer.approval.channel)
            if channel is not None:  # the chat's prompt says what became of it, as after a press
                await control.approvals.settle(channel, answer.approval)
        subject = f"{answer.approval.tool} in {answer.approval.channel}:{answer.approval.chat_id}" \
            if answer.approval else approval_id
        await self.panel.audit(request, f"approval {choice}", f"{approval_id}: {subject}: {answer.note}")
        return self.panel.noted("/ui/approvals", answer.note)

    # --- tasks ---------------------------------------------------------------------------------
    async def _tasks(self) -> list[Any]:
        stores = self.runtime.stores
        if stores is None:
            return []
        return await stores.tasks.every_chat()

    async def tasks(self, request: web.Request) -> web.Response:
        from talon.storage.tasks import ACTIVE, PAUSED

        tasks = await self._tasks()
        return self.panel.render(request, "tasks.html", title="Tasks", tasks=tasks, live=(ACTIVE, PAUSED))

    async def task_action(self, request: web.Request) -> web.Response:
        from talon.scheduler import when as w
        from talon.storage.tasks import ACTIVE, CANCELLED, PAUSED

        stores = self.runtime.stores
        if stores is None:
            raise web.HTTPNotFound(text="no task store")
        form = await request.post()
        action = str(form.get("action", ""))
        task_id = request.match_info["id"]
        task = await stores.tasks.get(task_id)
        if task is None:
            raise web.HTTPNotFound(text="no such task")
        now = time.time()
        if action == "pause":
            changed = await stores.tasks.set_status(task_id, PAUSED, only_from=(ACTIVE,))
        elif action == "resume":
            zone = w.zone_named(task.timezone)
            nxt = w.next_run(task.kind, task.spec, zone, now) if task.repeats else now
            changed = await stores.tasks.set_status(task_id, ACTIVE, next_run=nxt, only_from=(PAUSED,))
        elif action == "cancel":
            changed = await stores.tasks.set_status(task_id, CANCELLED)
        elif action == "run":
            # Due now: the scheduler of some worker hands it to the inbox at its next look.
            changed = await stores.tasks.set_status(task_id, ACTIVE, next_run=now, only_from=(ACTIVE, PAUSED))
        else:
            raise web.HTTPBadRequest(text="action must be pause, resume, cancel or run")
        note = f"Task {task_id}: {action} done." if changed else f"Task {task_id} is {task.status}: nothing changed."
        await self.panel.audit(request, f"task {action}", f"{task_id} in {task.channel}:{task.chat_id}: "
                                                          f"{'done' if changed else 'nothing changed'}")
        return self.panel.noted("/ui/tasks", note)

    # --- usage ---------------------------------------------------------------------------------
    async def usage(self, request: web.Request) -> web.Response:
        from talon.control.caps import period_bounds

        settings = self.runtime.settings
        now = time.time()
        month, _ = period_bounds("month", now, settings.zone)
        people, chats, models, days = await asyncio.gather(
            self.store.usage_by("person", month), self.store.usage_by("chat", month),
            self.store.usage_by("model", month), self.store.usage_by("day", now - 86400 * 30))
        caps = []
        control = self.runtime.bridge.control
        if control is not None and control.caps.person:
            for row in people[:50]:
                channel, _, person = row.key.partition(":")
                for limit in control.caps.person:
                    since, _ = period_bounds(limit.period, now, settings.zone)
                    spent = await control.usage.spend(since, channel=channel, person=person)
                    allowed = limit.amount + await control.usage.granted(channel, person, limit.unit, since)
                    used = limit.used(spent)
                    caps.append({"who": row.key, "limit": limit.describe(), "used": used, "allowed": allowed,
                                 "unit": limit.unit, "share": min(100, round(100 * used / allowed)) if allowed else 100})
        top = max([d.tokens for d in days] + [1])
        return self.panel.render(request, "usage.html", title="Usage", people=people, chats=chats, models=models,
                                 days=days, top=top, caps=caps, has_caps=bool(control and control.caps.any))

    async def grant(self, request: web.Request) -> web.Response:
        from talon.control.caps import parse_grant
        from talon.control.cli import parse_person

        form = await request.post()
        try:
            channel, person = parse_person(str(form.get("person", "")))
            amount, unit = parse_grant(str(form.get("amount", "")))
        except ConfigError as exc:
            return self.panel.noted("/ui/usage", str(exc))
        await self.runtime.stores.usage.grant(channel, person, amount, unit, time.time()) \
            if self.runtime.stores is not None else None
        shown = f"${amount:,.2f}" if unit == "usd" else f"{int(amount):,} tokens"
        await self.panel.audit(request, "usage grant", f"{shown} to {channel}:{person}")
        return self.panel.noted("/ui/usage", f'Granted {shown} to {channel}:{person} for today and this month.')

    # --- access --------------------------------------------------------------------------------
    async def access(self, request: web.Request) -> web.Response:
        gate = self.runtime.bridge.gate
        pending, approved = await asyncio.gather(gate.pending(), gate.approvals())
        settings = self.runtime.settings
        lists = [("telegram", "people", sorted(settings.telegram_allowlist)),
                 ("telegram", "groups", sorted(str(c) for c in settings.telegram_allowed_chat_ids)),
                 ("whatsapp", "numbers", sorted(settings.whatsapp_allowlist))]
        return self.panel.render(request, "access.html", title="Access", pending=pending, approved=approved,
                                 lists=lists, pairing=settings.pairing)

    async def access_action(self, request: web.Request) -> web.Response:
        gate = self.runtime.bridge.gate
        action = request.match_info["action"]
        form = await request.post()
        try:
            if action == "approve":
                done = await gate.approve(str(form.get("code", "")))
                note = f"Approved {done.who}."
            elif action == "reject":
                rejected = await gate.reject(str(form.get("code", "")))
                note = f"Rejected the request of {rejected.channel}:{rejected.sender_id}."
            elif action == "revoke":
                revoked = await gate.revoke(str(form.get("channel", "")), str(form.get("sender", "")))
                note = f"Revoked {revoked.who}." if revoked else "Nobody was approved so: nothing changed."
            else:
                raise web.HTTPNotFound()
        except PairingError as exc:
            note = str(exc)
        await self.panel.audit(request, f"access {action}", note)
        return self.panel.noted("/ui/access", note)

    # --- logs, settings, audit, status ---------------------------------------------------------
    async def logs(self, request: web.Request) -> web.Response:
        level = request.query.get("level", "INFO").upper()
        levelno = logging.getLevelName(level) if level in ("DEBUG", "INFO", "WARNING", "ERROR") else logging.INFO
        lines = self.panel.logs.since(0, int(levelno))
        return self.panel.render(request, "logs.html", title="Logs", lines=lines, level=logging.getLevelName(levelno),
                                 last=lines[-1].seq if lines else 0)

    async def logs_since(self, request: web.Request) -> web.Response:
        level = request.query.get("level", "INFO").upper()
        levelno = logging.getLevelName(level) if level in ("DEBUG", "INFO", "WARNING", "ERROR") else logging.INFO
        lines = self.panel.logs.since(_int(request.query.get("after"), 0), int(levelno))
        return web.json_response({"lines": [{"seq": l.seq, "at": views.when(l.at), "level": l.level, "text": l.text}
                                            for l in lines]})

    async def settings_page(self, request: web.Request) -> web.Response:
        return self.panel.render(request, "settings.html", title="Settings", rows=settings_rows(self.runtime.settings))

    async def audit(self, request: web.Request) -> web.Response:
        return self.panel.render(request, "audit.html", title="Audit log", entries=await self.store.audit_log(500))

    async def status(self, request: web.Request) -> web.Response:
        pending = await self.store.pending_approvals(limit=1000)
        return web.json_response({"model": self.runtime.settings.model, "pending_approvals": len(pending),
                                  "chats": await self.store.chat_count(),
                                  "uptime_s": round(time.time() - self.panel.started)})


def settings_rows(settings: Any) -> list[dict[str, str]]:
    """Every setting: its name, its value (secrets: set / not set) and where it came from."""
    from talon.settings_source import find_env_file
    from talon.ui.security import is_secret_field

    try:
        source = find_env_file()
        from dotenv import dotenv_values

        in_file = set(dotenv_values(source.path).keys()) if source.path is not None else set()
        file_name = str(source.path) if source.path else ""
    except (ConfigError, OSError):
        in_file, file_name = set(), ""
    rows = []
    for field, info in type(settings).model_fields.items():
        choices = getattr(info.validation_alias, "choices", None) or [field.upper()]
        name = next((c for c in choices if isinstance(c, str) and c.isupper()), field.upper())
        value = getattr(settings, field)
        if is_secret_field(field):
            shown = "set" if value else "not set"
        elif value is None:
            shown = "(auto)"
        else:
            shown = str(value)
        if name in os.environ:
            origin = "environment"
        elif name in in_file:
            origin = f".env ({file_name})"
        elif field in settings.model_fields_set:
            origin = "given at start"
        else:
            origin = "default"
        rows.append({"name": name, "value": shown[:300], "origin": origin, "secret": "yes" if is_secret_field(field) else ""})
    return sorted(rows, key=lambda r: r["name"])


def _int(value: str | None, default: int) -> int:
    try:
        return max(0, int(value or default))
    except ValueError:
        return default


def _headers(response: web.StreamResponse) -> None:
    from talon.ui.app import HEADERS

    for name, value in HEADERS.items():
        response.headers.setdefault(name, value)
