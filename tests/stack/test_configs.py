"""The files compose mounts, checked by the real tools: the Prometheus config with the rules
``dashboards-render`` writes (promtool), the Alertmanager routes (amtool), Grafana provisioning (parsed,
pointing at dashboards that exist), the collector config (structure, contrib components, the spanmetrics
connector's buckets and the OTTL that names stages) and Tempo's."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from rag.stages import STAGES
from stack import topology
from stack.collector import collector_problems, go_duration_ns, spanmetrics_bounds
from telemetry.buckets import LATENCY_SECONDS
from tests.stack.conftest import REPO, tool

DEPLOY = REPO / "deploy"


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def service_hosts(compose_model: dict) -> set[str]:
    """Names a container can reach: every service name and network alias."""
    hosts = set(compose_model["services"])
    for service in compose_model["services"].values():
        for network in (service.get("networks") or {}).values():
            hosts.update((network or {}).get("aliases", []))
    return hosts


def _target(job: dict) -> str:
    """A scrape job's one target, static or found by DNS (``name:port``)."""
    if "dns_sd_configs" in job:
        (sd,) = job["dns_sd_configs"]
        (name,) = sd["names"]
        return f"{name}:{sd['port']}"
    return job["static_configs"][0]["targets"][0]


def in_container(path: str, rendered: Path) -> Path:
    """A container path under the rendered volume, as the local copy of that volume."""
    assert path.startswith(topology.RENDERED_MOUNT), path
    return rendered / path[len(topology.RENDERED_MOUNT):].lstrip("/")


@pytest.fixture(scope="module")
def prometheus_config(rendered, tmp_path_factory) -> Path:
    """deploy/prometheus/prometheus.yml with only its rule_files path moved to the local rendered copy."""
    config = load(DEPLOY / "prometheus" / "prometheus.yml")
    config["rule_files"] = [str(in_container(p, rendered)) for p in config["rule_files"]]
    path = tmp_path_factory.mktemp("prometheus") / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_promtool_accepts_the_prometheus_config_and_its_rules(prometheus_config, rendered):
    result = subprocess.run([tool("promtool", "Debian's package prometheus"), "check", "config", str(prometheus_config)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    rules = sorted((rendered / "prometheus").glob("*.yml"))
    assert rules and all(f"Checking {r}" in result.stdout for r in rules), result.stdout  # the rules were read too
    assert "SUCCESS" in result.stdout and "rules found" in result.stdout


def test_promtool_rejects_a_config_whose_rules_are_broken(prometheus_config, rendered, tmp_path):
    """The check above can fail: the same config pointing at a broken rule file is refused."""
    broken = tmp_path / "broken.yml"
    broken.write_text("groups:\n- name: x\n  rules:\n  - record: a:b\n    expr: sum(\n")
    config = load(prometheus_config)
    config["rule_files"] = [str(broken)]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run([tool("promtool", "Debian's package prometheus"), "check", "config", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0


def test_prometheus_scrapes_compose_services_and_the_rules_come_from_the_rendered_volume(compose_model):
    config = load(DEPLOY / "prometheus" / "prometheus.yml")
    hosts = service_hosts(compose_model) | {"localhost"}
    jobs = {job["job_name"]: _target(job) for job in config["scrape_configs"]}
    assert set(jobs) == set(topology.JOB_COMPONENTS)
    for job, target in jobs.items():
        assert target.rsplit(":", 1)[0] in hosts, f"job {job} scrapes {target}, which is no compose service"
    # Every API replica, found through Docker's DNS (one address per replica), each labelled: not the balancer.
    # The API's own metrics port: its API port asks for a key.
    assert jobs["ragheat-api"] == f"api:{compose_model['services']['api']['environment']['RAGHEAT_SERVER__METRICS_PORT']}"
    api_job = next(j for j in config["scrape_configs"] if j["job_name"] == "ragheat-api")
    assert "static_configs" not in api_job and api_job["dns_sd_configs"][0]["type"] == "A"
    assert api_job["relabel_configs"] == [{"source_labels": ["__address__"], "target_label": topology.REPLICA_LABEL}]
    assert "deploy" in compose_model["services"]["api"] and "ports" not in compose_model["services"]["api"]
    probes_command = compose_model["services"]["probes"]["command"]
    assert jobs["ragheat-probes"] == f"api:{probes_command[probes_command.index('--port') + 1]}"
    assert all(p.startswith(topology.RENDERED_MOUNT) for p in config["rule_files"])
    mounts = {v["target"] for v in compose_model["services"]["prometheus"]["volumes"]}
    assert topology.RENDERED_MOUNT in mounts and "/etc/prometheus/prometheus.yml" in mounts


def test_prometheus_keeps_exemplars_and_native_histograms_and_takes_remote_write(compose_model):
    flags = compose_model["services"]["prometheus"]["command"]
    features = {f for flag in flags if flag.startswith("--enable-feature=") for f in flag.split("=", 1)[1].split(",")}
    assert {"exemplar-storage", "native-histograms"} <= features
    assert "--web.enable-remote-write-receiver" in flags


def test_amtool_accepts_the_rendered_routes_and_pages_reach_the_page_receiver(rendered, compose_model):
    config = rendered / "alertmanager" / "alertmanager.yml"
    command = compose_model["services"]["alertmanager"]["command"]
    assert f"--config.file={topology.RENDERED_MOUNT}/alertmanager/alertmanager.yml" in command
    amtool = tool("amtool", "Debian's package prometheus-alertmanager")
    result = subprocess.run([amtool, "check-config", str(config)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    for severity in ("page", "ticket"):
        routed = subprocess.run([amtool, "config", "routes", "test", f"--config.file={config}",
                                 f"severity={severity}", "slo=latency"], capture_output=True, text=True, timeout=60)
        assert routed.stdout.split() == [severity], routed.stdout + routed.stderr
    hosts = service_hosts(compose_model)
    for receiver in load(config)["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            assert urlsplit(hook["url"]).hostname in hosts, f"{hook['url']} is no compose service"


def test_grafana_provisioning_parses_and_points_at_rendered_dashboards(rendered, compose_model):
    grafana = compose_model["services"]["grafana"]
    provisioning = in_container(grafana["environment"]["GF_PATHS_PROVISIONING"], rendered)
    datasources = [d for f in sorted((provisioning / "datasources").glob("*.yml")) for d in load(f)["datasources"]]
    assert {d["type"] for d in datasources} >= {"prometheus", "tempo"}
    hosts = service_hosts(compose_model)
    for source in datasources:
        assert urlsplit(source["url"]).hostname in hosts, f"datasource {source['name']} points at {source['url']}"
    uids = {d["uid"] for d in datasources}
    for source in datasources:  # exemplar links open a trace datasource that exists
        for link in source.get("jsonData", {}).get("exemplarTraceIdDestinations", []):
            assert link["datasourceUid"] in uids
    providers = [p for f in sorted((provisioning / "dashboards").glob("*.yml")) for p in load(f)["providers"]]
    assert providers
    for provider in providers:
        boards = sorted(in_container(provider["options"]["path"], rendered).glob("*.json"))
        assert boards, f"provider {provider['name']} points at a folder without dashboards"
        for board in boards:
            assert json.loads(board.read_text())["uid"]
    assert in_container(grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"], rendered).is_file()


def test_collector_config_uses_only_contrib_components_and_is_well_formed(compose_model):
    config = load(DEPLOY / "otel-collector" / "config.yaml")
    assert collector_problems(config) == []
    assert compose_model["services"]["otel-collector"]["image"].startswith("otel/opentelemetry-collector-contrib:")
    # The API's OTLP/HTTP endpoint is the receiver's HTTP port; exports go to compose services.
    api = urlsplit(compose_model["services"]["api"]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert config["receivers"]["otlp"]["protocols"]["http"]["endpoint"].endswith(f":{api.port}")
    remote_write = urlsplit(config["exporters"]["prometheusremotewrite"]["endpoint"])
    assert (remote_write.hostname, remote_write.port, remote_write.path) == ("prometheus", 9090, "/api/v1/write")
    tempo = load(DEPLOY / "tempo" / "tempo.yaml")
    tempo_grpc = tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    assert config["exporters"]["otlp/tempo"]["endpoint"] == "tempo:" + tempo_grpc.rsplit(":", 1)[1]


def _statements(config: dict) -> list[str]:
    return config["processors"]["transform/rag_stage"]["trace_statements"]


def _set_statement(config: dict, index: int, text: str) -> None:
    _statements(config)[index] = text


@pytest.mark.parametrize("break_it, problem", [
    (lambda c: c["exporters"].update({"kafka/typo": {}}), "exporters.kafka/typo"),
    (lambda c: c["service"]["pipelines"]["traces"]["exporters"].append("zipkin"), "'zipkin', which is not defined"),
    (lambda c: c["service"]["pipelines"]["metrics"].update({"processors": ["batch", "memory_limiter"]}),
     "memory_limiter must come first"),
    (lambda c: c["connectors"].update({"servicegraph": {}}), "connectors.servicegraph: not a component"),
    (lambda c: c["service"]["pipelines"].pop("metrics/spanmetrics"), "spanmetrics is in no pipeline's receivers"),
    (lambda c: c["service"]["pipelines"]["metrics"]["exporters"].append("spanmetrics"),
     "spanmetrics must be in the exporters of traces pipelines only"),
    (lambda c: c["connectors"]["spanmetrics"]["histogram"].update({"exponential": {"max_size": 160}}),
     "both explicit and exponential"),
    (lambda c: c["connectors"]["spanmetrics"]["histogram"]["explicit"]["buckets"].insert(3, "1.5ms"),
     "not a Go duration in whole units"),
    (lambda c: c["connectors"]["spanmetrics"]["histogram"]["explicit"]["buckets"].append("5s"),
     "strictly increasing"),
    (lambda c: _set_statement(c, 0, 'set(span.attributes["rag.stage"], "embed") where (span.name == "x"'),
     "expected ')'"),
    (lambda c: _set_statement(c, 0, 'set(attributes["rag.stage"], "embed") where attributes["x"] == "y"'),
     "lacks a context prefix"),
    (lambda c: _set_statement(c, 0, 'set(span.attributes["rag.stage"], "embed) where span.name == "x"'),
     "unterminated string"),
    (lambda c: _set_statement(c, 0, 'sett(span.attributes["rag.stage"], "embed")'), "not an OTTL editor"),
    (lambda c: c["processors"]["filter/rag_stage"]["traces"]["span"].append('attributes["rag.stage"] =='),
     "span condition"),
    (lambda c: c["service"]["extensions"].remove("basicauth/prometheus"),
     "authenticator 'basicauth/prometheus', which service.extensions does not start"),
], ids=["unknown-component", "undefined-exporter", "processor-order", "unknown-connector", "connector-one-end",
        "connector-wrong-signal", "two-histograms", "fractional-bucket", "unordered-buckets", "ottl-unbalanced",
        "ottl-no-context", "ottl-unterminated", "ottl-editor", "ottl-filter", "authenticator-not-started"])
def test_collector_check_catches_mistakes(break_it, problem):
    config = load(DEPLOY / "otel-collector" / "config.yaml")
    break_it(config)
    assert any(problem in p for p in collector_problems(config)), collector_problems(config)


# The stages spans are mapped to: the GenAI semantic conventions' gen_ai.operation.name and OpenInference's span
# kinds. Stages outside ragheat's own set are named in docs/telemetry.md.
GENAI_STAGES = {"embeddings": "embed", "retrieval": "retrieve", "chat": "generate", "text_completion": "generate",
                "generate_content": "generate", "execute_tool": "tool"}
OPENINFERENCE_STAGES = {"EMBEDDING": "embed", "RETRIEVER": "retrieve", "RERANKER": "rerank", "LLM": "generate",
                        "TOOL": "tool"}
SPAN_ONLY_STAGES = {"retrieve", "tool"}
_STAGE_SET = re.compile(r'set\(span\.attributes\["rag\.stage"\], "(\w+)"\) '
                        r'where span\.attributes\["rag\.stage"\] == nil and (.+)$')


def test_spanmetrics_buckets_are_ragheats_latency_buckets():
    spanmetrics = load(DEPLOY / "otel-collector" / "config.yaml")["connectors"]["spanmetrics"]
    assert spanmetrics["histogram"]["unit"] == "s" and "exponential" not in spanmetrics["histogram"]
    assert spanmetrics_bounds(spanmetrics) == LATENCY_SECONDS
    # The conversion the check mirrors: whole units, the connector's nanoseconds / unit in float64.
    assert go_duration_ns("7500us") == 7_500_000 and go_duration_ns("1m30s") == 90 * 10 ** 9
    with pytest.raises(ValueError):
        go_duration_ns("0.42s")


def test_spans_become_stage_histograms_with_exemplars_remote_written():
    config = load(DEPLOY / "otel-collector" / "config.yaml")
    pipelines = config["service"]["pipelines"]
    spans, metrics = pipelines["traces/spanmetrics"], pipelines["metrics/spanmetrics"]
    assert spans["receivers"] == ["otlp"] and spans["exporters"] == ["spanmetrics"]
    assert spans["processors"].index("transform/rag_stage") < spans["processors"].index("filter/rag_stage")
    assert metrics["receivers"] == ["spanmetrics"] and metrics["exporters"] == ["prometheusremotewrite"]
    assert "transform/rag_stage" not in pipelines["traces"]["processors"]  # Tempo gets the spans unchanged
    spanmetrics = config["connectors"]["spanmetrics"]
    assert spanmetrics["exemplars"]["enabled"] is True
    assert [d["name"] for d in spanmetrics["dimensions"]] == ["rag.stage", "rag.outcome"]
    # The Prometheus names remote write gives them (dots to underscores, unit s to _seconds), as documented.
    prefix = spanmetrics["namespace"].replace(".", "_")
    telemetry_doc = (REPO / "docs" / "telemetry.md").read_text()
    for name in (f"{prefix}_duration_seconds_bucket", f"{prefix}_duration_seconds_count", f"{prefix}_calls_total"):
        assert name in telemetry_doc, name


def test_span_attributes_map_onto_ragheat_stages():
    config = load(DEPLOY / "otel-collector" / "config.yaml")
    genai, openinference = {}, {}
    for statement in _statements(config):
        match = _STAGE_SET.match(statement)
        if match is None:
            assert statement.startswith('set(span.attributes["rag.outcome"], "error") where '), statement
            continue
        stage, condition = match.groups()
        for key, found in (("gen_ai.operation.name", genai), ("openinference.span.kind", openinference)):
            for value in re.findall(rf'span\.attributes\["{re.escape(key)}"\] == "(\w+)"', condition):
                found[value] = stage
    assert genai == GENAI_STAGES and openinference == OPENINFERENCE_STAGES
    assert set(genai.values()) | set(openinference.values()) <= set(STAGES) | SPAN_ONLY_STAGES
    assert SPAN_ONLY_STAGES.isdisjoint(STAGES)
    assert config["processors"]["filter/rag_stage"]["traces"]["span"] == ['attributes["rag.stage"] == nil']


def test_tempo_serves_grafana_on_the_datasource_port(rendered):
    tempo = load(DEPLOY / "tempo" / "tempo.yaml")
    datasources = [d for f in (rendered / "grafana" / "provisioning" / "datasources").glob("*.yml")
                   for d in load(f)["datasources"]]
    trace_url = next(urlsplit(d["url"]) for d in datasources if d["type"] == "tempo")
    assert (trace_url.hostname, trace_url.port) == ("tempo", tempo["server"]["http_listen_port"])
