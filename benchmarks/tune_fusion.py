"""Grid-search the weighted-RRF constants on a BEIR split (tune on train only).

    .venv/bin/python benchmarks/tune_fusion.py --beir datasets/scifact --index data/index/scifact

Each retriever runs once per query (300 chunks deep); fusion is then re-scored for every grid cell,
so the grid costs seconds. Prints nDCG@10 per cell and the best cell, and writes
benchmarks/results/fusion.json (--json elsewhere) with the grid and, for the default cell, the best cell and
plain RRF, every query's nDCG@10: the renderer compares cells on the same queries (paired), so it can say when
a difference between two cells is smaller than its own noise.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

from loadgen.resultsfile import BenchmarkRun
from rag.eval.beir import load_qrels, load_queries, ndcg_at, score_run
from rag.pipeline import RagPipeline
from rag.retrieval.fusion import WeightedRRF
from rag.settings import RagheatSettings

DEPTH_CHUNKS = 300
PLAIN_RRF = (60.0, 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beir", type=Path, required=True)
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--split", default="train")
    parser.add_argument("--k", default="1,5,10,20,30,60,100")
    parser.add_argument("--bm25-weight", default="0.6,0.8,1.0,1.2,1.5,2.0")
    parser.add_argument("--json", type=Path, help="results file (default benchmarks/results/fusion.json)")
    args = parser.parse_args()
    run_record = BenchmarkRun("fusion")

    settings = RagheatSettings()
    pipeline = RagPipeline(settings, args.index)
    pipeline.warm_up()
    queries, qrels = load_queries(args.beir), load_qrels(args.beir, args.split)
    judged = {q: t for q, t in queries.items() if q in qrels}
    per_query = {}
    for qid, text in judged.items():
        vector = pipeline.embedder.embed_query(text).vector
        per_query[qid] = [pipeline.retrievers[name].retrieve(text, vector, DEPTH_CHUNKS) for name in ("dense", "bm25")]

    def ranking(fuser=None, only=None) -> dict[str, list[str]]:
        run = {}
        for qid, results in per_query.items():
            hits = results[only].hits if only is not None else fuser.fuse(results, DEPTH_CHUNKS).hits
            run[qid] = [doc for doc, _ in pipeline.chunk_hits_to_docs(hits)][:100]
        return run

    def fused(k: float, w: float) -> dict[str, list[str]]:
        return ranking(WeightedRRF({"dense": settings.retrieval.dense_weight, "bm25": w}, k=k))

    def per_query_ndcg(run: dict[str, list[str]]) -> dict[str, float]:
        return {qid: round(ndcg_at(run.get(qid, []), rel, 10), 6) for qid, rel in sorted(qrels.items())
                if any(g > 0 for g in rel.values())}

    alone = {"dense": score_run(ranking(only=0), qrels)["ndcg@10"], "bm25": score_run(ranking(only=1), qrels)["ndcg@10"]}
    print(f"dense alone {alone['dense']:.4f}   bm25 alone {alone['bm25']:.4f}")
    ks = [float(x) for x in args.k.split(",")]
    weights = [float(x) for x in args.bm25_weight.split(",")]
    grid = []
    for k, w in itertools.product(ks, weights):
        score = score_run(fused(k, w), qrels)["ndcg@10"]
        print(f"rrf_k={k:<6g} bm25_weight={w:<5g} nDCG@10={score:.4f}")
        grid.append({"rrf_k": k, "bm25_weight": w, "ndcg@10": score})
    best = max(grid, key=lambda cell: cell["ndcg@10"])
    print(f"best: rrf_k={best['rrf_k']:g} bm25_weight={best['bm25_weight']:g} nDCG@10={best['ndcg@10']:.4f}")
    default = (settings.retrieval.rrf_k, settings.retrieval.bm25_weight)
    cells = {"default": default, "best": (best["rrf_k"], best["bm25_weight"]), "plain_rrf": PLAIN_RRF}
    results = {"beir": str(args.beir), "split": args.split, "queries": len(per_query), "depth_chunks": DEPTH_CHUNKS,
               "dense_weight": settings.retrieval.dense_weight, "alone_ndcg@10": alone, "grid": grid,
               "cells": {name: {"rrf_k": k, "bm25_weight": w,
                                "ndcg@10": score_run(fused(k, w), qrels)["ndcg@10"],
                                "per_query_ndcg@10": per_query_ndcg(fused(k, w))}
                         for name, (k, w) in cells.items()},
               "index": pipeline.index.manifest["dense"], "chunks": pipeline.index.manifest["counts"]["chunks"],
               "model_precision": pipeline.index.manifest["model"]["precision"]}
    pipeline.close()
    print(f"wrote {run_record.write(results, args.json)}")


if __name__ == "__main__":
    main()
