"""Steering under load: the quality-ladder controller, admission control alone, and neither, side by side.

Three ``ragheat serve`` processes over the same index, identical but for two settings: ``steer`` (the load controller
on, ``steering.enabled``, with admission control's defaults: under load it steps the quality ladder down, cheaper
answers, before admission has to refuse anyone, and back up when the load falls), ``shed`` (the defaults: admission
control alone, every answer at full quality) and ``neither`` (admission off: every query queued). All run for the
whole benchmark; every step is measured on each in turn (the order rotating), with the project's open-loop generator
(Poisson arrivals, latency from the intended send time, loadgen/runner.py), SciFact train claims as queries, and each
service's ``/metrics`` scraped every ``--sample`` seconds meanwhile (``ragheat_quality_level``, the rung new queries
are served at, and ``ragheat_quality_level_changes_total``).

1. The full-quality knee: ascending rates on ``shed`` alone until the first that misses the SLO (``find_knee``), or
   ``--knee R``; then confirmed over the 1x step's length (``--warmup`` + its duration): the highest passing rate
   that ``neither`` holds that long, on the very arrivals the 1x step offers (descending through the passing
   rates; when none holds, or the run is stopped, the sweep's knee), so that 1x is a load full quality holds, not one
   a short step happened to pass (``--no-confirm-knee``: the sweep's knee as it is). Without admission control: at
   a rate past the capacity admission control refuses the excess as it comes and a short step can stay under the
   share of refusals the knee allows, while every query queued shows the queue that grows.
2. Steady load at ``--factors`` times the knee: ``--duration`` seconds measured after ``--warmup`` seconds (time for
   the controller to settle); at ``--long-factors`` (by default 1x and 1.5x, the loads where a controller could
   oscillate) ``--long-duration`` seconds, so that level changes a minute are counted over a minute. Per step:
   goodput (answers within the SLO per second), admitted P99, refusals per second (and by the service's reason),
   the answers' quality levels (each response's ``quality_level``), their mean quality (the ladder's
   nDCG@10 of each rung, ``rag/steering/ladder.json``, weighted by its share: not measured on these answers) and the
   controller's level changes (the counter, before and after the measured part).
   ``--skip`` leaves steps out (by default ``neither`` at 4x: its queue would take minutes to drain).
3. A burst (``--burst-base`` s at ``--base-factor`` x the knee, ``--burst`` s at ``--burst-factor`` x, then
   ``--burst-after`` s at the base rate; ``--others-after`` s for ``shed`` and ``neither``) on each configuration, and
   a ramp (``--ramp-from`` x to ``--ramp-to`` x over ``--ramp`` s) on ``steer``: when the controller first stepped
   down, when it was back at full quality, and goodput and P99 within each part.

Between steps each service is left to finish what it holds (``ragheat_requests_in_flight``), so a backlog does not
spill into the next configuration's step. docs/benchmarks.md, "Steering under load", shows the results.

    .venv/bin/python benchmarks/bench_steering.py --index data/index/scifact \\
        --queries datasets/scifact --results-file benchmarks/results/steering.json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp  # noqa: E402
import httpx  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.bench_capacity import train_claims  # noqa: E402
from benchmarks.common import MAX_ERROR_RATE, check_index, rotated, sweep_parser  # noqa: E402
from benchmarks.docgen.page import preview  # noqa: E402
from loadgen.arrivals import parse_rates, poisson_offsets  # noqa: E402
from loadgen.cpu import CpuWindow  # noqa: E402
from loadgen.resultsfile import BenchmarkRun  # noqa: E402
from loadgen.runner import Outcome, StopSignals, open_loop, run, shuffled, window  # noqa: E402
from loadgen.stats import find_knee  # noqa: E402
from rag.stages import QUALITY_LEVELS  # noqa: E402
from rag.steering.ladder import Ladder  # noqa: E402
from stack.servers import ServeFleet  # noqa: E402

STEADY_SEED = 100  # the steady steps' arrivals: step i draws from STEADY_SEED + i
ADMISSION_OFF = {"RAGHEAT_ADMISSION__ENABLED": "false", "RAGHEAT_ADMISSION__DEGRADE": "false"}
CONFIGS = {"steer": {"RAGHEAT_STEERING__ENABLED": "true"}, "shed": {"RAGHEAT_STEERING__ENABLED": "false"},
           "neither": {**ADMISSION_OFF, "RAGHEAT_STEERING__ENABLED": "false"}}
CONFIRM_ON = "neither"  # the knee holds without admission control: no refusal hides a queue that grows
GAUGE, CHANGES, IN_FLIGHT = "ragheat_quality_level", "ragheat_quality_level_changes_total", "ragheat_requests_in_flight"
SHED = "ragheat_requests_shed_total"
_SAMPLE = re.compile(r'^(?P<name>[a-z_]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)')
_DIRECTION = re.compile(r'direction="(\w+)"')
_REASON = re.compile(r'reason="(\w+)"')


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = sweep_parser(__doc__.split("\n\n")[0], rates="60:200:20", duration=10.0, stop_factor=3.0,
                     ready_timeout=240.0, work="service logs")
    p.set_defaults(warmup=8.0)
    p.add_argument("--queries", type=Path, default=Path("datasets/scifact"),
                   help="a BEIR folder (its train claims: qrels/train.tsv) or a queries file")
    p.add_argument("--knee", type=float, default=None, help="the full-quality knee in req/s (skips measuring it)")
    p.add_argument("--knee-duration", type=float, default=10.0, help="measured seconds per knee rate")
    p.add_argument("--knee-warmup", type=float, default=2.0, help="unmeasured seconds before each knee rate")
    p.add_argument("--confirm-knee", action=argparse.BooleanOptionalAction, default=True,
                   help="confirm the sweep's knee over a steady step's length, descending until a rate holds")
    p.add_argument("--factors", default="1,1.5,2,4", help="steady steps, as multiples of the knee")
    p.add_argument("--long-factors", default="1,1.5",
                   help="steady steps measured for --long-duration seconds instead of --duration ('': none)")
    p.add_argument("--long-duration", type=float, default=60.0,
                   help="measured seconds of the --long-factors steps (and of the knee's confirmation, when 1 is one)")
    p.add_argument("--base-factor", type=float, default=0.5, help="the burst's rate before and after it (x knee)")
    p.add_argument("--burst-factor", type=float, default=4.0, help="the burst's rate (x knee)")
    p.add_argument("--burst-base", type=float, default=5.0, help="seconds at the base rate before the burst")
    p.add_argument("--burst", type=float, default=15.0, help="seconds of the burst")
    p.add_argument("--burst-after", type=float, default=40.0, help="seconds at the base rate after the burst")
    p.add_argument("--others-after", type=float, default=10.0,
                   help="seconds at the base rate after the burst for shed and neither (steer: --burst-after)")
    p.add_argument("--skip", default="neither@4",
                   help="steady steps not offered, CONFIG@FACTOR,... (default: neither's queue at 4x would take "
                        "minutes to drain; '' offers every one)")
    p.add_argument("--ramp", type=float, default=30.0, help="seconds of the ramp (0: none)")
    p.add_argument("--ramp-from", type=float, default=0.5, help="the ramp's first rate (x knee)")
    p.add_argument("--ramp-to", type=float, default=4.0, help="the ramp's last rate (x knee)")
    p.add_argument("--sample", type=float, default=0.5, help="seconds between scrapes of /metrics during a step")
    p.add_argument("--drain-timeout", type=float, default=120.0,
                   help="most seconds to wait for a service to finish its backlog after a step")
    p.add_argument("--settle-timeout", type=float, default=60.0,
                   help="most seconds to wait for steer to be back at full quality before the burst and the ramp")
    p.add_argument("--corpus", default=None, help="the ladder's corpus for mean quality (default: the index's name)")
    args = p.parse_args(argv)
    check_index(p, args.index)
    args.factors = parse_rates(args.factors)
    args.long_factors = parse_rates(args.long_factors) if args.long_factors else []
    try:
        args.skip = {(c, float(f)) for c, _, f in (item.partition("@") for item in args.skip.split(",") if item)}
    except ValueError:
        p.error(f"--skip takes CONFIG@FACTOR,...; got {args.skip!r}")
    if unknown := {c for c, _ in args.skip} - set(CONFIGS):
        p.error(f"--skip: no configuration {', '.join(sorted(unknown))} (they are {', '.join(CONFIGS)})")
    return args


# --- the service's own view: its quality level and backlog, from /metrics -------------------------------------

@dataclass(frozen=True)
class Scrape:
    t: float  # perf_counter seconds, the clock of loadgen's Outcome.intended
    level: int | None  # ragheat_quality_level (highest over worker processes): the index in QUALITY_LEVELS
    down: float
    up: float
    in_flight: float
    shed: dict[str, float]  # refusals so far by reason (rag.api.admission.SHED_REASONS)


def read_scrape(t: float, text: str) -> Scrape:
    """The few lines of a /metrics exposition the benchmark follows (a line scan: the generator's CPU is the load's)."""
    level, changes, in_flight, shed = None, {"down": 0.0, "up": 0.0}, 0.0, {}
    for line in text.splitlines():
        if not line.startswith(("ragheat_quality_level", IN_FLIGHT, SHED)):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        name, value = m["name"], float(m["value"])
        if name == GAUGE:
            level = int(value) if level is None else max(level, int(value))
        elif name == CHANGES and (d := _DIRECTION.search(m["labels"] or "")) and d[1] in changes:
            changes[d[1]] += value
        elif name == IN_FLIGHT:
            in_flight += value
        elif name == SHED and (r := _REASON.search(m["labels"] or "")):
            shed[r[1]] = shed.get(r[1], 0.0) + value
    return Scrape(t, level, changes["down"], changes["up"], in_flight, shed)


async def _scrape_once(session: aiohttp.ClientSession, url: str, out: list[Scrape]) -> None:
    t = time.perf_counter()
    try:
        async with session.get(url + "/metrics") as response:
            out.append(read_scrape(t, await response.text()))
    except (aiohttp.ClientError, TimeoutError):
        pass  # a missed sample: the timeline has a gap there


async def _scrape_every(session: aiohttp.ClientSession, url: str, interval: float, done: asyncio.Event,
                        out: list[Scrape]) -> None:
    due = time.perf_counter()
    while not done.is_set():
        due += interval
        try:
            await asyncio.wait_for(done.wait(), max(0.0, due - time.perf_counter()))
        except TimeoutError:
            await _scrape_once(session, url, out)


async def _sampled(step, url: str, interval: float, scrapes: list[Scrape]):
    """Await the load ``step`` while /metrics is scraped every ``interval`` s, once before it starts and once after
    its last request is back (so that counts over any part of it have a scrape on either side)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=max(interval, 1.0))) as session:
        await _scrape_once(session, url, scrapes)
        done = asyncio.Event()
        sampler = asyncio.create_task(_scrape_every(session, url, interval, done, scrapes))
        try:
            return await step
        finally:
            done.set()
            await sampler
            await _scrape_once(session, url, scrapes)


def scrape(url: str) -> Scrape | None:
    try:
        return read_scrape(time.perf_counter(), httpx.get(url + "/metrics", timeout=30).text)
    except httpx.HTTPError:
        return None


def wait_until(url: str, ready, timeout_s: float) -> tuple[float, Scrape | None]:
    """Scrape every half second until ``ready(scrape)`` or ``timeout_s``: seconds waited and the last scrape."""
    started, last = time.monotonic(), None
    while time.monotonic() - started < timeout_s:
        last = scrape(url)
        if last is not None and ready(last):
            break
        time.sleep(0.5)
    return round(time.monotonic() - started, 2), last


# --- schedules ------------------------------------------------------------------------------------------------

def piecewise_offsets(parts: list[tuple[float, float]], rng: np.random.Generator) -> np.ndarray:
    """Poisson arrivals through ``parts``, each (seconds, rate), one after the other."""
    out, at = [], 0.0
    for seconds, rate in parts:
        out.append(at + poisson_offsets(rate, seconds, rng))
        at += seconds
    return np.concatenate(out)


def ramp_offsets(first: float, last: float, seconds: float, rng: np.random.Generator) -> np.ndarray:
    """Poisson arrivals whose rate goes linearly from ``first`` to ``last`` per second over ``seconds`` (thinning: a
    draw at the highest rate, each arrival kept with the share of it the rate has reached then)."""
    top = max(first, last)
    times = poisson_offsets(top, seconds, rng)
    rate = first + (last - first) * times / seconds
    return times[rng.random(len(times)) < rate / top]


# --- what a step's outcomes and scrapes say -------------------------------------------------------------------

def row(step) -> dict:
    return {"offered_qps": step.offered_qps, "duration_s": step.duration_s, "requests": step.requests,
            "achieved_qps": round(step.achieved_qps, 2), "goodput_qps": round(step.goodput_qps, 2),
            "errors": step.errors, "error_rate": round(step.error_rate, 5), "error_reasons": step.error_reasons,
            "shed": step.shed, "shed_rate": round(step.shed_rate, 5),
            "shed_qps": round(step.shed / step.duration_s, 2) if step.duration_s else 0.0,
            "shed_reasons": step.shed_reasons, "latency_ms": step.latency_ms, "send_error_ms": step.send_error_ms,
            "levels": step.levels, "cpu_ms_per_answer": step.cpu_ms_per_answer, "interrupted": step.interrupted}


def mean_quality(levels: dict[str, int], ndcg: dict[str, float]) -> float | None:
    """The answers' quality: each level's ladder nDCG@10 by its share of the answers (None: a level off the
    ladder)."""
    answered = sum(levels.values())
    if not answered or any(level not in ndcg for level in levels):
        return None
    return round(sum(n * ndcg[level] for level, n in levels.items()) / answered, 4)


def timeline(outcomes: list[Outcome], origin: float, slo_ms: float, seconds: float) -> list[dict]:
    """Per second of intended send time: requests sent, answered (and within the SLO), refused, failed, and the
    answers' levels."""
    bins = [{"t": i, "sent": 0, "answered": 0, "in_slo": 0, "shed": 0, "errors": 0, "levels": Counter()}
            for i in range(int(np.ceil(seconds)))]
    for o in outcomes:
        i = int(o.intended - origin)
        if not 0 <= i < len(bins):
            continue
        b = bins[i]
        b["sent"] += 1
        if o.ok:
            b["answered"] += 1
            b["in_slo"] += (o.done - o.intended) * 1000 <= slo_ms
            if o.level is not None:
                b["levels"][o.level] += 1
        elif o.shed is not None:
            b["shed"] += 1
        else:
            b["errors"] += 1
    return [{**b, "levels": dict(sorted(b["levels"].items()))} for b in bins]


def level_track(scrapes: list[Scrape], origin: float) -> list[list[float]]:
    """The gauge's changes as [seconds from ``origin``, level index], its first sample included."""
    out: list[list[float]] = []
    for s in scrapes:
        if s.level is not None and (not out or out[-1][1] != s.level):
            out.append([round(s.t - origin, 2), s.level])
    return out


def changes_between(scrapes: list[Scrape], start: float, end: float) -> dict | None:
    """Level changes counted by the service between the last scrape at or before ``start`` and the first at or
    after ``end`` (None without both)."""
    before = [s for s in scrapes if s.t <= start]
    after = [s for s in scrapes if s.t >= end]
    if not before or not after:
        return None
    a, b = before[-1], after[0]
    return {"down": int(b.down - a.down), "up": int(b.up - a.up), "from_s": round(a.t - start, 2),
            "to_s": round(b.t - end, 2)}


def shed_by_reason(scrapes: list[Scrape]) -> dict[str, int]:
    """Refusals by reason between the first and the last scrape of a step (the service's own counter)."""
    if len(scrapes) < 2:
        return {}
    first, last = scrapes[0].shed, scrapes[-1].shed
    return {reason: int(last[reason] - first.get(reason, 0.0)) for reason in sorted(last)
            if last[reason] > first.get(reason, 0.0)}


def first_scrape(scrapes: list[Scrape], after: float, test) -> float | None:
    return next((s.t - after for s in scrapes if s.t >= after and s.level is not None and test(s.level)), None)


def first_answer(outcomes: list[Outcome], after: float, test) -> float | None:
    """Seconds from ``after`` to the intended send time of the first answer (sent then or later) whose level passes."""
    return min((o.intended - after for o in outcomes if o.ok and o.intended >= after and o.level is not None
                and test(o.level)), default=None)


def last_answer(outcomes: list[Outcome], after: float, test) -> float | None:
    return max((o.intended - after for o in outcomes if o.ok and o.intended >= after and o.level is not None
                and test(o.level)), default=None)


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def controller_view(outcomes: list[Outcome], scrapes: list[Scrape], rise: float, fall: float | None) -> dict:
    """When the controller first stepped below the rung it served at ``rise`` and was back at full quality after
    ``fall``, from its gauge (sampled) and from the answers' levels (by send time)."""
    start = next((s.level for s in reversed(scrapes) if s.t <= rise and s.level is not None), 0)
    below = lambda level: level > start  # noqa: E731
    full = lambda level: level == 0  # noqa: E731
    stepped = lambda level: level > 0  # noqa: E731
    index = QUALITY_LEVELS.index
    out = {"level_at_rise": start, "first_down_s": _round(first_scrape(scrapes, rise, below)),
           "first_answer_below_start_s": _round(first_answer(outcomes, rise, lambda level: index(level) > start)),
           "lowest_level": max((s.level for s in scrapes if s.t >= rise and s.level is not None), default=None)}
    if fall is not None:
        back = first_scrape(scrapes, fall, full)
        out.update({
            "back_to_full_s": _round(back),
            "down_again_after_full": back is not None and first_scrape(scrapes, fall + back, stepped) is not None,
            "last_answer_below_full_s": _round(last_answer(outcomes, fall, lambda level: level != "full")),
            "level_at_end": next((s.level for s in reversed(scrapes) if s.level is not None), None)})
    return out


# --- the benchmark --------------------------------------------------------------------------------------------

def step_seconds(args: argparse.Namespace, factor: float) -> float:
    """The measured seconds of the steady step at ``factor`` times the knee."""
    return args.long_duration if factor in args.long_factors else args.duration


def main(argv: list[str] | None = None) -> int:
    record = BenchmarkRun("steering")
    args = parse_args(argv)
    texts = shuffled(train_claims(args.queries), 0)
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-steering-"))
    work.mkdir(parents=True, exist_ok=True)
    ladder = Ladder.load()
    corpus = args.corpus or args.index.resolve().name
    ndcg = {level: q[corpus] for level, q in ladder.quality.items() if corpus in q}
    configs = list(CONFIGS)
    load_before = os.getloadavg()
    # steer logs why it changes rungs (ragheat.steering, at info)
    fleet = {name: (("--log-level", "info") if name == "steer" else (), env) for name, env in CONFIGS.items()}
    knee_steps, confirmations, steady, burst, ramp = [], [], [], {}, None
    with ServeFleet(args.index, fleet, work, args.ready_timeout) as services, StopSignals() as stop:
        urls = services.urls

        def load(config: str, offsets: np.ndarray, rate: float, duration: float, warmup: float, *, cpu: bool = True,
                 sampled: bool = True):
            """One step on ``config``; its summary, every outcome, the scrapes and the schedule's zero."""
            outcomes: list[Outcome] = []
            scrapes: list[Scrape] = []
            window_cpu = CpuWindow([services.pids[config]]) if cpu else None
            step = open_loop(urls[config] + "/v1/query", texts, rate, duration, warmup, timeout_s=args.timeout,
                             slo_ms=args.slo_ms, cpu=window_cpu, offsets=offsets, outcomes=outcomes)
            if sampled:
                step = _sampled(step, urls[config], args.sample, scrapes)
            summary = run(step, stop)
            origin = outcomes[0].intended - offsets[0] if outcomes else time.perf_counter()
            return summary, outcomes, scrapes, origin

        def drain(config: str) -> float:
            waited, last = wait_until(urls[config], lambda s: s.in_flight <= 0, args.drain_timeout)
            if last is None or last.in_flight > 0:
                print(f"  {config}: still {last.in_flight if last else '?'} in flight after {waited:g} s", flush=True)
            return waited

        def settle() -> dict:
            """Wait (up to --settle-timeout) for steer to be back at full quality: where a burst or ramp starts."""
            waited, last = wait_until(urls["steer"], lambda s: s.level == 0, args.settle_timeout)
            return {"waited_s": waited, "level": last.level if last else None}

        def say(config: str, label: str, step, levels: dict | None = None) -> None:
            p99, nan = step.latency_ms.get("p99"), float("nan")
            mix = ", ".join(f"{k} {v}" for k, v in (levels if levels is not None else step.levels).items())
            print(f"{config:8s} {label:12s} goodput {step.goodput_qps:7.1f}/s  P99 {p99 or nan:8.1f} ms  shed "
                  f"{step.shed:5d}  errors {step.errors:4d}  levels [{mix}]", flush=True)

        def on_one(config: str, label: str, rate: float, duration: float, warmup: float, seed: int):
            """One step on ``config`` alone (its arrivals drawn from ``seed``), its backlog drained after it."""
            offsets = poisson_offsets(rate, warmup + duration, np.random.default_rng(seed))
            step, *_ = load(config, offsets, rate, duration, warmup, sampled=False)
            if step is not None:
                say(config, f"{label} {rate:g}", step)
                drain(config)
            return step

        # 1. the full-quality knee, on admission control alone
        if args.knee is None:
            for i, rate in enumerate(parse_rates(args.rates)):
                if stop.presses:
                    break
                step = on_one("shed", "knee", rate, args.knee_duration, args.knee_warmup, i)
                if step is None:
                    break
                knee_steps.append(step)
                if find_knee(knee_steps, args.slo_ms, MAX_ERROR_RATE) != rate:
                    break  # the first rate that misses the SLO: no higher one can be the knee
            knee = find_knee(knee_steps, args.slo_ms, MAX_ERROR_RATE)
            if knee is None:
                raise SystemExit("no knee rate met the SLO: offer lower --rates, or give --knee")
            passing = sorted((s.offered_qps for s in knee_steps if s.offered_qps <= knee), reverse=True)
            # the arrivals the 1x steady step offers when this rate is the knee (the first step's, without one)
            first = args.factors.index(1.0) if 1.0 in args.factors else 0
            seed, seconds = STEADY_SEED + first, step_seconds(args, args.factors[first] if args.factors else 1.0)
            for rate in passing if args.confirm_knee else []:
                if stop.presses:
                    break
                step = on_one(CONFIRM_ON, "confirm", rate, seconds, args.warmup, seed)
                if step is None:
                    break
                held = find_knee([step], args.slo_ms, MAX_ERROR_RATE) == rate
                confirmations.append({"held": held, "config": CONFIRM_ON, **row(step)})
                if held:
                    knee = rate
                    break
            if confirmations and not confirmations[-1]["held"]:
                print(f"no rate of the sweep held over a steady step's length: the steps multiply the sweep's knee "
                      f"({knee:g} req/s)", flush=True)
        else:
            knee = args.knee

        # 2. steady load at multiples of the knee
        for i, factor in enumerate(args.factors):
            rate, seconds = factor * knee, step_seconds(args, factor)
            offsets = poisson_offsets(rate, args.warmup + seconds, np.random.default_rng(STEADY_SEED + i))
            for position, config in enumerate(rotated(configs, i)):
                if stop.presses:
                    break
                if (config, factor) in args.skip:
                    continue
                before = scrape(urls[config])
                step, outcomes, scrapes, origin = load(config, offsets, rate, seconds, args.warmup)
                if step is None:
                    break
                measured = origin + args.warmup
                steady.append({
                    "factor": factor, "config": config, "position": position, **row(step),
                    "mean_ndcg": mean_quality(step.levels, ndcg),
                    "changes_measured": changes_between(scrapes, measured, measured + seconds),
                    "changes_step": changes_between(scrapes, origin, measured + seconds),
                    "shed_by_reason": shed_by_reason(scrapes),
                    "level_at_start": before.level if before else None,
                    "gauge": level_track(scrapes, measured), "scrapes": len(scrapes),
                    "timeline": timeline(outcomes, origin, args.slo_ms, args.warmup + seconds),
                    "drained_s": drain(config)})
                say(config, f"{factor:g}x {rate:g}", step)

        # 3. a burst on each configuration, the ramp on steer
        parts = [(args.burst_base, args.base_factor * knee), (args.burst, args.burst_factor * knee),
                 (args.burst_after, args.base_factor * knee)]
        total = sum(s for s, _ in parts)
        offsets = piecewise_offsets(parts, np.random.default_rng(200))
        for config in rotated(configs, len(args.factors)):
            if stop.presses:
                break
            settled = settle() if config == "steer" else None
            # the others' return to the base rate is cut short: what it shows (the backlog left) is over sooner
            seconds = total - args.burst_after + (args.burst_after if config == "steer"
                                                  else min(args.burst_after, args.others_after))
            mine = offsets[offsets < seconds]
            step, outcomes, scrapes, origin = load(config, mine, len(mine) / seconds, seconds, 0.0)
            if step is None:
                break
            rise, fall = origin + args.burst_base, origin + args.burst_base + args.burst
            windows = {"base": window(outcomes, origin, rise, parts[0][1], args.slo_ms),
                       "burst": window(outcomes, rise, fall, parts[1][1], args.slo_ms),
                       "after": window(outcomes, fall, origin + seconds, parts[2][1], args.slo_ms)}
            burst[config] = {"whole": row(step), "windows": {k: row(w) for k, w in windows.items()},
                             "settled": settled, "gauge": level_track(scrapes, origin), "scrapes": len(scrapes),
                             "changes": changes_between(scrapes, origin, origin + seconds),
                             "controller": controller_view(outcomes, scrapes, rise, fall),
                             "timeline": timeline(outcomes, origin, args.slo_ms, seconds),
                             "after_s": seconds - args.burst_base - args.burst,
                             "drained_s": drain(config)}
            for name, w in windows.items():
                say(config, f"burst {name}", w)
        if args.ramp > 0 and not stop.presses:
            settled = settle()
            offsets = ramp_offsets(args.ramp_from * knee, args.ramp_to * knee, args.ramp, np.random.default_rng(300))
            step, outcomes, scrapes, origin = load("steer", offsets, len(offsets) / args.ramp, args.ramp, 0.0)
            if step is not None:
                view = controller_view(outcomes, scrapes, origin, None)
                first = view["first_down_s"]
                ramp = {"config": "steer", "whole": row(step), "settled": settled,
                        "gauge": level_track(scrapes, origin), "scrapes": len(scrapes),
                        "changes": changes_between(scrapes, origin, origin + args.ramp), "controller": view,
                        "first_down_factor": None if first is None else round(
                            args.ramp_from + (args.ramp_to - args.ramp_from) * first / args.ramp, 3),
                        "timeline": timeline(outcomes, origin, args.slo_ms, args.ramp), "drained_s": drain("steer")}
                say("steer", "ramp", step)
    results = {
        "slo_ms": args.slo_ms, "max_error_rate": MAX_ERROR_RATE, "queries": len(texts),
        "queries_source": str(args.queries), "index": str(args.index), "cores": os.cpu_count(),
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "configs": CONFIGS, "level_names": list(QUALITY_LEVELS), "sample_s": args.sample,
        "ladder": {"corpus": corpus, "ndcg@10": ndcg, "cpu_ms": dict(ladder.cpu_ms),
                   "command": ladder.source.get("command")},
        "knee": {"qps": knee, "measured": args.knee is None, "duration_s": args.knee_duration,
                 "warmup_s": args.knee_warmup, "steps": [row(s) for s in knee_steps],
                 "top_met": bool(knee_steps) and knee == knee_steps[-1].offered_qps,
                 "confirmations": confirmations},
        "steady": {"factors": args.factors, "duration_s": args.duration, "warmup_s": args.warmup,
                   "long_factors": args.long_factors, "long_duration_s": args.long_duration,
                   "skipped": [[c, f] for c, f in sorted(args.skip)], "steps": steady},
        "burst": {"base_s": args.burst_base, "burst_s": args.burst, "after_s": args.burst_after,
                  "others_after_s": min(args.burst_after, args.others_after), "base_factor": args.base_factor,
                  "burst_factor": args.burst_factor, "configs": burst},
        "ramp": {"seconds": args.ramp, "from_factor": args.ramp_from, "to_factor": args.ramp_to, "run": ramp},
        "interrupted": bool(stop.presses),
    }
    if args.results_file is not None:
        print(f"wrote {record.write(results, args.results_file)}")
    print(preview("steering", results))
    return 0


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"took {time.monotonic() - started:.0f} s")
    sys.exit(code)
