"""Replicas behind nginx on loopback: is a second API process worth a balancer's hop?

Ways to serve the same index, measured side by side in one run with the project's open-loop load generator
(Poisson arrivals, latency from the intended send time, loadgen/runner.py):

- ``direct-1``: one ``ragheat serve``, no proxy (what ``ragheat bench`` measures);
- ``direct-1-no-rerank``: the same with reranking off (``RAGHEAT_RERANK__ENABLED=false``): what the default-on
  rerank stage costs in capacity;
- ``workers-2``: one ``ragheat serve --workers 2``: two worker processes on one port (SO_REUSEPORT, the kernel
  spreading connections), no proxy;
- ``nginx-1``: the same replica behind nginx: the proxy's own cost (an extra loopback hop, nginx's CPU);
- ``nginx-2``: two replicas behind nginx (stack/nginx.py's config: least_conn, keepalive), as
  ``ragheat stack up --replicas 2`` runs them.

Every server and both nginx instances run for the whole benchmark, and every rate is measured for each
configuration in turn (the order rotating from rate to rate), so slow drift of the machine lands on all alike; with
``--rounds N`` the whole ascending sweep is repeated N times and each configuration's knee is reported per round.
A configuration whose P99 passes ``--stop-factor`` times the SLO (or whose errors pass 10 %) is not offered higher
rates: past its knee it only queues. Report: P50/P99 per rate and the knee (the highest rate meeting the SLO with
every lower rate meeting it) per configuration, in docs/benchmarks.md, "Replicas behind nginx".

On a machine with two cores shared with the load generator, two processes compete with each other, nginx and the
generator for the same cores: they may not beat one. The figures say what was measured, not what was hoped.

    .venv/bin/python benchmarks/bench_replicas.py --index data/index/scifact \\
        --queries datasets/scifact/queries.jsonl --results-file benchmarks/results/replicas.json
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import MAX_ERROR_RATE, check_index, rotated, scifact_queries, sweep_parser  # noqa: E402
from benchmarks.docgen.page import preview  # noqa: E402
from loadgen.arrivals import parse_rates  # noqa: E402
from loadgen.resultsfile import BenchmarkRun  # noqa: E402
from loadgen.runner import StopSignals, open_loop, run  # noqa: E402
from loadgen.stats import find_knee  # noqa: E402
from rag.childproc import ChildProcess, free_port  # noqa: E402
from stack import nginx  # noqa: E402
from stack.servers import ServeFleet  # noqa: E402

CONFIGS = ("direct-1", "direct-1-no-rerank", "workers-2", "nginx-1", "nginx-2")
SATURATED_ERRORS = 0.10  # past this error share a configuration is not offered higher rates


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = sweep_parser(__doc__.split("\n\n")[0], rates="50,100,150,200,250,300", duration=5.0, stop_factor=5.0,
                     ready_timeout=240.0, work="logs and nginx config")
    p.add_argument("--queries", type=Path, default=None, help="plain lines or a BEIR queries.jsonl "
                                                              "(default datasets/scifact/queries.jsonl if present)")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"which of {', '.join(CONFIGS)}")
    p.add_argument("--rounds", type=int, default=1, help="repeat the whole sweep this many times (a knee per round)")
    args = p.parse_args(argv)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = sorted(set(args.configs) - set(CONFIGS))
    if unknown or not args.configs:
        p.error(f"--configs takes {', '.join(CONFIGS)}; unknown: {', '.join(unknown) or '(none given)'}")
    check_index(p, args.index)
    return args


class Services:
    """The ``ragheat serve`` processes the configurations need (loading side by side) and one nginx per balanced
    configuration; ``urls[config]``."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.stack = contextlib.ExitStack()
        self.urls: dict[str, str] = {}

    def __enter__(self) -> "Services":
        try:
            self._start()
        except BaseException:
            self.stack.close()
            raise
        return self

    def _start(self) -> None:
        serves: dict[str, tuple[tuple[str, ...], dict]] = {"api-1": ((), {})}
        if "nginx-2" in self.args.configs:
            serves["api-2"] = ((), {})
        if "workers-2" in self.args.configs:
            serves["workers-2"] = (("--workers", "2"), {})
        if "direct-1-no-rerank" in self.args.configs:
            serves["no-rerank"] = ((), {"RAGHEAT_RERANK__ENABLED": "false"})
        fleet = self.stack.enter_context(ServeFleet(self.args.index, serves, self.work, self.args.ready_timeout))
        self.urls["direct-1"] = fleet.urls["api-1"]
        if "workers-2" in fleet.urls:
            self.urls["workers-2"] = fleet.urls["workers-2"]
        if "no-rerank" in fleet.urls:
            self.urls["direct-1-no-rerank"] = fleet.urls["no-rerank"]
        replicas = [fleet.urls[name].removeprefix("http://") for name in ("api-1", "api-2") if name in fleet.urls]
        binary = nginx.nginx_binary() if any(c.startswith("nginx") for c in self.args.configs) else None
        for name, upstreams in (("nginx-1", replicas[:1]), ("nginx-2", replicas[:2])):
            if name not in self.args.configs:
                continue
            listen = f"127.0.0.1:{free_port()}"
            config = nginx.write_local_config(self.work / name, listen, upstreams)
            child = self.stack.enter_context(ChildProcess(name, nginx.argv(config, binary),
                                                          log_path=self.work / f"{name}.log", die_with_parent=True))
            child.wait_until_ok(f"http://{listen}/readyz", 30)  # through nginx to a replica
            self.urls[name] = f"http://{listen}"

    def __exit__(self, *exc) -> None:
        self.stack.close()


def summary_row(step) -> dict:
    return {"offered_qps": step.offered_qps, "achieved_qps": round(step.achieved_qps, 2), "requests": step.requests,
            "errors": step.errors, "error_rate": round(step.error_rate, 5), "shed": step.shed,
            "shed_rate": round(step.shed_rate, 5), "goodput_qps": round(step.goodput_qps, 2),
            "interrupted": step.interrupted, "latency_ms": step.latency_ms, "send_error_ms": step.send_error_ms}


def main(argv: list[str] | None = None) -> int:
    record = BenchmarkRun("replicas")
    args = parse_args(argv)
    queries_file, texts = scifact_queries(args.queries)
    rates = parse_rates(args.rates)
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-replicas-"))
    work.mkdir(parents=True, exist_ok=True)
    rounds: list[dict[str, list]] = []
    stopped: list[dict[str, str]] = []
    load_before = os.getloadavg()
    with Services(args, work) as services, StopSignals() as stop:
        for r in range(args.rounds):
            rounds.append({c: [] for c in args.configs})
            stopped.append({})
            for i, rate in enumerate(rates):
                for config in rotated(args.configs, i + r):
                    if config in stopped[r] or stop.presses:
                        continue
                    step = run(open_loop(services.urls[config] + "/v1/query", texts, rate, args.duration,
                                         args.warmup, seed=1000 * r + i, timeout_s=args.timeout), stop)
                    if step is None:
                        break
                    rounds[r][config].append(step)
                    p99 = step.latency_ms.get("p99")
                    print(f"round {r + 1} {config:9s} {rate:7g} req/s  achieved {step.achieved_qps:7.1f}  P50 "
                          f"{step.latency_ms.get('p50') or float('nan'):8.1f} ms  P99 {p99 or float('nan'):8.1f} ms  "
                          f"errors {step.errors}  shed {step.shed}", flush=True)
                    if (p99 is None or p99 > args.stop_factor * args.slo_ms or step.error_rate > SATURATED_ERRORS
                            or step.shed_rate > SATURATED_ERRORS):
                        stopped[r][config] = (f"saturated at {rate:g} req/s (P99 {p99} ms, error rate "
                                              f"{step.error_rate:.3f}, shed {step.shed_rate:.3f})")
    results = {
        "slo_ms": args.slo_ms, "max_error_rate": MAX_ERROR_RATE, "duration_s": args.duration, "warmup_s": args.warmup,
        "rates": rates, "queries_file": str(queries_file) if queries_file else None, "queries": len(texts),
        "index": str(args.index), "cores": os.cpu_count(), "rounds": len(rounds),
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "configs": {c: {"knee_qps": _median([find_knee(rnd[c], args.slo_ms, MAX_ERROR_RATE) for rnd in rounds]),
                        "knees_qps": [find_knee(rnd[c], args.slo_ms, MAX_ERROR_RATE) for rnd in rounds],
                        "stopped": "; ".join(f"round {r + 1}: {s[c]}" for r, s in enumerate(stopped) if c in s)
                                   or None,
                        "steps": [summary_row(s) for s in rounds[0][c]] if rounds else [],
                        "rounds": [[summary_row(s) for s in rnd[c]] for rnd in rounds]}
                    for c in args.configs},
        "interrupted": bool(stop.presses),
    }
    if args.results_file is not None:
        print(f"wrote {record.write(results, args.results_file)}")
    print(preview("replicas", results))
    return 0


def _median(knees: list) -> float | None:
    """The median knee of the rounds; a round with no knee (the lowest rate failed) counts as 0."""
    return statistics.median(k or 0.0 for k in knees) if knees else None


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"took {time.monotonic() - started:.0f} s")
    sys.exit(code)
