"""From two sets of signals (the window and its baseline) to ranked causes.

The currency is milliseconds of stage P99 growth. The end-to-end P99 grew; each stage's P99 grew by some amount;
each stage's growth is charged to what the evidence says slowed it:

- ``queue`` time is waiting for a worker: charged to **overload**, with the offered load against the baseline's
  (and the knee, when known), the share shed and the share of answers served below full quality as evidence.
  With the load controller on (rag/steering), an overload may not slow anything: it steps the quality ladder down
  instead, and more answers below full quality is then overload by itself, as more refusals are.
- A stage that slowed far more than the others (its P99 ratio ``STANDS_OUT`` times theirs) has a cause of its own:
  its dependency (the language model, the graph store) or, when the kernel probes report it, what its threads
  waited on (a lock, the disk, the network); otherwise the stage itself, unless a machine-wide source moved (below):
  then the stage is the one that source hurt most.
- Stages that slowed together share a machine-wide cause, split by how many CPU cores each source took beyond the
  baseline: the rest of the host (a **neighbour**; on a host already busy, whose busy time cannot grow, the extra
  time its tasks waited for a CPU; while memory stalls grow, the kernel's CPU spent reclaiming it counts as
  memory), the service's own process at the same load (**work no request explains**: a spinning thread, a lock or
  GIL holder), the extra load itself, and stall time on memory or I/O (the kernel's pressure stall information,
  counted in cores lost).

Nothing is wrong when the P99 did not grow beyond ``NOISE_MS`` and ``NOISE_SHARE`` of the baseline (or grew with
fewer than ``TAIL_SHARE`` of the window's requests slower than the baseline's P99, or no more of them than the
baseline's own rate above that bound explains by chance: an outlier), nothing more was shed, no more answers fell back
and no more were served below full quality: then the explanation says so and names no cause.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Literal

from explain.signals import QUANTILE, Evidence, Side
from rag.stages import DEPENDENCY, SLOWED_BY_DEPENDENCY, STAGE_BY_NAME, WAIT_STAGES, describes

NOISE_MS = 10.0
"""A P99 growth below this is noise: a fast service's tail moves a few milliseconds between quiet windows."""
NOISE_SHARE = 0.3
"""...or below this share of the baseline's P99."""
CORE_NOISE = 0.25
"""CPU use (in cores) that moved less than this did not change."""
PRESSURE_NOISE = 0.05
"""A stall share (of time) that moved less than this did not change."""
SHARE_NOISE = 0.01
"""A share of requests shed or degraded that moved less than this did not change."""
TAIL_SHARE = 0.03
"""A P99 grew for real when at least this share of the window's requests (three times the 1 % expected) were slower
than the baseline's P99..."""
TAIL_REQUESTS = 3
"""...and at least this many: one slow outlier among few requests moves a P99 without anything being wrong..."""
TAIL_CHANCE = 0.01
"""...and so many that the baseline's own rate above the bound would give as many or more by chance (Poisson) at most
this often: a P99 read from a hundred-odd requests rests on two or three of them, so a quiet window often shows
three or four above it."""
STANDS_OUT = 2.0
"""A stage whose P99 ratio (window over baseline) is this many times the others' median slowed on its own."""
LOAD_GROWTH = 1.25
"""Offered load this many times the baseline's is more load."""

Kind = Literal["overload", "cpu_neighbour", "cpu_in_process", "memory", "io", "language_model", "graph_store",
               "vector_store", "lock", "network", "stage"]
Verdict = Literal["ok", "slower", "no_data"]
KERNEL_KINDS = {"offcpu:uninterruptible": "io", "syscall:read": "io", "syscall:write": "io", "syscall:file": "io",
                "syscall:futex": "lock", "syscall:network": "network", "syscall:poll": "network",
                "runqueue:runqueue": "cpu_neighbour"}
"""A kernel component of a stage's time -> the cause it points at when it makes most of that stage's growth."""


@dataclass
class Cause:
    kind: Kind
    ms: float
    """Milliseconds of stage P99 growth charged to this cause."""
    headline: str
    evidence: list[str] = field(default_factory=list)
    stages: tuple[str, ...] = ()


@dataclass
class StageChange:
    stage: str
    before_p99_ms: float
    now_p99_ms: float
    before_ms_per_request: float
    now_ms_per_request: float

    @property
    def growth_ms(self) -> float:
        before = 0.0 if math.isnan(self.before_p99_ms) else self.before_p99_ms
        return max(0.0, self.now_p99_ms - before) if not math.isnan(self.now_p99_ms) else 0.0

    @property
    def ratio(self) -> float:
        if math.isnan(self.now_p99_ms):
            return 1.0
        if math.isnan(self.before_p99_ms) or self.before_p99_ms <= 0:
            return math.inf
        return self.now_p99_ms / self.before_p99_ms


@dataclass
class Explanation:
    verdict: Verdict
    headline: str
    job: str | None
    window_s: int
    baseline_s: int
    p99_ms: float
    baseline_p99_ms: float
    causes: list[Cause]
    stages: list[StageChange]
    slowest_traces: list[tuple[float, str]]
    baseline_gap_s: int = 0  # between the baseline's end and the window's start


def _ms(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.1f} ms"


def _tail_by_chance(evidence: Evidence) -> bool:
    """Whether the window's requests above the baseline's P99 bound are as many as the baseline's own rate above it
    gives by chance more often than ``TAIL_CHANCE`` (a one-sided Poisson test)."""
    rate = evidence.baseline_tail_share
    expected = evidence.window_requests * max(1.0 - QUANTILE, 0.0 if math.isnan(rate) else rate)
    seen = round(evidence.tail_requests)
    if expected <= 0 or seen <= 0:
        return False
    term = below = math.exp(-expected)
    for i in range(1, seen):
        term *= expected / i
        below += term
    return 1.0 - below > TAIL_CHANCE


def _share(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0


def _offered(side: Side) -> float:
    return side.answered_per_s + side.shed_per_s


def stage_changes(evidence: Evidence) -> list[StageChange]:
    now, before = evidence.now, evidence.before
    names = sorted(set(now.stage_p99_ms) | set(before.stage_p99_ms),
                   key=lambda s: list(STAGE_BY_NAME).index(s) if s in STAGE_BY_NAME else len(STAGE_BY_NAME))
    return [StageChange(s, before.stage_p99_ms.get(s, math.nan), now.stage_p99_ms.get(s, math.nan),
                        before.stage_ms_per_request.get(s, math.nan), now.stage_ms_per_request.get(s, math.nan))
            for s in names]


def explain(evidence: Evidence, knee_qps: float | None = None) -> Explanation:
    """Rank the causes of the P99's growth from the window over the baseline (see the module docstring)."""
    now, before = evidence.now, evidence.before
    stages = stage_changes(evidence)
    result = Explanation("ok", "", evidence.job, evidence.window.seconds, evidence.baseline.seconds, now.p99_ms,
                         before.p99_ms, [], stages, evidence.slowest_traces,
                         evidence.baseline.offset_s - evidence.window.seconds)
    if now.answered_per_s <= 0 or math.isnan(now.p99_ms):
        result.verdict = "no_data"
        result.headline = "no answered requests in the window: nothing to explain (is the service receiving load?)"
        return result
    if before.answered_per_s <= 0 or math.isnan(before.p99_ms):
        result.verdict = "no_data"
        result.headline = ("no answered requests in the baseline to compare with: widen --baseline or move it "
                           "(--baseline-gap) to minutes the service was serving")
        return result
    growth = now.p99_ms - before.p99_ms
    shed_more = _share(now.shed_per_s, _offered(now)) - _share(before.shed_per_s, _offered(before))
    degraded_more = (_share(sum(now.degraded_per_s.values()), now.answered_per_s)
                     - _share(sum(before.degraded_per_s.values()), before.answered_per_s))
    stepped_more = _share(now.below_full_per_s, now.answered_per_s) - _share(before.below_full_per_s,
                                                                               before.answered_per_s)
    skipped_more = _skipped_more(now, before)
    slower = (growth > max(NOISE_MS, NOISE_SHARE * before.p99_ms)
              and not evidence.tail_share < TAIL_SHARE and evidence.tail_requests >= TAIL_REQUESTS
              and not _tail_by_chance(evidence))
    if not (slower or shed_more > SHARE_NOISE or degraded_more > SHARE_NOISE or stepped_more > SHARE_NOISE
            or max(skipped_more.values(), default=0.0) > SHARE_NOISE):
        result.headline = (f"nothing is wrong: P99 {_ms(now.p99_ms)} against {_ms(before.p99_ms)} in the baseline "
                           f"(within noise), nothing more shed, degraded or skipped")
        return result
    result.verdict = "slower"
    causes = _causes(evidence, stages, knee_qps, max(shed_more, stepped_more), degraded_more, skipped_more)
    causes.sort(key=lambda c: c.ms, reverse=True)
    result.causes = causes
    top = causes[0].headline if causes else "no stage's P99 grew: the time is outside the stages ragheat sees"
    result.headline = f"P99 {_ms(before.p99_ms)} -> {_ms(now.p99_ms)}: {top}"
    return result


def _skipped_more(now: Side, before: Side) -> dict[str, float]:
    """Per mandatory stage that calls a dependency: how much more of the answers went without it in the window. An
    optional stage is also skipped when the deadline cannot hold it (the counter does not say which), so its skips
    point at nothing."""
    return {stage: _share(now.skipped_per_s.get(stage, 0.0), now.answered_per_s)
            - _share(before.skipped_per_s.get(stage, 0.0), before.answered_per_s)
            for stage in DEPENDENCY if not STAGE_BY_NAME[stage].optional}


def _causes(evidence: Evidence, stages: list[StageChange], knee_qps: float | None, shed_more: float,
            degraded_more: float, skipped_more: dict[str, float]) -> list[Cause]:
    """``shed_more``: how much more of the load was refused, or answered below full quality (the larger);
    ``skipped_more``: per stage, how much more of the answers went without it."""
    now, before = evidence.now, evidence.before
    causes: dict[str, Cause] = {}

    def charge(key: str, kind: Kind, ms: float, headline: str, evidence_lines: list[str], stage: str | None):
        cause = causes.setdefault(key, Cause(kind, 0.0, headline, evidence_lines))
        cause.ms += ms
        if stage and stage not in cause.stages:
            cause.stages += (stage,)

    load_ratio = _share(_offered(now), _offered(before))
    overload_line = (f"overload: {_offered(now):.1f} req/s offered against {_offered(before):.1f} in the baseline"
                     + (f" and a knee of {knee_qps:g}" if knee_qps else "")
                     + (f"; shed {_share(now.shed_per_s, _offered(now)):.0%}" if now.shed_per_s else "")
                     + (f"; {_share(now.below_full_per_s, now.answered_per_s):.0%} of answers below full quality"
                        if now.below_full_per_s else ""))
    overload_evidence = [f"offered {_offered(before):.2f} -> {_offered(now):.2f} req/s ({load_ratio:.2f}x)",
                         f"shed {_share(before.shed_per_s, _offered(before)):.1%} -> "
                         f"{_share(now.shed_per_s, _offered(now)):.1%} of offered requests"]
    if now.below_full_per_s or before.below_full_per_s:  # the load controller traded quality for capacity
        below_before = _share(before.below_full_per_s, before.answered_per_s)
        below_now = _share(now.below_full_per_s, now.answered_per_s)
        overload_evidence.append(f"answers below full quality {below_before:.1%} -> {below_now:.1%} (the load "
                                 f"controller stepped the quality ladder down)")
    weights = _machine_weights(now, before)
    total = sum(weights.values())
    ordinary = [c.ratio for c in stages if c.growth_ms > 0 and c.stage not in WAIT_STAGES
                and c.stage not in SLOWED_BY_DEPENDENCY and math.isfinite(c.ratio)]
    median_ratio = max(1.0, statistics.median(ordinary)) if ordinary else 1.0
    shared: list[StageChange] = []
    for change in stages:
        if change.growth_ms <= 0:
            continue
        if change.stage in WAIT_STAGES:
            charge("overload", "overload", change.growth_ms, overload_line,
                   overload_evidence + [f"{change.stage} P99 {_ms(change.before_p99_ms)} -> "
                                        f"{_ms(change.now_p99_ms)}"], change.stage)
            continue
        on_its_own = change.ratio >= STANDS_OUT * median_ratio and change.growth_ms >= NOISE_MS / 2
        if on_its_own:
            key, kind, headline, lines = _own_cause(change, evidence)
            if kind != "stage" or total <= 0:
                charge(key, kind, change.growth_ms, headline, lines, change.stage)
                continue
            # Nothing of its own explains it but a machine-wide source moved: the stage that suffers most from
            # a busy CPU or an interpreter lock held elsewhere (the one with the most CPU or lock hand-offs) is its
            # victim, not its cause.
        shared.append(change)
    pool = sum(c.growth_ms for c in shared)
    if pool > 0 and total > 0:
        for key, weight in weights.items():
            if weight <= 0:
                continue
            kind, headline, lines = _machine_cause(key, now, before, overload_line, overload_evidence)
            for change in shared:
                charge(key, kind, change.growth_ms * weight / total, headline, lines, change.stage)
    elif pool > 0:
        for change in shared:
            key, kind, headline, lines = _own_cause(change, evidence)
            charge(key, kind, change.growth_ms, headline, lines, change.stage)
    if shed_more > SHARE_NOISE and "overload" not in causes:
        charge("overload", "overload", 0.0, overload_line, overload_evidence, None)
    if degraded_more > SHARE_NOISE and "language_model" not in causes:
        reasons = ", ".join(f"{r} {v / now.answered_per_s:.0%}" for r, v in sorted(now.degraded_per_s.items()) if v)
        charge("language_model", "language_model", 0.0,
               f"the language model: {degraded_more:.0%} more answers fell back to extractive ({reasons})",
               _model_evidence(now, before), None)
    for stage, more in skipped_more.items():  # a dependency down: answers go without its stage, no later
        dependency = DEPENDENCY[stage]
        if more > SHARE_NOISE:  # after a first stage, a second of the same dependency joins its cause
            charge(dependency, dependency, 0.0,
                   f"the {dependency.replace('_', ' ')}: {more:.0%} more answers without {describes(stage)} "
                   f"(unavailable)",
                   [f"{stage} skipped {before.skipped_per_s.get(stage, 0.0):.2f} -> "
                    f"{now.skipped_per_s.get(stage, 0.0):.2f} /s"], stage)
    return list(causes.values())


def _machine_weights(now: Side, before: Side) -> dict[str, float]:
    """Cores each machine-wide source took beyond the baseline (zero where it did not move beyond noise)."""
    weights = {}
    others = now.others_cores - before.others_cores
    cores = now.host_cores if math.isfinite(now.host_cores) else 1.0
    stalled = {r: now.pressure.get(r, 0.0) - before.pressure.get(r, 0.0) for r in ("memory", "io")}
    reclaim = 0.0
    if stalled["memory"] >= PRESSURE_NOISE and others > 0:
        # Reclaiming memory is kernel CPU outside the service (kswapd): a symptom of the memory pressure, not a
        # neighbour's work.
        reclaim = min(others, max(0.0, _or_zero(now.host_system_cores - before.host_system_cores)))
        others -= reclaim
    weights["cpu_neighbour"] = others if others >= CORE_NOISE else 0.0
    per_request = _share(before.process_cores, before.answered_per_s)
    load_cores = per_request * max(0.0, now.answered_per_s - before.answered_per_s)
    more_load = _share(_offered(now), _offered(before)) >= LOAD_GROWTH
    weights["overload"] = max(load_cores, CORE_NOISE) if more_load else 0.0
    own = (now.process_cores - before.process_cores) - load_cores
    weights["cpu_in_process"] = own if own >= CORE_NOISE else 0.0
    waiting = now.pressure.get("cpu", 0.0) - before.pressure.get("cpu", 0.0)
    if not weights["cpu_neighbour"] and not more_load and not own >= CORE_NOISE and waiting >= PRESSURE_NOISE:
        # A host already busy cannot get busier, but its tasks wait longer for a CPU: at the same load and with
        # the service burning no more, the extra wait is someone else's.
        weights["cpu_neighbour"] = cores * waiting
    for resource in ("memory", "io"):
        weights[resource] = cores * stalled[resource] if stalled[resource] >= PRESSURE_NOISE else 0.0
    weights["memory"] += reclaim
    return {k: (0.0 if math.isnan(v) else v) for k, v in weights.items()}


def _or_zero(value: float) -> float:
    return 0.0 if math.isnan(value) else value


def _machine_cause(key: str, now: Side, before: Side, overload_line: str,
                   overload_evidence: list[str]) -> tuple[Kind, str, list[str]]:
    cores = f" of {now.host_cores:.0f} cores" if math.isfinite(now.host_cores) else ""
    if key == "overload":
        return "overload", overload_line, overload_evidence + [
            f"service CPU {before.process_cores:.2f} -> {now.process_cores:.2f} cores"]
    if key == "cpu_neighbour":
        return "cpu_neighbour", (f"CPU taken by other processes on the host: {now.others_cores:.2f}{cores} busy "
                                 f"outside the service, against {before.others_cores:.2f} in the baseline"), [
            f"host busy {before.host_busy_cores:.2f} -> {now.host_busy_cores:.2f} cores; service "
            f"{before.process_cores:.2f} -> {now.process_cores:.2f}",
            f"CPU pressure {before.pressure.get('cpu', 0):.0%} -> {now.pressure.get('cpu', 0):.0%} of the time"]
    if key == "cpu_in_process":
        per_before = 1e3 * _share(before.process_cores, before.answered_per_s)
        per_now = 1e3 * _share(now.process_cores, now.answered_per_s)
        return "cpu_in_process", (f"the service's own process burns CPU its requests do not explain: "
                                  f"{before.process_cores:.2f} -> {now.process_cores:.2f} cores at "
                                  f"{_offered(before):.1f} -> {_offered(now):.1f} req/s (a busy thread, a lock or "
                                  f"GIL holder, a background job)"), [
            f"CPU per answered request {per_before:.1f} -> {per_now:.1f} ms"]
    stalled = (before.pressure.get(key, 0.0), now.pressure.get(key, 0.0))
    name = "memory (reclaim, page faults: a cold page cache)" if key == "memory" else "I/O (the disk)"
    lines = [f"{key} pressure (some) {stalled[0]:.1%} -> {stalled[1]:.1%}"]
    if key == "memory" and math.isfinite(now.host_system_cores):
        lines.append(f"the host's kernel CPU (reclaim among it) {before.host_system_cores:.2f} -> "
                     f"{now.host_system_cores:.2f} cores")
    return key, f"tasks of the host stalled on {name} {stalled[1]:.0%} of the time, against {stalled[0]:.0%}", lines


def _kernel_growth(evidence: Evidence, stage: str) -> list[tuple[float, str]]:
    """(ms per request of growth, component) of one stage's kernel time, largest first."""
    now, before = evidence.now.kernel_ms_per_request, evidence.before.kernel_ms_per_request
    grown = [(value - before.get(key, 0.0), key[1]) for key, value in now.items() if key[0] == stage]
    return sorted((g for g in grown if g[0] > 0), reverse=True)


def _own_cause(change: StageChange, evidence: Evidence) -> tuple[str, Kind, str, list[str]]:
    """The cause of one stage that slowed on its own: its dependency, what the kernel saw it wait on, or itself."""
    stage, now, before = change.stage, evidence.now, evidence.before
    p99 = f"{stage} P99 {_ms(change.before_p99_ms)} -> {_ms(change.now_p99_ms)}"
    kernel = _kernel_growth(evidence, stage)
    lines = [p99] + [f"kernel: {component} +{ms:.1f} ms per request" for ms, component in kernel[:3]]
    dependency = SLOWED_BY_DEPENDENCY.get(stage)  # what it waits on when it alone slows down
    if dependency == "language_model":
        return dependency, dependency, f"the language model: {p99}", lines + _model_evidence(now, before)
    if dependency == "graph_store":
        skipped = now.skipped_per_s.get(stage, 0.0)
        return dependency, dependency, f"the graph store: {p99}", lines + (
            [f"{stage} skipped {skipped:.2f} /s (store unavailable or too slow for the deadline)"] if skipped else [])
    mean_growth = change.now_ms_per_request - change.before_ms_per_request
    if kernel and mean_growth > 0 and kernel[0][0] >= 0.5 * mean_growth and kernel[0][1] in KERNEL_KINDS:
        kind = KERNEL_KINDS[kernel[0][1]]
        what = {"io": "the disk or the page cache", "lock": "a lock (futex waits)", "network": "the network",
                "cpu_neighbour": "a CPU (run-queue wait)"}[kind]
        return f"{kind}:{stage}", kind, f"{stage} waits on {what}: {p99}", lines
    return f"stage:{stage}", "stage", (f"{stage} itself got slower: {p99}, with no machine-wide signal (its code, "
                                       f"its data or something ragheat does not see)"), lines


def _model_evidence(now: Side, before: Side) -> list[str]:
    lines = []
    if math.isfinite(now.ttft_p99_ms):
        lines.append(f"time to first token P99 {_ms(before.ttft_p99_ms)} -> {_ms(now.ttft_p99_ms)}")
    if math.isfinite(now.kv_usage):
        lines.append(f"vLLM KV cache up to {now.kv_usage:.0%} used; preemptions {now.preemptions_per_s:.2f} /s")
    degraded = {r: v for r, v in now.degraded_per_s.items() if v}
    if degraded:
        lines.append("answers fell back: " + ", ".join(f"{r} {v:.2f} /s" for r, v in sorted(degraded.items())))
    return lines
