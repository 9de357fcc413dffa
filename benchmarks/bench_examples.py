"""The knees of services ragheat did not write: each example of examples/ (Haystack, LlamaIndex, LangChain) in its
form (i), ``ragheat.observe``'s few lines, swept by ``ragheat bench`` as a user would sweep it.

    .venv/bin/python benchmarks/bench_examples.py

Writes benchmarks/results/examples.json (--json elsewhere).

For each framework in turn, so that the service has the machine to itself but for the load generator:

1. ``uvicorn examples.<fw>.app_ragheat:app`` as a child process over the first --docs SciFact abstracts (uvicorn's
   defaults otherwise), and a local Prometheus scraping its /metrics every second (stack/prometheus.py);
2. ``ragheat bench --url ... --path /query --body '{"question": ""}' --query-field question --expect-field answer
   --server-pid PID --prometheus URL`` as a subprocess, --rounds times: open loop, SciFact claims; per step the
   knee's inputs, P50/P99, goodput and CPU per answer, and the stages' percentiles from the service's own
   histograms as Prometheus scraped them;
3. the service's /metrics scraped before and after the sweeps: each stage's and the route's P50/P99 over all the
   sweeps' requests (warm-ups included), from the ``ragheat_stage_duration_seconds`` and
   ``ragheat_request_duration_seconds`` buckets, interpolated as ``histogram_quantile`` does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import MAX_ERROR_RATE  # noqa: E402
from benchmarks.docgen.page import preview  # noqa: E402
from examples._shared import DEFAULT_DOCS, SCIFACT_DOCS_ENV  # noqa: E402 - plain Python and pydantic, no framework
from loadgen.arrivals import parse_rates  # noqa: E402
from loadgen.resultsfile import BenchmarkRun  # noqa: E402
from loadgen.stats import scraped_buckets  # noqa: E402
from rag.childproc import ChildProcess, free_port  # noqa: E402
from rag.slo import SLO_MS  # noqa: E402

FRAMEWORKS = ("haystack", "llama_index", "langchain")
STAGE_H, REQUEST_H = "ragheat_stage_duration_seconds", "ragheat_request_duration_seconds"
ROUTE = "/query"
BODY = '{"question": ""}'
IN_FLIGHT = "ragheat_requests_in_flight"
IDLE_TIMEOUT_S = 180.0
QUANTILES = {"p50": 0.5, "p99": 0.99}
# A step's own figures; its per-request samples (the report's heatmaps) stay in the bench's results.json.
STEP_FIELDS = ("offered_qps", "duration_s", "requests", "errors", "error_rate", "error_reasons", "achieved_qps",
               "goodput_qps", "latency_ms", "send_error_ms", "stages_ms", "stages_source", "cpu_ms_per_answer",
               "shed", "shed_rate", "interrupted")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS), help="comma list, in the order swept")
    p.add_argument("--docs", type=int, default=DEFAULT_DOCS,
                   help="SciFact abstracts each service indexes (its EXAMPLES_SCIFACT_DOCS; default: the examples')")
    p.add_argument("--rates", default="10,15,20,25,30,40,50", help="offered req/s, '5,10' or 'start:stop:step'")
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per step")
    p.add_argument("--warmup", type=float, default=1.5, help="unmeasured seconds before each step")
    p.add_argument("--rounds", type=int, default=2, help="sweeps per service (the knee's spread across them)")
    p.add_argument("--slo-ms", type=float, default=SLO_MS, help="P99 objective for the knee")
    p.add_argument("--queries", type=Path, default=REPO / "datasets" / "scifact" / "queries.jsonl")
    p.add_argument("--prometheus", action=argparse.BooleanOptionalAction, default=True,
                   help="per-step stage percentiles from a local Prometheus (ragheat bench --prometheus)")
    p.add_argument("--ready-timeout", type=float, default=600.0, help="seconds a service may take to start")
    p.add_argument("--work", type=Path, default=REPO / "data" / "bench" / "examples",
                   help="service logs and each sweep's results.json and report.html")
    p.add_argument("--json", type=Path, help="results file (default benchmarks/results/examples.json)")
    args = p.parse_args(argv)
    args.frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    unknown = sorted(set(args.frameworks) - set(FRAMEWORKS))
    if unknown or not args.frameworks:
        p.error(f"--frameworks: choose among {', '.join(FRAMEWORKS)} (got {args.frameworks})")
    try:
        parse_rates(args.rates)
    except ValueError as exc:
        p.error(str(exc))
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if not args.queries.is_file():
        p.error(f"--queries {args.queries}: no such file")
    return args


def service_env(docs: int) -> dict[str, str]:
    """This environment for the service, less OTEL_* (no span leaves the machine), with the repository importable
    and --docs as the corpus size (the flag, which the results file records, wins over the environment)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env[SCIFACT_DOCS_ENV] = str(docs)
    return env


def uvicorn_argv(framework: str, port: int | str) -> list[str]:
    """The command line of one example's form (i), as a user types it."""
    return ["uvicorn", f"examples.{framework}.app_ragheat:app", "--host", "127.0.0.1", "--port", str(port)]


@contextlib.contextmanager
def example_service(framework: str, docs: int, log: Path, ready_timeout: float):
    """Form (i) of one example on a free port; yields its URL, pid and how long it took to serve."""
    port = free_port()
    argv = [sys.executable, "-m", *uvicorn_argv(framework, port)]  # this venv's uvicorn
    started = time.monotonic()
    with ChildProcess(f"{framework} app_ragheat", argv, log_path=log, env=service_env(docs),
                      die_with_parent=True) as child:
        url = f"http://127.0.0.1:{port}"
        child.wait_until_ok(url + "/metrics", ready_timeout)
        yield url, child.pid, time.monotonic() - started


def subtract(after: dict, before: dict) -> dict[str, dict[float, float]]:
    """Per series, the counts observed between two scrapes."""
    return {key: {le: n - before.get(key, {}).get(le, 0.0) for le, n in edges.items()} for key, edges in after.items()}


def bucket_quantile(q: float, edges: dict[float, float]) -> tuple[float, bool] | None:
    """``histogram_quantile(q, ...)`` over one series' cumulative buckets, in seconds, and whether it fell in the
    +Inf bucket (then it is the highest finite bound: a floor, not a value); linear within the bucket the rank falls
    in, the first bucket's lower bound 0; None when empty."""
    ordered = sorted(edges.items())
    total = ordered[-1][1] if ordered else 0.0
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for upper, count in ordered:
        if count >= rank:
            if math.isinf(upper):
                return lower, True
            return lower + (upper - lower) * ((rank - below) / (count - below) if count > below else 0.0), False
        lower, below = upper, count
    return lower, True


def percentiles(deltas: dict[str, dict[float, float]]) -> dict[str, dict]:
    """P50/P99 (ms) and the count of each series that saw requests; ``above_top`` names the percentiles that fell
    past the highest finite bucket edge."""
    out = {}
    for key, edges in sorted(deltas.items()):
        count = max(edges.values(), default=0.0)
        if count > 0:
            found = {name: bucket_quantile(q, edges) for name, q in QUANTILES.items()}
            out[key] = {"count": int(count), **{name: seconds * 1000 for name, (seconds, _) in found.items()},
                        "above_top": [name for name, (_, capped) in found.items() if capped]}
    return out


def in_flight(text: str) -> float:
    """Requests the service is still working on (``ragheat_requests_in_flight``, every route)."""
    return sum(s.value for fam in text_string_to_metric_families(text) if fam.name == IN_FLIGHT for s in fam.samples)


def wait_idle(url: str, timeout_s: float = IDLE_TIMEOUT_S) -> float:
    """Wait until the service has answered every request it holds (past its knee it works through a backlog long
    after the generator gave up on it), so that the next sweep starts on an idle service; the seconds waited."""
    started = time.monotonic()
    while in_flight(httpx.get(url + "/metrics", timeout=30).text) > 0:
        if time.monotonic() - started > timeout_s:
            raise SystemExit(f"{url} still had requests in flight after {timeout_s:g} s")
        time.sleep(0.5)
    return time.monotonic() - started


def ragheat_command() -> str:
    """The venv's ``ragheat`` beside this interpreter (what a user types), else the one on PATH."""
    beside = Path(sys.executable).with_name("ragheat")
    return str(beside) if beside.exists() else "ragheat"


def bench_argv(url: str, pid: int, args: argparse.Namespace, seed: int, out: Path, prometheus: str | None
               ) -> list[str]:
    return [ragheat_command(), "bench", "--url", url, "--path", ROUTE, "--body", BODY, "--query-field", "question",
            "--expect-field", "answer", "--rates", args.rates, "--duration", f"{args.duration:g}",
            "--warmup", f"{args.warmup:g}", "--slo-ms", f"{args.slo_ms:g}", "--queries", str(args.queries),
            "--seed", str(seed), "--server-pid", str(pid), "--out", str(out),
            *(["--prometheus", prometheus] if prometheus else [])]


def shown_argv(argv: list[str]) -> list[str]:
    """A sweep's command as the doc shows it: the URL's port, the pid and the work folder as placeholders."""
    placeholders = {"--url": "http://127.0.0.1:PORT", "--server-pid": "PID", "--out": "OUT",
                    "--prometheus": "http://127.0.0.1:PROMETHEUS_PORT"}
    shown, held = ["ragheat"], None
    for word in argv[1:]:
        shown.append(placeholders.get(held, word) if held else word)
        held = word if word in placeholders else None
    return [w.replace(str(REPO) + "/", "") for w in shown]


def sweep(url: str, pid: int, args: argparse.Namespace, seed: int, out: Path, prometheus: str | None) -> dict:
    """One ``ragheat bench`` run, its output to ``out``/bench.log; its results.json, steps slimmed. Each round has
    its own ``seed`` (arrival times and query order), so the rounds' spread is the one a user would meet."""
    argv = bench_argv(url, pid, args, seed, out, prometheus)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "bench.log", "wb") as log:
        done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                              env={**os.environ, "COLUMNS": "200"})
    if done.returncode != 0:
        raise SystemExit(f"ragheat bench exited with {done.returncode}; see {out / 'bench.log'}")
    results = json.loads((out / "results.json").read_text())
    return {"knee_qps": results["knee_qps"], "notes": results["notes"], "interrupted": results["interrupted"],
            "steps": [{k: step.get(k) for k in STEP_FIELDS} for step in results["steps"]], "argv": argv}


def measure(framework: str, args: argparse.Namespace) -> dict:
    """Start one example, sweep it --rounds times, read its histograms; stop it."""
    work = args.work / framework
    work.mkdir(parents=True, exist_ok=True)
    with example_service(framework, args.docs, work / "service.log", args.ready_timeout) as (url, pid, start_s), \
            contextlib.ExitStack() as extra:
        print(f"{framework}: serving at {url} (pid {pid}) after {start_s:.1f} s", flush=True)
        prometheus = None
        if args.prometheus:
            from stack.prometheus import LocalPrometheus

            prometheus = extra.enter_context(LocalPrometheus(url.removeprefix("http://"), scrape_interval_s=1))
        httpx.post(url + ROUTE, json={"question": "Vitamin D deficiency and bone density"}, timeout=60
                   ).raise_for_status()  # the first request pays for lazy set-up; it is not the sweep's
        before = httpx.get(url + "/metrics", timeout=30).text
        rounds = []
        for r in range(args.rounds):
            rounds.append(sweep(url, pid, args, r, work / f"round-{r + 1}", prometheus))
            rounds[-1]["drained_s"] = wait_idle(url)
            print(f"{framework} round {r + 1}: knee {rounds[-1]['knee_qps']}, backlog drained in "
                  f"{rounds[-1]['drained_s']:.1f} s", flush=True)
        after = httpx.get(url + "/metrics", timeout=30).text
    for r in rounds:
        r["argv"] = shown_argv(r["argv"])
    return {"app": f"examples.{framework}.app_ragheat:app", "start_s": start_s, "rounds": rounds,
            "service_argv": uvicorn_argv(framework, "PORT"),
            "stages_ms": percentiles(subtract(scraped_buckets(after, STAGE_H, "stage"),
                                              scraped_buckets(before, STAGE_H, "stage"))),
            "request_ms": percentiles(subtract(scraped_buckets(after, REQUEST_H, "route"),
                                               scraped_buckets(before, REQUEST_H, "route"))).get(ROUTE)}


def main(argv: list[str] | None = None) -> int:
    record = BenchmarkRun("examples")
    args = parse_args(argv)
    load_before = os.getloadavg()
    frameworks = {name: measure(name, args) for name in args.frameworks}
    results = {"slo_ms": args.slo_ms, "max_error_rate": MAX_ERROR_RATE, "rates": parse_rates(args.rates),
               "duration_s": args.duration, "warmup_s": args.warmup, "rounds": args.rounds,
               "docs": args.docs, "queries_file": shown_argv(["", str(args.queries.resolve())])[1],
               "prometheus": args.prometheus, "cores": len(os.sched_getaffinity(0)),
               "load_average_before": load_before, "load_average_after": os.getloadavg(),
               "frameworks": frameworks}
    print(f"wrote {record.write(results, args.json)}")
    print(preview("examples", results))
    first = next(iter(frameworks.values()))["rounds"][0]["argv"]
    print("each sweep: " + shlex.join(first))
    return 0


if __name__ == "__main__":
    sys.exit(main())
