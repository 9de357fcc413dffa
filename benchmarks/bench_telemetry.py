"""Telemetry overhead: the same query load against telemetry off and fully on, side by side.

    .venv/bin/python benchmarks/bench_telemetry.py --beir ../shared/data/scifact --index data/index/scifact

Two `ragheat serve` processes run at once: one with `--no-telemetry`, one with metrics, spans and OTLP
export (traces and exponential-histogram metrics every second) to a real OTLP/HTTP receiver in this
process. Three measurements, each alternating between the two servers so both see the same machine:

1. latency at concurrency 1: requests interleaved A, B, A, B...; P50/P99 per server;
2. throughput with --clients concurrent clients: rounds of --round-s seconds, alternating servers;
   the median requests/s per server;
3. the in-process cost of recording one request (Telemetry.start + finish with real stage timings and
   span creation), in microseconds, with and without an exporter attached.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from rag.eval.beir import load_queries
from rag.pipeline import RagPipeline
from rag.settings import RagheatSettings
from telemetry.otlp_receiver import OtlpReceiver
from telemetry.prometheus_server import free_port
from telemetry.recorder import RequestInfo, Telemetry


def start_server(index: Path, telemetry: bool, env: dict) -> tuple[subprocess.Popen, str]:
    port = free_port()
    ragheat = Path(sys.executable).parent / "ragheat"
    args = [str(ragheat), "serve", "--index", str(index), "--port", str(port), "--log-level", "warning"]
    if not telemetry:
        args.append("--no-telemetry")
    process = subprocess.Popen(args, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        if process.poll() is not None:
            break
        time.sleep(0.1)
    raise SystemExit(f"server {args} did not start")


def latency_interleaved(urls: dict[str, str], queries: list[str], rounds: int) -> dict:
    clients = {name: httpx.Client(base_url=url) for name, url in urls.items()}
    samples = {name: [] for name in urls}
    for q in queries[:20]:
        for client in clients.values():
            client.post("/v1/query", json={"query": q})
    for _ in range(rounds):
        for q in queries:
            for name, client in clients.items():
                start = time.perf_counter()
                client.post("/v1/query", json={"query": q}).raise_for_status()
                samples[name].append(time.perf_counter() - start)
    return {name: {"p50_ms": float(np.percentile(v, 50) * 1000), "p99_ms": float(np.percentile(v, 99) * 1000),
                   "mean_ms": float(np.mean(v) * 1000), "n": len(v)} for name, v in samples.items()}


def throughput_rounds(urls: dict[str, str], queries: list[str], clients: int, round_s: float, rounds: int) -> dict:
    per_round = {name: [] for name in urls}
    for _ in range(rounds):
        for name, url in urls.items():
            done = [0] * clients
            stop = time.monotonic() + round_s

            def worker(i: int) -> None:
                with httpx.Client(base_url=url) as client:
                    j = i
                    while time.monotonic() < stop:
                        client.post("/v1/query", json={"query": queries[j % len(queries)]}).raise_for_status()
                        done[i] += 1
                        j += clients

            threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            per_round[name].append(sum(done) / round_s)
    return {name: {"median_rps": statistics.median(v), "rounds_rps": v} for name, v in per_round.items()}


def recording_cost_us(settings: RagheatSettings, pipeline: RagPipeline, queries: list[str], exporter: bool) -> float:
    """Mean microseconds for Telemetry.start + finish on real results (pipeline time excluded)."""
    results = [pipeline.query(q, 5) for q in queries[:50]]
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"]} if exporter else {}
    telemetry = Telemetry(settings.telemetry.model_copy(update={"otlp": "on" if exporter else "off"}),
                          data_source="bench", model="bench", environ=env)
    n = 5000
    start = time.perf_counter()
    for i in range(n):
        scope = telemetry.start("/v1/query")
        telemetry.finish(scope, 200, RequestInfo(query=queries[i % 50], top_k=5, result=results[i % 50]))
    cost = (time.perf_counter() - start) / n * 1e6
    telemetry.shutdown()
    return cost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beir", type=Path, required=True)
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--round-s", type=float, default=8.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    queries = list(load_queries(args.beir).values())[: args.queries]

    receiver = OtlpReceiver()
    with receiver as endpoint:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
        env_on = {**os.environ, "RAGHEAT_TELEMETRY__OTLP_METRICS_INTERVAL_S": "1"}
        env_off = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        off, url_off = start_server(args.index, False, env_off)
        on, url_on = start_server(args.index, True, env_on)
        try:
            urls = {"off": url_off, "on": url_on}
            report = {"latency_c1": latency_interleaved(urls, queries, args.rounds),
                      "throughput": throughput_rounds(urls, queries, args.clients, args.round_s, args.rounds)}
        finally:
            for p in (off, on):
                p.terminate()
                p.wait(15)
        # Proof that "on" really exported: what reached the receiver over OTLP/HTTP.
        report["otlp_received"] = {"spans": len(receiver.spans()), "metric_requests": len(receiver.metrics)}
        settings = RagheatSettings()
        pipeline = RagPipeline(settings, args.index)
        pipeline.warm_up()
        report["recording_cost_us"] = {"metrics_and_spans_no_export": recording_cost_us(settings, pipeline, queries, False),
                                       "metrics_spans_otlp": recording_cost_us(settings, pipeline, queries, True)}
    lat, thr = report["latency_c1"], report["throughput"]
    report["summary"] = {
        "throughput_loss_pct": (1 - thr["on"]["median_rps"] / thr["off"]["median_rps"]) * 100,
        "p99_added_ms": lat["on"]["p99_ms"] - lat["off"]["p99_ms"],
        "p50_added_ms": lat["on"]["p50_ms"] - lat["off"]["p50_ms"],
        "mean_added_us": (lat["on"]["mean_ms"] - lat["off"]["mean_ms"]) * 1000,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
