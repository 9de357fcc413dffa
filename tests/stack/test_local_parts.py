"""The parts of ``ragheat stack up`` on their own: compose's configs rewritten for loopback, processes
recorded by pid and start time, and the alert receiver over real HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import replace

import httpx
import pytest

from rag.errors import ConfigurationError
from stack import topology
from stack.alert_receiver import AlertReceiver
from stack.processes import StackState, start_time

ALL_LOCAL = {"api": "127.0.0.1:1001", "probes": "127.0.0.1:1002", "vllm": "127.0.0.1:1003",
             "prometheus": "127.0.0.1:1004", "alertmanager": "127.0.0.1:1005", "alert-receiver": "127.0.0.1:1006"}


def test_every_target_moves_to_loopback_and_absent_components_are_named(tmp_path):
    config, dropped = topology.local_prometheus_config(topology.LocalAddresses(ALL_LOCAL), tmp_path)
    targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in config["scrape_configs"]}
    assert targets == {job: [ALL_LOCAL[c]] for job, c in topology.JOB_COMPONENTS.items() if c in ALL_LOCAL}
    assert dropped == ["otel-collector"]
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [ALL_LOCAL["alertmanager"]]
    assert all(p.startswith(str(tmp_path)) for p in config["rule_files"])
    original = topology.load_yaml(topology.PROMETHEUS_CONFIG)
    assert config["global"] == original["global"]  # only addresses change

    fewer = {k: v for k, v in ALL_LOCAL.items() if k not in ("probes", "vllm")}
    _, dropped = topology.local_prometheus_config(topology.LocalAddresses(fewer), tmp_path)
    assert sorted(dropped) == ["otel-collector", "ragheat-probes", "vllm"]


def test_an_unknown_scrape_job_is_refused_by_name(tmp_path):
    config = topology.load_yaml(topology.PROMETHEUS_CONFIG)
    config["scrape_configs"].append({"job_name": "mystery", "static_configs": [{"targets": ["x:1"]}]})
    with pytest.raises(ConfigurationError, match="mystery"):
        topology.local_prometheus_config(topology.LocalAddresses(ALL_LOCAL), tmp_path, config)


def test_render_command_is_composes_with_local_paths_and_urls(tmp_path):
    command = topology.render_command(topology.LocalAddresses(ALL_LOCAL), tmp_path)
    compose = topology.compose_command("dashboards-render")
    assert len(command) == len(compose) and command[:3] == compose[:3]
    assert command[3] == str(tmp_path)
    assert f"http://{ALL_LOCAL['prometheus']}" in command
    assert f"http://{ALL_LOCAL['alert-receiver']}/page" in command
    assert not any("alert-receiver:" in a or "prometheus:9090" in a or a.startswith(topology.RENDERED_MOUNT)
                   for a in command)


def test_prometheus_flags_are_composes_less_container_paths():
    flags = topology.prometheus_flags()
    assert "--web.enable-remote-write-receiver" in flags
    assert not any(f.startswith(("--config.file", "--storage.tsdb.path")) for f in flags)


def test_a_recorded_process_is_stopped_with_its_group_and_the_state_is_cleared(tmp_path):
    state = StackState(tmp_path)
    # A parent with a child in the same group, which logs the child's pid: stopping the group ends both.
    managed = state.spawn("sleeper", [sys.executable, "-c", "import subprocess, time; "
                                      "print(subprocess.Popen(['sleep', '60']).pid, flush=True); time.sleep(60)"])
    loaded = StackState.load(tmp_path)
    assert loaded is not None and loaded.get("sleeper").pid == managed.pid and loaded.get("sleeper").alive()
    deadline = time.monotonic() + 10
    while not (log := open(managed.log).read()).strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(log.split()[0])
    assert start_time(child) is not None
    assert loaded.stop_all() == ["sleeper"]
    assert not managed.alive() and start_time(child) is None
    assert not (tmp_path / "state.json").exists()


def test_a_child_left_behind_by_a_dead_leader_is_stopped_too(tmp_path):
    """Like vLLM's API server crashing while its engine-core child lives on in the same process group."""
    state = StackState(tmp_path)
    managed = state.spawn("crashed", [sys.executable, "-c", "import subprocess; "
                                      "print(subprocess.Popen(['sleep', '60']).pid, flush=True)"])
    deadline = time.monotonic() + 10
    while (managed.alive() or not open(managed.log).read().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(open(managed.log).read().split()[0])
    assert not managed.alive() and start_time(child) is not None  # the leader is gone, its child is not
    assert StackState.load(tmp_path).stop_all() == ["crashed"]
    assert start_time(child) is None


def test_a_reused_pid_is_never_taken_for_ours(tmp_path):
    """A stale state whose pid now belongs to another process (other start time) leaves that process alone."""
    stranger = subprocess.Popen(["sleep", "30"])
    try:
        state = StackState(tmp_path)
        managed = state.spawn("short", ["true"])
        # Our record, but the pid now someone else's: their start time differs from the one recorded.
        state.processes[0] = replace(managed, pid=stranger.pid, started=start_time(stranger.pid) + 1)
        state.save()
        assert StackState.load(tmp_path).stop_all() == []
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_an_unreadable_state_file_is_reported_not_guessed(tmp_path):
    (tmp_path / "state.json").write_text("{not json")
    with pytest.raises(ValueError, match="state.json is unreadable"):
        StackState.load(tmp_path)


@pytest.fixture
def receiver():
    server = AlertReceiver(("127.0.0.1", 0), out=open("/dev/null", "w"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_alert_receiver_records_pages_and_tickets(receiver):
    server, url = receiver
    payload = {"status": "firing", "receiver": "page",
               "alerts": [{"status": "firing", "labels": {"alertname": "RagheatLatencyBudgetBurn", "slo": "latency"}}]}
    assert httpx.post(url + "/page", json=payload).status_code == 200
    assert httpx.post(url + "/ticket", json={**payload, "status": "resolved"}).status_code == 200
    received = httpx.get(url + "/alerts").json()
    assert [(r["route"], r["status"]) for r in received] == [("page", "firing"), ("ticket", "resolved")]
    assert received[0]["alerts"][0]["name"] == "RagheatLatencyBudgetBurn"
    assert httpx.get(url + "/healthz").status_code == 200


def test_alert_receiver_rejects_what_is_not_a_webhook(receiver):
    _, url = receiver
    assert httpx.post(url + "/elsewhere", json={}).status_code == 404
    bad = httpx.post(url + "/page", content=b"{oops", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and "not an Alertmanager webhook payload" in bad.json()["error"]
    assert json.loads(httpx.get(url + "/alerts").text) == []
