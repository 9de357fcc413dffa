"""Hot swap under load (``rag.index_generations``): a new generation published by ``ingest`` while clients keep asking is
loaded beside the served one and swapped in with no failed request; answers come from it afterwards; the old
pipeline is closed and its memory released. A generation that cannot be loaded is never swapped in."""

from __future__ import annotations

import gc
import json
import os
import shutil
import threading
import time
import weakref
from pathlib import Path

import httpx
import pytest

from api_testkit import KEYS, metric_values, serve_live, with_sections
from index_copy import copy_index
from rag.index.store import CURRENT, GENERATIONS, MANIFEST, read_manifest
from rag.ingest.pipeline import ingest
from rag.pipeline import RagPipeline

QUERIES = ["0-dimensional biomaterials lack inductive properties.",
           "What causes the tides in the oceans?",
           "Vitamin D deficiency is associated with bone density loss.",
           "Why does bread dough rise?"]
NEW_DOCS = {
    "tides.txt": "Tides are caused by the gravitational pull of the Moon and the Sun on the oceans.",
    "volcanoes.md": "# Volcanoes\nA volcano erupts when molten rock called magma rises through the crust.",
    "bread.txt": "Bread dough rises because yeast ferments sugar and releases carbon dioxide gas.",
}
RELOADS = "ragheat_index_reloads_total"


@pytest.fixture
def index(subset_index, tmp_path) -> Path:
    return copy_index(subset_index, tmp_path / "index")


@pytest.fixture
def new_source(tmp_path) -> Path:
    folder = tmp_path / "new-source"
    folder.mkdir()
    for name, text in NEW_DOCS.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


class Load:
    """Clients asking in a loop, each outcome recorded as (started, status or error, generation header)."""

    def __init__(self, url: str, clients: int = 3, headers: dict | None = None) -> None:
        self.url, self.headers, self.stop = url, headers or {}, threading.Event()
        self.outcomes: list[tuple[float, object, str | None]] = []
        self.threads = [threading.Thread(target=self._ask, args=(n,), daemon=True) for n in range(clients)]

    def _ask(self, n: int) -> None:
        with httpx.Client(base_url=self.url, timeout=60, headers=self.headers) as client:
            i = n
            while not self.stop.is_set():
                route = "/v1/query/stream" if i % 4 == 3 else "/v1/query"
                started = time.monotonic()
                try:
                    response = client.post(route, json={"query": QUERIES[i % len(QUERIES)], "top_k": 3})
                    status = response.status_code if response.status_code != 200 or route.endswith("query") \
                        or "event: done" in response.text else "stream without done"
                    self.outcomes.append((started, status, response.headers.get("x-ragheat-generation")))
                except httpx.HTTPError as exc:
                    self.outcomes.append((started, repr(exc), None))
                i += 1

    def __enter__(self) -> "Load":
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=120)

    def failures(self) -> list:
        return [o for o in self.outcomes if o[1] != 200]


def wait_for_generation(url: str, generation: str, timeout_s: float = 180) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready = httpx.get(url + "/readyz", timeout=30)
        if ready.status_code == 200 and ready.json()["generation"] == generation:
            return time.monotonic()
        time.sleep(0.1)
    raise AssertionError(f"generation {generation} not served within {timeout_s} s: {ready.text}")


def test_swap_under_load_fails_no_request_and_releases_the_old_generation(settings, index, new_source, embedder):
    s = with_sections(settings, server={"reload_poll_s": 0.2}, telemetry={"otlp": "off"})
    with serve_live(s, RagPipeline(s, index)) as live:
        old = live.service.pipeline
        old_generation = old.describe().generation
        closed, released = threading.Event(), weakref.ref(old)

        def spy_close() -> None:  # holds no reference to the pipeline: the test checks that it is freed
            closed.set()
            RagPipeline.close(released())

        old.close = spy_close
        del old
        with Load(live.url) as load:
            time.sleep(1.0)
            report = ingest(str(new_source), index, s, embedder=embedder)  # publishes: current -> new generation
            new_generation = report.manifest["generation"]
            assert new_generation != old_generation
            swapped_at = wait_for_generation(live.url, new_generation)
            time.sleep(1.5)
        assert load.failures() == [], load.failures()[:5]
        before = [o for o in load.outcomes if o[0] < swapped_at]
        after = [o for o in load.outcomes if o[0] > swapped_at]
        assert {o[2] for o in before} >= {old_generation}, "load ran on the old generation first"
        assert after and {o[2] for o in after} == {new_generation}, {o[2] for o in after}
        # Answers come from the new corpus now.
        answer = httpx.post(live.url + "/v1/query", json={"query": "What causes the tides?", "top_k": 1},
                            timeout=60).json()
        assert "Moon" in answer["citations"][0]["text"], answer["citations"][0]
        # The old pipeline was closed once its last request finished, and nothing keeps it alive.
        assert closed.wait(30), "the retired generation's pipeline was never closed"
        deadline = time.monotonic() + 30
        while released() is not None and time.monotonic() < deadline:
            gc.collect()
            time.sleep(0.2)
        assert released() is None, f"the old pipeline is still referenced by {len(gc.get_referrers(released()))}"
        assert live.service.generations.swaps == 1
        reloads = metric_values(httpx.get(live.url + "/metrics", timeout=30).text, RELOADS, "outcome")
        assert reloads == {"swapped": 1, "unchanged": 0, "failed": 0}, reloads


def publish_broken_generation(index: Path) -> str:
    """A generation as ``IndexWriter.publish`` leaves one (renamed into place, ``current`` swapped) whose dense index
    is truncated: what a disk failure or a bug in a writer could leave."""
    current = (index / CURRENT).resolve()
    name = current.name + "-broken"
    broken = index / GENERATIONS / name
    shutil.copytree(current, broken)
    manifest = json.loads((broken / MANIFEST).read_text())
    manifest["generation"] = name
    (broken / MANIFEST).write_text(json.dumps(manifest))
    dense = broken / "dense.faiss"
    dense.write_bytes(dense.read_bytes()[:100])
    link = index / f".{CURRENT}.tmp"
    os.symlink(Path(GENERATIONS) / name, link)
    os.replace(link, index / CURRENT)
    return name


def test_admin_reload_refuses_a_broken_generation_then_swaps_a_good_one(settings, index, new_source, embedder):
    key = {"Authorization": f"Bearer {KEYS['admin']}"}
    s = with_sections(settings, server={"reload_poll_s": 0, "api_keys": [KEYS["admin"]]}, telemetry={"otlp": "off"})
    with serve_live(s, RagPipeline(s, index)) as live, httpx.Client(base_url=live.url, timeout=120) as client:
        served = read_manifest(index)["generation"]
        assert client.post("/admin/reload").status_code == 401
        assert client.post("/admin/reload", headers=key).json() == {"outcome": "unchanged", "generation": served,
                                                                   "previous": served}
        broken = publish_broken_generation(index)
        response = client.post("/admin/reload", headers=key)
        assert response.status_code == 500 and response.json()["error"] == "reload_failed", response.text
        assert broken in response.json()["reason"] and served in response.json()["reason"]
        ready = client.get("/readyz").json()
        assert ready["generation"] == served and broken in ready["reload_error"], ready
        asked = client.post("/v1/query", json={"query": QUERIES[0]}, headers=key)
        assert asked.status_code == 200 and asked.headers["x-ragheat-generation"] == served
        # The next ingest publishes a good generation; a reload swaps it in and clears the error.
        report = ingest(str(new_source), index, s, embedder=embedder, force=True)
        response = client.post("/admin/reload", headers=key)
        assert response.status_code == 200, response.text
        assert response.json() == {"outcome": "swapped", "generation": report.manifest["generation"],
                                   "previous": served}
        assert "reload_error" not in client.get("/readyz").json()
        scrape = client.get("/metrics", headers=key).text
        assert metric_values(scrape, RELOADS, "outcome") == {"swapped": 1, "unchanged": 1, "failed": 1}
