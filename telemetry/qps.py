"""Load level as a label: the request rate over a sliding window, mapped to a closed set of buckets.

Each request is tagged with the rate *at the moment it started*, so a latency histogram can be
split by load ("P99 at 10-50 QPS") without the label set growing with traffic.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Callable, Sequence


class SlidingWindowRate:
    """Requests per second over the last ``window_s`` seconds, in O(1) memory.

    Time is cut into slots of ``resolution_s``; a ring of counters holds the slots of the current
    window, and the rate is their sum over the whole window, as Prometheus' ``rate()`` over the same
    range would read it. (Dividing by the time since the first request instead would label a lone
    request on an idle server as a burst.)
    """

    def __init__(self, window_s: float = 10.0, resolution_s: float = 0.25,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not (0 < resolution_s <= window_s < math.inf):  # also rejects NaN
            raise ValueError(f"need 0 < resolution_s ({resolution_s}) <= window_s ({window_s}) < inf")
        self.window_s, self.resolution_s, self.clock = window_s, resolution_s, clock
        slots = round(window_s / resolution_s)  # 2.1 / 0.3 is 7.000000000000001 in floating point
        if not math.isclose(slots * resolution_s, window_s):
            slots = math.ceil(window_s / resolution_s)
        self._slots = [0] * max(1, slots)
        self._slot_ids = [-1] * len(self._slots)  # which absolute slot each ring entry holds
        self._lock = threading.Lock()

    def _slot(self, now: float) -> int:
        return int(now // self.resolution_s)

    def record(self) -> float:
        """Count one request now and return the rate including it."""
        with self._lock:
            slot = self._slot(self.clock())
            i = slot % len(self._slots)
            if self._slot_ids[i] != slot:
                self._slot_ids[i], self._slots[i] = slot, 0
            self._slots[i] += 1
            return self._rate(slot)

    def rate(self) -> float:
        """The current rate, without counting a request."""
        with self._lock:
            return self._rate(self._slot(self.clock()))

    def _rate(self, slot: int) -> float:
        oldest = slot - len(self._slots) + 1
        count = sum(c for c, s in zip(self._slots, self._slot_ids) if oldest <= s <= slot)
        return count / (len(self._slots) * self.resolution_s)


class QpsBuckets:
    """Maps a rate to one of ``len(edges) + 1`` labels: edges (1, 10, 50, 200) give
    ``0-1``, ``1-10``, ``10-50``, ``50-200`` and ``200+``. A rate equal to an edge goes to the upper bucket."""

    def __init__(self, edges: Sequence[float]) -> None:
        edges = list(edges)
        if (not edges or not all(math.isfinite(e) for e in edges) or edges[0] <= 0
                or any(b <= a for a, b in zip(edges, edges[1:]))):
            raise ValueError(f"qps edges must be positive and strictly increasing: {edges}")
        self.edges = edges
        bounds = [0.0, *edges]
        self.labels = [f"{_fmt(lo)}-{_fmt(hi)}" for lo, hi in zip(bounds, edges)] + [f"{_fmt(edges[-1])}+"]

    def label(self, rate: float) -> str:
        for edge, label in zip(self.edges, self.labels):
            if rate < edge:
                return label
        return self.labels[-1]


def _fmt(value: float) -> str:
    return f"{value:g}"
