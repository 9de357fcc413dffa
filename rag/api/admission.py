"""Admission control: a bounded number of queries in flight, a bounded queue, and deadlines.

A query runs on a worker thread only while it holds one of ``admission.max_in_flight`` slots; up to
``admission.max_queue`` more wait for one, in arrival order. The decision is taken on the event loop as soon as the
query's body is parsed, before any thread-pool hop, so a refusal is answered in well under a millisecond of server
work even when every worker is busy:

- ``queue_full``: the queue is at its bound;
- ``deadline``: no slot is free and its predicted completion (its wait: the queries ahead of it x the recent time a
  query holds a slot, per slot; plus its own least time) lies past its deadline (less ``admission.headroom``);
- ``expired``: it was admitted to the queue but its deadline came before a slot (the prediction was wrong).

A low-priority query (``X-Request-Priority: low``) is refused first: once half the queue is taken, or when its
predicted completion passes half its time left. With steering on (``rag.api.steering``), a queue's predicted wait is
priced at the ladder's floor (``steer_scale``: the floor's recent service time over the current rung's, once the
floor has been measured): the controller steps down before the queue's turn comes, so a query is refused only when
even the cheapest rung could not answer it in time.

Each is a 503 with ``Retry-After`` (the per-key rate limit stays a 429, ``rag.api.access``) and counted by reason
(``SHED_REASONS``, exported as ``ragheat_requests_shed_total{reason}``). A deadline is ``admission.deadline_ms`` (the
SLO) from the request's arrival, or tighter: the body's ``timeout_ms`` or the ``X-Request-Timeout-Ms`` header.

Arrival is stamped by ``ArrivalMiddleware`` (the app's outermost), and the time from it to the pipeline's start on
its worker thread (parsing, the queue, the thread-pool hop) is the ``queue`` stage.
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
from dataclasses import dataclass

from rag.deadline import Deadline, ServiceTimes
from rag.slo import SLO_MS
from rag.stages import PRIORITIES
from rag.tally import Tally

SHED_REASONS = ("queue_full", "deadline", "expired")
"""Why a query was shed (closed set; each is also the error kind of its 503)."""
ARRIVAL_KEY = "arrival_perf"
"""Where ``ArrivalMiddleware`` leaves the request's arrival (a ``time.perf_counter()`` reading) in the ASGI scope's
``state``; an outer layer that stamped it first (the connection layer) wins."""
TIMEOUT_HEADER = "x-request-timeout-ms"
PRIORITY_HEADER = "x-request-priority"


def parse_priority_header(value: str | None, key_priority: str = "normal") -> str:
    """A request's priority: ``X-Request-Priority`` (high, normal or low), which may lower its API key's priority
    (``key_priority``, from the keys file) but never raise it; the key's when absent. ``ValueError`` with a sentence
    for a value that is none of them."""
    if value is None:
        return key_priority
    text = value.strip().lower()
    if text not in PRIORITIES:
        raise ValueError(f"X-Request-Priority: {value.strip()[:32]!r} is not one of {', '.join(PRIORITIES)}")
    return max(text, key_priority, key=PRIORITIES.index)


class ArrivalMiddleware:
    """Stamps each HTTP request's arrival as early as the app sees it (the queue stage starts there)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            scope.setdefault("state", {}).setdefault(ARRIVAL_KEY, time.perf_counter())
        return await self.app(scope, receive, send)


def arrival_of(state) -> float:
    """The request's arrival from Starlette's ``request.state`` (now, if nothing stamped it)."""
    return getattr(state, ARRIVAL_KEY, None) or time.perf_counter()


def parse_timeout_header(value: str | None, max_ms: float) -> float | None:
    """``X-Request-Timeout-Ms`` in milliseconds; None when absent. ``ValueError`` with a sentence when it is not a
    whole number of milliseconds in 1..``max_ms``."""
    if value is None:
        return None
    text = value.strip()
    if not text.isascii() or not text.isdigit():
        raise ValueError(f"X-Request-Timeout-Ms: {text[:32]!r} is not a whole number of milliseconds")
    ms = int(text)
    if not 1 <= ms <= max_ms:
        raise ValueError(f"X-Request-Timeout-Ms: {ms} is outside 1..{max_ms:g} ms (admission.max_timeout_ms)")
    return float(ms)


@dataclass(frozen=True)
class Shed:
    """A query refused by admission control: ``reason`` (one of ``SHED_REASONS``), a sentence, ``Retry-After``, and
    how long the service had held it when it decided (from its arrival stamp): sent as ``Server-Timing: queue``,
    so a client (the load generator) can tell the service's refusal time from the network's and its own."""

    reason: str
    sentence: str
    retry_after_s: int
    held_s: float = 0.0

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s), "Server-Timing": f"queue;dur={self.held_s * 1000:.3f}"}


class Slot:
    """A query's place among those in flight; ``release()`` (idempotent, from any thread) hands it to the next."""

    def __init__(self, controller: "AdmissionController | None") -> None:
        self._controller, self._released = controller, False
        self.granted = time.perf_counter()

    def release(self) -> None:
        if self._released or self._controller is None:
            return
        self._released = True
        self._controller._release_threadsafe(self.granted)

    def release_when_done(self, future: asyncio.Future | None) -> None:
        """Release once ``future`` (a worker running the pipeline) is done; now if there is none."""
        if future is None:
            self.release()
        else:
            future.add_done_callback(lambda _: self.release())


class AdmissionController:
    """Slots, the queue and the shedding decision (see the module). Its state is touched on the event loop only;
    ``Slot.release`` from a worker thread hops there. ``listeners`` (telemetry) hear each shed reason."""

    def __init__(self, max_in_flight: int, max_queue: int, times: ServiceTimes, *, enabled: bool = True,
                 deadline_ms: float = SLO_MS, max_timeout_ms: float = 10_000, degrade: bool = True,
                 headroom: float = 0.0, worker_nice: int = 0) -> None:
        if max_in_flight < 1 or max_queue < 0:
            raise ValueError(f"admission needs max_in_flight >= 1 and max_queue >= 0, got {max_in_flight} and "
                             f"{max_queue}")
        self.max_in_flight, self.max_queue, self.times, self.enabled = max_in_flight, max_queue, times, enabled
        self.deadline_ms, self.max_timeout_ms = deadline_ms, max_timeout_ms
        self.degrade, self.headroom = degrade, headroom
        self.worker_nice = worker_nice  # applied by each worker thread to itself (rag/api/worker_priority.py)
        self.slot_hold_s: float | None = None  # recent time a query held its slot (grant to release, on the event loop)
        self.in_flight = 0
        self._waiting: collections.deque[asyncio.Future] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.shed_tally = Tally(SHED_REASONS, "shed reason (SHED_REASONS)")
        self.counts, self.listeners = self.shed_tally.counts, self.shed_tally.listeners
        # By priority (PRIORITIES): queries answered, and refused; with the arrivals, what steering reads.
        self.answered = Tally(PRIORITIES, "priority (PRIORITIES)")
        self.refused = Tally(PRIORITIES, "priority (PRIORITIES)")
        self.arrived = 0
        self.steer_scale = None  # steering: a callable giving the floor's service time over the current rung's
        self.level_service_s: dict[str, float] = {}  # recent service time by rung of the quality ladder

    @classmethod
    def from_settings(cls, admission) -> "AdmissionController":
        return cls(admission.max_in_flight, admission.max_queue,
                   ServiceTimes(admission.ewma_alpha, admission.estimate_ttl_s), enabled=admission.enabled,
                   deadline_ms=admission.deadline_ms, max_timeout_ms=admission.max_timeout_ms,
                   degrade=admission.degrade, headroom=admission.headroom, worker_nice=admission.worker_nice)

    def deadline_s(self, timeout_ms: int | None, header: str | None) -> float:
        """A query's deadline in seconds: the tighter of the body's ``timeout_ms`` and the ``X-Request-Timeout-Ms``
        header, else ``admission.deadline_ms``. ``ValueError`` with a sentence when either is out of bounds."""
        asked = parse_timeout_header(header, self.max_timeout_ms)
        if timeout_ms is not None:
            if not 1 <= timeout_ms <= self.max_timeout_ms:
                raise ValueError(f"timeout_ms: {timeout_ms} is outside 1..{self.max_timeout_ms:g} ms "
                                 f"(admission.max_timeout_ms)")
            asked = timeout_ms if asked is None else min(asked, timeout_ms)
        return (self.deadline_ms if asked is None else asked) / 1000.0

    def observe(self, stages, service_s: float, priority: str = "normal", level: str | None = None) -> None:
        """A finished query's stage timings and service time (its worker's, queue excluded), its priority and the
        rung that answered it."""
        self.times.observe(stages, service_s)
        self.answered.count(priority)
        if level is not None:
            old = self.level_service_s.get(level)
            self.level_service_s[level] = service_s if old is None else old + self.times.alpha * (service_s - old)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def least_service_s(self) -> float:
        """What a query will hold its slot for at the least: the recent hold time without the optional stages (which
        its deadline may skip); 0 before anything was measured."""
        hold = self.slot_hold_s or self.times.service_s or 0.0
        optional = max(0.0, (self.times.service_s or 0.0) - (self.times.core_s or 0.0))
        return max(self.times.core_s or 0.0, hold - optional)

    def predicted_s(self, ahead: int, scale: float = 1.0) -> float:
        """Seconds until a query with ``ahead`` queries waiting before it would finish: a slot frees every
        ``hold / max_in_flight`` on average (hold: the recent time a query held its slot, which counts what the
        worker's own timing misses: encoding, the hops to and from the event loop), then its own time. ``scale``
        prices the queue's wait at a cheaper rung of the quality ladder."""
        hold = (self.slot_hold_s or self.times.service_s or 0.0) * scale
        wait = 0.0 if self.in_flight < self.max_in_flight and ahead == 0 else (ahead + 1) * hold / self.max_in_flight
        return wait + self.least_service_s()

    def _shed(self, reason: str, sentence: str, wait_s: float, arrival: float, priority: str = "normal") -> Shed:
        self.shed_tally.count(reason)
        self.refused.count(priority)
        return Shed(reason, sentence, max(1, math.ceil(wait_s)), time.perf_counter() - arrival)

    async def acquire(self, arrival: float, deadline_s: float, priority: str = "normal") -> Slot | Shed:
        """A slot for a query that arrived at ``arrival`` (perf_counter) with ``deadline_s`` to finish, or why not.
        Returns at once, except while the query waits in the queue."""
        self.arrived += 1
        if not self.enabled:
            return Slot(None)
        self._loop = self._loop or asyncio.get_running_loop()
        while self._waiting and self._waiting[0].done():  # expired or gone: no longer ahead of anyone
            self._waiting.popleft()
        # What the service sees of the deadline: less the headroom kept for what it cannot see (the client's side,
        # the kernel's accept queue, parsing before the arrival stamp).
        left = deadline_s * (1.0 - self.headroom) - (time.perf_counter() - arrival)
        if self.in_flight < self.max_in_flight and not self._waiting:
            # A free slot: nothing to wait for, so nothing to predict; a deadline tighter than the query's own time
            # is met as well as it can be, by skipping its optional stages.
            self.in_flight += 1
            return Slot(self)
        ahead = len(self._waiting)
        predicted = self.predicted_s(ahead, self.steer_scale() if self.steer_scale else 1.0)
        low = priority == "low"
        if ahead >= (self.max_queue // 2 if low else self.max_queue):
            bound = "half of admission.max_queue, for low priority" if low else "admission.max_queue"
            return self._shed("queue_full", f"overloaded: {self.in_flight} queries in flight and {ahead} waiting "
                                            f"({bound}); retry later", predicted, arrival, priority)
        if predicted > (left / 2 if low else left):
            return self._shed("deadline", self._deadline_sentence(left, ahead, low), predicted, arrival, priority)
        waiter = self._loop.create_future()
        self._waiting.append(waiter)
        try:
            # Waits at most until the deadline, less the least it then needs to run.
            await asyncio.wait_for(asyncio.shield(waiter), max(0.0, left - self.least_service_s()))
        except asyncio.TimeoutError:
            if waiter.done() and not waiter.cancelled():  # granted just as it expired: keep it
                return Slot(self)
            waiter.cancel()
            return self._shed("expired", f"overloaded: the deadline of {deadline_s * 1000:.0f} ms passed while "
                                         f"the query waited for a slot; retry later",
                              self.predicted_s(len(self._waiting)), arrival, priority)
        except BaseException:  # cancelled (the client left): give the slot on if it was granted meanwhile
            if waiter.done() and not waiter.cancelled():
                self._release()
            else:
                waiter.cancel()
            raise
        return Slot(self)

    def _deadline_sentence(self, left: float, ahead: int, low: bool = False) -> str:
        service = (self.slot_hold_s or self.times.service_s or 0.0) * 1000
        bound = "half of its deadline, for low priority" if low else "its deadline"
        return (f"overloaded: {ahead} queries are waiting for {self.max_in_flight} slots at ~{service:.0f} ms each, so "
                f"this one would finish after {bound} ({max(left, 0.0) * 1000:.0f} ms left); retry later")

    def _release(self, granted: float | None = None) -> None:
        """On the event loop: hand the slot to the first query still waiting, or free it."""
        if granted is not None:
            held = time.perf_counter() - granted
            alpha = self.times.alpha
            old = self.slot_hold_s
            self.slot_hold_s = held if old is None else old + alpha * (held - old)
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():  # a waiter that expired or left was cancelled
                waiter.set_result(None)
                return
        self.in_flight -= 1

    def _release_threadsafe(self, granted: float | None = None) -> None:
        loop = self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop:
            self._release(granted)
        else:
            loop.call_soon_threadsafe(self._release, granted)

    def deadline(self, arrival: float, deadline_s: float) -> Deadline:
        """The request's deadline, which decides its optional stages (all run with ``admission.degrade`` off)."""
        return Deadline(arrival + deadline_s, self.times, self.degrade)
