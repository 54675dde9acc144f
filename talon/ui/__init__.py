"""The web panel ("control room") under ``/ui/`` on Talon's HTTP server: docs/control-room.md.

``add_ui_routes(runtime)`` adds its routes (before the server starts); ``talon.ui.security`` has
its walls as plain functions, ``talon.ui.app`` the checks every route stands behind,
``talon.ui.pages`` the pages, ``talon.ui.webchat`` the web chat channel, ``talon.ui.cli`` the
``talon ui password`` and ``talon ui link`` commands.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from talon.ui.security import check_ui_settings, ui_enabled

if TYPE_CHECKING:
    from talon.runtime import Runtime
    from talon.ui.app import Panel

__all__ = ["add_ui_routes", "check_ui_settings", "ui_enabled"]

log = logging.getLogger(__name__)


def add_ui_routes(runtime: "Runtime") -> "Panel | None":
    """The panel on ``runtime.http`` when it is on (``talon.ui.security.ui_enabled``); None when not."""
    http, stores = runtime.http, runtime.stores
    if http is None or http.running or stores is None or stores.panel is None:
        return None
    if not ui_enabled(runtime.settings, http_runs=True) or http.has_route("GET", "/ui/"):
        return None
    check_ui_settings(runtime.settings)
    from talon.ui.app import Panel

    panel = Panel(runtime, stores.panel)
    panel.webchat = runtime.webchat
    panel.install()
    how = "password" if runtime.settings.ui_password_hash else "a link from `talon ui link`"
    log.info("ui: the web panel is on at /ui/ (sign-in by %s)", how)
    return panel
