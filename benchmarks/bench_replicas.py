"""Replicas behind nginx on loopback: is a second API process worth a balancer's hop?

Three ways to serve the same index, measured side by side in one run with the project's open-loop load generator
(Poisson arrivals, latency from the intended send time, loadgen/runner.py):

- ``direct-1``: one ``ragheat serve``, no proxy (what ``ragheat bench`` measures);
- ``nginx-1``: the same replica behind nginx: the proxy's own cost (an extra loopback hop, nginx's CPU);
- ``nginx-2``: two replicas behind nginx (stack/nginx.py's config: least_conn, keepalive), as
  ``ragheat stack up --replicas 2`` runs them.

The two replicas and both nginx instances run for the whole benchmark, and every rate is measured for each
configuration in turn (the order rotating from rate to rate), so slow drift of the machine lands on all three alike.
A configuration whose P99 passes ``--stop-factor`` times the SLO (or whose errors pass 10 %) is not offered higher
rates: past its knee it only queues. Report: P50/P99 per rate and the knee (the highest rate meeting the SLO with
every lower rate meeting it) per configuration.

On a machine with two cores shared with the load generator, two replicas compete with each other, nginx and the
generator for the same cores: they may not beat one. The figures say what was measured, not what was hoped.

    .venv/bin/python benchmarks/bench_replicas.py --index data/index/scifact \\
        --queries datasets/scifact/queries.jsonl --results-file benchmarks/results/replicas.json
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadgen.arrivals import parse_rates  # noqa: E402
from loadgen.resultsfile import BenchmarkRun  # noqa: E402
from loadgen.runner import DEFAULT_QUERIES, StopSignals, load_queries, open_loop, run, shuffled  # noqa: E402
from loadgen.stats import find_knee  # noqa: E402
from rag.childproc import ChildProcess, free_port  # noqa: E402
from rag.slo import SLO_MS  # noqa: E402
from stack import nginx  # noqa: E402

CONFIGS = ("direct-1", "nginx-1", "nginx-2")
MAX_ERROR_RATE = 0.001  # the knee's error allowance, as `ragheat bench`
SATURATED_ERRORS = 0.10  # past this error share a configuration is not offered higher rates


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--index", type=Path, default=Path("data/index/scifact"), help="index folder to serve")
    p.add_argument("--queries", type=Path, default=None, help="plain lines or a BEIR queries.jsonl "
                                                              "(default datasets/scifact/queries.jsonl if present)")
    p.add_argument("--rates", default="50,100,150,200,250,300", help="offered req/s, '50,100' or 'start:stop:step'")
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per step")
    p.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each step")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"which of {', '.join(CONFIGS)}")
    p.add_argument("--slo-ms", type=float, default=SLO_MS, help="P99 objective for the knee")
    p.add_argument("--stop-factor", type=float, default=5.0,
                   help="stop offering a configuration more once its P99 passes this many SLOs")
    p.add_argument("--timeout", type=float, default=10.0, help="per-request timeout, seconds")
    p.add_argument("--ready-timeout", type=float, default=240.0, help="seconds each replica may take to load")
    p.add_argument("--work", type=Path, default=None, help="logs and nginx config (default: a temporary folder)")
    p.add_argument("--results-file", "--json", dest="results_file", type=Path, default=None,
                   help="write a benchmark results file (loadgen/resultsfile.py) here")
    args = p.parse_args(argv)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = sorted(set(args.configs) - set(CONFIGS))
    if unknown or not args.configs:
        p.error(f"--configs takes {', '.join(CONFIGS)}; unknown: {', '.join(unknown) or '(none given)'}")
    if not (args.index / "current").exists():
        p.error(f"--index {args.index} is not an index folder (no 'current'); build one with `ragheat ingest`")
    return args


class Services:
    """The replicas (as many as the configurations need) and one nginx per balanced configuration."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.children: list[ChildProcess] = []
        self.urls: dict[str, str] = {}

    def __enter__(self) -> "Services":
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self) -> None:
        ragheat = str(Path(sys.executable).parent / "ragheat")
        count = 2 if "nginx-2" in self.args.configs else 1
        replicas = []
        for i in range(1, count + 1):
            port = free_port()
            child = ChildProcess(f"api-{i}", [ragheat, "serve", "--index", str(self.args.index.resolve()), "--host",
                                              "127.0.0.1", "--port", str(port), "--log-level", "warning"],
                                 log_path=self.work / f"api-{i}.log", die_with_parent=True).start()
            self.children.append(child)
            replicas.append(f"127.0.0.1:{port}")
        for child, address in zip(self.children, replicas):  # loading side by side
            child.wait_until_ok(f"http://{address}/readyz", self.args.ready_timeout)
        self.urls["direct-1"] = f"http://{replicas[0]}"
        binary = nginx.nginx_binary() if any(c.startswith("nginx") for c in self.args.configs) else None
        for name, upstreams in (("nginx-1", replicas[:1]), ("nginx-2", replicas[:2])):
            if name not in self.args.configs:
                continue
            listen = f"127.0.0.1:{free_port()}"
            config = nginx.write_local_config(self.work / name, listen, upstreams)
            child = ChildProcess(name, nginx.argv(config, binary), log_path=self.work / f"{name}.log",
                                 die_with_parent=True).start()
            self.children.append(child)
            child.wait_until_ok(f"http://{listen}/readyz", 30)  # through nginx to a replica
            self.urls[name] = f"http://{listen}"

    def __exit__(self, *exc) -> None:
        for child in reversed(self.children):
            child.stop()


def summary_row(step) -> dict:
    return {"offered_qps": step.offered_qps, "achieved_qps": round(step.achieved_qps, 2), "requests": step.requests,
            "errors": step.errors, "error_rate": round(step.error_rate, 5), "interrupted": step.interrupted,
            "latency_ms": step.latency_ms, "send_error_ms": step.send_error_ms}


def main(argv: list[str] | None = None) -> int:
    record = BenchmarkRun("replicas")
    args = parse_args(argv)
    queries_file = args.queries or (Path("datasets/scifact/queries.jsonl")
                                    if Path("datasets/scifact/queries.jsonl").is_file() else None)
    texts = shuffled(load_queries(queries_file) if queries_file else DEFAULT_QUERIES, 0)
    rates = parse_rates(args.rates)
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-replicas-"))
    work.mkdir(parents=True, exist_ok=True)
    steps: dict[str, list] = {c: [] for c in args.configs}
    stopped: dict[str, str] = {}
    with Services(args, work) as services, StopSignals() as stop:
        for i, rate in enumerate(rates):
            order = args.configs[i % len(args.configs):] + args.configs[:i % len(args.configs)]
            for config in order:
                if config in stopped or stop.presses:
                    continue
                step = run(open_loop(services.urls[config] + "/v1/query", texts, rate, args.duration, args.warmup,
                                     seed=i, timeout_s=args.timeout), stop)
                if step is None:
                    break
                steps[config].append(step)
                p99 = step.latency_ms.get("p99")
                print(f"{config:9s} {rate:7g} req/s  achieved {step.achieved_qps:7.1f}  P50 "
                      f"{step.latency_ms.get('p50') or float('nan'):8.1f} ms  P99 {p99 or float('nan'):8.1f} ms  "
                      f"errors {step.errors}", flush=True)
                if p99 is None or p99 > args.stop_factor * args.slo_ms or step.error_rate > SATURATED_ERRORS:
                    stopped[config] = f"saturated at {rate:g} req/s (P99 {p99} ms, error rate {step.error_rate:.3f})"
    results = {
        "slo_ms": args.slo_ms, "max_error_rate": MAX_ERROR_RATE, "duration_s": args.duration, "warmup_s": args.warmup,
        "rates": rates, "queries_file": str(queries_file) if queries_file else None, "queries": len(texts),
        "index": str(args.index), "cores": os.cpu_count(),
        "configs": {c: {"knee_qps": find_knee(steps[c], args.slo_ms, MAX_ERROR_RATE),
                        "stopped": stopped.get(c), "steps": [summary_row(s) for s in steps[c]]}
                    for c in args.configs},
        "interrupted": bool(stop.presses),
    }
    results["doc_tables"] = doc_tables(results)  # what docs/benchmarks.md shows (benchmarks/docgen/render.py)
    print_table(results)
    if args.results_file is not None:
        print(f"wrote {record.write(results, args.results_file)}")
    return 0


def doc_tables(results: dict) -> list[dict]:
    """Two tables for docs/benchmarks.md: P50 / P99 and achieved rate per offered rate, side by side; the knees."""
    configs = list(results["configs"])
    by_rate: dict[float, dict] = {}
    for c in configs:
        for s in results["configs"][c]["steps"]:
            by_rate.setdefault(s["offered_qps"], {})[c] = s
    rows = []
    for rate in sorted(by_rate):
        row = [f"{rate:g}"]
        for c in configs:
            s = by_rate[rate].get(c)
            row.append("not offered (saturated)" if s is None else
                       f"{_ms(s['latency_ms'].get('p50'))} / {_ms(s['latency_ms'].get('p99'))} "
                       f"({s['achieved_qps']:.0f}/s" + (f", {s['errors']} errors)" if s["errors"] else ")"))
        rows.append(row)
    knees = [[c, "none" if results["configs"][c]["knee_qps"] is None else f"{results['configs'][c]['knee_qps']:g}",
              results["configs"][c]["stopped"] or "–"] for c in configs]
    slo = f"{results['slo_ms']:g}"
    return [{"title": "P50 / P99 latency in ms (achieved req/s), per offered rate", "align": "r" + "r" * len(configs),
             "columns": ["offered req/s", *configs], "rows": rows},
            {"title": f"Knee: the highest offered rate with P99 ≤ {slo} ms and errors ≤ "
                      f"{results['max_error_rate'] * 100:g} %, every lower rate meeting it too",
             "align": "lrl", "columns": ["configuration", "knee req/s", "stopped"], "rows": knees}]


def print_table(results: dict) -> None:
    configs = list(results["configs"])
    by_rate: dict[float, dict] = {}
    for c in configs:
        for s in results["configs"][c]["steps"]:
            by_rate.setdefault(s["offered_qps"], {})[c] = s["latency_ms"]
    print("\noffered req/s | " + " | ".join(f"{c} P50 / P99 ms" for c in configs))
    for rate in sorted(by_rate):
        cells = []
        for c in configs:
            lat = by_rate[rate].get(c)
            cells.append("–" if lat is None else f"{_ms(lat.get('p50'))} / {_ms(lat.get('p99'))}")
        print(f"{rate:g} | " + " | ".join(cells))
    for c in configs:
        knee = results["configs"][c]["knee_qps"]
        print(f"knee {c}: {'none' if knee is None else f'{knee:g} req/s'}"
              + (f"  ({results['configs'][c]['stopped']})" if results["configs"][c]["stopped"] else ""))


def _ms(value) -> str:
    return "–" if value is None else f"{value:.1f}"


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"took {time.monotonic() - started:.0f} s")
    sys.exit(code)
