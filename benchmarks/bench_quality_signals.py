"""How well the label-free quality signals (rag/quality) track real quality, and what moves them.

For each judged set, every query is retrieved as the service retrieves it (default retrievers, reranked), and its
signals are set beside its nDCG@10 from the human labels:

- ``sets``: per signal, Spearman's rank correlation with nDCG@10 and the area under the ROC curve for telling the
  queries with nDCG@10 = 0 (nothing relevant in the top ten) apart (a signal below 0.5 points the wrong way); for
  the ``no_good_passage`` flag (best similarity under the calibration's threshold), its rate, precision and recall
  for nDCG@10 = 0.
- ``held_out``: the threshold calibrated on half of the queries (both sets pooled), the flag rate on the other half,
  over ``--rounds`` random halves: what the calibrated rate becomes on questions it was not fitted to.
- ``cost_us`` (per set): what measuring one answer's signals and verdict takes, in microseconds.
- ``shifted``: traffic and indexes that went wrong, each against its own set's normal traffic: the other set's
  questions (out of domain); the dense search in another embedding space (a random rotation of the query vector:
  an index built by another encoder); the dense hits attached to the wrong chunks (a random permutation: shuffled
  vectors). Per case: the flag rate and each signal's median.

    .venv/bin/python benchmarks/bench_quality_signals.py --results-file benchmarks/results/quality-signals.json
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from benchmarks.common import DEFAULT_SETS, SMOKE, parse_set  # noqa: E402
from loadgen.resultsfile import BenchmarkRun  # noqa: E402

DEPTH = 30  # chunks retrieved per query: documents have several chunks; the first ten documents are scored


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--set", dest="sets", action="append", default=None,
                   help="NAME=BEIR:SPLIT:INDEX (repeatable; default SciFact train and HotpotQA dev)")
    p.add_argument("--rounds", type=int, default=20, help="random halves of the held-out flag rate")
    p.add_argument("--limit", type=int, default=None, help="queries per set (default: all judged ones)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--results-file", type=Path, default=None,
                   help="write a benchmark results file (loadgen/resultsfile.py) here")
    return p.parse_args(argv)


class RotatedQueries:
    """The dense retriever searching with the query rotated into another space: an index another encoder built."""

    def __init__(self, inner, dim: int, seed: int) -> None:
        q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((dim, dim)))
        self.inner, self.rotation, self.name = inner, q.astype(np.float32), inner.name

    def retrieve(self, query, vector, k, **options):
        return self.inner.retrieve(query, (self.rotation @ np.asarray(vector, np.float32)).astype(np.float32), k,
                                   **options)


class ShuffledChunks:
    """The dense retriever's hits attached to the wrong chunks: an index whose vectors were shuffled."""

    def __init__(self, inner, chunks: int, seed: int) -> None:
        self.inner, self.name = inner, inner.name
        self.permutation = np.random.default_rng(seed).permutation(chunks)

    def retrieve(self, query, vector, k, **options):
        result = self.inner.retrieve(query, vector, k, **options)
        hits = [dataclasses.replace(h, chunk_id=int(self.permutation[h.chunk_id])) for h in result.hits]
        return dataclasses.replace(result, hits=hits)


def run(pipeline, texts, qrels_by_text=None) -> list[dict]:
    """Per query: its signals (and nDCG@10 when labelled)."""
    from rag.eval.beir import ndcg_at
    from rag.quality.signals import of_context

    rows = []
    threshold = pipeline.quality.min_similarity
    for text, relevant in zip(texts, qrels_by_text or [None] * len(texts)):
        context = pipeline.retrieve(text, DEPTH)
        start = time.perf_counter_ns()
        signals = of_context(context, min_similarity=threshold)
        row = {"verdict": signals.verdict, "cost_us": (time.perf_counter_ns() - start) / 1000, **signals.values()}
        if relevant is not None:
            docs = [doc for doc, _ in pipeline.chunk_hits_to_docs(context.hits)][:10]
            row["ndcg@10"] = ndcg_at(docs, relevant, 10)
        rows.append(row)
    return rows


def correlations(rows: list[dict]) -> dict:
    from scipy.stats import spearmanr
    from sklearn.metrics import roc_auc_score

    from rag.quality.signals import RERANK_SIGNALS, UNIT_SIGNALS

    ndcg = np.array([r["ndcg@10"] for r in rows])
    zero = ndcg == 0
    found = {}
    for signal in UNIT_SIGNALS + RERANK_SIGNALS:
        pairs = [(r[signal], n) for r, n in zip(rows, ndcg) if signal in r]
        if len(pairs) < 20:
            continue
        values, scores = map(np.array, zip(*pairs))
        rho = spearmanr(values, scores)
        zeros = scores == 0
        found[signal] = {"queries": len(pairs), "spearman": float(rho.statistic), "p_value": float(rho.pvalue),
                         "auc_zero": float(roc_auc_score(zeros, -values)) if 0 < zeros.sum() < len(zeros) else None}
    flagged = np.array([r["verdict"] == "no_good_passage" for r in rows])
    return {"queries": len(rows), "ndcg@10": float(ndcg.mean()), "zero_share": float(zero.mean()),
            "zero_queries": int(zero.sum()), "signals": found,
            "flag": {"rate": float(flagged.mean()), "flagged": int(flagged.sum()),
                     "precision_zero": float(zero[flagged].mean()) if flagged.any() else None,
                     "recall_zero": float(flagged[zero].mean()) if zero.any() else None}}


def held_out(similarities: list[float], flag_rate: float, rounds: int, seed: int) -> dict:
    """The flag rate on the half of the queries the threshold was not calibrated on, over random halves."""
    values, rng, rates = np.asarray(similarities), np.random.default_rng(seed), []
    for _ in range(rounds):
        order = rng.permutation(len(values))
        fit, check = values[order[: len(values) // 2]], values[order[len(values) // 2:]]
        rates.append(float((check < np.quantile(fit, flag_rate)).mean()))
    return {"rounds": rounds, "flag_rate": flag_rate, "rates": rates}


def summary(rows: list[dict]) -> dict:
    from rag.quality.signals import QUALITY_SIGNALS

    medians = {s: float(statistics.median(v)) for s in QUALITY_SIGNALS
               if (v := [r[s] for r in rows if s in r])}
    return {"queries": len(rows), "flag_rate": float(np.mean([r["verdict"] == "no_good_passage" for r in rows])),
            "medians": medians}


def main(argv: list[str] | None = None) -> None:
    from rich.progress import track

    from rag.eval.beir import load_qrels, load_queries
    from rag.pipeline import RagPipeline
    from rag.settings import RagheatSettings

    args = parse_args(argv)
    limit = 40 if SMOKE else args.limit
    record = BenchmarkRun("quality-signals")
    settings = RagheatSettings()
    sets = [parse_set(spec)[:4] for spec in (args.sets or DEFAULT_SETS)]
    questions = {}
    for name, beir, split, _index in sets:
        queries, qrels = load_queries(beir), load_qrels(beir, split)
        judged = [(text, qrels[qid]) for qid, text in queries.items() if qid in qrels][:limit]
        questions[name] = judged
    data: dict = {"sets": {}, "shifted": {}, "depth": DEPTH}
    pooled = []
    for name, _beir, _split, index in sets:
        pipeline = RagPipeline(settings, index)
        pipeline.warm_up()
        try:
            data["threshold"] = pipeline.quality.min_similarity
            data["flag_rate"] = pipeline.quality.calibration.flag_rate
            texts, relevant = zip(*questions[name])
            rows = run(pipeline, list(track(texts, description=f"{name}")), list(relevant))
            data["sets"][name] = correlations(rows)
            data["sets"][name]["cost_us"] = [r["cost_us"] for r in rows]
            pooled += [r["best_similarity"] for r in rows if "best_similarity" in r]
            cases = {"normal": rows}
            for other, judged in questions.items():
                if other != name:
                    cases[f"{other} questions"] = run(pipeline, [t for t, _ in judged])
            dense = pipeline.retrievers["dense"]
            dim = pipeline.embedder.dimension
            for case, wrapper in (("another encoder's space", RotatedQueries(dense, dim, args.seed)),
                                  ("shuffled vectors", ShuffledChunks(dense, len(pipeline.index.chunks), args.seed))):
                pipeline.retrievers["dense"] = wrapper
                try:
                    cases[case] = run(pipeline, list(texts))
                finally:
                    pipeline.retrievers["dense"] = dense
            data["shifted"][name] = {case: summary(r) for case, r in cases.items()}
        finally:
            pipeline.close()
    data["held_out"] = held_out(pooled, data["flag_rate"], args.rounds, args.seed)
    path = record.write(data, args.results_file)
    for name, s in data["sets"].items():
        print(f"{name}: nDCG@10 {s['ndcg@10']:.3f}, {s['zero_queries']} with nothing relevant; flag rate "
              f"{s['flag']['rate']:.3f}; "
              + ", ".join(f"{k} rho {v['spearman']:+.2f}" for k, v in s["signals"].items()))
    for name, cases in data["shifted"].items():
        print(name + ": " + "; ".join(f"{case} flagged {c['flag_rate']:.0%}" for case, c in cases.items()))
    print(f"held out: flag rate median {statistics.median(data['held_out']['rates']):.3f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
