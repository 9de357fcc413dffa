"""Deadlines inside the pipeline: recent service times, and the time a request has left.

``ServiceTimes`` keeps an exponentially weighted average of each stage's recent time and of a whole query's service
time (on its worker thread, queue excluded). Admission control (``rag.api.admission``) predicts from them whether a
request can finish within its deadline; a request's ``Deadline`` uses them to skip an optional stage (rerank, the
graph, HyDE, the language model) that the time left cannot hold. The answer then lists what was skipped
(``QueryResult.skipped``) and is degraded, rather than late.

Standard library only, and free of the API: the pipeline imports it.

>>> times = ServiceTimes(alpha=0.2, ttl_s=5.0)
>>> deadline = Deadline(deadline_at=time.perf_counter() + 0.05, times=times)
>>> deadline.shortfall("rerank", then=("generate",))   # None until rerank has been seen taking longer than what is left
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Callable, Iterable

from rag.stages import OPTIONAL_STAGES, LANGUAGE_MODEL_STAGES, WAIT_STAGES, describes, estimated_as

if TYPE_CHECKING:
    from rag.types import StageTiming


class ServiceTimes:
    """Recent per-stage and per-query service times (seconds), as exponentially weighted averages (``alpha``: the
    newest sample's weight). Thread-safe: worker threads report, the event loop reads.

    ``core_s`` is a query's time without its optional stages, what it costs at the least; ``service_s`` its whole
    time, what a query ahead of it in the queue holds a slot for."""

    def __init__(self, alpha: float = 0.2, ttl_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha, self.ttl_s, self.clock = alpha, ttl_s, clock
        self._stages: dict[str, tuple[float, float]] = {}  # stage -> (average s, when last seen)
        self.service_s: float | None = None
        self.core_s: float | None = None
        self._lock = threading.Lock()

    def _mix(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.alpha * (new - old)

    def observe(self, stages: Iterable[StageTiming], service_s: float) -> None:
        """One finished query: its stage timings and its service time (pipeline start to end)."""
        now = self.clock()
        optional = 0.0
        with self._lock:
            for stage in stages:
                if stage.name in WAIT_STAGES:
                    continue
                if stage.name in OPTIONAL_STAGES or stage.name in LANGUAGE_MODEL_STAGES:
                    optional += stage.seconds
                old = self._stages.get(stage.name)
                # A stale estimate is replaced, not averaged: a stage skipped on an outlier (a cold start's page
                # faults) runs again after ttl_s, and that one run must be enough to let it back in.
                fresh = old is not None and now - old[1] <= self.ttl_s
                self._stages[stage.name] = (self._mix(old[0] if fresh else None, stage.seconds), now)
            self.service_s = self._mix(self.service_s, service_s)
            self.core_s = self._mix(self.core_s, max(0.0, service_s - optional))

    def stage(self, name: str) -> float | None:
        """The recent time of ``name``; None if never seen, or seen longer than ``ttl_s`` ago (it may have changed:
        let it run and be measured again)."""
        found = self._stages.get(name)
        if found is None or self.clock() - found[1] > self.ttl_s:
            return None
        return found[0]

    def stage_or_zero(self, name: str) -> float:
        found = self._stages.get(name)
        return found[0] if found else 0.0


class Deadline:
    """What one request has left until ``deadline_at`` (a ``time.perf_counter()`` reading). ``shortfall(stage,
    then)`` says whether an optional stage fits, reserving the recent time of the mandatory stages still to come
    (``then``: ``rag.stages.still_to_run`` works them out): None when it fits, else the sentence the answer lists in
    ``skipped``. With ``enabled`` False (``admission.degrade`` off) every stage fits."""

    def __init__(self, deadline_at: float, times: ServiceTimes, enabled: bool = True,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.deadline_at, self.times, self.enabled, self.clock = deadline_at, times, enabled, clock

    def remaining_s(self) -> float:
        return self.deadline_at - self.clock()

    def shortfall(self, stage: str, then: Iterable[str] = ()) -> str | None:
        if not self.enabled:
            return None
        estimates = [self.times.stage(name) for name in estimated_as(stage)]
        if estimates[0] is None:  # never measured (or measured long ago): run it, and learn its time
            return None
        need = sum(e or 0.0 for e in estimates)
        reserve = sum(self.times.stage_or_zero(name) for name in then)
        left = self.remaining_s()
        if left - reserve >= need:
            return None
        return (f"deadline: {max(left, 0.0) * 1000:.0f} ms left, {describes(stage)} took {need * 1000:.0f} ms "
                f"recently" + (f" and the stages after it {reserve * 1000:.0f} ms" if reserve else ""))
