"""The parts of ``ragheat stack up`` on their own: compose's configs rewritten for loopback (absolute paths only,
checked by the real promtool from another folder), the rules check, who answers, processes recorded by pid and
start time, and the alert receiver over real HTTP."""

from __future__ import annotations

import glob
import json
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from rag.errors import ConfigurationError
from stack import topology
from stack.alert_receiver import AlertReceiver
from stack.local import DEFAULT_PORTS, StackError, StackOptions, answer_plan, prepare_configs
from stack.processes import StackState, start_time
from tests.stack.conftest import tool

ALL_LOCAL = {"api": "127.0.0.1:1001", "probes": "127.0.0.1:1002", "vllm": "127.0.0.1:1003",
             "prometheus": "127.0.0.1:1004", "alertmanager": "127.0.0.1:1005", "alert-receiver": "127.0.0.1:1006"}


def test_every_target_moves_to_loopback_and_absent_components_are_named(tmp_path):
    config, dropped = topology.local_prometheus_config(topology.LocalAddresses(ALL_LOCAL), tmp_path)
    targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in config["scrape_configs"]}
    assert targets == {job: [ALL_LOCAL[c]] for job, c in topology.JOB_COMPONENTS.items() if c in ALL_LOCAL}
    assert sorted(dropped) == ["milvus", "otel-collector"]
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [ALL_LOCAL["alertmanager"]]
    assert all(p.startswith(str(tmp_path)) for p in config["rule_files"])
    original = topology.load_yaml(topology.PROMETHEUS_CONFIG)
    assert config["global"] == original["global"]  # only addresses change

    fewer = {k: v for k, v in ALL_LOCAL.items() if k not in ("probes", "vllm")}
    _, dropped = topology.local_prometheus_config(topology.LocalAddresses(fewer), tmp_path)
    assert sorted(dropped) == ["milvus", "otel-collector", "ragheat-probes", "vllm"]


def test_an_unknown_scrape_job_is_refused_by_name(tmp_path):
    config = topology.load_yaml(topology.PROMETHEUS_CONFIG)
    config["scrape_configs"].append({"job_name": "mystery", "static_configs": [{"targets": ["x:1"]}]})
    with pytest.raises(ConfigurationError, match="mystery"):
        topology.local_prometheus_config(topology.LocalAddresses(ALL_LOCAL), tmp_path, config)


def test_render_command_is_composes_with_local_paths_and_urls(tmp_path):
    command = topology.render_command(topology.LocalAddresses(ALL_LOCAL), tmp_path)
    compose = topology.compose_command("dashboards-render")
    # The local Prometheus asks for no password, so Grafana's data source presents none.
    assert topology.LOCAL_DROPPED_RENDER_OPTION in compose and topology.LOCAL_DROPPED_RENDER_OPTION not in command
    assert len(command) == len(compose) - 2 and command[:3] == compose[:3]
    assert command[3] == str(tmp_path)
    assert f"http://{ALL_LOCAL['prometheus']}" in command
    assert f"http://{ALL_LOCAL['alert-receiver']}/page" in command
    assert not any("alert-receiver:" in a or "prometheus:9090" in a or a.startswith(topology.RENDERED_MOUNT)
                   for a in command)


def test_the_rules_profile_replaces_composes_profile(tmp_path):
    command = topology.render_command(topology.LocalAddresses(ALL_LOCAL), tmp_path, profile="test")
    assert command[command.index("--profile") + 1] == "test" and command.count("--profile") == 1


def test_a_relative_rendered_folder_is_refused(tmp_path):
    """A trap: Prometheus reads relative rule_files from its config file's folder."""
    with pytest.raises(ConfigurationError, match="absolute"):
        topology.local_prometheus_config(topology.LocalAddresses(ALL_LOCAL), Path("data/stack/rendered"))
    # ...and the check that catches such a config: the same pattern, relative, matches nothing from the config's folder.
    (tmp_path / "rendered" / "prometheus").mkdir(parents=True)
    (tmp_path / "rendered" / "prometheus" / "rules.yml").write_text("groups: []\n")
    config = {"rule_files": ["rendered/prometheus/*.yml"]}
    assert topology.unmatched_rule_files(config, tmp_path / "prometheus.yml") == []
    assert topology.unmatched_rule_files(config, tmp_path / "prometheus" / "prometheus.yml") == ["rendered/prometheus/*.yml"]


def test_durations_and_the_test_profiles_timers():
    assert [topology.parse_duration(d) for d in ("500ms", "15s", "5m", "1h30m", "12h")] == [0.5, 15, 300, 5400, 43200]
    assert [topology.format_duration(s) for s in (0.5, 1, 5, 720, 5400)] == ["500ms", "1s", "5s", "12m", "90m"]
    with pytest.raises(ConfigurationError, match="duration"):
        topology.parse_duration("5 minutes")
    routes = {"route": {"receiver": "ticket", "group_wait": "30s", "group_interval": "5m", "repeat_interval": "12h",
                        "routes": [{"receiver": "page", "repeat_interval": "1h"}]}, "receivers": []}
    scaled = topology.scaled_routes(routes, 60)
    assert scaled["route"]["group_wait"] == "500ms" and scaled["route"]["group_interval"] == "5s"
    assert scaled["route"]["repeat_interval"] == "12m" and scaled["route"]["routes"][0]["repeat_interval"] == "1m"
    assert routes["route"]["group_wait"] == "30s"  # the input is left as it was
    config, _ = topology.local_prometheus_config(topology.LocalAddresses(ALL_LOCAL), Path("/abs"), time_divisor=60)
    assert config["global"]["scrape_interval"] == "1s" and config["global"]["evaluation_interval"] == "1s"


def test_rule_problems_name_each_missing_group_alert_and_failing_rule():
    expected = {"quantiles": [], "burn": ["A", "B"]}
    good = [{"name": "quantiles", "alerts": [], "unhealthy": []}, {"name": "burn", "alerts": ["A", "B"], "unhealthy": []}]
    assert topology.rule_problems(expected, good) == []
    assert topology.rule_problems(expected, []) == ["rule group quantiles is not loaded", "rule group burn is not loaded"]
    partial = [good[0], {"name": "burn", "alerts": ["A"], "unhealthy": ["A"]}]
    assert topology.rule_problems(expected, partial) == ["rule group burn lacks the alerts B",
                                                         "rule group burn has failing rules: A"]
    assert "no rule group was rendered" in topology.rule_problems({}, good)[0]


def test_generated_configs_name_absolute_paths_even_from_a_relative_folder(tmp_path, monkeypatch):
    """``stack up --folder data/stack`` (the default is relative): every path written into a generated config is
    absolute, and the real promtool, run from another folder, finds the rule files through the written config."""
    monkeypatch.chdir(tmp_path)
    options = StackOptions(tmp_path / "index", Path("data/stack"), rules_profile="test", time_divisor=60)
    configs = prepare_configs(options, topology.load_yaml(topology.COMPOSE_FILE),
                              topology.LocalAddresses({c: f"127.0.0.1:{p}" for c, p in DEFAULT_PORTS.items()}))
    prometheus = topology.load_yaml(configs.prometheus)
    assert prometheus["rule_files"] and all(Path(p).is_absolute() and glob.glob(p) for p in prometheus["rule_files"])
    provider = topology.load_yaml(configs.rendered / "grafana" / "provisioning" / "dashboards" / "ragheat.yml")
    dashboards = Path(provider["providers"][0]["options"]["path"])
    assert dashboards.is_absolute() and {"latency.json", "slo.json", "quality.json"} <= {
        board.name for board in dashboards.glob("*.json")}  # the Quality board is provisioned beside the others
    assert set(configs.expected_rules) == {"ragheat-stage-quantiles", "ragheat-slo-error-ratios", "ragheat-why",
                                           "ragheat-slo-burn-alerts", "ragheat-quality-drift"}
    assert set(configs.expected_rules["ragheat-slo-burn-alerts"]) == {
        "RagheatLatencyBudgetBurn", "RagheatAvailabilityBudgetBurn", "RagheatQualityBudgetBurn"}
    assert set(configs.expected_rules["ragheat-quality-drift"]) == {"RagheatQualityDrift"}
    templates = topology.load_yaml(configs.alertmanager)["templates"]  # the notification template, rendered here
    assert templates and all(Path(t).is_absolute() and glob.glob(t) for t in templates), templates
    routes = topology.load_yaml(configs.alertmanager)["route"]
    assert routes["group_wait"] == "500ms"  # the test profile's timers
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    check = subprocess.run([tool("promtool", "Debian's package prometheus"), "check", "config", str(configs.prometheus)],
                           capture_output=True, text=True, timeout=60, cwd=elsewhere)
    assert check.returncode == 0 and "SUCCESS: 1 rule files found" in check.stdout, check.stdout + check.stderr
    amtool = subprocess.run([tool("amtool", "Debian's package prometheus-alertmanager"), "check-config",
                             str(configs.alertmanager)], capture_output=True, text=True, timeout=60, cwd=elsewhere)
    assert amtool.returncode == 0, amtool.stdout + amtool.stderr


def test_without_a_model_the_api_answers_extractively_and_says_so(tmp_path):
    plan = answer_plan(StackOptions(tmp_path, tmp_path), tmp_path)
    assert plan.env == {"RAGHEAT_GENERATION__GENERATOR": "extractive"} and plan.vllm_python is None
    assert plan.line.startswith("answers: extractive") and "--vllm-model DIR" in plan.line and not plan.warning


def test_random_weights_are_only_run_when_asked_and_then_said_loudly(tmp_path):
    python = Path(sys.executable)  # any interpreter file stands in for .venv-vllm's here: nothing is started
    plan = answer_plan(StackOptions(tmp_path, tmp_path, vllm_model="dummy", vllm_python=python), tmp_path)
    assert plan.warning and plan.dummy and plan.line.startswith("WARNING") and "RANDOM weights" in plan.line
    assert plan.env["RAGHEAT_GENERATION__GENERATOR"] == "openai" and (Path(plan.vllm_model) / "config.json").is_file()


def test_a_model_is_named_once_and_must_be_a_real_one(tmp_path):
    python = Path(sys.executable)
    with pytest.raises(StackError, match="give one of them"):
        answer_plan(StackOptions(tmp_path, tmp_path, vllm_model="dummy", llm_url="http://x/v1"), tmp_path)
    with pytest.raises(StackError, match="http"):
        answer_plan(StackOptions(tmp_path, tmp_path, llm_url="127.0.0.1:8001"), tmp_path)
    with pytest.raises(StackError, match="no config.json"):
        answer_plan(StackOptions(tmp_path, tmp_path, vllm_model=str(tmp_path), vllm_python=python), tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(StackError, match="no weight files"):  # e.g. the tiny model's folder: random weights only
        answer_plan(StackOptions(tmp_path, tmp_path, vllm_model=str(tmp_path), vllm_python=python), tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")
    plan = answer_plan(StackOptions(tmp_path, tmp_path, vllm_model=str(tmp_path), vllm_python=python), tmp_path)
    assert not plan.warning and str(tmp_path) in plan.line and plan.vllm_model == str(tmp_path)
    # a real model on the CPU gets deadlines it fits in (the SLO would have admission skip it)
    assert float(plan.env["RAGHEAT_ADMISSION__DEADLINE_MS"]) >= 10_000
    assert float(plan.env["RAGHEAT_ADMISSION__MAX_TIMEOUT_MS"]) >= float(plan.env["RAGHEAT_ADMISSION__DEADLINE_MS"])
    with pytest.raises(StackError, match="install_vllm.sh"):
        answer_plan(StackOptions(tmp_path, tmp_path, vllm_model="dummy", vllm_python=tmp_path / "nope"), tmp_path)
    url = answer_plan(StackOptions(tmp_path, tmp_path, llm_url="http://127.0.0.1:9/v1", llm_model="m"), tmp_path)
    assert url.env == {"RAGHEAT_GENERATION__GENERATOR": "openai", "RAGHEAT_GENERATION__BASE_URL": "http://127.0.0.1:9/v1",
                       "RAGHEAT_GENERATION__MODEL": "m"} and url.vllm_python is None


def test_prometheus_flags_are_composes_less_container_paths():
    flags = topology.prometheus_flags()
    assert "--web.enable-remote-write-receiver" in flags
    assert not any(f.startswith(("--config.file", "--storage.tsdb.path", "--web.config.file")) for f in flags)
    assert any(f.startswith("--web.config.file=") for f in topology.compose_command("prometheus"))


def _auth_blocks(config: dict) -> list[dict]:
    return [section.get("basic_auth") for section in (*config["scrape_configs"], *config["alerting"]["alertmanagers"])
            if "basic_auth" in section]


def test_the_local_config_drops_composes_basic_auth_or_points_it_at_a_local_password(tmp_path):
    """compose's Prometheus presents web-auth's password to itself, Alertmanager and its alert deliveries; the
    loopback stack runs them without a web config, so those blocks go, unless a password file is given (the
    web-auth test runs them with one)."""
    compose = topology.load_yaml(topology.PROMETHEUS_CONFIG)
    assert len(_auth_blocks(compose)) == 3
    plain, _ = topology.local_prometheus_config(topology.LocalAddresses(ALL_LOCAL), tmp_path)
    assert _auth_blocks(plain) == []
    password = tmp_path / "auth" / "password"
    secured, _ = topology.local_prometheus_config(topology.LocalAddresses(ALL_LOCAL), tmp_path, password_file=password)
    assert _auth_blocks(secured) == [{"username": "ragheat", "password_file": str(password)}] * 3
    assert [j["job_name"] for j in secured["scrape_configs"]] == [j["job_name"] for j in plain["scrape_configs"]]


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
               "alerts": [{"status": "firing", "labels": {"alertname": "RagheatLatencyBudgetBurn", "slo": "latency"},
                           "annotations": {"stage": "fuse", "description": "Objective: 99 % ..."}}]}
    assert httpx.post(url + "/page", json=payload).status_code == 200
    assert httpx.post(url + "/ticket", json={**payload, "status": "resolved"}).status_code == 200
    received = httpx.get(url + "/alerts").json()
    assert [(r["route"], r["status"]) for r in received] == [("page", "firing"), ("ticket", "resolved")]
    assert received[0]["alerts"][0]["name"] == "RagheatLatencyBudgetBurn"
    assert received[0]["alerts"][0]["annotations"] == {"stage": "fuse"}  # the blamed stage kept, the prose not
    assert httpx.get(url + "/healthz").status_code == 200


def test_alert_receiver_rejects_what_is_not_a_webhook(receiver):
    _, url = receiver
    assert httpx.post(url + "/elsewhere", json={}).status_code == 404
    bad = httpx.post(url + "/page", content=b"{oops", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and "not an Alertmanager webhook payload" in bad.json()["error"]
    assert json.loads(httpx.get(url + "/alerts").text) == []
