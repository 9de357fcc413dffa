"""The semantic answer cache (stage ``cache_lookup``, rag/cache) under Zipf-distributed load, side by side:

    .venv/bin/python benchmarks/bench_cache.py --beir datasets/scifact --index data/index/scifact \
        --rates 40,60,80,100,120,140,160,200,240 --duration 6 --warmup 2 --zipf 1.1

1. Knee search: two ``ragheat serve`` processes over the same index, one with ``cache.enabled`` and one without;
   for each offered rate (ascending, open loop, Poisson arrivals) both get the same seeded Zipf(s) draw of the
   split's judged claims, one after the other, the order alternating step by step so that drift in the machine's
   load hits both alike. A configuration stops once a step misses the SLO (P99 <= rag.slo, errors <= 0.1 %); the
   knee is the highest rate met with every lower one met too (loadgen.stats.find_knee). Per step: P50/P99 from the
   intended send time, the hit rate (hit / (hit + miss), from each response's ``cache`` field), P50/P99 of hits and
   of misses apart, and the ``cache_lookup`` and ``embed`` stage times the responses report. The cache carries over
   from step to step, as in a running service: its hit rate climbs as the popular claims are stored.
2. Lookup cost: ``SemanticCache.get`` alone (one single-threaded matrix-vector product over every entry) on random
   unit vectors of the model's dimension, at several cache sizes, P50/P90/P99 over --lookups calls; ``put``; and
   the same product through BLAS (``@``, multi-threaded), the reason the cache does not use it.

Writes a results file (loadgen.resultsfile) to benchmarks/results/cache.json, or to --json; docs/benchmarks.md,
"Semantic answer cache", shows it.
The index is built first when missing (``ragheat ingest``'s code; up to date = nothing to do).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import MAX_ERROR_RATE  # noqa: E402
from benchmarks.docgen.page import preview  # noqa: E402
from loadgen.resultsfile import BenchmarkRun  # noqa: E402
from loadgen.runner import open_loop, run as run_step, shuffled  # noqa: E402
from loadgen.stats import StepResult, cache_hit_rate, find_knee, percentiles_ms  # noqa: E402
from rag.cache import SemanticCache  # noqa: E402
from rag.eval.beir import load_qrels, load_queries  # noqa: E402
from rag.settings import CacheSettings, RagheatSettings  # noqa: E402
from rag.slo import SLO_MS  # noqa: E402
from rag.types import CacheKey, QueryResult  # noqa: E402
from stack.servers import ServeProcess  # noqa: E402

CONFIGS = ("no cache", "cache")


def step_row(step: StepResult) -> dict:
    """One configuration at one rate: what the doc and the knee need, plus hits and misses apart."""
    samples = step.samples
    by = {"hit": [], "miss": []}
    for outcome, ms in zip(samples.get("cache", []), samples.get("latency_ms", [])):
        if outcome in by:
            by[outcome].append(ms / 1000.0)
    return {"offered_qps": step.offered_qps, "achieved_qps": step.achieved_qps, "requests": step.requests,
            "errors": step.errors, "latency_ms": step.latency_ms, "cache": step.cache,
            "hit_rate": cache_hit_rate(step.cache), "hit_ms": percentiles_ms(by["hit"]),
            "miss_ms": percentiles_ms(by["miss"]),
            "cache_lookup_ms": step.stages_ms.get("cache_lookup"), "embed_ms": step.stages_ms.get("embed"),
            "meets_slo": _meets(step)}


def _meets(step: StepResult) -> bool:
    p99 = step.latency_ms.get("p99")
    return bool(step.requests and p99 is not None and p99 <= SLO_MS and step.error_rate <= MAX_ERROR_RATE)


def knee_search(services: dict, queries: list[str], rates: list[float], args) -> dict:
    steps: dict[str, list[StepResult]] = {name: [] for name in CONFIGS}
    rows: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    running = set(CONFIGS)
    for i, rate in enumerate(rates):
        order = CONFIGS if i % 2 == 0 else CONFIGS[::-1]
        for name in order:
            if name not in running:
                continue
            step = run_step(open_loop(services[name].url + "/v1/query", queries, rate, args.duration, args.warmup,
                                      seed=args.seed + i, top_k=args.top_k, zipf_s=args.zipf, slo_ms=SLO_MS))
            steps[name].append(step)
            rows[name].append(step_row(step))
            r, nan = rows[name][-1], float("nan")
            print(f"{rate:g} req/s {name:>8}: P50 {r['latency_ms']['p50'] or nan:.1f} P99 "
                  f"{r['latency_ms']['p99'] or nan:.1f} ms, errors {step.errors}, hit rate {r['hit_rate']}", flush=True)
            if not r["meets_slo"]:
                running.discard(name)
            time.sleep(args.pause)
        if not running:
            break
    return {"steps": rows, "knee_qps": {name: find_knee(steps[name], SLO_MS) for name in CONFIGS}}


def bench_lookup(dim: int, sizes: list[int], lookups: int, seed: int) -> list[dict]:
    """``get`` and ``put`` of a full cache of ``size`` random unit vectors (scope matching, no hit: the worst case
    scans every row and finds nothing at the threshold)."""
    rng = np.random.default_rng(seed)
    out = []
    for size in sizes:
        cache = SemanticCache(CacheSettings(enabled=True, max_entries=size, max_bytes=1 << 40))
        vectors = rng.normal(size=(size + lookups, dim)).astype(np.float32)
        result = QueryResult("an answer [1]", "extractive", [])
        for v in vectors[:size]:
            cache.put(CacheKey(v, 5, ("dense", "bm25"), False, "g"), result)
        get_s, put_s, blas_s = [], [], []
        matrix = cache._matrix[:size]
        for v in vectors[size:]:
            key = CacheKey(v, 5, ("dense", "bm25"), False, "g")
            t = time.perf_counter()
            cache.get(key)
            get_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            matrix @ v  # the same product through BLAS (multi-threaded), for the comparison in rag/cache/semantic.py
            blas_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            cache.put(key, result)  # evicts one: the cache stays full
            put_s.append(time.perf_counter() - t)
        out.append({"entries": size, "dim": dim, "get_us": {k: v * 1000 for k, v in percentiles_ms(get_s).items()},
                    "put_us": {k: v * 1000 for k, v in percentiles_ms(put_s).items()},
                    "blas_matvec_us": {k: v * 1000 for k, v in percentiles_ms(blas_s).items()},
                    "matrix_bytes": size * dim * 4})
    return out


def main() -> None:
    record = BenchmarkRun("cache")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beir", type=Path, default=Path("datasets/scifact"))
    parser.add_argument("--index", type=Path, default=Path("data/index/scifact"))
    parser.add_argument("--split", default="train")
    parser.add_argument("--rates", default="40,60,80,100,120,140,160,200,240", help="ascending offered req/s")
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--pause", type=float, default=1.0, help="seconds between steps (the server drains)")
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lookup-sizes", default="1024,4096,16384")
    parser.add_argument("--lookups", type=int, default=2000)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    if rates != sorted(rates) or not rates:
        parser.error("--rates must be ascending")
    load = list(os.getloadavg())

    from rag.ingest.pipeline import ingest

    settings = RagheatSettings()
    ingest(str(args.beir), args.index, settings)  # nothing to do when the index is up to date
    qrels = load_qrels(args.beir, args.split)
    texts = [text for qid, text in load_queries(args.beir).items() if qid in qrels]
    queries = shuffled(texts, args.seed)  # popularity rank = this order (loadgen.runner.zipf_picks)

    lookup = bench_lookup(384, [int(s) for s in args.lookup_sizes.split(",")], args.lookups, args.seed)
    for r in lookup:
        print(f"lookup at {r['entries']:,} entries: get P50 {r['get_us']['p50']:.0f} us, P90 {r['get_us']['p90']:.0f} "
              f"us, P99 {r['get_us']['p99']:.0f} us; put P50 {r['put_us']['p50']:.0f} us; BLAS matvec P50 "
              f"{r['blas_matvec_us']['p50']:.0f} us, P90 {r['blas_matvec_us']['p90']:.0f} us", flush=True)

    env = {name: {**os.environ, "RAGHEAT_CACHE__ENABLED": str(name == "cache").lower()} for name in CONFIGS}
    with ServeProcess(args.index, env=env["no cache"]) as off, ServeProcess(args.index, env=env["cache"]) as on:
        knee = knee_search({"no cache": off, "cache": on}, queries, rates, args)
    data = {**knee, "zipf_s": args.zipf, "split": args.split, "queries": len(queries), "rates": rates,
            "duration_s": args.duration, "warmup_s": args.warmup, "top_k": args.top_k, "seed": args.seed,
            "threshold": CacheSettings().threshold, "slo_ms": SLO_MS, "lookup": lookup, "lookups": args.lookups,
            "load_average": load, "load_average_after": list(os.getloadavg())}
    print(f"wrote {record.write(data, args.json)}")
    print(preview("cache", data))


if __name__ == "__main__":
    main()
