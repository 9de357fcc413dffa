"""Steering on the event loop: every ``steering.interval_s`` the ``LevelController`` (rag/steering/controller.py)
reads what admission control counted since the last tick (arrivals, answers, refusals), the queue, and the
process's CPU time, and keeps or changes the rung of the quality ladder new queries are served at. A query takes its
rung when its worker starts it (``level_for``), so queries already waiting are answered at the rung the controller
chose for the load they are part of.

Each worker process of ``serve --workers N`` steers on its own load, over its share of the cores; so does each
replica behind a proxy: nothing is shared, and a replica that receives more than the others steps down first."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Callable

from rag.api.admission import AdmissionController
from rag.errors import ConfigurationError
from rag.stages import QUALITY_LEVELS
from rag.steering.controller import Change, LevelController, Reading
from rag.steering.ladder import Ladder, distinct_levels

log = logging.getLogger("ragheat.steering")
WORKERS_ENV = "RAGHEAT_STEERING_WORKERS"
"""Set by ``serve --workers N`` for its workers: the cores each steers over are its share."""


def usable_cores(workers: int = 1) -> float:
    """The CPUs this process may run on, shared among ``workers`` processes."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return cores / max(workers, 1)


class Steering:
    """The controller, fed from ``admission`` every ``interval_s``; ``listeners`` hear each ``Change`` (telemetry),
    ``level_for(priority)`` is the rung a query starts at."""

    def __init__(self, controller: LevelController, admission: AdmissionController, interval_s: float,
                 cpu_clock: Callable[[], float] = time.process_time) -> None:
        self.controller, self.admission, self.interval_s, self.cpu_clock = controller, admission, interval_s, cpu_clock
        self.listeners: list[Callable[[Change], None]] = []
        self.changes: list[Change] = []
        self._task: asyncio.Task | None = None
        self._last = self._snapshot()
        floor = controller.levels[-1]
        admission.steer_scale = lambda: self._scale(floor)

    @classmethod
    def from_settings(cls, settings, admission: AdmissionController, workers: int | None = None) -> "Steering":
        s = settings.steering
        workers = workers or int(os.environ.get(WORKERS_ENV, "1") or 1)
        ladder = Ladder.load(s.ladder)
        served = distinct_levels(settings)
        levels = ladder.frontier(tuple(n for n in served if QUALITY_LEVELS.index(n) <= QUALITY_LEVELS.index(s.floor)))
        if not levels:
            raise ConfigurationError(f"steering.floor: {s.floor} leaves no rung of {served}")
        controller = LevelController(levels, ladder.cpu_ms, usable_cores(workers), hold_s=s.hold_s,
                                     window_s=s.window_s, down_at=s.down_at, settle_at=s.settle_at, up_at=s.up_at,
                                     pressure_share=s.pressure_share)
        return cls(controller, admission, s.interval_s)

    @property
    def level(self) -> str:
        return self.controller.level

    def level_for(self, priority: str) -> str:
        return self.controller.level_for(priority)

    def _scale(self, floor: str) -> float:
        """The floor's recent service time over the current rung's: wall time, not CPU, since what makes a rung
        slow may be a wait (a model server, the graph store, an injected delay). 1 until both were measured."""
        times = self.admission.level_service_s
        here, cheapest = times.get(self.controller.level), times.get(floor)
        return 1.0 if not here or cheapest is None else min(1.0, cheapest / here)

    def _snapshot(self) -> tuple[float, int, int, int, float]:
        a = self.admission
        return (time.monotonic(), a.arrived, sum(a.answered.counts.values()), sum(a.refused.counts.values()),
                self.cpu_clock())

    def tick(self) -> Change | None:
        """Read the load since the last tick and let the controller decide (on the event loop)."""
        now = self._snapshot()
        (t0, arrived0, answered0, shed0, cpu0), (t1, arrived1, answered1, shed1, cpu1) = self._last, now
        self._last = now
        a = self.admission
        reading = Reading(seconds=t1 - t0, arrived=arrived1 - arrived0, answered=answered1 - answered0,
                          shed=shed1 - shed0, cpu_s=cpu1 - cpu0, waiting=a.waiting,
                          predicted_s=a.predicted_s(a.waiting), deadline_s=a.deadline_ms / 1000)
        change = self.controller.tick(reading)
        if change is not None:
            self.changes.append(change)
            del self.changes[:-100]
            log.info("quality level %s -> %s: %s", change.before, change.after, change.why)
            for listener in self.listeners:
                try:
                    listener(change)
                except Exception:  # an observer never fails what it observes
                    log.debug("a steering listener failed", exc_info=True)
        return change

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="ragheat-steering")

    async def _run(self) -> None:
        self._last = self._snapshot()
        while True:
            await asyncio.sleep(self.interval_s)
            self.tick()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
