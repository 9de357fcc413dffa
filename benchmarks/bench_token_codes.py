"""The reranker's stored token vectors, compressed: product codes (``rerank.token_dtype`` pq64 / pq32 / pq16) against
today's int8, on the same index, the same fused candidates and the same head.

Per set (default SciFact train and HotpotQA dev, hybrid + rerank, every judged query) and per dtype:

- size        bytes per token and per chunk of what the generation stores for reranking, and what a corpus of
              --at chunks of this set's mean length would hold (arithmetic from the measured bytes, not a run)
- build       seconds to learn the codebooks and code every token (what an ingest adds, on all cores)
- quality     nDCG@10 of hybrid + rerank, query by query against int8 (paired: mean difference, its standard error,
              queries better and worse)
- cost        the rerank stage alone over each query's real fused candidates (gather, decode, MaxSim, combine),
              wall and this thread's CPU, P50 / P99, the dtypes interleaved query by query

The product codes are learnt from the index's int8 vectors, as ``ragheat ingest`` learns them (rag/rerank/store.py:
the ingest keeps int8 vectors until all are in, then codes them), so the figures are what a re-ingest would serve.

    .venv/bin/python benchmarks/bench_token_codes.py --results-file benchmarks/results/token-codes.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import DEFAULT_SETS, SMOKE, p50_p99, parse_set  # noqa: E402
from loadgen.resultsfile import BenchmarkRun  # noqa: E402

CODES = ("pq64", "pq32", "pq16")
MAX_LOSS = 0.005  # the largest nDCG@10 loss against int8 a default may cost


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--set", dest="sets", action="append", default=None,
                   help=f"NAME=BEIR:SPLIT:INDEX (repeatable; default {' and '.join(DEFAULT_SETS)})")
    p.add_argument("--codes", default=",".join(CODES), help=f"comma list of {', '.join(CODES)}")
    p.add_argument("--queries", type=int, default=None, help="judged queries per set (default all)")
    p.add_argument("--cost-queries", type=int, default=200, help="queries whose rerank stage is timed")
    p.add_argument("--rounds", type=int, default=3, help="timed reranks per query and dtype")
    p.add_argument("--at", type=int, default=1_000_000, help="chunks of the corpus the sizes are scaled to")
    p.add_argument("--results-file", "--json", dest="results_file", type=Path,
                   default=Path("benchmarks/results/token-codes.json"))
    return p.parse_args(argv)


def measure_set(spec: str, codes: list[str], queries: int | None, cost_queries: int, rounds: int, at: int) -> dict:
    from rag.eval.beir import load_qrels, load_queries, ndcg_at
    from rag.eval.runner import run_retrieval
    from rag.pipeline import RagPipeline
    from rag.rerank.firststage import FirstStageRecorder
    from rag.rerank.reranker import LateInteractionReranker
    from rag.rerank.store import TokenVectors, product_bytes, product_quantize
    from rag.settings import RagheatSettings

    name, beir, split, index, _head = parse_set(spec)
    settings = RagheatSettings()
    settings.graph.enabled = False
    pipeline = RagPipeline(settings, index)
    pipeline.warm_up()
    served = pipeline.reranker
    stored = served.vectors
    if stored.scales is None:
        raise SystemExit(f"{index}: its token vectors are {pipeline.index.manifest['rerank']['dtype']}, not int8; "
                         "this benchmark codes int8 vectors")
    chunks, tokens = len(stored), int(stored.offsets[-1])
    rerankers = {"int8": served}
    sizes = {"int8": {"bytes_per_token": stored.codes.shape[1] + stored.scales.itemsize}}
    for dtype in codes:
        started = time.perf_counter()
        product_codes, product = product_quantize(np.asarray(stored.codes), stored.scales, product_bytes(dtype))
        build_s = time.perf_counter() - started
        vectors = TokenVectors(product_codes, stored.offsets, None, product)
        rerankers[dtype] = LateInteractionReranker(served.head, vectors, served.candidates)
        sizes[dtype] = {"bytes_per_token": product_codes.shape[1], "build_s": build_s,
                        "codebook_bytes": int(product.codebook.nbytes)}
    for dtype, size in sizes.items():
        size["bytes_per_chunk"] = size["bytes_per_token"] * tokens / chunks
        size[f"gib_at_{at}"] = size["bytes_per_chunk"] * at / 2**30

    qrels = load_qrels(beir, split)
    judged = {q: t for q, t in load_queries(beir).items() if q in qrels and any(g > 0 for g in qrels[q].values())}
    judged = dict(list(judged.items())[:queries]) if queries else judged
    ndcg = {}
    for dtype, reranker in rerankers.items():
        run, _, _ = run_retrieval(pipeline, judged, ("dense", "bm25", "rerank"), reranker=reranker)
        ndcg[dtype] = np.array([ndcg_at(run.get(q, []), qrels[q], 10) for q in judged])
        print(f"  {name} {dtype}: nDCG@10 {ndcg[dtype].mean():.4f}", flush=True)
    quality = {"int8": {"ndcg@10": float(ndcg["int8"].mean())}}
    for dtype in codes:
        diff = ndcg[dtype] - ndcg["int8"]
        quality[dtype] = {"ndcg@10": float(ndcg[dtype].mean()), "difference": float(diff.mean()),
                          "difference_se": float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else 0.0,
                          "better": int((diff > 1e-9).sum()), "worse": int((diff < -1e-9).sum())}

    wall = {dtype: [] for dtype in rerankers}
    cpu = {dtype: [] for dtype in rerankers}
    order = list(rerankers)
    with FirstStageRecorder(pipeline) as recorder:
        for i, text in enumerate(list(judged.values())[:cost_queries]):
            fused = pipeline.retrieve(text, served.candidates, ("dense", "bm25"), rerank=False)
            query = recorder.take(text)
            for r in range(rounds):
                shift = (i + r) % len(order)  # every dtype takes every place in the order
                for dtype in order[shift:] + order[:shift]:
                    started = time.thread_time()
                    wall[dtype].append(rerankers[dtype].rerank(query, fused.hits, 10).seconds)
                    cpu[dtype].append(time.thread_time() - started)
    pipeline.close()
    return {"beir": str(beir), "split": split, "index": str(index), "chunks": chunks, "tokens": tokens,
            "queries": len(judged), "candidates": served.candidates, "sizes": sizes, "quality": quality,
            "rerank_ms": {dtype: p50_p99(values) for dtype, values in wall.items()},
            "rerank_cpu_ms": {dtype: p50_p99(values) for dtype, values in cpu.items()}}


def choose(sets: dict, codes: list[str]) -> dict:
    """The smallest code whose nDCG@10 loss against int8 is within ``MAX_LOSS`` on every set."""
    from rag.rerank.store import product_bytes

    fitting = [dtype for dtype in codes
               if all(-s["quality"][dtype]["difference"] <= MAX_LOSS for s in sets.values())]
    smallest = min(fitting, key=product_bytes, default=None)
    return {"max_loss": MAX_LOSS, "within": fitting, "smallest_within": smallest}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    codes = [c.strip() for c in args.codes.split(",") if c.strip()]
    unknown = sorted(set(codes) - set(CODES))
    if unknown or not codes:
        raise SystemExit(f"--codes takes a comma list of {', '.join(CODES)}; got {args.codes!r}")
    queries = 20 if SMOKE else args.queries
    run = BenchmarkRun("token-codes")
    sets = {}
    for spec in args.sets or list(DEFAULT_SETS):
        name = parse_set(spec)[0]
        print(f"{name}: coding the token vectors as {', '.join(codes)}", flush=True)
        sets[name] = measure_set(spec, codes, queries, 10 if SMOKE else args.cost_queries,
                                 1 if SMOKE else args.rounds, args.at)
        s = sets[name]
        for dtype in ["int8", *codes]:
            print(f"  {name} {dtype}: {s['sizes'][dtype]['bytes_per_chunk'] / 1024:.1f} KiB a chunk, "
                  f"rerank P50 {s['rerank_ms'][dtype]['p50']:.2f} ms, nDCG@10 {s['quality'][dtype]['ndcg@10']:.4f}",
                  flush=True)
    data = {"codes": codes, "at_chunks": args.at, "sets": sets, "choice": choose(sets, codes)}
    print(f"within {MAX_LOSS} of int8 on every set: {data['choice']['within']}; smallest: "
          f"{data['choice']['smallest_within']}")
    run.write(data, args.results_file)
    print(f"wrote {args.results_file}")


if __name__ == "__main__":
    main()
