"""Send the load: open loop (Poisson arrivals, latency from the intended send time) or closed loop.

Open loop is what users do: they arrive whether or not the service kept up. Measuring each request
from when it *should* have been sent, not from when the generator got round to it, keeps a stalled
server from hiding its own queueing (coordinated omission). The send-time error (actual minus intended)
is reported too, so a generator that falls behind is visible rather than silently flattering.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Coroutine, Sequence

import aiohttp
import numpy as np

from loadgen.arrivals import poisson_offsets
from loadgen.cpu import CpuWindow
from loadgen.http_target import NOT_JSON, HttpTarget, ragheat_body
from loadgen.stats import StepResult, percentiles_ms
from rag.api.admission import SHED_REASONS
from rag.slo import SLO_MS

CACHE_RESULTS = ("hit", "miss", "off")


@dataclass
class Outcome:
    intended: float  # perf_counter time the request was meant to be sent
    sent: float
    done: float
    ok: bool
    stages: list | None  # [{"name", "ms"}] from the response, when asked for
    shed: str | None = None  # a 503 from admission control: its reason (rag.api.admission.SHED_REASONS)
    server_ms: float | None = None  # a shed query: the service's own time to refuse it (its Server-Timing header)
    cache: str | None = None  # the response's "cache" field (hit, miss, off), when stages were asked for
    error: str | None = None  # why a request that is neither an answer nor shed failed (HttpTarget.failure)
    level: str | None = None  # the response's "quality_level" (the steering ladder's rung), when stages were asked for


@dataclass
class LoadStep(StepResult):
    """A step's StepResult, plus why its failed requests failed: ``error_reasons``, reason -> count."""

    error_reasons: dict = field(default_factory=dict)


async def _send(session: aiohttp.ClientSession, url: str, target: HttpTarget, headers, body: bytes,
                want_stages: bool, intended: float) -> Outcome:
    sent = _now()
    try:
        async with session.request(target.method, url, data=body, headers=headers) as response:
            payload = await response.read()
    except TimeoutError:  # before OSError, of which it is a subclass; aiohttp's timeouts are TimeoutErrors too
        return Outcome(intended, sent, _now(), False, None, error="timeout")
    except (aiohttp.ClientError, OSError) as exc:
        return Outcome(intended, sent, _now(), False, None, error=type(exc).__name__)
    done = _now()
    if response.status == 503 and (shed := _shed_reason(payload)) is not None:
        return Outcome(intended, sent, done, False, None, shed, _server_ms(response.headers.get("Server-Timing")))
    ok = 200 <= response.status < 300
    document = _parse(payload) if ok and (want_stages or target.expect_field) else NOT_JSON
    error = target.failure(response.status, document)
    if error is not None:
        return Outcome(intended, sent, done, False, None, error=error)
    if not want_stages or not isinstance(document, dict):
        return Outcome(intended, sent, done, True, None)
    cache, level = document.get("cache"), document.get("quality_level")
    return Outcome(intended, sent, done, True, _stage_timings(document.get("stages")),
                   cache=cache if cache in CACHE_RESULTS else None, level=level if isinstance(level, str) else None)


def _parse(payload: bytes):
    try:
        return json.loads(payload)
    except ValueError:
        return NOT_JSON


def _stage_timings(stages) -> list | None:
    """ragheat's ``stages`` list ([{"name", "ms"}]), or None when the response carries none in that shape (another
    service's responses need not)."""
    if not isinstance(stages, list):
        return None
    valid = [s for s in stages if isinstance(s, dict) and isinstance(s.get("name"), str)
             and isinstance(s.get("ms"), (int, float)) and not isinstance(s.get("ms"), bool)]
    return valid or None


def _shed_reason(payload: bytes) -> str | None:
    """The shed reason of a 503 (its body's ``error``), or None for any other 503 (not ready: an error)."""
    try:
        kind = json.loads(payload).get("error")
    except (ValueError, AttributeError):
        return None
    return kind if kind in SHED_REASONS else None


def _server_ms(header: str | None) -> float | None:
    """``dur`` of a ``Server-Timing: queue;dur=MS`` header, or None."""
    for part in (header or "").split(";"):
        name, _, value = part.strip().partition("=")
        if name == "dur":
            try:
                return float(value)
            except ValueError:
                return None
    return None


class StopSignals:
    """Ctrl-C (SIGINT) and SIGTERM for the length of a sweep: each press stops the sweep rather than raising
    KeyboardInterrupt wherever it lands (in a step's set-up, a progress update, an event loop's teardown).

    First press: stop sending; the step in progress lets its requests in flight finish and returns what it
    measured, marked interrupted. Second press: drop the requests still in flight too. Third: KeyboardInterrupt,
    for a sweep stuck outside any step. A signal the process started with ignored stays ignored (a shell starts
    background jobs with SIGINT ignored so that Ctrl-C meant for the foreground does not reach them); SIGTERM
    stops those. Outside the main thread, where Python cannot take signals, it does nothing. Re-entrant: the
    handlers go back to what they were when the outermost ``with`` ends.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.presses = 0
        self._depth = 0
        self._previous: dict[int, object] = {}
        self._step: tuple[asyncio.AbstractEventLoop, asyncio.Task] | None = None  # the step a press cancels

    def __enter__(self) -> "StopSignals":
        self._depth += 1
        if self._depth == 1 and threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                if signal.getsignal(signum) not in (signal.SIG_IGN, None):  # None: a handler not set from Python
                    self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth == 0:
            for signum, previous in self._previous.items():
                signal.signal(signum, previous)
            self._previous.clear()

    def _on_signal(self, signum, frame) -> None:
        # Runs in the main thread between two bytecodes, possibly inside the event loop's own code: it only
        # counts and schedules; the cancellation itself runs as a loop callback.
        self.presses += 1
        if self.presses >= 3:
            raise KeyboardInterrupt
        if self._step is not None:
            loop, task = self._step
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop closed in between: the step is over anyway
                pass

    async def step(self, coro: Coroutine):
        """Await one step's coroutine as what the next press cancels; None, without starting it, if a press
        came before it could begin."""
        self._step = (asyncio.get_running_loop(), asyncio.current_task())
        try:
            if self.presses:  # checked after registering, so that no press falls between the two
                coro.close()
                return None
            return await coro
        finally:
            self._step = None


def run(coro, stop: StopSignals | None = None):
    """Run a load coroutine on uvloop when it is installed (it comes with uvicorn[standard]): its timers and
    sockets cost less per request than asyncio's, which is what keeps send times close to the schedule.

    With ``stop`` (whose handlers asyncio.Runner then leaves alone), a press cancels the coroutine, which returns
    what it measured; None if a press came before it began."""
    if stop is not None:
        coro = stop.step(coro)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


TIMER_SLACK_S = 0.0015  # event-loop timers fire on millisecond ticks (libuv), so the last stretch is polled
# All timestamps come from perf_counter: uvloop's loop.time() is libuv's cached millisecond clock, too coarse
# to time requests that take a few milliseconds.
_now = time.perf_counter


async def _sleep_until(when: float) -> None:
    """Sleep on the timer until just before ``when``, then yield to the loop (serving responses meanwhile)
    until it arrives: a plain sleep would fire up to a millisecond late on libuv's millisecond timers."""
    delay = when - _now()
    if delay > TIMER_SLACK_S:
        await asyncio.sleep(delay - TIMER_SLACK_S)
    while _now() < when:
        await asyncio.sleep(0)


def _target(target: HttpTarget | None, top_k: int) -> HttpTarget:
    return target if target is not None else HttpTarget(body=ragheat_body(top_k))


async def _drain(tasks: list[asyncio.Task], cut: bool) -> bool:
    """Wait for the requests in flight; True if the step was cut (``cut``: it already was). A press while
    waiting cuts a step that was not, and drops the requests of one that was (they then count nowhere)."""
    while tasks:
        try:
            await asyncio.wait(tasks)  # not gather: a cancellation here must not cancel the requests by itself
            break
        except asyncio.CancelledError:
            asyncio.current_task().uncancel()
            if cut:
                for task in tasks:
                    task.cancel()
                await asyncio.wait(tasks)
                break
            cut = True
    return cut


async def _close(session: aiohttp.ClientSession) -> None:
    """Close the session; a press landing here, once the step has measured all it will, must not cost its results."""
    try:
        await session.close()
    except asyncio.CancelledError:
        asyncio.current_task().uncancel()


async def open_loop(url: str, queries: Sequence[str], rate: float, duration_s: float, warmup_s: float, *,
                    seed: int = 0, timeout_s: float = 10.0, top_k: int = 5, want_stages: bool = True,
                    progress: Callable[[float], None] | None = None, slo_ms: float = SLO_MS,
                    zipf_s: float | None = None, cpu: CpuWindow | None = None,
                    target: HttpTarget | None = None, offsets: Sequence[float] | None = None,
                    outcomes: list | None = None) -> LoadStep:
    """Poisson arrivals at ``rate`` for ``warmup_s + duration_s``; only the last ``duration_s`` counts. Queries are
    sent in order, cycling, or with ``zipf_s`` drawn from a Zipf law over them (``zipf_picks``, seeded by ``seed``).
    ``cpu``: started as the measured part begins and stopped once its requests are back (``loadgen.cpu``).
    ``url`` is the whole address; ``target`` says how to send to it and what an answer is (default: ragheat's
    body with ``top_k``).

    ``offsets``: intended send times of a schedule of the caller's own (seconds from the start, ascending, within
    ``warmup_s + duration_s``; a rate that changes over the step) in place of the Poisson draw; ``rate`` is then only
    what the step reports as offered. ``outcomes``: a list every request's ``Outcome`` is appended to, warm-up
    included, in schedule order (the ``i``-th is ``offsets[i]``'s), for a caller that cuts windows of its own
    (``window``).

    Cancelled (Ctrl-C, see StopSignals), it stops sending, waits for the requests in flight and returns what was
    measured, marked interrupted; cancelled again while it waits, it drops those requests (they count nowhere).
    """
    rng = np.random.default_rng(seed)
    offsets = poisson_offsets(rate, warmup_s + duration_s, rng) if offsets is None else np.asarray(offsets, float)
    target = _target(target, top_k)
    bodies, headers = [target.body_for(q) for q in queries], target.request_headers()
    picks = zipf_picks(len(bodies), zipf_s, len(offsets), seed) if zipf_s else range(len(offsets))
    loop = asyncio.get_running_loop()
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
                                    timeout=aiohttp.ClientTimeout(total=timeout_s))
    tasks: list[asyncio.Task] = []
    interrupted = False
    start = _now() + 0.05
    try:
        try:
            for i, offset in enumerate(offsets):
                intended = start + offset
                await _sleep_until(intended)
                if cpu is not None and not cpu.started and offset >= warmup_s:
                    cpu.start()
                tasks.append(loop.create_task(
                    _send(session, url, target, headers, bodies[picks[i] % len(bodies)], want_stages, intended)))
                if progress is not None and i % 64 == 0:
                    progress(min(1.0, offset / (warmup_s + duration_s)))
        except asyncio.CancelledError:
            asyncio.current_task().uncancel()
            interrupted = True
        interrupted = await _drain(tasks, interrupted)
        if cpu is not None and cpu.started:
            cpu.stop()
    finally:
        await _close(session)
    done = [task.result() for task in tasks if not task.cancelled()]
    if outcomes is not None:
        outcomes.extend(done)
    measured = [o for o in done if o.intended >= start + warmup_s]
    if interrupted:  # the step ran short: rates are over the time actually measured
        duration_s = max(0.0, (max((o.intended for o in done), default=start) - start) - warmup_s) or duration_s
    return _summarise("open", measured, duration_s, rate, None, interrupted, slo_ms, cpu,
                      _unix(start + warmup_s, duration_s))


def window(outcomes: Sequence[Outcome], start: float, end: float, rate: float | None = None,
           slo_ms: float = SLO_MS) -> LoadStep:
    """The open-loop summary of the ``outcomes`` whose intended send time (``perf_counter`` seconds, as
    ``Outcome.intended``) falls in ``[start, end)``: a part of a step (a burst within a schedule) measured alone."""
    inside = [o for o in outcomes if start <= o.intended < end]
    return _summarise("open", inside, end - start, rate, None, False, slo_ms)


async def closed_loop(url: str, queries: Sequence[str], concurrency: int, duration_s: float, warmup_s: float, *,
                      timeout_s: float = 10.0, top_k: int = 5, want_stages: bool = True,
                      progress: Callable[[float], None] | None = None, slo_ms: float = SLO_MS,
                      zipf_s: float | None = None, seed: int = 0, cpu: CpuWindow | None = None,
                      target: HttpTarget | None = None) -> LoadStep:
    """``concurrency`` clients, each sending its next request when the previous one returns (queries in order, or
    drawn from a Zipf law with ``zipf_s``, as in ``open_loop``; ``cpu`` and ``target`` as there).

    Cancelled, the clients finish the request they are waiting for and stop (cancelled again, they drop it);
    the step returns what was measured, marked interrupted."""
    target = _target(target, top_k)
    bodies, headers = [target.body_for(q) for q in queries], target.request_headers()
    picks = zipf_picks(len(bodies), zipf_s, 1 << 16, seed) if zipf_s else range(len(bodies))
    outcomes: list[Outcome] = []
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                    timeout=aiohttp.ClientTimeout(total=timeout_s))
    start = _now()
    stop = start + warmup_s + duration_s
    interrupted = False

    async def client(i: int) -> None:
        j = i
        while _now() < stop:
            now = _now()
            if cpu is not None and not cpu.started and now >= start + warmup_s:
                cpu.start()
            outcome = await _send(session, url, target, headers, bodies[picks[j % len(picks)]], want_stages, now)
            if now >= start + warmup_s:
                outcomes.append(outcome)
            j += concurrency

    async def ticker() -> None:
        while _now() < stop:
            if progress is not None:
                progress(min(1.0, (_now() - start) / (stop - start)))
            await asyncio.sleep(0.2)

    tasks = [asyncio.create_task(client(i)) for i in range(concurrency)] + [asyncio.create_task(ticker())]
    try:
        try:
            await asyncio.wait(tasks)
        except asyncio.CancelledError:
            asyncio.current_task().uncancel()
            interrupted, stop = True, _now()  # the clients see it after their current request
            tasks[-1].cancel()  # the ticker
            await _drain(tasks, cut=True)
        if cpu is not None and cpu.started:
            cpu.stop()
    finally:
        await _close(session)
    for task in tasks:
        if not task.cancelled():
            task.result()  # a client's own error surfaces here, as gather would have raised it
    if interrupted:
        duration_s = max(0.0, stop - start - warmup_s) or duration_s
    return _summarise("closed", outcomes, duration_s, None, concurrency, interrupted, slo_ms, cpu,
                      _unix(start + warmup_s, duration_s))


def _unix(measured_from: float, duration_s: float) -> list[float]:
    """[start, end] in unix seconds of a measured part that starts at perf_counter time ``measured_from``."""
    start = time.time() - (_now() - measured_from)
    return [round(start, 3), round(start + duration_s, 3)]


def _summarise(mode: str, outcomes: list[Outcome], duration_s: float, rate: float | None,
               concurrency: int | None, interrupted: bool, slo_ms: float = SLO_MS,
               cpu: CpuWindow | None = None, measured_unix: list[float] | None = None) -> LoadStep:
    ok = sorted((o for o in outcomes if o.ok), key=lambda o: o.intended)
    shed = [o for o in outcomes if o.shed is not None]
    at_once = [o for o in shed if o.shed != "expired"]  # expired ones waited in the queue until their deadline
    stage_seconds: dict[str, list[float]] = {}
    per_request: list[dict] = []
    for o in ok:
        stages = {stage["name"]: stage["ms"] for stage in o.stages or ()}
        per_request.append(stages)
        for name, ms in stages.items():
            stage_seconds.setdefault(name, []).append(ms / 1000.0)
    origin = ok[0].intended if ok else 0.0
    samples = {"t_s": [round(o.intended - origin, 4) for o in ok],
               "latency_ms": [round((o.done - o.intended) * 1000, 3) for o in ok],
               "stages_ms": {name: [r.get(name) for r in per_request] for name in stage_seconds},
               "cache": [o.cache for o in ok]}
    failed = [o.error or "unknown" for o in outcomes if not o.ok and o.shed is None]
    return LoadStep(
        mode=mode, offered_qps=rate, concurrency=concurrency, duration_s=duration_s,
        requests=len(outcomes), errors=len(failed),
        error_reasons=dict(Counter(failed).most_common()),
        achieved_qps=len(ok) / duration_s if duration_s else 0.0,
        # Shed queries (503 + a shed reason) are neither errors nor latency samples: counted, and their own latency.
        shed=len(shed), shed_reasons={r: n for r in SHED_REASONS if (n := sum(o.shed == r for o in shed))},
        refusal_ms=percentiles_ms([o.done - o.sent for o in at_once]),
        refusal_server_ms=percentiles_ms([o.server_ms / 1000 for o in at_once if o.server_ms is not None]),
        expired_ms=percentiles_ms([o.done - o.sent for o in shed if o.shed == "expired"]),
        goodput_qps=(sum((o.done - o.intended) * 1000 <= slo_ms for o in ok) / duration_s) if duration_s else 0.0,
        cache={result: n for result in CACHE_RESULTS if (n := sum(o.cache == result for o in ok))},
        levels=dict(sorted(Counter(o.level for o in ok if o.level is not None).items())),
        # Latency from the intended send time; errors count in the error rate, not in the latency.
        latency_ms=percentiles_ms([o.done - o.intended for o in ok]),
        send_error_ms=percentiles_ms([o.sent - o.intended for o in outcomes]) if mode == "open" else {},
        stages_ms={name: percentiles_ms(values) for name, values in stage_seconds.items()},
        interrupted=interrupted,
        samples=samples,
        cpu_ms_per_answer=cpu.per_answer(len(ok)) if cpu is not None else {},
        measured_unix=measured_unix or [],
    )


def load_queries(path) -> list[str]:
    """Plain lines, or a BEIR ``queries.jsonl`` ({"_id", "text"} per line)."""
    from pathlib import Path

    lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if lines and lines[0].lstrip().startswith("{"):
        try:
            return [json.loads(line)["text"] for line in lines]
        except (ValueError, KeyError) as exc:
            raise ValueError(f"{path}: looks like JSON lines but a line has no 'text' ({exc})") from None
    return lines


DEFAULT_QUERIES = [
    "What causes the seasons on Earth?", "Who painted the Mona Lisa?", "How does photosynthesis work?",
    "When did the Roman Empire fall?", "What is the speed of light?", "How do vaccines train the immune system?",
    "Why is the sky blue?", "What is quantum entanglement?",
]


def zipf_picks(n: int, s: float, count: int, seed: int) -> np.ndarray:
    """``count`` indices into ``n`` queries drawn from a Zipf law of exponent ``s`` (index ``i`` has probability
    proportional to ``(i + 1) ** -s``: the first queries are the popular ones; ``shuffled`` first so that popularity
    does not follow the file's order), seeded. A finite support, unlike ``numpy``'s ``zipf`` (which needs s > 1)."""
    if n < 1 or s <= 0:
        raise ValueError(f"a Zipf draw needs queries and an exponent above 0, got {n} queries and s={s}")
    weights = np.arange(1, n + 1, dtype=np.float64) ** -float(s)
    return np.random.default_rng(seed).choice(n, size=count, p=weights / weights.sum())


def shuffled(queries: Sequence[str], seed: int) -> list[str]:
    out = list(queries)
    random.Random(seed).shuffle(out)
    return out

