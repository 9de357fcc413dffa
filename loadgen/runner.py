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
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import aiohttp
import numpy as np

from loadgen.arrivals import poisson_offsets
from loadgen.stats import StepResult, percentiles_ms


@dataclass
class Outcome:
    intended: float  # perf_counter time the request was meant to be sent
    sent: float
    done: float
    ok: bool
    stages: list | None  # [{"name", "ms"}] from the response, when asked for


async def _post(session: aiohttp.ClientSession, url: str, body: bytes, want_stages: bool,
                intended: float) -> Outcome:
    sent = _now()
    try:
        async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
            payload = await response.read()
            ok = 200 <= response.status < 300
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return Outcome(intended, sent, _now(), False, None)
    done = _now()
    stages = None
    if ok and want_stages:
        try:
            stages = json.loads(payload).get("stages")
        except (ValueError, AttributeError):
            stages = None
    return Outcome(intended, sent, done, ok, stages)


def run(coro):
    """Run a load coroutine on uvloop when it is installed (it comes with uvicorn[standard]): its timers and
    sockets cost less per request than asyncio's, which is what keeps send times close to the schedule."""
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


def _bodies(queries: Sequence[str], top_k: int) -> list[bytes]:
    return [json.dumps({"query": q, "top_k": top_k}).encode() for q in queries]


async def open_loop(url: str, queries: Sequence[str], rate: float, duration_s: float, warmup_s: float, *,
                    seed: int = 0, timeout_s: float = 10.0, top_k: int = 5, want_stages: bool = True,
                    progress: Callable[[float], None] | None = None, holder: dict | None = None) -> StepResult:
    """Poisson arrivals at ``rate`` for ``warmup_s + duration_s``; only the last ``duration_s`` counts.

    On Ctrl-C (the task is cancelled) it stops sending, waits for the requests in flight and returns what
    was measured, marked interrupted; ``holder["result"]`` keeps it for a caller that sees KeyboardInterrupt.
    """
    rng = np.random.default_rng(seed)
    offsets = poisson_offsets(rate, warmup_s + duration_s, rng)
    bodies = _bodies(queries, top_k)
    loop = asyncio.get_running_loop()
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    tasks: list[asyncio.Task] = []
    interrupted = False
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = _now() + 0.05
        try:
            for i, offset in enumerate(offsets):
                intended = start + offset
                await _sleep_until(intended)
                tasks.append(loop.create_task(
                    _post(session, url, bodies[i % len(bodies)], want_stages, intended)))
                if progress is not None and i % 64 == 0:
                    progress(min(1.0, offset / (warmup_s + duration_s)))
        except asyncio.CancelledError:
            interrupted = True
        outcomes = await asyncio.gather(*tasks)
    measured = [o for o in outcomes if o.intended >= start + warmup_s]
    if interrupted:  # the step ran short: rates are over the time actually measured
        duration_s = max(0.0, (max((o.intended for o in outcomes), default=start) - start) - warmup_s) or duration_s
    result = _summarise("open", measured, duration_s, rate, None, interrupted)
    if holder is not None:
        holder["result"] = result
    return result


async def closed_loop(url: str, queries: Sequence[str], concurrency: int, duration_s: float, warmup_s: float, *,
                      timeout_s: float = 10.0, top_k: int = 5, want_stages: bool = True,
                      progress: Callable[[float], None] | None = None) -> StepResult:
    """``concurrency`` clients, each sending its next request when the previous one returns."""
    bodies = _bodies(queries, top_k)
    connector = aiohttp.TCPConnector(limit=0)
    outcomes: list[Outcome] = []
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        start = _now()
        stop = start + warmup_s + duration_s

        async def client(i: int) -> None:
            j = i
            while _now() < stop:
                now = _now()
                outcome = await _post(session, url, bodies[j % len(bodies)], want_stages, now)
                if now >= start + warmup_s:
                    outcomes.append(outcome)
                j += concurrency

        async def ticker() -> None:
            while _now() < stop:
                if progress is not None:
                    progress(min(1.0, (_now() - start) / (stop - start)))
                await asyncio.sleep(0.2)

        await asyncio.gather(*(client(i) for i in range(concurrency)), ticker())
    return _summarise("closed", outcomes, duration_s, None, concurrency, False)


def _summarise(mode: str, outcomes: list[Outcome], duration_s: float, rate: float | None,
               concurrency: int | None, interrupted: bool) -> StepResult:
    ok = sorted((o for o in outcomes if o.ok), key=lambda o: o.intended)
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
               "stages_ms": {name: [r.get(name) for r in per_request] for name in stage_seconds}}
    return StepResult(
        mode=mode, offered_qps=rate, concurrency=concurrency, duration_s=duration_s,
        requests=len(outcomes), errors=len(outcomes) - len(ok),
        achieved_qps=len(ok) / duration_s if duration_s else 0.0,
        # Latency from the intended send time; errors count in the error rate, not in the latency.
        latency_ms=percentiles_ms([o.done - o.intended for o in ok]),
        send_error_ms=percentiles_ms([o.sent - o.intended for o in outcomes]) if mode == "open" else {},
        stages_ms={name: percentiles_ms(values) for name, values in stage_seconds.items()},
        interrupted=interrupted,
        samples=samples,
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


def shuffled(queries: Sequence[str], seed: int) -> list[str]:
    out = list(queries)
    random.Random(seed).shuffle(out)
    return out

