"""The graph and the router in the query path, on a real index of a hotpotqa subset: which stages run (and are
named for the kernel probes), when the graph makes no round trip, how ``routed`` chooses, and what a store outage
does to a request."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time

import pytest

from rag.pipeline import RagPipeline
from rag.stages import RETRIEVAL_ROUTES, ROUTER_ARMS
from rag.threadnames import get_name, stage_comm
from rag.types import StageTiming

from graph_testkit import CountingStore


def linked_question(pipeline: RagPipeline, hotpot_subset) -> str:
    """A question of the subset that names an entity of its graph."""
    for line in (hotpot_subset / "queries.jsonl").read_text().splitlines():
        text = json.loads(line)["text"]
        if pipeline.linker.link(text).seeds:
            return text
    raise AssertionError("no question of the subset links an entity")


UNLINKED = "zzzz qqqq xxxx"


def names(stages: list[StageTiming]) -> list[str]:
    return [s.name for s in stages]


def test_the_graph_alone_needs_no_embedding_unless_reranked(graph_pipeline, hotpot_subset):
    question = linked_question(graph_pipeline, hotpot_subset)
    run = graph_pipeline.retrieve(question, 10, ["graph"], rerank=False)
    assert names(run.stages) == ["link_entities", "retrieve_graph"] and run.hits
    assert run.route == "graph" and run.retrieved["graph"] == len(run.hits) and not run.skipped
    reranked = graph_pipeline.retrieve(question, 10, ["graph"])  # reranking reads the token states: one embed run
    assert reranked.hits
    assert names(reranked.stages) == ["link_entities", "embed", "retrieve_graph", "rerank"]


def test_hybrid_plus_graph_runs_every_stage_in_order_and_fuses_three_lists(graph_pipeline, hotpot_subset):
    run = graph_pipeline.retrieve(linked_question(graph_pipeline, hotpot_subset), 10, ["hybrid+graph"])
    assert names(run.stages) == ["link_entities", "embed", "retrieve_dense", "retrieve_bm25", "retrieve_graph", "fuse",
                             "rerank"]
    assert run.route == "hybrid+graph" and set(run.retrieved) == {"dense", "bm25", "graph"}


def test_a_query_that_links_nothing_runs_no_graph_stage_and_makes_no_round_trip(graph_pipeline, monkeypatch):
    counting = CountingStore(graph_pipeline.graph)
    monkeypatch.setattr(graph_pipeline.graph_retriever, "store", counting)
    run = graph_pipeline.retrieve(UNLINKED, 10, ["dense", "bm25", "graph"])
    assert "retrieve_graph" not in names(run.stages) and counting.calls == 0
    assert run.route == "hybrid" and "graph" not in run.retrieved
    assert (alone := graph_pipeline.retrieve(UNLINKED, 10, ["graph"])).hits == []
    assert alone.route == "none" and counting.calls == 0


def test_a_hybrid_request_is_unchanged_by_the_graph(graph_pipeline):
    run = graph_pipeline.retrieve("Who directed Black Book?", 5, ["dense", "bm25"])
    assert names(run.stages) == ["embed", "retrieve_dense", "retrieve_bm25", "fuse", "rerank"]


def test_routed_picks_a_route_per_query_and_never_the_graph_without_entities(graph_pipeline, hotpot_subset):
    run = graph_pipeline.retrieve(UNLINKED, 10, ["routed"])
    assert names(run.stages)[:3] == ["embed", "link_entities", "route"] and "retrieve_graph" not in names(run.stages)
    assert run.route in ROUTER_ARMS and "graph" not in run.route
    questions = [json.loads(line)["text"] for line in (hotpot_subset / "queries.jsonl").read_text().splitlines()]
    routes = set()
    for question in questions:
        run = graph_pipeline.retrieve(question, 10, ["routed"])
        assert run.route in RETRIEVAL_ROUTES and run.route in ROUTER_ARMS
        assert ("graph" in run.retrieved) == ("+graph" in run.route)
        if "graph" in run.route:
            assert graph_pipeline.linker.link(question).seeds
        routes.add(run.route)
    assert any("graph" in r for r in routes), "multi-hop questions that name entities should get the graph"


def test_each_graph_stage_runs_on_a_thread_named_for_it(graph_pipeline, hotpot_subset, monkeypatch):
    seen = {}
    for attribute, method, stage in (("linker", "link", "link_entities"), ("router", "route", "route"),
                                     ("graph_retriever", "retrieve", "retrieve_graph")):
        target = getattr(graph_pipeline, attribute)
        original = getattr(target, method)

        def spy(*args, _original=original, _stage=stage, **kwargs):
            seen[_stage] = get_name()
            return _original(*args, **kwargs)

        monkeypatch.setattr(target, method, spy)
    question = linked_question(graph_pipeline, hotpot_subset)
    graph_pipeline.retrieve(question, 10, ["routed"])
    graph_pipeline.retrieve(question, 10, ["graph"])
    assert seen == {stage: stage_comm(stage) for stage in ("link_entities", "route", "retrieve_graph")}


def test_what_a_pipeline_cannot_serve_is_said_in_a_sentence(settings, graph_index, graph_pipeline):
    assert graph_pipeline.check_retrievers(["hybrid+graph"]) is None
    assert graph_pipeline.check_retrievers(["routed"]) is None
    assert "unknown retriever 'splade'" in graph_pipeline.check_retrievers(["splade"])
    assert "cannot be combined" in graph_pipeline.check_retrievers(["routed", "bm25"])
    without = RagPipeline(settings.model_copy(update={"graph": settings.graph.model_copy(update={"enabled": False})}),
                          graph_index)
    without.warm_up()
    try:
        assert without.graph is None and without.graph_retriever is None
        assert "no knowledge graph" in without.check_retrievers(["graph"])
        run = without.retrieve("Who directed Black Book?", 5, ["routed"])  # routes without graph arms
        assert run.route in ROUTER_ARMS and "graph" not in run.route
    finally:
        without.close()


def test_a_killed_store_skips_the_stage_and_is_restarted(settings, graph_index, hotpot_subset):
    pipeline = RagPipeline(settings, graph_index)
    pipeline.warm_up()
    try:
        question = linked_question(pipeline, hotpot_subset)
        store = pipeline.graph.store
        old = store.child.pid
        os.kill(old, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while store.healthy() and time.monotonic() < deadline:
            time.sleep(0.02)
        result = pipeline.query(question, 5, ["hybrid+graph"])
        assert "retrieve_graph" in result.skipped and "did not answer" in result.skipped["retrieve_graph"]
        assert result.sources and "graph" not in result.retrieved and result.route == "hybrid+graph"
        assert pipeline.graph.wait_until_healthy(30), "the store was not restarted"
        assert store.child.pid != old and pipeline.graph.restarts == 1 and pipeline.graph.errors >= 1
        again = pipeline.query(question, 5, ["hybrid+graph"])
        assert not again.skipped and again.retrieved["graph"] > 0
    finally:
        pipeline.close()
    assert store.child is None, "close() stops the store"


def test_eval_scores_every_name_and_counts_retrievers_and_routes(graph_pipeline, hotpot_subset):
    from rag.eval.beir import load_qrels, load_queries
    from rag.eval.runner import evaluate

    queries, qrels = load_queries(hotpot_subset), load_qrels(hotpot_subset, "dev")
    report = evaluate(graph_pipeline, queries, qrels, ["hybrid", "graph", "hybrid+graph", "routed"])
    r = report["retrievers"]
    linked = sum(1 for q in queries.values() if graph_pipeline.linker.link(q).seeds) / len(queries)
    assert r["hybrid"]["retrievers_per_query"] == 2.0 and r["hybrid"]["routes"] == {"hybrid": 1.0}
    assert r["hybrid+graph"]["retrievers_per_query"] == pytest.approx(2 + linked)
    assert r["graph"]["routes"].get("graph", 0) == pytest.approx(linked)
    assert sum(r["routed"]["routes"].values()) == pytest.approx(1.0)
    assert set(r["routed"]["routes"]) <= set(ROUTER_ARMS) and r["routed"]["skipped"] == 0


def test_the_router_is_trained_on_exactly_what_routed_serves(graph_pipeline, hotpot_subset):
    """The outcome table's nDCG of the choice the router picks, per query, averages to what ``ragheat eval``
    measures for routed (arm alone) and routed+rerank (arm, reranked when the choice says so): training and serving
    fuse and rerank the same lists the same way."""
    from rag.eval.beir import load_qrels, load_queries
    from rag.eval.runner import evaluate
    from rag.routing.arms import RERANKED
    from rag.routing.train import collect_outcomes

    queries, qrels = load_queries(hotpot_subset), load_qrels(hotpot_subset, "dev")
    table = collect_outcomes(graph_pipeline, "subset", queries, qrels)
    assert len(table.choices) == 10 and table.ndcg.shape == (len(table.qids), 10)
    routes = [graph_pipeline.router.route(queries[q], graph_pipeline.linker.link(queries[q])) for q in table.qids]
    # routed alone may not rerank: its router picks among the choices without the reranker
    plain = [graph_pipeline.router.route(queries[q], graph_pipeline.linker.link(queries[q]), rerank=False)
             for q in table.qids]
    assert not any(r.rerank for r in plain)
    arms = [table.choices.index(r.name) for r in plain]
    chosen = [table.choices.index(r.name + (RERANKED if r.rerank else "")) for r in routes]
    served = evaluate(graph_pipeline, queries, qrels, ["routed", "routed+rerank", "hybrid+graph",
                                                       "hybrid+graph+rerank"])["retrievers"]
    rows = range(len(routes))
    assert served["routed"]["ndcg@10"] == pytest.approx(float(table.ndcg[rows, arms].mean()), abs=1e-12)
    assert served["routed+rerank"]["ndcg@10"] == pytest.approx(float(table.ndcg[rows, chosen].mean()), abs=1e-12)
    assert served["routed+rerank"]["reranked_share"] == pytest.approx(sum(r.rerank for r in routes) / len(routes))
    assert served["routed"]["reranked_share"] == 0.0 and served["hybrid+graph+rerank"]["reranked_share"] == 1.0
    for name in ("hybrid+graph", "hybrid+graph+rerank"):
        assert served[name]["ndcg@10"] == pytest.approx(float(table.ndcg[:, table.choices.index(name)].mean()),
                                                        abs=1e-12)


def test_a_route_that_keeps_the_fused_order_runs_no_rerank_and_is_not_degraded(graph_pipeline, hotpot_subset,
                                                                                monkeypatch):
    question = linked_question(graph_pipeline, hotpot_subset)
    route = graph_pipeline.router.route
    monkeypatch.setattr(graph_pipeline.router, "route",
                        lambda q, linked, rerank=True: dataclasses.replace(route(q, linked), rerank=False))
    run = graph_pipeline.retrieve(question, 10, ["routed"])
    assert "rerank" not in names(run.stages) and not run.skipped and run.reranked is None
    assert run.hits and run.rerank is False  # the route turned the asked-for reranker off
    result = graph_pipeline.query(question, 5, ["routed"])
    assert not result.degraded and "rerank" not in result.skipped
    monkeypatch.setattr(graph_pipeline.router, "route",
                        lambda q, linked, rerank=True: dataclasses.replace(route(q, linked), rerank=rerank))
    assert "rerank" in names(graph_pipeline.retrieve(question, 10, ["routed"]).stages)
    # A request that asks for no reranking gets none, whatever the route says.
    assert "rerank" not in names(graph_pipeline.retrieve(question, 10, ["routed"], rerank=False).stages)
