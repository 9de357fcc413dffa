"""``POST /v1/query/stream``'s ``done`` event says what the JSON response says about retrieval: the ``route`` taken,
the ``skipped_stages``, and ``degraded`` when a stage was skipped. Real uvicorn on loopback, a real SciFact-subset
index with its knowledge graph in the embedded FalkorDB, whose process is killed to make the graph unavailable."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest

from rag.api.app import create_app
from rag.pipeline import RagPipeline
from stack.servers import BackgroundServer

UNLINKED = "0-dimensional biomaterials lack inductive properties."  # a SciFact claim: names no title


def events(response: httpx.Response) -> list[tuple[str, dict]]:
    assert response.status_code == 200, response.text
    out = []
    for block in response.text.split("\n\n"):
        if block.strip():
            fields = dict(line.split(": ", 1) for line in block.splitlines())
            out.append((fields["event"], json.loads(fields["data"])))
    return out


def done(client: httpx.Client, body: dict) -> dict:
    received = events(client.post("/v1/query/stream", json=body))
    assert received[-1][0] == "done", received
    return received[-1][1]


@pytest.fixture(scope="module")
def served(settings, subset_index):
    pipeline = RagPipeline(settings, subset_index)
    with BackgroundServer(create_app(settings, pipeline=pipeline)) as url:
        with httpx.Client(base_url=url, timeout=60) as client:
            yield pipeline, client


@pytest.fixture(scope="module")
def titled(served, scifact_subset) -> str:
    """A question naming a document title of the subset: the linker finds an entity in it, so the graph runs."""
    pipeline, _ = served
    for line in (scifact_subset / "corpus.jsonl").read_text().splitlines():
        title = json.loads(line)["title"]
        if pipeline.linker.link(title).seeds:
            return title
    raise AssertionError("no title of the subset links an entity")


@pytest.mark.parametrize("retrievers, route, graph_runs", [
    (["dense", "bm25"], "hybrid", False), (["bm25"], "bm25", False), (["hybrid+graph"], "hybrid+graph", True),
    (["graph"], "graph", True),
    (None, "hybrid+graph", True),  # the default routes: a question that names an entity gets the graph
])
def test_done_names_the_route_as_the_json_response_does(served, titled, retrievers, route, graph_runs):
    _, client = served
    body = {"query": titled, **({"retrievers": retrievers} if retrievers else {})}
    final = done(client, body)
    plain = client.post("/v1/query", json=body).json()
    assert final["route"] == plain["route"] == route
    assert final["skipped_stages"] == plain["skipped_stages"] == [] and final["degraded"] is plain["degraded"] is False
    assert ("retrieve_graph" in [s["name"] for s in final["stages"]]) == graph_runs


def test_done_names_no_graph_route_when_the_query_links_nothing(served):
    _, client = served
    final = done(client, {"query": UNLINKED, "retrievers": ["hybrid+graph"]})
    assert final["route"] == "hybrid" and final["skipped_stages"] == []


def test_done_says_the_graph_was_skipped_and_the_answer_degraded_while_its_store_is_down(served, titled):
    pipeline, client = served
    store = pipeline.graph.store
    old_pid = store.child.pid
    os.kill(old_pid, signal.SIGKILL)
    body = {"query": titled, "retrievers": ["hybrid+graph"]}
    deadline, finals = time.monotonic() + 60, []
    while time.monotonic() < deadline and not any(f["skipped_stages"] for f in finals):
        finals.append(done(client, body))
    skipped = [f for f in finals if f["skipped_stages"]]
    assert skipped, f"no streamed answer was served without the graph after its store was killed: {finals}"
    final = skipped[0]
    assert [s["stage"] for s in final["skipped_stages"]] == ["retrieve_graph"] and final["skipped_stages"][0]["reason"]
    assert final["degraded"] is True and final["degraded_reason"] is None  # degraded by the skip, not by a model
    assert final["route"] == "hybrid+graph"  # the route chosen; skipped_stages says what it ran without
    # The store comes back (restarted in the background), and so does the graph in the stream.
    assert pipeline.graph.wait_until_healthy(60) and store.child.pid != old_pid
    back = done(client, body)
    assert back["route"] == "hybrid+graph" and back["skipped_stages"] == [] and back["degraded"] is False
