"""The semantic answer cache over HTTP, as ``ragheat serve`` runs it (real uvicorn, telemetry, the generation switch,
a real SciFact-subset index): the response's and the stream's ``cache`` field, ``ragheat_cache_requests_total`` and
the size gauges, and a hot-swapped generation that starts with an empty cache."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from api_testkit import KEYS, metric_values, serve_live, with_sections
from index_copy import copy_index
from rag.ingest.pipeline import ingest
from rag.pipeline import RagPipeline

CLAIM = "Vitamin D deficiency is associated with bone density loss."
PARAPHRASE = "Vitamin D deficiency is linked to loss of bone density."  # cosine 0.984 (tests/rag/test_cache.py)
OTHER = "0-dimensional biomaterials lack inductive properties."
COUNTER = "ragheat_cache_requests_total"
ADMIN = {"Authorization": f"Bearer {KEYS['admin']}"}


def events(response: httpx.Response) -> list[tuple[str, dict]]:
    assert response.status_code == 200, response.text
    out = []
    for block in response.text.split("\n\n"):
        if block.strip():
            fields = dict(line.split(": ", 1) for line in block.splitlines())
            out.append((fields["event"], json.loads(fields["data"])))
    return out


def stage_names(stages: list[dict]) -> list[str]:
    return [s["name"] for s in stages if s["name"] != "queue"]


class Scrape:
    def __init__(self, client: httpx.Client) -> None:
        self.text = client.get("/metrics", headers=ADMIN).text

    def counts(self) -> dict[str, float]:
        return metric_values(self.text, COUNTER, "result")

    def gauge(self, name: str) -> float:
        for line in self.text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(f"{name} is not in the scrape")


@pytest.fixture
def index(subset_index, tmp_path) -> Path:
    return copy_index(subset_index, tmp_path / "index")


def test_hits_misses_counters_gauges_stream_and_a_new_generation(settings, index, tmp_path, embedder):
    # A deadline a loaded machine cannot exhaust: an answer degraded by a skipped stage is (rightly) not stored, and
    # this test is about what is.
    s = with_sections(settings, cache={"enabled": True}, graph={"enabled": False},
                      server={"reload_poll_s": 0, "api_keys": [KEYS["admin"]]}, telemetry={"otlp": "off"},
                      admission={"deadline_ms": 10_000})
    with serve_live(s, RagPipeline(s, index)) as live, \
            httpx.Client(base_url=live.url, timeout=60, headers=ADMIN) as client:
        before = Scrape(client)
        assert before.counts() == {"hit": 0, "miss": 0, "off": 0}
        assert before.gauge("ragheat_cache_entries") == 0 and before.gauge("ragheat_cache_bytes") == 0

        first = client.post("/v1/query", json={"query": CLAIM, "top_k": 3}).json()
        assert first["cache"] == "miss" and stage_names(first["stages"])[:2] == ["embed", "cache_lookup"]
        hit = client.post("/v1/query", json={"query": PARAPHRASE, "top_k": 3}).json()
        assert hit["cache"] == "hit" and stage_names(hit["stages"]) == ["embed", "cache_lookup"]
        assert hit["answer"] == first["answer"] and hit["citations"] == first["citations"]
        assert client.post("/v1/query", json={"query": OTHER, "top_k": 3}).json()["cache"] == "miss"

        # Streamed: a hit still sends the sources, the answer and done.
        received = events(client.post("/v1/query/stream", json={"query": CLAIM, "top_k": 3}))
        kinds = [kind for kind, _ in received]
        assert kinds[0] == "sources" and kinds[-1] == "done" and "answer" in kinds and "token" not in kinds
        assert [c["doc_id"] for c in received[0][1]] == [c["doc_id"] for c in first["citations"]]
        done = received[-1][1]
        assert done["cache"] == "hit" and stage_names(done["stages"]) == ["embed", "cache_lookup"]

        after = Scrape(client)
        assert after.counts() == {"hit": 2, "miss": 2, "off": 0}
        assert after.gauge("ragheat_cache_entries") == 2
        assert after.gauge("ragheat_cache_bytes") > 0
        # A hit ran no retriever: the route counter counts answers that retrieved.
        routes = metric_values(after.text, "ragheat_retrieval_routes_total", "retrieval_route")
        assert routes["hybrid"] == 2

        # A new generation is served by a new pipeline, whose cache starts empty.
        source = tmp_path / "new-source"
        source.mkdir()
        (source / "vitamin.txt").write_text("Vitamin D deficiency lowers bone mineral density in adults.")
        new = ingest(str(source), index, s, embedder=embedder).manifest["generation"]
        assert client.post("/admin/reload").json()["outcome"] == "swapped"
        swapped = Scrape(client)
        assert swapped.gauge("ragheat_cache_entries") == 0 and swapped.gauge("ragheat_cache_bytes") == 0
        again = client.post("/v1/query", json={"query": CLAIM, "top_k": 3})
        assert again.headers["x-ragheat-generation"] == new
        assert again.json()["cache"] == "miss" and again.json()["citations"][0]["title"] == "vitamin"
        assert client.post("/v1/query", json={"query": PARAPHRASE, "top_k": 3}).json()["cache"] == "hit"
        assert Scrape(client).gauge("ragheat_cache_entries") == 1


def test_off_by_default_and_counted_as_off(settings, subset_index):
    s = with_sections(settings, graph={"enabled": False}, telemetry={"otlp": "off"})
    assert s.cache.enabled is False
    with serve_live(s, RagPipeline(s, subset_index)) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        for _ in range(2):
            body = client.post("/v1/query", json={"query": CLAIM, "top_k": 3}).json()
            assert body["cache"] == "off" and "cache_lookup" not in stage_names(body["stages"])
        done = events(client.post("/v1/query/stream", json={"query": CLAIM, "top_k": 3}))[-1][1]
        assert done["cache"] == "off"
        scrape = Scrape(client)
        assert scrape.counts() == {"hit": 0, "miss": 0, "off": 3}
        assert scrape.gauge("ragheat_cache_entries") == 0
