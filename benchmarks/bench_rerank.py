"""The late-interaction reranker (stage ``rerank``, rag/rerank): its latency, what it costs the embed stage, the index
size it adds, and its quality, on an index built with stored token vectors.

    .venv/bin/python benchmarks/bench_rerank.py --index data/index/scifact --beir datasets/scifact   # ~2 min

Measured:
  rerank stage      ``LateInteractionReranker.rerank`` alone (project the query, gather the candidates' stored
                    vectors, MaxSim, combine) over the real fused candidates of each query: P50 / P99 (ms) at
                    --candidates (default 50), --rounds times per query; wall time, and this thread's CPU time
                    (robust to a busy neighbour, which stretches wall time, not CPU time)
  embed stage       one query's model run asking for the pooled vector alone vs for the token states too (the
                    reranker's query side): P50 / P99 (ms); the difference is all that reranking adds before it
  index size       bytes of the stored token vectors vs the rest of the generation (dense, BM25, chunks, graph)
  quality          nDCG@10 of hybrid and hybrid+rerank through ``ragheat eval``'s runner (--quality; a head trained
                    on these queries scores them optimistically: cross-validated figures come from
                    ``ragheat train-reranker --cv 5``)

Writes a results file (loadgen.resultsfile) to benchmarks/results/rerank.json, or to --json / --results-file.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from loadgen.resultsfile import BenchmarkRun
from rag.eval.beir import load_qrels, load_queries
from rag.eval.runner import evaluate
from rag.index.store import resolve_generation
from rag.pipeline import RagPipeline
from rag.rerank.firststage import FirstStageRecorder
from rag.rerank.reranker import load_reranker
from rag.settings import RagheatSettings


def _ms(values) -> dict:
    ms = np.asarray(values) * 1000.0
    return {"p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)), "n": int(len(ms))}


def main() -> None:
    run = BenchmarkRun("rerank")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", type=Path, required=True, help="an index built with stored token vectors")
    parser.add_argument("--beir", type=Path, required=True, help="the BEIR folder of its corpus (queries, qrels)")
    parser.add_argument("--split", default="train")
    parser.add_argument("--head", type=Path, default=None, help="the head (default: the shipped one)")
    parser.add_argument("--candidates", type=int, default=50)
    parser.add_argument("--queries", type=int, default=200, help="queries timed")
    parser.add_argument("--rounds", type=int, default=3, help="timings per query")
    parser.add_argument("--quality", action="store_true", help="also score hybrid and hybrid+rerank (nDCG@10)")
    parser.add_argument("--json", "--results-file", dest="json", type=Path, default=None)
    args = parser.parse_args()

    settings = RagheatSettings()
    settings.graph.enabled = False
    pipeline = RagPipeline(settings, args.index)
    pipeline.warm_up()
    reranker = load_reranker(pipeline.index.folder, pipeline.index.manifest, args.head, args.candidates)
    queries = load_queries(args.beir)
    qrels = load_qrels(args.beir, args.split)
    texts = [t for q, t in queries.items() if q in qrels][: args.queries]

    rerank_s, rerank_cpu_s, embed_s, embed_tokens_s = [], [], [], []
    with FirstStageRecorder(pipeline) as recorder:
        for text in texts:
            fused = pipeline.retrieve(text, args.candidates, ("dense", "bm25"))
            query = recorder.take(text)
            for _ in range(args.rounds):
                cpu = time.thread_time()
                rerank_s.append(reranker.rerank(query, fused.hits, 10).seconds)
                rerank_cpu_s.append(time.thread_time() - cpu)
    embedder = pipeline.embedder
    for _ in range(args.rounds):
        for text in texts:
            start = time.perf_counter()
            embedder.embed_query(text)
            embed_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            embedder.embed_query_tokens(text)
            embed_tokens_s.append(time.perf_counter() - start)

    folder = resolve_generation(args.index)
    block = pipeline.index.manifest["rerank"]
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    data = {"candidates": args.candidates, "queries": len(texts), "rounds": args.rounds,
            "rerank_ms": _ms(rerank_s), "rerank_cpu_ms": _ms(rerank_cpu_s), "embed_ms": _ms(embed_s), "embed_with_tokens_ms": _ms(embed_tokens_s),
            "index": {"rerank_bytes": block["bytes"], "other_bytes": total - block["bytes"], "dtype": block["dtype"],
                      "tokens": block["tokens"], "chunks": block["chunks"], "dim": block["dim"]},
            "head": reranker.head.meta.get("command")}
    if args.quality:
        judged = {q: t for q, t in queries.items() if q in qrels}
        report = evaluate(pipeline, judged, qrels, ["hybrid", "hybrid+rerank"], reranker=reranker)["retrievers"]
        data["ndcg@10"] = {name: m["ndcg@10"] for name, m in report.items()}
    pipeline.close()
    r, e, t, i = data["rerank_ms"], data["embed_ms"], data["embed_with_tokens_ms"], data["index"]
    c = data["rerank_cpu_ms"]
    print(f"rerank stage ({args.candidates} candidates): P50 {r['p50']:.2f} ms, P99 {r['p99']:.2f} ms wall; "
          f"CPU P50 {c['p50']:.2f} ms, P99 {c['p99']:.2f} ms")
    print(f"embed: P50 {e['p50']:.2f} / P99 {e['p99']:.2f} ms; with token states P50 {t['p50']:.2f} / "
          f"P99 {t['p99']:.2f} ms")
    print(f"index: token vectors {i['rerank_bytes'] / 2**20:.1f} MiB ({i['dtype']}, {i['tokens']} tokens) beside "
          f"{i['other_bytes'] / 2**20:.1f} MiB of the rest (x{(i['rerank_bytes'] + i['other_bytes']) / i['other_bytes']:.1f})")
    if "ndcg@10" in data:
        print("nDCG@10: " + ", ".join(f"{k} {v:.4f}" for k, v in data["ndcg@10"].items()))
    print(f"wrote {run.write(data, args.json)}")


if __name__ == "__main__":
    main()
