"""The service's default against every fixed configuration, per set: the router picks each question's retrievers and
whether the reranker runs (``retrieval.retrievers=routed``, the default), and the default should be within reach of
the best fixed configuration on every set, where no fixed configuration is.

Per set (default SciFact train and HotpotQA dev), every judged question through the same code as ``ragheat eval``
(``run_retrieval``, ``score_run``), with the service's default settings:

- fixed       hybrid, hybrid+rerank (the default before the router chose the reranker), hybrid+graph,
              hybrid+graph+rerank
- default     what the service serves by default (``ragheat eval --retrievers default``)

nDCG@10, recall@10, in-process P50 / P99 of retrieval, the share of questions the graph and the reranker ran for,
and each question's nDCG@10 so the page pairs the default with the best fixed configuration question by question.
The router was trained on these very questions, so the default's figure here is in-sample; the shipped model's own
nested cross-validation figures (``ragheat train-router``'s report, kept in its metadata: no question scored by a
model fitted on it) are copied beside them and are the ones the target is read on.

    .venv/bin/python benchmarks/bench_routing.py --results-file benchmarks/results/routing.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import DEFAULT_SETS, SMOKE, p50_p99, parse_set  # noqa: E402
from loadgen.resultsfile import BenchmarkRun  # noqa: E402

FIXED = ("hybrid", "hybrid+rerank", "hybrid+graph", "hybrid+graph+rerank")
PREVIOUS_DEFAULT = "hybrid+rerank"
MAX_GAP = 0.005  # how far below the best fixed configuration the default may be, on every set


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--set", dest="sets", action="append", default=None, metavar="NAME=BEIR:SPLIT:INDEX",
                   help=f"default: {' and '.join(DEFAULT_SETS)}")
    p.add_argument("--results-file", "--json", dest="results_file", type=Path,
                   default=Path("benchmarks/results/routing.json"))
    return p.parse_args(argv)


def measure_set(spec: str) -> dict:
    from rag.eval.beir import load_qrels, load_queries, ndcg_at, score_run
    from rag.eval.runner import DEFAULT, parse_retriever_sets, run_retrieval
    from rag.pipeline import RagPipeline
    from rag.settings import RagheatSettings

    name, beir, split, index, _ = parse_set(spec)
    settings = RagheatSettings()
    qrels = load_qrels(beir, split)
    judged = {qid: text for qid, text in load_queries(beir).items() if qid in qrels}
    if SMOKE:
        judged = dict(list(judged.items())[:40])
    pipeline = RagPipeline(settings, index)
    pipeline.warm_up()
    out: dict = {"split": split, "queries": len(judged), "configurations": {}}
    try:
        for label, retrievers in parse_retriever_sets(",".join((*FIXED, DEFAULT)), settings).items():
            print(f"  {name}: {label}", flush=True)
            run, latencies, runs = run_retrieval(pipeline, judged, retrievers)
            metrics = score_run(run, {q: qrels[q] for q in judged})
            out["configurations"][label] = {
                "retrievers": list(retrievers), "ndcg@10": metrics["ndcg@10"], "recall@10": metrics["recall@10"],
                "latency_ms": p50_p99(latencies),
                "graph_ran_share": float(np.mean(["graph" in r.retrieved for r in runs])),
                "reranked_share": float(np.mean([r.reranked is not None for r in runs])),
                "per_query_ndcg@10": {q: ndcg_at(run.get(q, []), qrels[q], 10) for q in judged}}
        router = pipeline.router.model.metadata if pipeline.router is not None else {}
    finally:
        pipeline.close()
    out["default_retrievers"] = list(settings.retrieval.retrievers)
    trained = router.get("report", {}).get("datasets", {}).get(name)
    if trained is not None:  # the shipped router's nested cross-validation on this set
        out["router_nested_cv"] = {
            "ndcg@10": trained["router_nested_cv"]["ndcg@10"],
            "ndcg@10_std_over_repeats": trained["router_nested_cv"]["ndcg@10_std_over_repeats"],
            "routes": trained["router_nested_cv"]["routes"],
            "fixed": {choice: f["ndcg@10"] for choice, f in trained["fixed"].items()},
            "oracle_ndcg@10": trained["oracle_ndcg@10"], "queries": trained["queries"]}
        out["router_trained"] = router.get("trained", {}).get("command")
    return out


def verdict(sets: dict) -> dict:
    """Per set, the default's gap to the best fixed configuration (in the router's nested CV when it has this set,
    else as measured here), and whether every set is within ``MAX_GAP``."""
    gaps = {}
    for name, s in sets.items():
        cv = s.get("router_nested_cv")
        if cv is not None:
            best = max(cv["fixed"], key=cv["fixed"].get)
            gaps[name] = {"read_on": "nested_cv", "best_fixed": best,
                          "gap": cv["ndcg@10"] - cv["fixed"][best]}
        else:
            fixed = {k: v["ndcg@10"] for k, v in s["configurations"].items() if k in FIXED}
            best = max(fixed, key=fixed.get)
            gaps[name] = {"read_on": "measured", "best_fixed": best,
                          "gap": s["configurations"]["default"]["ndcg@10"] - fixed[best]}
    return {"max_gap": MAX_GAP, "sets": gaps, "met": all(g["gap"] >= -MAX_GAP for g in gaps.values())}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    run = BenchmarkRun("routing")
    sets = {}
    for spec in args.sets or list(DEFAULT_SETS):
        name = parse_set(spec)[0]
        sets[name] = s = measure_set(spec)
        for label, c in s["configurations"].items():
            print(f"  {name} {label}: nDCG@10 {c['ndcg@10']:.4f}, reranked {c['reranked_share']:.0%}, graph "
                  f"{c['graph_ran_share']:.0%}, P50 {c['latency_ms']['p50']:.2f} ms", flush=True)
    data = {"fixed": list(FIXED), "previous_default": PREVIOUS_DEFAULT, "sets": sets, "verdict": verdict(sets)}
    for name, g in data["verdict"]["sets"].items():
        print(f"{name}: default {g['gap']:+.4f} nDCG@10 against the best fixed ({g['best_fixed']}, {g['read_on']})")
    run.write(data, args.results_file)
    print(f"wrote {args.results_file}")


if __name__ == "__main__":
    main()
