"""``ragheat eval``: run the query path's retrieval on BEIR queries and score it against the qrels."""

from __future__ import annotations

import time
from typing import Mapping, Sequence

import numpy as np

from rag.eval.beir import Qrels, score_run
from rag.pipeline import RagPipeline

RETRIEVER_SETS = {"dense": ("dense",), "bm25": ("bm25",), "hybrid": ("dense", "bm25")}
DEPTH = 100  # documents per query, enough for recall@100


def parse_retriever_sets(spec: str) -> list[str]:
    """``dense,bm25,hybrid`` -> named retriever lists; a sentence naming ``--retrievers`` when invalid."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in RETRIEVER_SETS]
    if unknown or not names:
        raise ValueError(f"--retrievers takes a comma list of {', '.join(RETRIEVER_SETS)}; got {spec!r}")
    return names


def run_retrieval(pipeline: RagPipeline, queries: Mapping[str, str], retrievers: Sequence[str],
                  depth: int = DEPTH, advance=None) -> tuple[dict[str, list[str]], list[float]]:
    """Ranked document ids per query and the per-query retrieval latency (seconds)."""
    run: dict[str, list[str]] = {}
    latencies: list[float] = []
    # Documents have several chunks: ask for more chunks than documents, then keep each doc's best.
    chunk_depth = depth * 3
    for qid, text in queries.items():
        start = time.perf_counter()
        fused = pipeline.retrieve(text, chunk_depth, retrievers)
        latencies.append(time.perf_counter() - start)
        run[qid] = [doc for doc, _ in pipeline.chunk_hits_to_docs(fused.hits)][:depth]
        if advance:
            advance()
    return run, latencies


def evaluate(pipeline: RagPipeline, queries: Mapping[str, str], qrels: Qrels, sets: Sequence[str],
             progress=None) -> dict:
    """``{"retrievers": {name: {metrics..., "latency_ms": {"p50", "p99"}}}}`` for each named set."""
    judged = {qid: text for qid, text in queries.items() if qid in qrels}
    report: dict = {"queries": len(judged), "retrievers": {}}
    for name in sets:
        advance = None
        if progress is not None:
            task = progress.add_task(f"eval {name}", total=len(judged))
            advance = lambda: progress.advance(task)  # noqa: E731
        run, latencies = run_retrieval(pipeline, judged, RETRIEVER_SETS[name], advance=advance)
        metrics = score_run(run, qrels)
        ms = np.asarray(latencies) * 1000.0
        metrics["latency_ms"] = {"p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99))}
        report["retrievers"][name] = metrics
    return report
