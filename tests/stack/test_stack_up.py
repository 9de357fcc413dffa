"""``ragheat stack up`` end to end: the compose topology as real processes (API, Prometheus with compose's
config, Alertmanager, alert receiver, eBPF probes as root, vLLM on the CPU when installed), real traffic,
Prometheus seeing every target up and the rules loaded, then ``ragheat stack down`` leaving nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from stack.local import prometheus_report, wait_for_scrapes
from stack.processes import StackState, group_members, start_time

pytestmark = [pytest.mark.slow, pytest.mark.root]

RAGHEAT = str(Path(sys.executable).parent / "ragheat")
FREE_PORTS = ["--api-port", "0", "--prometheus-port", "0", "--alertmanager-port", "0", "--alert-receiver-port", "0",
              "--probes-port", "0", "--vllm-port", "0"]
QUERIES = ["vitamin D and bone density", "statins and muscle pain", "antibiotic resistance in hospitals",
           "sleep deprivation and memory", "BRCA1 mutations and cancer risk"] * 4


def vllm_installed() -> bool:
    from rag.errors import ConfigurationError
    from rag.settings import RagheatSettings
    from stack.vllm import vllm_python

    try:
        vllm_python(RagheatSettings().generation.vllm_python)
        return True
    except ConfigurationError:
        return False


@pytest.fixture(scope="module")
def running_stack(subset_index, tmp_path_factory):
    folder = tmp_path_factory.mktemp("stack")
    # A stack left behind by an earlier `up` (a crash, a lost terminal): the next `up` must stop it first.
    leftover = StackState(folder).spawn("api", ["sleep", "300"])
    up = subprocess.run([RAGHEAT, "stack", "up", "--index", str(subset_index), "--folder", str(folder), *FREE_PORTS],
                        capture_output=True, text=True, timeout=420, env={**os.environ, "COLUMNS": "200"})
    try:
        assert up.returncode == 0, f"ragheat stack up failed:\n{up.stderr[-3000:]}"
        assert not leftover.alive() and "cleared the previous stack state" in up.stderr, up.stderr
        state = json.loads((folder / "state.json").read_text())
        yield folder, {p["name"]: p for p in state["processes"]}, state["notes"], up
    finally:  # whatever happened, nothing outlives the tests (a no-op after test_down_leaves_nothing_running)
        subprocess.run([RAGHEAT, "stack", "down", "--folder", str(folder)], capture_output=True, timeout=120)


def test_every_component_runs_and_prometheus_sees_every_target_up(running_stack):
    folder, processes, notes, _ = running_stack
    expected = {"api", "prometheus", "alertmanager", "alert-receiver"}
    if os.geteuid() == 0:
        expected.add("probes")  # `ragheat probes` must work here: `up` fails, naming probes, when it does not
    if vllm_installed():
        expected.add("vllm")
    assert expected <= set(processes), f"started {sorted(processes)}; notes: {notes}"
    api, prometheus = processes["api"]["url"], processes["prometheus"]["url"]
    for query in QUERIES:
        response = httpx.post(api + "/v1/query", json={"query": query}, timeout=60)
        assert response.status_code == 200, response.text
    targets = wait_for_scrapes(prometheus, timeout_s=30)
    jobs = {"api": "ragheat-api", "probes": "ragheat-probes", "vllm": "vllm", "prometheus": "prometheus",
            "alertmanager": "alertmanager"}
    assert sorted(t["job"] for t in targets) == sorted(jobs[c] for c in processes if c in jobs)
    assert all(t["health"] == "up" for t in targets), targets
    # The traffic itself reached Prometheus through the API's /metrics.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        seen = httpx.get(prometheus + "/api/v1/query", params={"query": 'sum(ragheat_requests_total{route="/v1/query"})'},
                         timeout=10).json()["data"]["result"]
        if seen and float(seen[0]["value"][1]) >= len(QUERIES):
            break
        time.sleep(0.5)
    assert seen and float(seen[0]["value"][1]) >= len(QUERIES), seen


def test_prometheus_loaded_the_rendered_rules_and_alertmanager(running_stack):
    folder, processes, _, _ = running_stack
    prometheus = processes["prometheus"]["url"]
    rule_files = sorted((folder / "rendered" / "prometheus").glob("*.yml"))
    expected = {g["name"] for f in rule_files for g in yaml.safe_load(f.read_text())["groups"]}
    _, groups = prometheus_report(prometheus)
    assert {g["name"] for g in groups} == expected and expected
    assert not [g for g in groups if g["unhealthy"]], groups
    alertmanagers = httpx.get(prometheus + "/api/v1/alertmanagers", timeout=10).json()["data"]["activeAlertmanagers"]
    assert [a["url"].split("/api/")[0] for a in alertmanagers] == [processes["alertmanager"]["url"]]


def test_status_reports_the_running_stack(running_stack):
    folder, processes, _, _ = running_stack
    status = subprocess.run([RAGHEAT, "stack", "status", "--folder", str(folder)], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "COLUMNS": "250"})
    assert status.returncode == 0, status.stdout + status.stderr
    for name in processes:
        assert name in status.stdout


def test_down_leaves_nothing_running(running_stack, request):
    """Runs last in this module: stop through the CLI, then check every recorded process group is gone."""
    folder, processes, _, _ = running_stack
    down = subprocess.run([RAGHEAT, "stack", "down", "--folder", str(folder)], capture_output=True, text=True,
                          timeout=120)
    assert down.returncode == 0, down.stderr
    assert "stopped" in down.stdout
    assert not (folder / "state.json").exists()
    left = {name: group_members(p["pid"]) for name, p in processes.items()
            if start_time(p["pid"]) == p["started"] or group_members(p["pid"])}
    assert not left, f"still running after down: {left}"
    again = subprocess.run([RAGHEAT, "stack", "down", "--folder", str(folder)], capture_output=True, text=True,
                           timeout=60)
    assert again.returncode == 0 and "no stack running" in again.stdout
