"""The router: retriever names, features, the logistic model (deterministic training, a checked file), labels from
outcomes, nested cross-validation, and the model shipped with the code."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rag.errors import IndexLoadError
from rag.retrieval.lexical import LexicalAnalyzer
from rag.routing.arms import (ARM_MULTIPLIERS, RERANKED, ROUTER_CHOICES, arm_weights, retrievers_run, split_choice,
                              without_graph)
from rag.routing.features import FEATURE_NAMES, lexical_features
from rag.routing.model import RouterModel, best_arm_labels, fit_logistic
from rag.routing.names import expand, parse_eval_names, route_label
from rag.routing.router import SHIPPED_MODEL, LogisticRouter
from rag.routing.train import ARMS, OutcomeTable, stratified_folds, train_router
from rag.settings import RagheatSettings
from rag.stages import RETRIEVAL_ROUTES, ROUTER_ARMS
from rag.types import LinkedEntities


@pytest.mark.parametrize("names, expected", [
    (["dense"], ("dense",)), (["bm25", "dense"], ("dense", "bm25")), (["hybrid"], ("dense", "bm25")),
    (["hybrid+graph"], ("dense", "bm25", "graph")), ("bm25+graph", ("bm25", "graph")),
    (["graph", "hybrid"], ("dense", "bm25", "graph")), (["routed"], ("routed",)),
])
def test_names_expand_to_retrievers_in_one_order(names, expected):
    assert expand(names) == expected


@pytest.mark.parametrize("names, reason", [
    (["splade"], "unknown retriever 'splade'"), (["DENSE"], "unknown retriever"), (["routed", "bm25"], "cannot be combined"),
    (["hybrid+routed"], "cannot be combined"), ([], "at least one"), (["dense bm25"], "unknown retriever"),
])
def test_bad_names_are_refused_with_a_sentence(names, reason):
    with pytest.raises(ValueError, match=reason):
        expand(names)


def test_every_set_of_retrievers_and_every_arm_has_a_route_label():
    assert route_label(("dense", "bm25")) == "hybrid" and route_label(("dense", "bm25", "graph")) == "hybrid+graph"
    assert route_label(("bm25", "graph")) == "bm25+graph" and route_label(()) == "none"
    assert set(ROUTER_ARMS) <= set(RETRIEVAL_ROUTES) and tuple(ARM_MULTIPLIERS) == ROUTER_ARMS
    for arm in ROUTER_ARMS:
        assert without_graph(arm) in ROUTER_ARMS
        assert retrievers_run(arm, False) == tuple(r for r in ARM_MULTIPLIERS[arm] if r != "graph")


def test_eval_names_keep_their_spelling():
    parsed = parse_eval_names("dense,bm25,graph,hybrid,hybrid+graph,routed")
    assert list(parsed) == ["dense", "bm25", "graph", "hybrid", "hybrid+graph", "routed"]
    assert parsed["hybrid+graph"] == ("dense", "bm25", "graph")
    with pytest.raises(ValueError, match="--retrievers 'splade'"):
        parse_eval_names("dense,splade")


def test_arm_weights_scale_the_configured_weights():
    weights = arm_weights(RagheatSettings())
    assert weights["hybrid"] == {"dense": 1.0, "bm25": 1.2}
    assert weights["hybrid+graph"] == {"dense": 1.0, "bm25": 1.2, "graph": 1.5}
    assert weights["bm25-heavy"] == {"dense": 1.0, "bm25": 2.4} and weights["dense-heavy"] == {"dense": 2.0, "bm25": 1.2}


def test_features_of_a_query():
    analyzer = LexicalAnalyzer("english")
    idf = {"beatl": 3.0, "album": 1.0}
    x = lexical_features("Which Beatles album came first?", LinkedEntities({4: 0.5, 9: 0.2}, 0.0), idf, analyzer)
    named = dict(zip(FEATURE_NAMES, x))
    assert len(x) == len(FEATURE_NAMES) and x.dtype == np.float64
    assert named["first_which"] == 1.0 and named["first_who"] == 0.0 and named["ends_qmark"] == 1.0
    assert named["caps_ratio"] == pytest.approx(1 / 5) and named["any_seed"] == 1.0
    assert named["seed_max"] == 0.5 and named["seed_top3"] == pytest.approx(0.7)
    assert named["idf_max"] == 3.0 and 0 < named["oov_ratio"] < 1
    empty = dict(zip(FEATURE_NAMES, lexical_features("", LinkedEntities({}, 0.0), idf, analyzer)))
    assert empty["any_seed"] == 0.0 and empty["idf_mean"] == 0.0


def test_labels_go_to_the_best_arm_and_ties_to_the_cheapest():
    ndcg = np.array([[0.5, 0.5, 0.4], [0.2, 0.9, 0.2], [0.3, 0.3, 0.3]])
    costs = np.array([[2, 3, 2], [2, 3, 2], [2, 2, 2]])
    labels, weight = best_arm_labels(ndcg, costs)
    assert labels.tolist() == [0, 1, 0] and weight.tolist() == pytest.approx([0.1, 0.7, 0.0])


def synthetic_tables(seed: int = 0) -> list[OutcomeTable]:
    """Two datasets: in "linked" the graph arms win when a seed feature is on; in "plain" every arm ties."""
    rng = np.random.default_rng(seed)
    tables = []
    for name, n, helps in (("linked", 120, True), ("plain", 80, False)):
        X = rng.normal(size=(n, len(FEATURE_NAMES)))
        any_seed = rng.random(n) < 0.6
        X[:, FEATURE_NAMES.index("any_seed")] = any_seed
        ndcg = np.tile(rng.random((n, 1)) * 0.5 + 0.3, (1, len(ARMS)))
        if helps:
            graph_arms = [j for j, arm in enumerate(ARMS) if "graph" in arm]
            ndcg[np.ix_(any_seed, graph_arms)] += 0.2
        costs = np.array([[len(retrievers_run(a, s)) for a in ARMS] for s in any_seed])
        tables.append(OutcomeTable(name, [f"{name}{i}" for i in range(n)], X, ndcg, ndcg.copy(), costs, any_seed))
    return tables


def test_training_is_deterministic_and_learns_the_signal(tmp_path):
    tables = synthetic_tables()
    model, report = train_router(tables, repeats=1, seed=3)
    again, report_again = train_router(synthetic_tables(), repeats=1, seed=3)
    assert np.array_equal(model.W, again.W) and np.array_equal(model.b, again.b) and report == report_again
    linked = report["datasets"]["linked"]
    assert linked["router_nested_cv"]["ndcg@10"] > linked["fixed"]["hybrid"]["ndcg@10"] + 0.05
    assert linked["router_nested_cv"]["ndcg@10"] >= linked["fixed"]["hybrid+graph"]["ndcg@10"] - 0.01
    assert report["datasets"]["plain"]["router_nested_cv"]["retrievers_per_query"] < 3
    model.save(tmp_path / "a.npz")
    model.save(tmp_path / "b.npz")
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()


def test_folds_are_stratified_and_cover_every_row():
    groups = np.array([0] * 10 + [1] * 5)
    folds = stratified_folds(groups, 5, seed=1)
    assert sorted(np.concatenate(folds).tolist()) == list(range(15))
    assert all((groups[f] == 1).sum() == 1 for f in folds)


def test_a_saved_model_is_checked_when_loaded(tmp_path):
    X = np.random.default_rng(0).normal(size=(20, len(FEATURE_NAMES)))
    model = fit_logistic(X, np.arange(20) % len(ARMS), np.ones(20), ARMS, FEATURE_NAMES)
    model.metadata = {"trained": {"seed": 0}}
    model.save(tmp_path / "router.npz")
    loaded = RouterModel.load(tmp_path / "router.npz", arms=ARMS, features=FEATURE_NAMES)
    assert np.array_equal(loaded.scores(X), model.scores(X)) and loaded.metadata == model.metadata
    with pytest.raises(IndexLoadError, match="other features"):
        RouterModel.load(tmp_path / "router.npz", arms=ARMS, features=FEATURE_NAMES[:-1])
    (tmp_path / "bad.npz").write_bytes(b"not a model")
    with pytest.raises(IndexLoadError, match="unreadable"):
        RouterModel.load(tmp_path / "bad.npz", arms=ARMS, features=FEATURE_NAMES)


def test_the_shipped_model_loads_and_says_how_it_was_trained():
    model = RouterModel.load(SHIPPED_MODEL, arms=ROUTER_CHOICES, features=FEATURE_NAMES)
    assert set(model.arms) == set(ROUTER_CHOICES)  # it decides the reranker per query too
    trained = model.metadata["trained"]
    assert trained["command"].startswith("ragheat train-router") and "seed" in trained
    assert {d["split"] for d in trained["datasets"]} and SHIPPED_MODEL.stat().st_size < 64 * 1024
    json.dumps(model.metadata)


def test_the_router_masks_routes_that_cannot_run_and_drops_an_unused_graph():
    X = np.zeros((len(ARMS), len(FEATURE_NAMES)))
    model = fit_logistic(X, np.arange(len(ARMS)), np.ones(len(ARMS)), ARMS, FEATURE_NAMES)
    model.b = np.array([0.0, 5.0, 0.0, 0.0, 4.0])  # prefers hybrid+graph, then bm25-heavy+graph
    weights = arm_weights(RagheatSettings())
    analyzer = LexicalAnalyzer("english")
    router = LogisticRouter(model, weights, {}, analyzer, {"dense", "bm25", "graph"})
    assert router.route("q", LinkedEntities({1: 1.0}, 0.0)).name == "hybrid+graph"
    without_seeds = router.route("q", LinkedEntities({}, 0.0))
    assert without_seeds.name == "hybrid" and without_seeds.retrievers == ("dense", "bm25")
    no_graph = LogisticRouter(model, weights, {}, analyzer, {"dense", "bm25"})
    assert "graph" not in no_graph.route("q", LinkedEntities({1: 1.0}, 0.0)).name


def test_every_choice_is_an_arm_with_or_without_the_reranker():
    assert ROUTER_CHOICES[:len(ROUTER_ARMS)] == ROUTER_ARMS and len(ROUTER_CHOICES) == 2 * len(ROUTER_ARMS)
    assert split_choice("hybrid+graph+rerank") == ("hybrid+graph", True)
    assert split_choice("hybrid+graph") == ("hybrid+graph", False)
    assert all(split_choice(c)[0] in ROUTER_ARMS for c in ROUTER_CHOICES)


def _preferring(choices: tuple[str, ...], order: list[str]) -> RouterModel:
    """A model scoring ``order`` highest first, whatever the query."""
    X = np.zeros((len(choices), len(FEATURE_NAMES)))
    model = fit_logistic(X, np.arange(len(choices)), np.ones(len(choices)), choices, FEATURE_NAMES)
    model.W[:] = 0.0
    model.b = np.array([len(order) - order.index(c) if c in order else -10.0 for c in choices], float)
    return model


def test_the_router_decides_the_reranker_per_query_within_what_can_run():
    weights, analyzer = arm_weights(RagheatSettings()), LexicalAnalyzer("english")
    everything = {"dense", "bm25", "graph"}
    model = _preferring(ROUTER_CHOICES, ["hybrid+graph", "hybrid+rerank", "hybrid"])
    router = LogisticRouter(model, weights, {}, analyzer, everything)
    linked, unlinked = LinkedEntities({1: 1.0}, 0.0), LinkedEntities({}, 0.0)
    graph_route = router.route("q", linked)
    assert graph_route.name == "hybrid+graph" and graph_route.rerank is False  # the graph's order kept
    # Without the graph the best choice that can run is the reranked hybrid.
    assert LogisticRouter(model, weights, {}, analyzer, {"dense", "bm25"}).route("q", linked).rerank is True
    # A request that may not rerank gets the best choice without it.
    assert router.route("q", unlinked, rerank=False).name == "hybrid" and not router.route("q", unlinked,
                                                                                           rerank=False).rerank
    # Without the reranker the reranked choices are masked.
    no_reranker = LogisticRouter(_preferring(ROUTER_CHOICES, ["hybrid+rerank", "dense-heavy"]), weights, {},
                                 analyzer, everything, can_rerank=False)
    assert no_reranker.route("q", unlinked).name == "dense-heavy"
    with pytest.raises(ValueError, match="without the reranker"):
        LogisticRouter(_preferring(("hybrid" + RERANKED,), []), weights, {}, analyzer, everything, can_rerank=False)


def test_a_model_that_never_learnt_the_reranker_leaves_it_as_asked():
    router = LogisticRouter(_preferring(ARMS, ["hybrid"]), arm_weights(RagheatSettings()), {},
                            LexicalAnalyzer("english"), {"dense", "bm25", "graph"})
    assert not router.decides_rerank and router.route("q", LinkedEntities({}, 0.0)).rerank is True


def test_labels_prefer_the_choice_without_the_reranker_when_it_ties():
    choices = ("hybrid", "hybrid" + RERANKED)
    ndcg = np.array([[0.6, 0.6], [0.4, 0.7]])
    costs = np.array([[2, 2.5], [2, 2.5]])
    labels, _ = best_arm_labels(ndcg, costs)
    assert [choices[i] for i in labels] == ["hybrid", "hybrid+rerank"]
