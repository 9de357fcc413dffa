"""The routes the router chooses between (``rag.stages.ROUTER_ARMS``): each is a set of retrievers with multipliers
of the configured fusion weights (``retrieval.dense_weight``, ``retrieval.bm25_weight``, ``graph.weight``), fixed a
priori, not tuned per dataset. A graph arm on a query that links no entity runs without the graph (no round trip),
and is named as its graph-less twin.

The router's choices are the arms, each with and without the reranker (``hybrid+graph+rerank``): the reranker lifts
some questions and lowers others (on multi-hop questions it undoes part of what the graph found), so whether to run
it is decided per query like the retrievers. A model trained before that choice existed picks arms alone."""

from __future__ import annotations

from rag.settings import RagheatSettings
from rag.stages import ROUTER_ARMS

ARM_MULTIPLIERS: dict[str, dict[str, float]] = {
    "hybrid": {"dense": 1.0, "bm25": 1.0},
    "hybrid+graph": {"dense": 1.0, "bm25": 1.0, "graph": 1.0},
    "bm25-heavy": {"dense": 1.0, "bm25": 2.0},
    "dense-heavy": {"dense": 2.0, "bm25": 1.0},
    "bm25-heavy+graph": {"dense": 1.0, "bm25": 2.0, "graph": 1.0},
}
assert tuple(ARM_MULTIPLIERS) == ROUTER_ARMS
assert all("dense" in m for m in ARM_MULTIPLIERS.values())  # a routed request embeds before it is routed

RERANKED = "+rerank"
"""The suffix of a choice that also runs the reranker over the arm's fused candidates."""
ROUTER_CHOICES = ROUTER_ARMS + tuple(arm + RERANKED for arm in ROUTER_ARMS)
"""What the router's model may be trained to pick: every arm, without and with the reranker."""
RERANK_COST = 0.5
"""A choice's cost in retrievers' worth when it reranks: ties between choices go to the one without the reranker."""


def split_choice(choice: str) -> tuple[str, bool]:
    """``"hybrid+graph+rerank"`` -> ``("hybrid+graph", True)``; ``"hybrid"`` -> ``("hybrid", False)``."""
    return (choice.removesuffix(RERANKED), True) if choice.endswith(RERANKED) else (choice, False)


def arm_weights(settings: RagheatSettings) -> dict[str, dict[str, float]]:
    """Arm -> {retriever: fusion weight} under ``settings``."""
    base = {"dense": settings.retrieval.dense_weight, "bm25": settings.retrieval.bm25_weight,
            "graph": settings.graph.weight}
    return {arm: {r: base[r] * m for r, m in multipliers.items()} for arm, multipliers in ARM_MULTIPLIERS.items()}


def without_graph(arm: str) -> str:
    """The arm that runs when ``arm``'s graph has nothing to expand: ``hybrid+graph`` -> ``hybrid``."""
    return arm.removesuffix("+graph")


def retrievers_run(arm: str, linked_any: bool) -> tuple[str, ...]:
    """The retrievers ``arm`` runs for a query that did (or did not) link an entity."""
    return tuple(r for r in ARM_MULTIPLIERS[arm] if r != "graph" or linked_any)
