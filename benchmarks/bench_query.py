"""Query-path latency: raw embedder, raw FAISS and BM25, and /v1/query over HTTP, side by side.

    .venv/bin/python benchmarks/bench_query.py --beir datasets/scifact --index data/index/scifact

Writes benchmarks/results/query.json (--json elsewhere). Everything is measured in one run on the same queries so the service's own overhead shows as a
ratio (HTTP end-to-end P50 over the sum of the raw stage P50s). The server runs as a separate
`ragheat serve` process, the client sends one request at a time (concurrency 1). Each
measurement is repeated --rounds times and the median of the per-round percentiles is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import httpx
import numpy as np

from rag.embedding.embedder import OnnxEmbedder
from rag.eval.beir import load_queries
from rag.index import dense, sparse
from rag.pipeline import RagPipeline
from loadgen.resultsfile import BenchmarkRun
from rag.settings import RagheatSettings
from stack.servers import ServeProcess


def pct(values, q) -> float:
    return float(np.percentile(np.asarray(values) * 1000.0, q))


def summary(rounds: list[list[float]]) -> dict:
    """Median over rounds of each round's P50 and P99, in ms, and every round's own (the spread)."""
    per_round = {"p50": [pct(r, 50) for r in rounds], "p99": [pct(r, 99) for r in rounds]}
    return {"p50": statistics.median(per_round["p50"]), "p99": statistics.median(per_round["p99"]),
            "rounds": per_round, "n_per_round": len(rounds[0]) if rounds else 0}


def timed(fn, items) -> list[float]:
    out = []
    for item in items:
        start = time.perf_counter()
        fn(item)
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beir", type=Path, required=True)
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="results file (default benchmarks/results/query.json)")
    args = parser.parse_args()
    run = BenchmarkRun("query")

    settings = RagheatSettings()
    queries = list(load_queries(args.beir).values())[: args.queries]
    pipeline = RagPipeline(settings, args.index)
    pipeline.warm_up()
    manifest = pipeline.index.manifest
    tokens = [pipeline.embedder.embed_query(q).tokens for q in queries]
    results: dict = {"queries": len(queries), "rounds": args.rounds, "median_query_tokens": statistics.median(tokens),
                     "index": manifest["dense"], "chunks": manifest["counts"]["chunks"],
                     "model_precision": manifest["model"]["precision"], "top_k": 5,
                     "candidates": settings.retrieval.candidates, "retrievers": list(settings.retrieval.retrievers)}

    # Raw embedder, both precisions, one thread, one query at a time (the quiet case's idle cores and the query
    # precision's choice: bench_quiet_case.py).
    for precision in ("fp32", "int8"):
        embedder = OnnxEmbedder(settings.embedding.model_copy(
            update={"precision": precision, "query_precision": "same", "quiet_query_threads": 1}))
        embedder.warm_up()
        session, tok = embedder._query_session, embedder.tokenizer
        feeds = [embedder._feed([tok.encode(q)]) for q in queries]
        results[f"onnx_{precision}_session_ms"] = summary(
            [timed(lambda f: session.run(None, f), feeds) for _ in range(args.rounds)])
        results[f"embed_query_{precision}_ms"] = summary(
            [timed(embedder.embed_query, queries) for _ in range(args.rounds)])

    if pipeline.index.faiss_index is None:
        raise SystemExit("bench_query times the generation's own FAISS and BM25 indexes, which "
                         "vector_store.fallback=none leaves on disk: unset RAGHEAT_VECTOR_STORE__FALLBACK")
    vectors = [pipeline.embedder.embed_query(q).vector for q in queries]
    candidates = settings.retrieval.candidates
    results["faiss_search_ms"] = summary(
        [timed(lambda v: dense.search(pipeline.index.faiss_index, v, candidates), vectors) for _ in range(args.rounds)])
    analyzer = pipeline.retrievers["bm25"].analyzer
    results["bm25_search_ms"] = summary(
        [timed(lambda q: sparse.bm25_top_k(pipeline.index.bm25, analyzer.tokens(q), candidates), queries)
         for _ in range(args.rounds)])
    results["pipeline_in_process_ms"] = summary(
        [timed(lambda q: pipeline.query(q, 5), queries) for _ in range(args.rounds)])

    with ServeProcess(args.index, env={**os.environ}) as server:
        stage_ms: dict[str, list[float]] = {}
        with httpx.Client(base_url=server.url) as client:
            def ask(q):
                body = client.post("/v1/query", json={"query": q, "top_k": 5}).raise_for_status().json()
                for s in body["stages"]:
                    stage_ms.setdefault(s["name"], []).append(s["ms"])
            for q in queries[:20]:
                ask(q)  # warm-up
            stage_ms.clear()
            results["http_query_hybrid_ms"] = summary([timed(ask, queries) for _ in range(args.rounds)])
        results["server_stage_p50_ms"] = {k: statistics.median(v) for k, v in stage_ms.items()}

    raw = (results[f"embed_query_{results['model_precision']}_ms"]["p50"] + results["faiss_search_ms"]["p50"]
           + results["bm25_search_ms"]["p50"])
    results["http_p50_over_raw_stage_p50_sum"] = results["http_query_hybrid_ms"]["p50"] / raw
    print(json.dumps(results, indent=2))
    print(f"wrote {run.write(results, args.json)}")


if __name__ == "__main__":
    main()
