"""Each rung of the quality ladder measured on a corpus's own questions: CPU per answer and latency of the served
path (``RagPipeline.query`` at the rung, one query at a time) and retrieval quality (nDCG@10 of the rung's ranking
against the corpus's relevance labels). ``ragheat measure-ladder`` runs it and writes the ladder file."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from rag.eval.beir import Qrels, score_run

RANKED_DOCS = 10  # nDCG@10
CHUNKS_PER_DOC = 3  # documents have several chunks: ask for more chunks than documents, then keep each doc's best


@dataclass(frozen=True)
class RungMeasurement:
    """One rung on one corpus."""

    level: str
    queries: int
    cpu_ms: float  # the process's CPU per answer (median of the rounds)
    p50_ms: float
    p99_ms: float
    ndcg_at_10: float
    recall_at_10: float

    def to_json(self) -> dict:
        return {"queries": self.queries, "cpu_ms": round(self.cpu_ms, 3), "p50_ms": round(self.p50_ms, 3),
                "p99_ms": round(self.p99_ms, 3), "ndcg@10": round(self.ndcg_at_10, 4),
                "recall@10": round(self.recall_at_10, 4)}


def measure_rungs(pipeline, levels: Sequence[str], queries: Mapping[str, str], qrels: Qrels, rounds: int = 3,
                  advance: Callable[[], None] | None = None) -> dict[str, RungMeasurement]:
    """Each rung of ``levels``: ``rounds`` passes of the answers (CPU is the median pass's per answer), the rungs
    taking turns within each round so that the machine's drift falls on all of them alike, then one pass of the
    rankings."""
    judged = {qid: text for qid, text in queries.items() if qid in qrels}
    if not judged:
        raise ValueError("no query with relevance labels to measure the rung on")
    texts = list(judged.values())
    latencies: dict[str, list[float]] = {level: [] for level in levels}
    cpu_per_answer: dict[str, list[float]] = {level: [] for level in levels}
    for _ in range(rounds):
        for level in levels:
            cpu_start = time.process_time()
            for text in texts:
                start = time.perf_counter()
                pipeline.query(text, 5, level=level)
                latencies[level].append(time.perf_counter() - start)
                if advance:
                    advance()
            cpu_per_answer[level].append((time.process_time() - cpu_start) / len(texts))
    measured = {}
    for level in levels:
        run = {}
        for qid, text in judged.items():
            context = pipeline.retrieve(text, RANKED_DOCS * CHUNKS_PER_DOC, level=level)
            run[qid] = [doc for doc, _ in pipeline.chunk_hits_to_docs(context.hits)][:RANKED_DOCS]
            if advance:
                advance()
        scores = score_run(run, {qid: qrels[qid] for qid in judged})
        ms = np.asarray(latencies[level]) * 1000
        measured[level] = RungMeasurement(level, len(judged), float(np.median(cpu_per_answer[level])) * 1000,
                                          float(np.percentile(ms, 50)), float(np.percentile(ms, 99)),
                                          float(scores["ndcg@10"]), float(scores["recall@10"]))
    return measured
