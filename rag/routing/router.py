"""``LogisticRouter``: the ``Router`` the pipeline runs as stage ``route`` for ``routed`` requests."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Mapping

import numpy as np

from rag.errors import IndexLoadError
from rag.retrieval.lexical import LexicalAnalyzer
from rag.routing.arms import ARM_MULTIPLIERS, ROUTER_CHOICES, split_choice, without_graph
from rag.routing.features import FEATURE_NAMES, lexical_features
from rag.routing.model import RouterModel
from rag.types import LinkedEntities, Route

SHIPPED_MODEL = Path(__file__).with_name("router.npz")
"""Trained on hotpotqa-dev and SciFact train (its ``metadata`` records the command, data, seed and figures)."""


class LogisticRouter:
    """Picks the choice the model scores highest among those that can run here (no graph arm without a graph, no
    reranked choice without the reranker), then drops the graph from it when the query linked no entity. A model
    whose choices never rerank leaves the reranker as the request asked (``Route.rerank`` True)."""

    def __init__(self, model: RouterModel, weights: Mapping[str, Mapping[str, float]], idf: Mapping[str, float],
                 analyzer: LexicalAnalyzer, available: set[str], can_rerank: bool = True) -> None:
        self.model, self.weights, self.idf, self.analyzer = model, weights, idf, analyzer
        self.choices = [split_choice(choice) for choice in model.arms]
        self.decides_rerank = any(rerank for _, rerank in self.choices)
        self.allowed = np.array([set(ARM_MULTIPLIERS[arm]) <= available and (can_rerank or not rerank)
                                 for arm, rerank in self.choices])
        # A request that may not rerank (its level, or rerank off) picks among the choices without the reranker.
        self.without_rerank = self.allowed & np.array([not rerank for _, rerank in self.choices])
        if not self.without_rerank.any():
            raise ValueError(f"no route of the router model can run with the retrievers {sorted(available)} without "
                             f"the reranker")

    @classmethod
    def load(cls, path: Path | None, weights, idf, analyzer, available: set[str],
             can_rerank: bool = True) -> "LogisticRouter":
        model = RouterModel.load(path or SHIPPED_MODEL, arms=ROUTER_CHOICES, features=FEATURE_NAMES)
        try:
            return cls(model, weights, idf, analyzer, available, can_rerank)
        except ValueError as exc:
            raise IndexLoadError(path or SHIPPED_MODEL, str(exc)) from None

    def route(self, query: str, linked: LinkedEntities, rerank: bool = True) -> Route:
        started = time.perf_counter()
        x = lexical_features(query, linked, self.idf, self.analyzer)
        allowed = self.allowed if rerank else self.without_rerank
        arm, rerank = self.choices[int(self.model.predict(x, allowed)[0])]
        if not linked.seeds:
            arm = without_graph(arm)  # nothing to expand: no graph stage, no round trip
        weights = self.weights[arm]
        return Route(arm, tuple(weights), dict(weights), time.perf_counter() - started,
                     rerank=rerank or not self.decides_rerank)
