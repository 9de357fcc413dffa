"""What observing a service ragheat did not write costs: the same plain service bare and with ragheat.observe.

    .venv/bin/python benchmarks/bench_observe.py --beir datasets/scifact

Writes benchmarks/results/observe.json (--json elsewhere).

Two processes of benchmarks/plain_rag_service.py run at once on the same corpus: ``off`` (bare) and ``library``
(the middleware and five stage scopes, Prometheus metrics at GET /metrics, threads named for the probes).
Measurements alternate between them so both see the same machine:

1. latency at concurrency 1: requests interleaved A, B, A, B...; P50/P99 per server and per round;
2. throughput with --clients closed-loop clients: rounds of --round-s seconds, alternating; requests/s and each
   server's CPU time per request (from /proc);
3. in-process costs, in microseconds: one observed request with five stages (middleware-free: ``Observer.request``
   and ``stage``), and the span processor's share of a request traced by an OpenTelemetry SDK (six spans, the
   same tracer with and without ``StageSpanProcessor``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import latency_interleaved, throughput_rounds  # noqa: E402
from loadgen.resultsfile import BenchmarkRun  # noqa: E402
from rag.childproc import ChildProcess, free_port  # noqa: E402
from rag.eval.beir import load_queries  # noqa: E402

SERVICE = REPO / "benchmarks" / "plain_rag_service.py"
MODES = ("off", "library")


@contextlib.contextmanager
def plain_service(mode: str, corpus: Path, documents: int):
    port = free_port()
    env = {"RAGHEAT_OBSERVE": mode, "PLAIN_RAG_DOCUMENTS": str(documents), "PATH": "/usr/bin:/bin"}
    with ChildProcess(f"plain service ({mode})", [sys.executable, str(SERVICE), str(port), str(corpus)],
                      env=env, die_with_parent=True) as child:
        url = f"http://127.0.0.1:{port}"
        child.wait_until_ok(url + "/docs", 120)
        yield url, child.pid


def library_cost_us(n: int = 20000) -> dict:
    """One observed request with the service's five stage scopes, against the same loop bare."""
    import ragheat.observe as rh

    observer = rh.Observer(service="bench", routes=("/query",), settings=rh.TelemetrySettings(otlp="off"),
                           environ={})
    names = ("embed", "retrieve_dense", "retrieve_bm25", "fuse", "generate")
    scopes = [observer.stage(name) for name in names]

    def observed():
        with observer.request("/query"):
            for scope in scopes:
                with scope:
                    pass

    def bare():
        for _ in scopes:
            pass
    costs = {}
    for name, body in (("bare", bare), ("observed", observed)):
        start = time.perf_counter()
        for _ in range(n):
            body()
        costs[name] = (time.perf_counter() - start) / n * 1e6
    return {"request_with_5_stages_us": costs["observed"] - costs["bare"], "stages": len(scopes), "requests": n}


def span_processor_cost_us(n: int = 5000) -> dict:
    """Six SDK spans per request (a root chain, embedding, two retrievers, a joiner, an LLM), with and without the
    processor: the difference is what StageSpanProcessor adds to an app that is traced anyway."""
    from opentelemetry.sdk.trace import TracerProvider

    import ragheat.observe as rh

    observer = rh.Observer(service="bench-spans", routes=("/query",),
                           settings=rh.TelemetrySettings(tracing=False, otlp="off"), environ={})
    kinds = (("SentenceTransformersTextEmbedder", "EMBEDDING"), ("InMemoryBM25Retriever", "RETRIEVER"),
             ("InMemoryEmbeddingRetriever", "RETRIEVER"), ("DocumentJoiner", "CHAIN"), ("Generator", "LLM"))
    costs = {}
    for name, with_processor in (("sdk", False), ("sdk_and_processor", True)):
        provider = TracerProvider()
        if with_processor:
            provider.add_span_processor(rh.StageSpanProcessor(observer))
        tracer = provider.get_tracer("bench")
        start = time.perf_counter()
        for _ in range(n):
            with tracer.start_as_current_span("Pipeline.run", attributes={"openinference.span.kind": "CHAIN"}):
                for span_name, kind in kinds:
                    with tracer.start_as_current_span(span_name, attributes={"openinference.span.kind": kind}):
                        pass
        costs[name] = (time.perf_counter() - start) / n * 1e6
        provider.shutdown()
    return {"sdk_request_us": costs["sdk"], "processor_added_us": costs["sdk_and_processor"] - costs["sdk"],
            "spans_per_request": 1 + len(kinds), "requests": n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beir", type=Path, required=True, help="a BEIR folder (corpus.jsonl, queries.jsonl)")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--round-s", type=float, default=5.0)
    parser.add_argument("--documents", type=int, default=3000, help="abstracts the plain service searches")
    parser.add_argument("--json", type=Path, help="results file (default benchmarks/results/observe.json)")
    args = parser.parse_args()
    run = BenchmarkRun("observe")
    queries = list(load_queries(args.beir).values())[: args.queries]
    with contextlib.ExitStack() as running:
        servers = {mode: running.enter_context(plain_service(mode, args.beir / "corpus.jsonl", args.documents))
                   for mode in MODES}
        urls = {mode: url for mode, (url, _) in servers.items()}
        pids = {mode: pid for mode, (_, pid) in servers.items()}
        metrics = httpx.get(urls["library"] + "/metrics").text
        if 'stage="retrieve_bm25"' not in metrics:
            raise SystemExit("the observed service shows no stage histograms: the comparison would be void")
        report = {"latency_c1": latency_interleaved(urls, queries, args.rounds, "/query", "question"),
                  "throughput": throughput_rounds(urls, pids, queries, args.clients, args.round_s, args.rounds,
                                                  "/query", "question")}
        stages = sorted({s.labels["stage"] for family in text_string_to_metric_families(
            httpx.get(urls["library"] + "/metrics").text) for s in family.samples
            if s.name == "ragheat_stage_duration_seconds_count" and s.value > 0})
    lat, thr = report["latency_c1"], report["throughput"]
    paired = [(1 - a / b) * 100 for a, b in zip(thr["library"]["rounds_rps"], thr["off"]["rounds_rps"])]
    report["summary"] = {
        "p50_added_ms": lat["library"]["p50_ms"] - lat["off"]["p50_ms"],
        "p99_added_ms": lat["library"]["p99_ms"] - lat["off"]["p99_ms"],
        "rounds_p50_added_ms": [a - b for a, b in zip(lat["library"]["rounds"]["p50_ms"],
                                                      lat["off"]["rounds"]["p50_ms"])],
        "rounds_p99_added_ms": [a - b for a, b in zip(lat["library"]["rounds"]["p99_ms"],
                                                      lat["off"]["rounds"]["p99_ms"])],
        "throughput_loss_pct_paired_rounds": statistics.median(paired), "rounds_throughput_loss_pct_paired": paired,
        "server_cpu_added_us_per_request": thr["library"]["server_cpu_us_per_request"]
        - thr["off"]["server_cpu_us_per_request"]}
    report["in_process"] = {"library": library_cost_us(), "span_processor": span_processor_cost_us()}
    report["settings"] = {"queries": len(queries), "rounds": args.rounds, "clients": args.clients,
                          "round_s": args.round_s, "documents": args.documents, "stages": stages}
    print(json.dumps(report, indent=2))
    print(f"wrote {run.write(report, args.json)}")


if __name__ == "__main__":
    main()
