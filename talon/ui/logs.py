"""The last log lines of this worker, for ``/ui/logs``: a bounded ring fed by a logging handler.

Lines are formatted when they are logged and scrubbed of every secret then (the same values the
``talon run`` log formatter blanks out), so what the panel serves never holds one.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

from talon.ui.security import scrub

LINES_KEPT = 2000
_FORMAT = "%(name)s: %(message)s"


@dataclass(frozen=True)
class LogLine:
    seq: int
    at: float
    level: str
    levelno: int
    text: str


class LogRing(logging.Handler):
    def __init__(self, secrets: list[str], size: int = LINES_KEPT) -> None:
        super().__init__(logging.DEBUG)
        self.secrets = secrets
        self.lines: deque[LogLine] = deque(maxlen=size)
        self._seq = itertools.count(1)
        self._lock_lines = threading.Lock()  # records arrive from any thread
        self.setFormatter(logging.Formatter(_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = scrub(self.format(record), self.secrets)
        except Exception:  # a broken record must not break the program that logs it
            return
        with self._lock_lines:
            self.lines.append(LogLine(next(self._seq), record.created or time.time(), record.levelname,
                                      record.levelno, text))

    def since(self, after: int, level: int = logging.DEBUG, limit: int = 500) -> list[LogLine]:
        with self._lock_lines:
            found = [line for line in self.lines if line.seq > after and line.levelno >= level]
        return found[-limit:]


def install(secrets: list[str]) -> LogRing:
    """One ring per process, on the root logger (a second panel in the same process shares it)."""
    root = logging.getLogger()
    for handler in root.handlers:
        if isinstance(handler, LogRing):
            handler.secrets = secrets
            return handler
    ring = LogRing(secrets)
    root.addHandler(ring)
    return ring
