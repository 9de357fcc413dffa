"""Steering over HTTP (rag/api/steering.py): a real uvicorn serving the SciFact subset with the controller on. A
queue forms behind one slot whose rerank stage is slowed (``faults``), the controller steps down (answers say
``quality_level``, the gauge and the change counter follow), and steps back to full once the load stops. Priority
comes from ``X-Request-Priority``, counted by outcome; a bad value is a 422 naming the header."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from api_testkit import metric_values, serve_live, with_sections
from rag.pipeline import RagPipeline

QUERY = "0-dimensional biomaterials lack inductive properties."


@pytest.fixture(scope="module")
def steered(settings, subset_index):
    s = with_sections(settings, server={"reload_poll_s": 0},
                      steering={"enabled": True, "interval_s": 0.2, "hold_s": 0.5, "window_s": 1.0},
                      admission={"max_in_flight": 1, "max_queue": 64, "deadline_ms": 2000},
                      faults={"delay_stage": "rerank", "delay_ms": 150})
    with serve_live(s, RagPipeline(s, subset_index)) as live:
        yield live


def _plain(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in the scrape")


def test_a_queue_steps_the_ladder_down_and_a_quiet_spell_brings_it_back(steered):
    url = steered.url
    assert _plain(httpx.get(url + "/metrics").text, "ragheat_quality_level") == 0
    levels: list[str] = []

    def ask(i: int) -> None:
        with httpx.Client(base_url=url, timeout=60) as client:
            response = client.post("/v1/query", json={"query": f"{QUERY} {i}"})
            assert response.status_code in (200, 503), response.text
            if response.status_code == 200:
                levels.append(response.json()["quality_level"])

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(ask, range(48)))
    assert "full" in levels and set(levels) - {"full"}, levels
    text = httpx.get(url + "/metrics").text
    changes = metric_values(text, "ragheat_quality_level_changes_total", "direction")
    assert changes["down"] >= 1, changes
    deadline = time.monotonic() + 30
    while _plain(httpx.get(url + "/metrics").text, "ragheat_quality_level") != 0:
        assert time.monotonic() < deadline, "the controller did not step back up to full"
        time.sleep(0.3)
    body = httpx.post(url + "/v1/query", json={"query": QUERY}, timeout=60).json()
    assert body["quality_level"] == "full" and not body["degraded"]
    assert metric_values(httpx.get(url + "/metrics").text, "ragheat_quality_level_changes_total",
                         "direction")["up"] >= 1


def test_priority_is_read_from_its_header_and_counted(steered):
    with httpx.Client(base_url=steered.url, timeout=60) as client:
        before = client.get("/metrics").text
        ok = client.post("/v1/query", json={"query": QUERY}, headers={"X-Request-Priority": "low"})
        assert ok.status_code == 200, ok.text
        bad = client.post("/v1/query", json={"query": QUERY}, headers={"X-Request-Priority": "urgent"})
        assert bad.status_code == 422 and "X-Request-Priority" in bad.json()["reason"], bad.text
        after = client.get("/metrics").text

    def answered_low(text: str) -> float:
        return sum(s for key, s in _samples(text, "ragheat_requests_priority_total").items()
                   if key == ("low", "answered"))

    assert answered_low(after) - answered_low(before) == 1


def _samples(text: str, name: str) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.labels["priority"], s.labels["outcome"]): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name}


def test_the_stream_says_the_rung_too(steered):
    response = httpx.post(steered.url + "/v1/query/stream", json={"query": QUERY}, timeout=60)
    assert response.status_code == 200
    assert '"quality_level": "full"' in response.text
