"""Telemetry overhead: the same query load against telemetry off and fully on, side by side.

    .venv/bin/python benchmarks/bench_telemetry.py --beir datasets/scifact --index data/index/scifact

Writes benchmarks/results/telemetry.json (with --recording-only: telemetry-recording.json; --json elsewhere).

Three `ragheat serve` processes run at once: `off` (`--no-telemetry`), `on` (metrics, spans for every
request, OTLP export of traces and exponential-histogram metrics every 10 s) and `on_sampled` (the
same with --sample-ratio of requests traced). OTLP goes to a real OTLP/HTTP receiver in its own
process. Measurements alternate between the servers so all see the same machine:

1. latency at concurrency 1: requests interleaved A, B, C, A, B, C...; P50/P99 per server;
2. throughput with --clients concurrent clients: rounds of --round-s seconds, alternating servers;
   the median requests/s per server, and each server process's CPU time per request (from /proc);
3. the in-process cost of recording one request (Telemetry.start + finish with real stage timings,
   spans handed to an in-memory exporter), in microseconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import latency_interleaved, throughput_rounds  # noqa: E402
from loadgen.cpu import cpu_seconds  # noqa: E402
from loadgen.resultsfile import BenchmarkRun  # noqa: E402
from rag.eval.beir import load_queries  # noqa: E402
from rag.pipeline import RagPipeline  # noqa: E402
from rag.settings import RagheatSettings  # noqa: E402
from rag.types import RequestRecord  # noqa: E402
from stack.servers import ServeProcess  # noqa: E402
from telemetry.recorder import Telemetry  # noqa: E402


RECEIVER = """
import json, sys
from stack.otlp_receiver import OtlpReceiver
receiver = OtlpReceiver()
with receiver as endpoint:
    print(endpoint, flush=True)
    sys.stdin.read()
print(json.dumps({"spans": len(receiver.spans()), "metric_requests": len(receiver.metrics)}), flush=True)
"""


def recording_cost_us(settings: RagheatSettings, pipeline: RagPipeline, queries: list[str], tracing: bool,
                      otlp_endpoint: str | None = None, sample_ratio: float = 1.0) -> float:
    """Mean microseconds for Telemetry.start + finish on real results (pipeline time excluded); with
    ``otlp_endpoint``, OTLP metrics and spans are exported there for real."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    results = [pipeline.query(q, 5) for q in queries[:50]]
    update = {"otlp": "on" if otlp_endpoint else "off", "tracing": tracing, "trace_sample_ratio": sample_ratio,
              "otlp_metrics_interval_s": 1.0}
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp_endpoint} if otlp_endpoint else {}
    telemetry = Telemetry(settings.telemetry.model_copy(update=update), data_source="bench", model="bench",
                          environ=environ,
                          span_exporter=InMemorySpanExporter() if tracing and not otlp_endpoint else None)
    n = 5000
    start = time.perf_counter()
    for i in range(n):
        scope = telemetry.start("/v1/query")
        j = i % len(results)  # 50 queries, or every one when fewer were given
        telemetry.finish(scope, 200, RequestRecord(query=queries[j], top_k=5, result=results[j]))
    cost = (time.perf_counter() - start) / n * 1e6
    telemetry.shutdown()
    return cost


def recording_costs(index: Path, queries: list[str]) -> dict:
    """Request-path cost of telemetry per configuration, exporting to a real OTLP receiver process."""
    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)
    endpoint = receiver.stdout.readline().strip()
    settings = RagheatSettings()
    pipeline = RagPipeline(settings, index)
    pipeline.warm_up()
    try:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint  # the span exporter reads the process environment
        return {
            "prometheus_metrics_only": recording_cost_us(settings, pipeline, queries, False),
            "plus_otlp_metrics": recording_cost_us(settings, pipeline, queries, False, endpoint),
            "plus_otlp_spans_10pct": recording_cost_us(settings, pipeline, queries, True, endpoint, 0.1),
            "plus_otlp_spans_100pct": recording_cost_us(settings, pipeline, queries, True, endpoint, 1.0),
        }
    finally:
        receiver.stdin.close()
        receiver.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beir", type=Path, required=True)
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--round-s", type=float, default=6.0)
    parser.add_argument("--sample-ratio", type=float, default=0.1)
    parser.add_argument("--json", type=Path, help="results file (default benchmarks/results/telemetry.json)")
    parser.add_argument("--recording-only", action="store_true",
                        help="only the in-process recording cost, with real OTLP export (seconds, not minutes)")
    args = parser.parse_args()
    run = BenchmarkRun("telemetry-recording" if args.recording_only else "telemetry")
    queries = list(load_queries(args.beir).values())[: args.queries]
    if args.recording_only:
        costs = {"recording_cost_us": recording_costs(args.index, queries), "requests_per_configuration": 5000}
        print(json.dumps(costs, indent=2))
        print(f"wrote {run.write(costs, args.json)}")
        return

    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)
    endpoint = receiver.stdout.readline().strip()
    if not endpoint.startswith("http://"):
        raise SystemExit("the OTLP receiver did not start")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RAGHEAT_TELEMETRY"))}
    env_on = {**base, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}  # metrics pushed every 10 s (the default)
    envs = {"off": (False, base), "on": (True, {**env_on, "RAGHEAT_TELEMETRY__TRACE_SAMPLE_RATIO": "1.0"}),
            "on_sampled": (True, {**env_on, "RAGHEAT_TELEMETRY__TRACE_SAMPLE_RATIO": str(args.sample_ratio)})}
    with contextlib.ExitStack() as running:
        servers = {name: running.enter_context(ServeProcess(args.index, () if telemetry else ("--no-telemetry",), env))
                   for name, (telemetry, env) in envs.items()}
        urls = {name: server.url for name, server in servers.items()}
        pids = {name: server.pid for name, server in servers.items()}
        report = {"latency_c1": latency_interleaved(urls, queries, args.rounds),
                  "throughput": throughput_rounds(urls, pids, queries, args.clients, args.round_s, args.rounds)}
    receiver_cpu = cpu_seconds(receiver.pid)
    receiver.stdin.close()
    # Proof that "on" really exported: what reached the receiver over OTLP/HTTP.
    report["otlp_received"] = {**json.loads(receiver.stdout.readline()), "receiver_cpu_s": receiver_cpu}
    receiver.wait(10)
    settings = RagheatSettings()
    pipeline = RagPipeline(settings, args.index)
    pipeline.warm_up()
    report["recording_cost_us"] = {"metrics_only": recording_cost_us(settings, pipeline, queries, False),
                                   "metrics_and_spans": recording_cost_us(settings, pipeline, queries, True)}
    lat, thr = report["latency_c1"], report["throughput"]
    # Rounds alternate off, on, on_sampled, off, ...: each round's ratio to the "off" round just before it
    # cancels slow drifts of the machine's speed, so its median is the steadier estimate of the loss.
    paired_rounds = {name: [(1 - a / b) * 100 for a, b in zip(thr[name]["rounds_rps"], thr["off"]["rounds_rps"])]
                     for name in ("on", "on_sampled")}
    report["summary"] = {
        name: {"throughput_loss_pct": (1 - thr[name]["median_rps"] / thr["off"]["median_rps"]) * 100,
               "throughput_loss_pct_paired_rounds": statistics.median(paired_rounds[name]),
               "rounds_throughput_loss_pct_paired": paired_rounds[name],
               "p99_added_ms": lat[name]["p99_ms"] - lat["off"]["p99_ms"],
               "p50_added_ms": lat[name]["p50_ms"] - lat["off"]["p50_ms"],
               "server_cpu_added_us_per_request": thr[name]["server_cpu_us_per_request"]
               - thr["off"]["server_cpu_us_per_request"]}
        for name in ("on", "on_sampled")}
    report["settings"] = {"queries": len(queries), "rounds": args.rounds, "clients": args.clients,
                          "round_s": args.round_s, "sample_ratio": args.sample_ratio, "recording_requests": 5000}
    print(json.dumps(report, indent=2))
    print(f"wrote {run.write(report, args.json)}")


if __name__ == "__main__":
    main()
