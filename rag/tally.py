"""``Tally``: events counted by a closed set of labels, each heard by the listeners (telemetry) as it happens.

Admission control's refusals, the access layer's rejections and the sampled judge's outcomes each keep one, so that
whoever exports them subscribes, and nothing in ``rag`` imports a metrics library."""

from __future__ import annotations

import logging
import threading
from typing import Callable, Sequence

log = logging.getLogger(__name__)


class Tally:
    """``count(label)`` adds one to ``counts[label]`` (thread-safe) and calls each of ``listeners`` with it; a listener
    that raises is logged and never fails the caller. ``ValueError`` for a label outside ``labels``."""

    def __init__(self, labels: Sequence[str], what: str) -> None:
        self.counts = dict.fromkeys(labels, 0)
        self.listeners: list[Callable[[str], None]] = []
        self.what = what  # what a label is, for the error: "rejection reason (REJECTION_REASONS)"
        self._lock = threading.Lock()

    def count(self, label: str) -> None:
        if label not in self.counts:
            raise ValueError(f"unknown {self.what}: {label!r}")
        with self._lock:
            self.counts[label] += 1
        for listener in self.listeners:
            try:
                listener(label)
            except Exception:  # an observer never fails what it observes
                log.debug("a listener of %s failed", self.what, exc_info=True)
