"""Training the router (``ragheat train-router``) from per-query outcomes on BEIR training splits.

For every judged query of every dataset: link its entities, run dense, BM25 and (when it linked one) the graph once
at eval depth, fuse them per arm exactly as a ``routed`` request would (same fusers, same depth), rerank each arm's
fused candidates as the service would (when the pipeline has the reranker: ``rag.routing.arms.ROUTER_CHOICES``), and
score each choice's document ranking (nDCG@10). A query's label is its best choice, ties going to the one that runs
fewer retrievers and no reranker; its weight is best - worst nDCG@10 (a query where every choice ties teaches
nothing). Features: ``rag.routing.features``.

The regularisation is chosen by cross-validation on the training data only; the figures reported for the router are
nested cross-validation (5 folds stratified by dataset, repeated with ``repeats`` seeds, L2 chosen by an inner 3-fold
CV of each outer training part), so no reported figure comes from a query the model was fitted on.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from rag.eval.beir import Qrels, ndcg_at, recall_at
from rag.types import NO_ENTITIES
from rag.pipeline import RagPipeline
from rag.rerank.features import RerankQuery
from rag.routing.arms import ARM_MULTIPLIERS, RERANK_COST, RERANKED, ROUTER_CHOICES, retrievers_run, without_graph
from rag.routing.features import FEATURE_NAMES, lexical_features
from rag.routing.model import RouterModel, best_arm_labels, fit_logistic

ARMS = tuple(ARM_MULTIPLIERS)
L2_GRID = (0.3, 3.0, 30.0, 300.0, 3000.0, 30000.0)
CHUNK_DEPTH = 300  # what ``ragheat eval`` asks for: 100 documents x 3 chunks


@dataclass
class OutcomeTable:
    """Per query of one dataset: features, each choice's nDCG@10 and recall@10, and each choice's cost (retrievers
    run, ``RERANK_COST`` more when it reranks)."""

    name: str
    qids: list[str]
    features: np.ndarray  # (queries, features)
    ndcg: np.ndarray  # (queries, choices)
    recall: np.ndarray  # (queries, choices)
    costs: np.ndarray  # (queries, choices)
    linked: np.ndarray  # (queries,) bool
    choices: tuple[str, ...] = ARMS


def collect_outcomes(pipeline: RagPipeline, name: str, queries: Mapping[str, str], qrels: Qrels,
                     advance: Callable[[], None] | None = None) -> OutcomeTable:
    """Every choice's outcome on every judged query, through ``pipeline``'s own retrievers, route fusers and (when
    it has one) reranker."""
    if pipeline.graph_retriever is None:
        raise ValueError(f"{name}: the index has no knowledge graph; the router is trained with graph arms")
    judged = [(q, t) for q, t in queries.items() if q in qrels and any(g > 0 for g in qrels[q].values())]
    depth = max(CHUNK_DEPTH, pipeline.settings.retrieval.candidates)
    idf, analyzer = pipeline.index.idf, pipeline.retrievers["bm25"].analyzer
    reranker = pipeline.reranker
    choices = ROUTER_CHOICES if reranker is not None else ARMS
    rows = []
    for qid, text in judged:
        if reranker is not None:  # one model run: the pooled vector and the token states, as a reranked request
            embedded, states = pipeline.embedder.embed_query_tokens(text)
        else:
            embedded, states = pipeline.embedder.embed_query(text), None
        vector = embedded.vector
        linked = pipeline.linker.link(text, vector) if pipeline.linker is not None else NO_ENTITIES
        lists = {r: pipeline.retrievers[r].retrieve(text, vector, depth) for r in ("dense", "bm25")}
        if linked.seeds:
            lists["graph"] = pipeline.graph_retriever.retrieve(linked, depth)
        rankings, cost = [], []
        for arm in ARMS:
            names = retrievers_run(arm, bool(linked.seeds))
            fuser = pipeline._route_fusers[arm if linked.seeds else without_graph(arm)]
            rankings.append((fuser.fuse([lists[r] for r in names], depth).hits, names))
            cost.append(len(names))
        if reranker is not None:
            for hits, names in list(rankings):
                first_stage = RerankQuery(states, {r: lists[r].hits for r in names})
                rankings.append((reranker.rerank(first_stage, hits, depth).hits, names))
                cost.append(len(names) + RERANK_COST)
        docs = [[doc for doc, _ in pipeline.chunk_hits_to_docs(hits)][:100] for hits, _ in rankings]
        rows.append((qid, lexical_features(text, linked, idf, analyzer), [ndcg_at(d, qrels[qid], 10) for d in docs],
                     [recall_at(d, qrels[qid], 10) for d in docs], cost, bool(linked.seeds)))
        if advance is not None:
            advance()
    return OutcomeTable(name, [r[0] for r in rows], np.array([r[1] for r in rows]).reshape(len(rows), -1),
                        np.array([r[2] for r in rows]), np.array([r[3] for r in rows]), np.array([r[4] for r in rows]),
                        np.array([r[5] for r in rows], bool), choices)


def stratified_folds(groups: np.ndarray, k: int, seed: int) -> list[np.ndarray]:
    """``k`` folds with each group (dataset) spread evenly over them, shuffled by ``seed``."""
    rng = np.random.default_rng(seed)
    folds: list[list[int]] = [[] for _ in range(k)]
    for group in np.unique(groups):
        for i, j in enumerate(rng.permutation(np.flatnonzero(groups == group))):
            folds[i % k].append(int(j))
    return [np.array(sorted(f), int) for f in folds]


def _fit(X, ndcg, costs, rows, l2, choices: Sequence[str] = ARMS) -> RouterModel:
    labels, weight = best_arm_labels(ndcg[rows], costs[rows])
    return fit_logistic(X[rows], labels, weight, choices, FEATURE_NAMES, l2=l2)


def choose_l2(X, ndcg, costs, groups, rows: np.ndarray, seed: int, folds: int = 3,
              choices: Sequence[str] = ARMS) -> float:
    """The L2 of ``L2_GRID`` with the best mean nDCG@10 by ``folds``-fold CV within ``rows`` (ties: the larger)."""
    best, best_score = L2_GRID[-1], -1.0
    for l2 in L2_GRID:
        scores = []
        for test in stratified_folds(groups[rows], folds, seed):
            train = np.setdiff1d(np.arange(len(rows)), test)
            picks = _fit(X, ndcg, costs, rows[train], l2, choices).predict(X[rows[test]])
            scores.append(ndcg[rows[test], picks].mean())
        if np.mean(scores) >= best_score - 1e-12:
            best, best_score = l2, float(np.mean(scores))
    return best


def train_router(tables: Sequence[OutcomeTable], *, repeats: int = 5, seed: int = 0, folds: int = 5,
                 progress: Callable[[str], None] | None = None) -> tuple[RouterModel, dict]:
    """The model fitted on every query (L2 chosen as the nested CV chose most often) and the report: fixed choices,
    the graph-if-linked rules, the oracle, and the router's nested-CV figures per dataset."""
    choices = tables[0].choices
    if any(t.choices != choices for t in tables):
        raise ValueError("every training set must be scored with the same choices (the reranker on for all or none)")
    X = np.concatenate([t.features for t in tables])
    ndcg = np.concatenate([t.ndcg for t in tables])
    recall = np.concatenate([t.recall for t in tables])
    costs = np.concatenate([t.costs for t in tables])
    linked = np.concatenate([t.linked for t in tables])
    groups = np.concatenate([np.full(len(t.qids), i) for i, t in enumerate(tables)])
    bounds = np.cumsum([0] + [len(t.qids) for t in tables])
    rows_all = np.arange(len(groups))
    picks_per_repeat, chosen = [], []
    for repeat in range(repeats):
        picks = np.zeros(len(groups), int)
        for test in stratified_folds(groups, folds, seed + repeat):
            train = np.setdiff1d(rows_all, test)
            l2 = choose_l2(X, ndcg, costs, groups, train, seed + 100 + repeat, choices=choices)
            chosen.append(l2)
            picks[test] = _fit(X, ndcg, costs, train, l2, choices).predict(X[test])
        picks_per_repeat.append(picks)
        if progress is not None:
            progress(f"nested CV repeat {repeat + 1}/{repeats}")
    counts = Counter(chosen)
    l2 = max(counts, key=lambda value: (counts[value], value))
    model = _fit(X, ndcg, costs, rows_all, l2, choices)

    rules = {"graph_if_linked": np.where(linked, choices.index("hybrid+graph"), choices.index("hybrid"))}
    if "hybrid" + RERANKED in choices:  # the graph's answer kept as fused, the reranker on the others
        rules["graph_if_linked_else_rerank"] = np.where(linked, choices.index("hybrid+graph"),
                                                        choices.index("hybrid" + RERANKED))
    report: dict = {"arms": list(choices), "features": list(FEATURE_NAMES), "l2": l2,
                    "l2_chosen_by_nested_cv": {str(k): v for k, v in sorted(counts.items())},
                    "repeats": repeats, "folds": folds, "seed": seed, "datasets": {}}
    for t, lo, hi in zip(tables, bounds[:-1], bounds[1:]):
        rows = np.arange(lo, hi)

        def figures(pick: np.ndarray) -> dict:
            return {"ndcg@10": float(ndcg[rows, pick].mean()), "recall@10": float(recall[rows, pick].mean()),
                    "retrievers_per_query": float(costs[rows, pick].mean())}

        cv = [figures(p[rows]) for p in picks_per_repeat]
        shares = np.mean([np.bincount(p[rows], minlength=len(choices)) / len(rows) for p in picks_per_repeat], axis=0)
        report["datasets"][t.name] = {
            "queries": len(rows), "linked": float(linked[rows].mean()),
            "fixed": {arm: figures(np.full(len(rows), j)) for j, arm in enumerate(choices)},
            **{name: figures(rule[rows]) for name, rule in rules.items()},
            "oracle_ndcg@10": float(ndcg[rows].max(axis=1).mean()),
            "router_nested_cv": {**{k: float(np.mean([c[k] for c in cv])) for k in cv[0]},
                                 "ndcg@10_std_over_repeats": float(np.std([c["ndcg@10"] for c in cv])),
                                 "routes": {arm: float(s) for arm, s in zip(choices, shares)}},
            "router_in_sample": figures(model.predict(X[rows])),
        }
    return model, report
