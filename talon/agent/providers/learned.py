"""What a model server revealed about a model while running, remembered across restarts.

A window stated in a "too long" error, or images or tools refused, is true of that model on that
server until its owner changes the server; asking again after every restart would cost a refused
request each time (and for servers discovery cannot ask, it is the only source). Kept per model
and server URL in ``TALON_DATA_DIR/model_facts.json``; discovery and explicit settings still
apply on top at start.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class LearnedFacts:
    def __init__(self, path: Path, key: str) -> None:
        self.path = path
        self.key = key
        # What this process last read or wrote: ``save`` is called after every model call and
        # must not touch the disk when nothing new was learned.
        self._known: dict[str, Any] = {}

    def load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable %s: %s", self.path, exc)
            return {}
        entry = data.get(self.key) if isinstance(data, dict) else None
        self._known = dict(entry) if isinstance(entry, dict) else {}
        return dict(self._known)

    def save(self, **facts: Any) -> None:
        if self._known == {**self._known, **facts}:
            return
        try:
            data = json.loads(self.path.read_text(encoding="utf-8")) if self.path.exists() else {}
        except (OSError, ValueError):
            data = {}
        if not isinstance(data, dict):
            data = {}
        entry = data.setdefault(self.key, {})
        done = entry == {**entry, **facts}  # another process wrote it already
        entry.update(facts)
        self._known = dict(entry)
        if done:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".model_facts-")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(data, fh, indent=1, sort_keys=True)
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("could not remember model facts in %s: %s", self.path, exc)
