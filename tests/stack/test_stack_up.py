"""``ragheat stack up`` end to end: the compose topology as real processes (API, Prometheus with compose's
config, Alertmanager, alert receiver, eBPF probes as root, and, when vLLM is installed, vLLM serving the
random-weight model asked for with ``--vllm-model dummy``), real traffic, Prometheus seeing every target up and
every rendered rule group and alert loaded, the noise of random weights never served as an answer, ``status``
reporting (and failing when the rules are lost), then ``ragheat stack down`` leaving nothing behind."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from stack import topology
from stack.local import StackError, check_rules, prometheus_report, wait_for_scrapes
from stack.processes import StackState, group_members, start_time
from tests.stack.conftest import FREE_PORTS, RAGHEAT

pytestmark = [pytest.mark.slow, pytest.mark.root]

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


@dataclass
class RunningStack:
    folder: object
    processes: dict
    notes: list
    up: subprocess.CompletedProcess
    dummy: bool  # vLLM runs the random-weight model (only where .venv-vllm is installed)


@pytest.fixture(scope="module")
def running_stack(subset_index, tmp_path_factory):
    folder = tmp_path_factory.mktemp("stack")
    # A stack left behind by an earlier `up` (a crash, a lost terminal): the next `up` must stop it first.
    leftover = StackState(folder).spawn("api", ["sleep", "300"])
    dummy = vllm_installed()
    model = ["--vllm-model", "dummy"] if dummy else []
    # Short noise answers keep the run short; the API inherits the environment `stack up` runs in. A deadline the
    # random model's answers on two loaded cores cannot exhaust: with the default one, the queries after the first
    # may be predicted too slow for the model and answered extractively before it writes.
    env = {**os.environ, "COLUMNS": "200", "RAGHEAT_GENERATION__MAX_TOKENS": "32",
           "RAGHEAT_ADMISSION__DEADLINE_MS": "60000", "RAGHEAT_ADMISSION__MAX_TIMEOUT_MS": "60000"}
    up = subprocess.run([RAGHEAT, "stack", "up", "--index", str(subset_index), "--folder", str(folder), *FREE_PORTS,
                         *model], capture_output=True, text=True, timeout=420, env=env)
    try:
        assert up.returncode == 0, f"ragheat stack up failed:\n{up.stderr[-3000:]}"
        assert not leftover.alive() and "cleared the previous stack state" in up.stderr, up.stderr
        state = json.loads((folder / "state.json").read_text())
        yield RunningStack(folder, {p["name"]: p for p in state["processes"]}, state["notes"], up, dummy)
    finally:  # whatever happened, nothing outlives the tests (a no-op after test_down_leaves_nothing_running)
        subprocess.run([RAGHEAT, "stack", "down", "--folder", str(folder)], capture_output=True, timeout=120)


def test_every_component_runs_and_prometheus_sees_every_target_up(running_stack):
    processes, notes = running_stack.processes, running_stack.notes
    expected = {"api", "prometheus", "alertmanager", "alert-receiver"}
    if os.geteuid() == 0:
        expected.add("probes")  # `ragheat probes` must work here: `up` fails, naming probes, when it does not
    if running_stack.dummy:
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


def _address(hex_address: str) -> tuple[str, int]:
    """A /proc/net/tcp{,6} local address (little-endian 32-bit words, hex) as (IP, port)."""
    host, port = hex_address.split(":")
    raw = b"".join(bytes.fromhex(host[i:i + 8])[::-1] for i in range(0, len(host), 8))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw), int(port, 16)


def listening_addresses(pids: list[int]) -> set[tuple[str, int]]:
    """(IP, port) of every TCP socket the processes ``pids`` listen on."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            try:
                target = os.readlink(fd)
            except OSError:  # closed meanwhile
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                listening.add(_address(fields[1]))
    return listening


def test_every_stack_process_listens_on_loopback_only(running_stack):
    """`stack up` keeps the whole stack on this machine: every TCP port any of its processes (and their children:
    vLLM's engine, nginx's workers) listens on is bound to a loopback address, and each component's own URL is one
    of them. Alertmanager's cluster port, which would listen on every interface, is off."""
    from rag.api.access import is_loopback

    pids = sorted({pid for p in running_stack.processes.values() for pid in group_members(p["pid"])})
    listening = listening_addresses(pids)
    assert listening, pids
    exposed = sorted(address for address in listening if not is_loopback(address[0]))
    assert not exposed, f"stack processes listen beyond loopback: {exposed}"
    for name, process in running_stack.processes.items():
        port = int(process["url"].rsplit(":", 1)[1])
        assert ("127.0.0.1", port) in listening, (name, process["url"], sorted(listening))


def test_a_random_weight_model_is_never_presented_as_the_answering_model(running_stack):
    up, api = running_stack.up, running_stack.processes["api"]["url"]
    body = httpx.post(api + "/v1/query", json={"query": QUERIES[0]}, timeout=60).json()
    assert body["generator"] == "extractive", body
    if not running_stack.dummy:  # no model asked for: extractive answers, said in one line at start
        assert "answers: extractive" in up.stderr and "vllm" not in running_stack.processes
        assert body["degraded"] is False and body["generation"] is None
        return
    assert "WARNING: --vllm-model dummy" in up.stderr and "RANDOM weights" in up.stderr, up.stderr
    assert any("RANDOM weights" in note for note in running_stack.notes)
    # vLLM wrote (and was timed), the support check rejected the noise, the passages' sentences were served
    assert body["degraded_reason"] == "unsupported" and body["generation"]["model"] == "ragheat-llm", body
    assert body["dropped_sentences"] == body["unsupported_sentences"] > 0
    prometheus = running_stack.processes["prometheus"]["url"]
    deadline = time.monotonic() + 20
    while True:  # ...and counted: every query of the test above fell back
        seen = httpx.get(prometheus + "/api/v1/query", params={
            "query": 'sum(ragheat_generation_degraded_total{job="ragheat-api", reason="unsupported"})'},
            timeout=10).json()["data"]["result"]
        if (seen and float(seen[0]["value"][1]) >= len(QUERIES)) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert seen and float(seen[0]["value"][1]) >= len(QUERIES), seen


def test_prometheus_loaded_every_rendered_rule_group_and_alert_and_alertmanager(running_stack):
    folder, processes = running_stack.folder, running_stack.processes
    prometheus = processes["prometheus"]["url"]
    rule_files = sorted((folder / "rendered" / "prometheus").glob("*.yml"))
    expected = {g["name"]: sorted({r["alert"] for r in g["rules"] if "alert" in r})
                for f in rule_files for g in yaml.safe_load(f.read_text())["groups"]}
    _, groups = prometheus_report(prometheus)
    assert {g["name"]: g["alerts"] for g in groups} == expected and expected["ragheat-slo-burn-alerts"]
    assert not [g for g in groups if g["unhealthy"]], groups
    alertmanagers = httpx.get(prometheus + "/api/v1/alertmanagers", timeout=10).json()["data"]["activeAlertmanagers"]
    assert [a["url"].split("/api/")[0] for a in alertmanagers] == [processes["alertmanager"]["url"]]
    assert f"prometheus loaded {len(expected)} rule groups" in running_stack.up.stderr
    # The check `up` ran fails loudly, by name, on what is not there.
    with pytest.raises(StackError, match="rule group ragheat-imaginary is not loaded"):
        check_rules(prometheus, {**expected, "ragheat-imaginary": []}, processes["alertmanager"]["url"], timeout_s=1)


def test_status_reports_the_running_stack_and_its_rules(running_stack):
    status = subprocess.run([RAGHEAT, "stack", "status", "--folder", str(running_stack.folder)], capture_output=True,
                            text=True, timeout=60, env={**os.environ, "COLUMNS": "250"})
    assert status.returncode == 0, status.stdout + status.stderr
    for name in running_stack.processes:
        assert name in status.stdout
    assert "rules  ragheat-slo-burn-alerts" in status.stdout and "RagheatLatencyBudgetBurn" in status.stdout
    assert "rules problem" not in status.stdout


def test_status_fails_naming_the_rules_prometheus_lost(running_stack):
    """Runs after the others that need the rules: Prometheus reloads a config whose rules are gone."""
    prometheus = running_stack.processes["prometheus"]["url"]
    config_path = running_stack.folder / "prometheus" / "prometheus.yml"
    config = topology.load_yaml(config_path)
    config_path.write_text(yaml.safe_dump({**config, "rule_files": []}, sort_keys=False))
    assert httpx.post(prometheus + "/-/reload", timeout=30).status_code == 200
    status = subprocess.run([RAGHEAT, "stack", "status", "--folder", str(running_stack.folder)], capture_output=True,
                            text=True, timeout=60, env={**os.environ, "COLUMNS": "250"})
    assert status.returncode == 1, status.stdout + status.stderr
    assert "rules problem: rule group ragheat-slo-burn-alerts is not loaded" in status.stdout, status.stdout


def test_down_leaves_nothing_running(running_stack, request):
    """Runs last in this module: stop through the CLI, then check every recorded process group is gone."""
    folder, processes = running_stack.folder, running_stack.processes
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
