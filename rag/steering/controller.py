"""The level controller: every tick it reads the load and keeps, steps down or steps up the quality ladder's rung
the service answers at. Pure logic over readings (``Reading``), with its own clock: the API feeds it
(``rag.api.steering``), tests and benchmarks drive it directly.

Demand is what the answers would cost at a rung, as a share of the capacity: the recent arrival rate (refused
requests included: they asked) times that rung's CPU seconds per answer, over the CPU the process reaches when it is
saturated at that rung. A process rarely turns every core into answers (the event loop and the interpreter's lock
serialise part of each answer, a load generator or a neighbour takes its share), and how much it turns depends on the
rung: a cheap answer is mostly the event loop's work on one core, a reranked one mostly the model's on every core.
The capacity is learned per rung from the ticks a long queue or refusals lasted through at it (the process's CPU rate
then, the highest of a saturated stretch; the next stretch learns it anew; any tick at the rung that reaches more
raises it); a rung not seen saturated is given the cores the process may use, and a trial settles it: a trial that
fails leaves the rung no more capacity than it reached.

Each rung's cost is learned live, per answer, while the service runs at it; a rung not yet seen, or last seen more
than ``STALE_S`` ago, is priced from the measured ladder (``Ladder``): the current rung's live cost plus the
measured difference between the two. A cost learned long ago says more about that moment (a start's first answers, a
neighbour's burst) than about now.

- Step down when the service is under pressure: requests were refused in two readings running (more than one, than
  ``SHED_SHARE`` of a tick's arrivals and than the spread of a tick's random arrivals, one standard deviation of a
  Poisson count at the window's rate), or in one reading ``SHED_AT_ONCE_SHARE`` of its arrivals and more than
  ``SPREAD_AT_ONCE`` spreads (at the knee random arrivals bring a second now and then that the queue cannot absorb
  whole: refusals within what such a second brings above the rate are the spread, not a load the rung cannot hold;
  a second's excess may fall across two readings, so each is held to the spread), the queue's predicted completion
  passed ``pressure_share`` of the deadline in two readings running and did not fall between them (at the knee such
  a queue forms now and then and drains), or the demand at the current rung is above ``down_at``. It steps to the
  best rung whose demand fits under ``settle_at`` against no more capacity than the process reached in that tick
  (several rungs at once), at least one rung. The arrival rate a rung came under
  pressure at is remembered: the rung is not tried again at that rate (``BREAK_MARGIN``), nor any rung above it, for
  ``BREAK_MEMORY_S``.
- Step up when there was no pressure for ``hold_s``, to the best rung above whose demand would be under ``up_at``
  and that did not come under pressure at this rate. Near the capacity the estimates cannot tell a rung that fits
  from one that does not, so ``up_at`` sits just above it: a step up is a trial, settled by the pressure that
  follows or does not. A trial that fails (pressure within two holds of it) doubles ``hold_s`` (up to
  ``MAX_HOLD_S``; a step up that holds for two holds resets it), and for ``BREAK_MEMORY_S`` only rungs with clear
  headroom are tried: demand under ``settle_at``, against no more capacity than the failed trial reached, each price
  raised by as much as the tried rung's proved too low. The estimates proved optimistic at this load (the window's
  rate when the trial failed), and the lessons hold while it does: once it is clearly lower (``BREAK_MARGIN``) the
  usual hold and ``up_at`` are back.
"""

from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

MAX_HOLD_S = 120.0
LEARN_ALPHA = 0.2
MIN_ANSWERS = 3  # answers in a tick before its CPU per answer teaches the rung's cost
SHED_SHARE = 0.01  # a tick refuses when more than one request and this share of its arrivals are refused
SHED_AT_ONCE_SHARE = 0.1  # this share of a tick's arrivals refused is pressure at once; fewer, in two ticks running
SPREAD_AT_ONCE = 3.0  # refusals past this many spreads of a tick's random arrivals are no second's chance excess
MIN_COST_SHARE = 0.2  # a rung priced from the ladder costs at least this share of the current rung's live cost
STALE_S = 30.0  # a rung's learned cost older than this (or two holds, when longer) is priced from the current rung's
BURST_FACTOR = 1.5  # a second with this many times the window's arrivals is a burst, not random arrivals' spread
BREAK_MARGIN = 0.9  # a rung that came under pressure at a rate is tried again below this share of it
BREAK_MEMORY_S = MAX_HOLD_S  # how long the rate a rung came under pressure at is remembered


@dataclass(frozen=True)
class Reading:
    """One tick of the service: counts since the previous reading, and the queue now."""

    seconds: float  # since the previous reading
    arrived: int  # requests that asked admission for a slot (admitted or refused)
    answered: int  # answered at the current rung
    shed: int  # refused by admission control
    cpu_s: float  # the process's CPU seconds
    waiting: int  # queries in the queue now
    predicted_s: float  # admission's predicted completion of a query arriving now
    deadline_s: float  # the default deadline


@dataclass(frozen=True)
class Change:
    """A step of the controller: from one rung to another, and why."""

    before: str
    after: str
    direction: str  # rag.stages.LEVEL_DIRECTIONS
    why: str


class LevelController:
    """Picks the rung (of ``levels``, best first; the last is the floor) from ``Reading``s. ``prior_ms``: measured CPU
    ms per answer by rung (``Ladder.cpu_ms``); ``cores``: CPUs the process may use (the capacity until one is
    learned); ``down_at``, ``settle_at``, ``up_at``: shares of the capacity."""

    def __init__(self, levels: Sequence[str], prior_ms: Mapping[str, float], cores: float, *, hold_s: float = 5.0,
                 window_s: float = 5.0, down_at: float = 1.2, settle_at: float = 0.9, up_at: float = 1.05,
                 pressure_share: float = 0.5, clock: Callable[[], float] = time.monotonic) -> None:
        if not levels:
            raise ValueError("the ladder needs at least one level")
        if not (0 < settle_at < down_at and 0 < up_at < down_at):
            raise ValueError(f"steering needs settle_at and up_at under down_at, got settle_at {settle_at}, up_at "
                             f"{up_at}, down_at {down_at}")
        self.levels, self.prior_ms, self.cores = tuple(levels), dict(prior_ms), max(cores, 0.1)
        self.base_hold_s = self.hold_s = hold_s
        self.window_s, self.down_at, self.settle_at, self.up_at = window_s, down_at, settle_at, up_at
        self.pressure_share, self.clock = pressure_share, clock
        self.index = 0
        self.learned_s: dict[str, float] = {}
        self.learned_at: dict[str, float] = {}
        self.broke_at: dict[str, tuple[float, float]] = {}  # rung -> (arrival rate it came under pressure at, when)
        self.learned_capacity: dict[str, float] = {}  # rung -> CPU (cores) it reached saturated
        self._saturated_at: str | None = None  # the rung the previous tick ran saturated at
        self._window: collections.deque[tuple[float, Reading]] = collections.deque()
        self._last_change = self._last_pressure = clock() - hold_s
        self._last_up: float | None = None
        self._failed_trial: tuple[float, float] | None = None  # (rate, when) a step up last failed at
        self._failed_trial_cpu = 0.0  # the CPU rate (cores) the process reached in the tick that trial failed
        self._underpriced = 1.0  # how much more the failed trial's rung cost than it was priced at
        self._trial_price: float | None = None  # the price of the rung a step up went to, when it went
        self._queued_s: float | None = None  # the previous reading's predicted completion, when its queue was long
        self._refused = False  # the previous reading refused requests
        self._busy = False  # the previous reading found a long queue or refusals
        self._ran_at: str | None = None  # the rung the previous tick ran at

    @property
    def level(self) -> str:
        return self.levels[self.index]

    def capacity(self, level: str) -> float:
        """The CPU (in cores) the process turns into answers at ``level`` when saturated: learned at it, else the
        cores (a rung not seen saturated is given the benefit of the doubt: a trial settles it)."""
        return self.learned_capacity.get(level, self.cores)

    def cost_s(self, level: str) -> float | None:
        """CPU seconds per answer at ``level``: learned live (within ``STALE_S``, or the current rung's), else the
        current rung's live cost plus the measured ladder's difference between the two (what a rung adds or saves is
        pipeline work; the rest of an answer's cost, the HTTP exchange and its bookkeeping, is the same at every
        rung)."""
        if level in self.learned_s and (level == self.level or self._fresh(level, self.clock())):
            return self.learned_s[level]
        prior = self.prior_ms.get(level)
        if prior is None:
            return None
        here, here_prior = self.learned_s.get(self.level), self.prior_ms.get(self.level)
        if here is None or here_prior is None:
            return prior / 1000
        return max(here + (prior - here_prior) / 1000, MIN_COST_SHARE * here)

    def _fresh(self, level: str, now: float) -> bool:
        """Whether ``level``'s learned cost is recent enough to price it: within ``STALE_S``, or within two holds when
        a backed-off hold is longer (a step up that failed keeps its lesson until the next try)."""
        return now - self.learned_at.get(level, -float("inf")) <= max(STALE_S, 2 * self.hold_s)

    def arrival_rate(self, rising: bool = False, peak: bool = False) -> float:
        """Arrivals per second over the window; with ``rising``, the latest tick's rate when it is a burst
        (``BURST_FACTOR`` times the window's: a burst is met at once, a second of random arrivals is not one, and a
        step up waits for the whole window); with ``peak``, the latest tick's rate whenever it is higher (the rate a
        rung came under pressure at)."""
        span = sum(r.seconds for _, r in self._window)
        rate = sum(r.arrived for _, r in self._window) / span if span > 0 else 0.0
        if (rising or peak) and self._window and self._window[-1][1].seconds > 0:
            latest = self._window[-1][1]
            now = latest.arrived / latest.seconds
            if now > (rate if peak else BURST_FACTOR * rate):
                rate = now
        return rate

    def demand(self, level: str, rising: bool = False, capacity: float | None = None) -> float | None:
        """The share of the capacity (``capacity``, else the rung's) the recent arrivals would take at ``level``
        (None: its cost is unknown)."""
        cost = self.cost_s(level)
        if capacity is None:
            capacity = self.capacity(level)
        return None if cost is None else self.arrival_rate(rising) * cost / capacity

    def tick(self, reading: Reading) -> Change | None:
        now = self.clock()
        self._window.append((now, reading))
        while self._window and now - self._window[0][0] > self.window_s:
            self._window.popleft()
        if reading.answered >= MIN_ANSWERS and reading.cpu_s > 0:
            per_answer = reading.cpu_s / reading.answered
            old = self.learned_s.get(self.level) if self._fresh(self.level, now) else None  # stale: learned anew
            self.learned_s[self.level] = per_answer if old is None else old + LEARN_ALPHA * (per_answer - old)
            self.learned_at[self.level] = now
        pressed_cpu = self._learn_capacity(reading)
        why = self._pressure(reading)
        if why is not None:
            self._last_pressure = now
            return self._step_down(now, why, reading, pressed_cpu)
        if self._last_up is not None and now - self._last_up >= 2 * self.hold_s:
            self.hold_s, self._last_up = self.base_hold_s, None  # the last step up held: the next waits as usual
        rate = self.arrival_rate()
        failed_here = self._failed_trial is not None and self._near(self._failed_trial, rate, now)
        if not failed_here:  # a failed trial's lessons (a longer hold, caution) belong to the load it failed at
            self.hold_s = self.base_hold_s
        if self.index == 0:
            return None
        # a queue, or refusals not yet pressure, are no time to ask for more
        if now - max(self._last_change, self._last_pressure) < self.hold_s or reading.waiting or reading.shed:
            return None
        here = self.demand(self.level)
        # After a trial that failed, the estimates proved optimistic at this load: only clear headroom is tried,
        # against no more capacity than the failed trial found, each rung's price raised as much as the tried rung's
        # proved too low.
        limit = self.settle_at if failed_here else self.up_at
        for index in range(self.index):
            upper = self.levels[index]
            capacity = min(self.capacity(upper), self._failed_trial_cpu) if failed_here else None
            demand = self.demand(upper, capacity=capacity)
            if demand is None:  # never measured: priced at twice this rung
                demand = None if here is None else 2 * here
            elif failed_here:
                demand *= self._underpriced
            if demand is None or demand > limit or self._broke_near(index, rate, now):
                continue
            shown = self.capacity(upper) if capacity is None else capacity
            return self._move(now, index, f"demand at {upper} {demand:.0%} of the capacity "
                                          f"({shown:.2f} cores; < {limit:.0%})")
        return None

    def _cpu_rate(self, reading: Reading) -> float | None:
        """The process's CPU rate (cores) over a tick."""
        return min(self.cores, reading.cpu_s / reading.seconds) if reading.seconds > 0 and reading.cpu_s > 0 else None

    def _learn_capacity(self, reading: Reading) -> float | None:
        """A tick that a long queue or refusals lasted through ran saturated: its CPU rate is what the process can
        do. A short queue says nothing: random arrivals leave one now and then at any load. Any tick at a rung that
        reaches more than the capacity learned there proves it higher. Returns the tick's CPU rate when it ran busy
        at one rung."""
        busy = self._refusing(reading, self._spread(reading)) or self._long_queue(reading)
        # a tick that began at another rung mixes two rungs' work, and its queue was priced at the other's
        rate = self._cpu_rate(reading) if self._ran_at == self.level else None
        saturated = busy and self._busy and rate is not None
        known = self.learned_capacity.get(self.level)
        if saturated:
            stretch = self._saturated_at == self.level and known is not None
            self.learned_capacity[self.level] = max(known, rate) if stretch else rate
        elif rate is not None and known is not None and rate > known:
            self.learned_capacity[self.level] = rate
        self._busy, self._ran_at, self._saturated_at = busy, self.level, self.level if saturated else None
        return rate if busy else None

    def _broke_near(self, index: int, rate: float, now: float) -> bool:
        """Whether the rung at ``index``, or a cheaper one above the current rung, came under pressure lately at a
        rate not clearly above ``rate`` (what a cheaper rung could not hold, a costlier one cannot either)."""
        return any(level in self.broke_at and self._near(self.broke_at[level], rate, now)
                   for level in self.levels[index:self.index])

    @staticmethod
    def _near(lesson: tuple[float, float], rate: float, now: float) -> bool:
        """Whether a lesson learned at (rate, when) speaks of ``rate`` now: lately, and the load not clearly lower."""
        return now - lesson[1] <= BREAK_MEMORY_S and rate > BREAK_MARGIN * lesson[0]

    def _long_queue(self, reading: Reading) -> bool:
        """A queue whose newcomer is predicted to finish past ``pressure_share`` of its deadline."""
        return reading.waiting > 0 and reading.predicted_s > self.pressure_share * reading.deadline_s

    def _spread(self, reading: Reading) -> float:
        """One standard deviation of a tick's Poisson arrivals at the window's rate: how far a tick of random
        arrivals strays from the rate."""
        return math.sqrt(self.arrival_rate() * reading.seconds)

    @staticmethod
    def _refusing(reading: Reading, spread: float) -> bool:
        return reading.shed > max(1.0, SHED_SHARE * reading.arrived, spread)

    def _pressure(self, reading: Reading) -> str | None:
        spread = self._spread(reading)
        refusing, queued = self._refusing(reading, spread), self._long_queue(reading)
        was_refusing, was_queued_s = self._refused, self._queued_s
        self._refused, self._queued_s = refusing, reading.predicted_s if queued else None
        at_once = reading.shed >= max(SHED_AT_ONCE_SHARE * reading.arrived, SPREAD_AT_ONCE * spread)
        if refusing and (was_refusing or at_once):
            return f"{reading.shed} of {reading.arrived} requests refused"
        # two readings running, and not draining: a queue that lasts, not one a second of random arrivals left
        if queued and was_queued_s is not None and reading.predicted_s >= was_queued_s:
            return (f"{reading.waiting} waiting, a new request would finish in {reading.predicted_s * 1000:.0f} ms "
                    f"of its {reading.deadline_s * 1000:.0f}")
        demand = self.demand(self.level, rising=True)
        if demand is not None and demand > self.down_at:
            return (f"demand at {self.level} {demand:.0%} of the capacity ({self.capacity(self.level):.2f} cores; "
                    f"> {self.down_at:.0%})")
        return None

    def _step_down(self, now: float, why: str, reading: Reading, pressed_cpu: float | None) -> Change | None:
        self.broke_at[self.level] = (self.arrival_rate(peak=True), now)
        last = len(self.levels) - 1
        if self.index == last:
            return None
        # Sized by what the process did while it could not keep up (this tick's CPU rate, when the tick ran busy at
        # this rung, or when it was a trial's first) when that is lower than the capacity it would otherwise assume:
        # a rung not seen saturated is given every core.
        failed_trial = self._last_up is not None and now - self._last_up < 2 * self.hold_s
        seen = self._cpu_rate(reading) if failed_trial and pressed_cpu is None else pressed_cpu
        capacity = {level: self.capacity(level) if seen is None else min(self.capacity(level), seen)
                    for level in self.levels[self.index:]}
        target = next((i for i in range(self.index + 1, last + 1)
                       if (d := self.demand(self.levels[i], True, capacity[self.levels[i]])) is not None
                       and d <= self.settle_at), last)
        here = self.demand(self.level, True, capacity[self.level])
        if here is not None and here <= self.settle_at:
            target = self.index + 1  # the pressure is the queue's, not the rate's: one rung
        if failed_trial:
            self.hold_s = min(MAX_HOLD_S, 2 * self.hold_s)  # it stepped up too soon: wait longer next time
            # the load it failed at is the window's: a second's peak would let the lesson lapse at the next calm one
            self._failed_trial, self._last_up = (self.arrival_rate(), now), None
            self._failed_trial_cpu = self.cores if seen is None else seen
            cost, price = self.learned_s.get(self.level), self._trial_price
            self._underpriced = max(1.0, cost / price) if cost and price and self._fresh(self.level, now) else 1.0
            if seen is not None:  # the rung tried could not keep up on this much CPU
                self.learned_capacity[self.level] = min(self.capacity(self.level), seen)
        return self._move(now, target, why)

    def _move(self, now: float, index: int, why: str) -> Change:
        before = self.level
        direction = "down" if index > self.index else "up"
        price = self.cost_s(self.levels[index])  # as the rung it leaves prices it
        self.index, self._last_change = index, now
        self._refused, self._queued_s = False, None  # "two readings running" are two at the new rung
        if direction == "up":
            self._last_up, self._trial_price = now, price
        return Change(before, self.level, direction, why)

    def level_for(self, priority: str) -> str:
        """The rung a request of ``priority`` is served at: low one below the controller's once it has stepped
        down, high one above it."""
        if priority == "low" and self.index > 0:
            return self.levels[min(self.index + 1, len(self.levels) - 1)]
        if priority == "high":
            return self.levels[max(self.index - 1, 0)]
        return self.level
