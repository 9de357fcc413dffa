"""Grid-search the weighted-RRF constants on a BEIR split (tune on train only).

    .venv/bin/python benchmarks/tune_fusion.py --beir datasets/scifact --index data/index/scifact

Each retriever runs once per query (300 chunks deep); fusion is then re-scored for every grid cell,
so the grid costs seconds. Prints nDCG@10 per cell and the best cell.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

from rag.eval.beir import load_qrels, load_queries, score_run
from rag.pipeline import RagPipeline
from rag.retrieval.fusion import WeightedRRF
from rag.settings import RagheatSettings

DEPTH_CHUNKS = 300


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beir", type=Path, required=True)
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--split", default="train")
    parser.add_argument("--k", default="1,5,10,20,30,60,100")
    parser.add_argument("--bm25-weight", default="0.6,0.8,1.0,1.2,1.5,2.0")
    args = parser.parse_args()

    settings = RagheatSettings()
    pipeline = RagPipeline(settings, args.index)
    pipeline.warm_up()
    queries, qrels = load_queries(args.beir), load_qrels(args.beir, args.split)
    judged = {q: t for q, t in queries.items() if q in qrels}
    per_query = {}
    for qid, text in judged.items():
        vector = pipeline.embedder.embed_query(text).vector
        per_query[qid] = [pipeline.retrievers[name].retrieve(text, vector, DEPTH_CHUNKS) for name in ("dense", "bm25")]

    def ndcg(fuser=None, only=None) -> float:
        run = {}
        for qid, results in per_query.items():
            hits = results[only].hits if only is not None else fuser.fuse(results, DEPTH_CHUNKS).hits
            run[qid] = [doc for doc, _ in pipeline.chunk_hits_to_docs(hits)][:100]
        return score_run(run, qrels)["ndcg@10"]

    print(f"dense alone {ndcg(only=0):.4f}   bm25 alone {ndcg(only=1):.4f}")
    best = (0.0, None)
    for k, w in itertools.product([float(x) for x in args.k.split(",")],
                                  [float(x) for x in args.bm25_weight.split(",")]):
        score = ndcg(WeightedRRF({"dense": 1.0, "bm25": w}, k=k))
        print(f"rrf_k={k:<6g} bm25_weight={w:<5g} nDCG@10={score:.4f}")
        best = max(best, (score, (k, w)), key=lambda b: b[0])
    print(f"best: rrf_k={best[1][0]:g} bm25_weight={best[1][1]:g} nDCG@10={best[0]:.4f}")


if __name__ == "__main__":
    main()
