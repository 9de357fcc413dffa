"""Micro-batched query embedding: which batching window, if any, serves the most at the SLO?

One ``ragheat serve`` per configuration, all over the same index and running for the whole benchmark, measured side
by side with the project's open-loop generator (Poisson arrivals, latency from the intended send time,
loadgen/runner.py): ``off`` (``embedding.query_batch_max=1``: every request runs its own
query) and ``r<n>w<ms>`` (up to <n> model runs in flight, ``embedding.query_batch_runs``; queries arriving while all
are busy queue and share the next run, up to ``--max-batch``; a runner promoted under load waits up to <ms> for the
batch to fill; ``w0``: only what queued behind the previous run). Every rate is offered to each configuration in turn,
the order rotating from rate to rate, so the machine's drift lands on all alike; a configuration past ``--stop-factor``
SLOs is not offered more. Then the quiet case: one closed-loop client per configuration (``--c1-rounds`` rounds,
rotated), whose P99 batching must not make worse.

Reported per configuration and rate: P50/P99, the median ``embed`` and ``queue`` stage (from the responses' stage
timings: the batch wait is in ``queue``), and the knee; docs/benchmarks.md, "Micro-batched query embedding", shows
them.

    .venv/bin/python benchmarks/bench_batching.py --index data/index/scifact \\
        --queries datasets/scifact/queries.jsonl --results-file benchmarks/results/batching.json
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import MAX_ERROR_RATE, check_index, rotated, scifact_queries, sweep_parser  # noqa: E402
from benchmarks.docgen.page import preview  # noqa: E402
from loadgen.arrivals import parse_rates  # noqa: E402
from loadgen.resultsfile import BenchmarkRun  # noqa: E402
from loadgen.runner import StopSignals, closed_loop, open_loop, run  # noqa: E402
from loadgen.stats import find_knee  # noqa: E402
from stack.servers import ServeFleet  # noqa: E402

SATURATED_ERRORS = 0.10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = sweep_parser(__doc__.split("\n\n")[0], rates="50,100,150,200,250,300", duration=5.0, stop_factor=5.0,
                     ready_timeout=300.0, work="server logs")
    p.add_argument("--queries", type=Path, default=None, help="plain lines or a BEIR queries.jsonl "
                                                              "(default datasets/scifact/queries.jsonl if present)")
    p.add_argument("--windows", default="off,0,2", help="configurations: off, and max waits in ms")
    p.add_argument("--max-batch", type=int, default=8, help="embedding.query_batch_max of the batched configurations")
    p.add_argument("--runs", default="1,2", help="embedding.query_batch_runs values (model runs in flight) to combine "
                                                 "with each window")
    p.add_argument("--c1-duration", type=float, default=8.0, help="measured seconds of each concurrency-1 round")
    p.add_argument("--c1-rounds", type=int, default=2, help="concurrency-1 rounds per configuration")
    args = p.parse_args(argv)
    args.configs = []
    for item in (w.strip() for w in args.windows.split(",") if w.strip()):
        if item == "off":
            args.configs.append(("off", 1, 0.0, 1))
            continue
        try:
            wait = float(item)
        except ValueError:
            p.error(f"--windows takes off and numbers of milliseconds, not {item!r}")
        if not 0 <= wait <= 50:
            p.error(f"--windows: {item} ms is outside 0..50 (embedding.query_batch_wait_ms)")
        for runs in (int(r) for r in args.runs.split(",") if r.strip()):
            args.configs.append((f"r{runs}w{wait:g}", args.max_batch, wait, runs))
    if not args.configs:
        p.error("--windows names no configuration")
    check_index(p, args.index)
    return args


def _stage_p50(step, name: str) -> float | None:
    value = (step.stages_ms.get(name) or {}).get("p50")
    return None if value is None else round(value, 3)


def summary_row(step) -> dict:
    return {"offered_qps": step.offered_qps, "concurrency": step.concurrency,
            "achieved_qps": round(step.achieved_qps, 2), "requests": step.requests, "errors": step.errors,
            "shed": step.shed, "error_rate": round(step.error_rate, 5), "interrupted": step.interrupted,
            "latency_ms": step.latency_ms, "embed_p50_ms": _stage_p50(step, "embed"),
            "queue_p50_ms": _stage_p50(step, "queue")}


def _print(name: str, label: str, step) -> None:
    lat = step.latency_ms
    print(f"{name:6s} {label:>10s}  achieved {step.achieved_qps:7.1f}  P50 {lat.get('p50') or float('nan'):8.1f} ms  "
          f"P99 {lat.get('p99') or float('nan'):8.1f} ms  embed {_stage_p50(step, 'embed')} ms  queue "
          f"{_stage_p50(step, 'queue')} ms  errors {step.errors}  shed {step.shed}", flush=True)


def main(argv: list[str] | None = None) -> int:
    record = BenchmarkRun("batching")
    args = parse_args(argv)
    queries_file, texts = scifact_queries(args.queries)
    rates = parse_rates(args.rates)
    names = [c[0] for c in args.configs]
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-batching-"))
    work.mkdir(parents=True, exist_ok=True)
    steps: dict[str, list] = {n: [] for n in names}
    c1: dict[str, list] = {n: [] for n in names}
    stopped: dict[str, str] = {}
    fleet = {name: ((), {"RAGHEAT_EMBEDDING__QUERY_BATCH_MAX": str(batch),
                         "RAGHEAT_EMBEDDING__QUERY_BATCH_WAIT_MS": str(wait),
                         "RAGHEAT_EMBEDDING__QUERY_BATCH_RUNS": str(runs)})
             for name, batch, wait, runs in args.configs}
    with ServeFleet(args.index, fleet, work, args.ready_timeout) as servers, StopSignals() as stop:
        for r in range(args.c1_rounds):  # the quiet case first, on a machine the sweep has not yet heated
            for name in rotated(names, r):
                step = run(closed_loop(servers.urls[name] + "/v1/query", texts, 1, args.c1_duration, 1.0,
                                       timeout_s=args.timeout), stop)
                if step is None or stop.presses:
                    break
                c1[name].append(step)
                _print(name, "c=1", step)
        for i, rate in enumerate(rates):
            for name in rotated(names, i):
                if name in stopped or stop.presses:
                    continue
                step = run(open_loop(servers.urls[name] + "/v1/query", texts, rate, args.duration, args.warmup,
                                     seed=i, timeout_s=args.timeout), stop)
                if step is None:
                    break
                steps[name].append(step)
                _print(name, f"{rate:g}/s", step)
                p99 = step.latency_ms.get("p99")
                if p99 is None or p99 > args.stop_factor * args.slo_ms or step.error_rate > SATURATED_ERRORS:
                    stopped[name] = f"saturated at {rate:g} req/s (P99 {p99} ms, error rate {step.error_rate:.3f})"
    results = {
        "slo_ms": args.slo_ms, "max_error_rate": MAX_ERROR_RATE, "duration_s": args.duration, "warmup_s": args.warmup,
        "rates": rates, "max_batch": args.max_batch, "queries_file": str(queries_file) if queries_file else None,
        "queries": len(texts), "index": str(args.index), "cores": os.cpu_count(),
        "configs": {name: {"query_batch_max": batch, "query_batch_wait_ms": wait, "query_batch_runs": runs,
                           "knee_qps": find_knee(steps[name], args.slo_ms, MAX_ERROR_RATE),
                           "stopped": stopped.get(name), "steps": [summary_row(s) for s in steps[name]],
                           "concurrency1": [summary_row(s) for s in c1[name]]}
                    for name, batch, wait, runs in args.configs},
        "interrupted": bool(stop.presses),
    }
    if args.results_file is not None:
        print(f"wrote {record.write(results, args.results_file)}")
    print(preview("batching", results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
