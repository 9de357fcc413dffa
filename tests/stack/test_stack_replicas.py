"""``ragheat stack up --replicas 2`` end to end: two real ``ragheat serve`` processes behind Debian's nginx on the
stack's API port, Prometheus scraping each replica, traffic through nginx reaching both (each replica's own
request counter moves), a killed replica routed around with no error, ``status`` naming it, and ``stack down``
stopping every process, nginx included. Without probes or vLLM: test_stack_up.py covers those."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from stack.local import wait_for_scrapes
from stack.processes import StackState
from tests.stack.conftest import FREE_PORTS, RAGHEAT

pytestmark = pytest.mark.slow

QUERIES = ["vitamin D and bone density", "statins and muscle pain", "antibiotic resistance in hospitals",
           "sleep deprivation and memory", "BRCA1 mutations and cancer risk"] * 4


def queries_served(replica_url: str) -> float:
    """The replica's own count of answered ``POST /v1/query`` requests, from its /metrics."""
    text = httpx.get(replica_url + "/metrics", timeout=10).text
    return sum(s.value for family in text_string_to_metric_families(text) if family.name == "ragheat_requests"
               for s in family.samples
               if s.name == "ragheat_requests_total" and s.labels.get("route") == "/v1/query")


@pytest.fixture(scope="module")
def replicated(subset_index, tmp_path_factory):
    folder = tmp_path_factory.mktemp("stack-replicas")
    env = {**os.environ, "COLUMNS": "200", "RAGHEAT_GENERATION__GENERATOR": "extractive"}
    up = subprocess.run([RAGHEAT, "stack", "up", "--index", str(subset_index), "--folder", str(folder), *FREE_PORTS,
                         "--replicas", "2", "--probes", "off", "--vllm-model", "off"],
                        capture_output=True, text=True, timeout=420, env=env)
    try:
        assert up.returncode == 0, f"ragheat stack up --replicas 2 failed:\n{up.stderr[-3000:]}{up.stdout[-2000:]}"
        state = json.loads((folder / "state.json").read_text())
        yield folder, {p["name"]: p for p in state["processes"]}, up
    finally:
        subprocess.run([RAGHEAT, "stack", "down", "--folder", str(folder)], capture_output=True, timeout=120)


def test_traffic_through_nginx_reaches_both_replicas_and_prometheus_scrapes_each(replicated):
    folder, processes, up = replicated
    assert {"api-1", "api-2", "nginx", "prometheus"} <= set(processes) and "api" not in processes
    front, replicas = processes["nginx"]["url"], [processes["api-1"]["url"], processes["api-2"]["url"]]
    assert front not in replicas and "balancing 2 replicas" in up.stderr
    before = [queries_served(r) for r in replicas]
    with httpx.Client(timeout=60) as client:
        for query in QUERIES:
            response = client.post(front + "/v1/query", json={"query": query})
            assert response.status_code == 200, response.text
    moved = [queries_served(r) - b for r, b in zip(replicas, before)]
    assert sum(moved) == len(QUERIES) and all(m >= 3 for m in moved), moved
    prometheus = processes["prometheus"]["url"]
    targets = [t for t in wait_for_scrapes(prometheus) if t["job"] == "ragheat-api"]
    assert sorted((t["replica"], t["health"]) for t in targets) == [("api-1", "up"), ("api-2", "up")], targets
    # One SLO series for the service: the sum over replicas is what the rules read.
    deadline = time.monotonic() + 30
    while True:
        result = httpx.get(prometheus + "/api/v1/query", timeout=10, params={
            "query": 'sum by (replica) (ragheat_requests_total{route="/v1/query"})'}).json()["data"]["result"]
        seen = {r["metric"]["replica"]: float(r["value"][1]) for r in result}
        if sorted(seen) == ["api-1", "api-2"] and sum(seen.values()) >= len(QUERIES) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert sorted(seen) == ["api-1", "api-2"] and sum(seen.values()) >= len(QUERIES), seen


def test_a_killed_replica_is_routed_around_and_status_names_it(replicated):
    folder, processes, _ = replicated
    front, survivor = processes["nginx"]["url"], processes["api-1"]["url"]
    os.killpg(processes["api-2"]["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while StackState.load(folder).get("api-2").running() and time.monotonic() < deadline:
        time.sleep(0.1)
    before = queries_served(survivor)
    with httpx.Client(timeout=60) as client:
        statuses = [client.post(front + "/v1/query", json={"query": q}).status_code for q in QUERIES[:10]]
    assert statuses == [200] * 10, statuses  # refused connections are retried on api-1 (never sent: safe)
    assert queries_served(survivor) - before == 10
    status = subprocess.run([RAGHEAT, "stack", "status", "--folder", str(folder)], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "COLUMNS": "250"})
    assert status.returncode == 1, status.stdout
    assert "api-2" in status.stdout and "nginx" in status.stdout


def test_down_stops_every_replica_and_nginx(replicated):
    folder, processes, _ = replicated
    state = StackState.load(folder)
    down = subprocess.run([RAGHEAT, "stack", "down", "--folder", str(folder)], capture_output=True, text=True,
                          timeout=120)
    assert down.returncode == 0, down.stderr
    assert "nginx" in down.stdout and "api-1" in down.stdout
    assert not any(p.running() for p in state.processes)
    with pytest.raises(httpx.TransportError):
        httpx.get(processes["nginx"]["url"] + "/balancer/healthz", timeout=2)
