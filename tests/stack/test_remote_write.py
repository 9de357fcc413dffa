"""``ragheat stack up --remote-write``: the stack's Prometheus ships every series to a VictoriaMetrics (Debian's
victoria-metrics) the stack starts on loopback. After real queries, VictoriaMetrics' own query API returns the same
per-stage latency histogram (every ``stage``, every bucket, the same counts at one timestamp) as the stack's
Prometheus, each series carrying Prometheus' external labels; what the receiver does not keep (exemplars, native
histograms: the API's own exponential histograms, remote-written into Prometheus as compose's collector writes them)
is measured: Prometheus sends both and VictoriaMetrics has neither. A bad ``--remote-write-url`` is refused
before anything starts; a receiver that is down leaves Prometheus scraping, counting the retries, and what it queued
arrives once the receiver answers. compose's remote-write variant is compose's Prometheus config plus the same
section, and its VictoriaMetrics is the version tested here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from rag.childproc import ChildProcess, free_port
from stack import topology
from stack.otlp_receiver import OtlpReceiver
from stack.remote_write import VictoriaMetrics, remote_write_section, victoriametrics_binary, with_remote_write
from telemetry.otlp_metrics import STAGE_DURATION
from tests.dashboards.native_testkit import remote_write_request, snappy_block
from tests.stack.conftest import FREE_PORTS, RAGHEAT, REPO, tool

QUERIES = ["vitamin D and bone density", "statins and muscle pain", "antibiotic resistance in hospitals",
           "sleep deprivation and memory", "BRCA1 mutations and cancer risk"] * 2
STAGES = 'ragheat_stage_duration_seconds_bucket{job="ragheat-api"}'
NATIVE_NAME = "ragheat_stage_duration_seconds"  # the API's exponential stage histogram as a native one
NATIVE = f'{NATIVE_NAME}{{job="ragheat"}}'  # the OTLP service name: the scraped ones are job="ragheat-api"
WATCH_PORTS = ["--prometheus-port", "0", "--alertmanager-port", "0", "--alert-receiver-port", "0"]
"""Watch mode starts no API, vLLM or probes: only these ports are asked for."""


def stack_up(folder: Path, *args: str, timeout: float = 420, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([RAGHEAT, "stack", "up", "--folder", str(folder), "--probes", "off", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})


def stack_down(folder: Path) -> None:
    subprocess.run([RAGHEAT, "stack", "down", "--folder", str(folder)], capture_output=True, timeout=120)


def processes(folder: Path) -> dict[str, dict]:
    return {p["name"]: p for p in json.loads((folder / "state.json").read_text())["processes"]}


def query(url: str, promql: str, at: float | None = None) -> list[dict]:
    """An instant query on Prometheus or VictoriaMetrics (``nocache``: VictoriaMetrics otherwise moves a time near now
    back by its latency offset, and Prometheus ignores the parameter)."""
    params = {"query": promql, "nocache": "1", **({"time": f"{at:.3f}"} if at is not None else {})}
    body = httpx.get(url + "/api/v1/query", params=params, timeout=10).json()
    assert body["status"] == "success", (url, promql, body)
    return body["data"]["result"]


def by_labels(result: list[dict], drop: tuple[str, ...] = ()) -> dict[tuple, float]:
    return {tuple(sorted((k, v) for k, v in r["metric"].items() if k not in drop)): float(r["value"][1])
            for r in result}


def wait_for(what: str, check, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not seen within {timeout_s} s (last: {value!r})")
        time.sleep(0.5)


def remote_storage(prometheus: str, metric: str) -> float:
    """A ``prometheus_remote_storage_*`` counter of Prometheus' own /metrics, summed over its queues."""
    text = httpx.get(prometheus + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if re.match(rf"{metric}(\{{|\s)", line))


@dataclass
class ShippingStack:
    folder: Path
    processes: dict[str, dict]
    up: subprocess.CompletedProcess
    otlp: OtlpReceiver  # what the API pushes over OTLP, where compose's collector would be


@pytest.fixture(scope="module")
def shipping_stack(subset_index, tmp_path_factory):
    folder = tmp_path_factory.mktemp("remote-write-stack")
    # Every request traced (tracing needs an OTLP endpoint: a real receiver here), so every stage histogram carries
    # exemplars for Prometheus to send; the API's exponential histograms are pushed every second. The test profile's
    # 1 s scrapes keep the receiver within seconds of Prometheus.
    otlp = OtlpReceiver()
    with otlp as endpoint:
        up = stack_up(folder, "--index", str(subset_index), *FREE_PORTS, "--vllm-model", "off", "--rules-profile",
                      "test", "--remote-write", "--victoriametrics-port", "0",
                      env={"RAGHEAT_TELEMETRY__TRACE_SAMPLE_RATIO": "1.0", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                           "RAGHEAT_TELEMETRY__OTLP_METRICS_INTERVAL_S": "1"})
        try:
            assert up.returncode == 0, f"ragheat stack up --remote-write failed:\n{up.stderr[-3000:]}"
            yield ShippingStack(folder, processes(folder), up, otlp)
        finally:
            stack_down(folder)


@pytest.mark.slow
def test_the_receiver_holds_the_same_stage_histograms_as_prometheus(shipping_stack):
    folder, running, up = shipping_stack.folder, shipping_stack.processes, shipping_stack.up
    assert {"api", "prometheus", "victoriametrics"} <= set(running), sorted(running)
    prometheus, receiver = running["prometheus"]["url"], running["victoriametrics"]["url"]
    assert "victoriametrics ready at" in up.stderr, up.stderr
    config = yaml.safe_load((folder / "prometheus" / "prometheus.yml").read_text())
    assert config["remote_write"] == [remote_write_section(receiver + "/api/v1/write")]
    assert (folder / "victoriametrics" / "data").is_dir()
    for question in QUERIES:
        response = httpx.post(running["api"]["url"] + "/v1/query", json={"query": question}, timeout=60)
        assert response.status_code == 200, response.text
    # One timestamp after Prometheus has scraped every query, a whole second (VictoriaMetrics evaluates an instant
    # query at a whole second): both stores answer for it, the receiver once the batches holding it have arrived.
    wait_for("every query in Prometheus' embed histogram", lambda: (seen := query(
        prometheus, 'sum(ragheat_stage_duration_seconds_count{job="ragheat-api", stage="embed"})'))
        and float(seen[0]["value"][1]) >= len(QUERIES))
    time.sleep(1.0)  # so the whole second below comes after the scrape that held every query
    at = float(int(time.time()))
    both: dict[str, list] = {}

    def same() -> bool:
        both["prometheus"], both["receiver"] = query(prometheus, STAGES, at), query(receiver, STAGES, at)
        return bool(both["receiver"]) and by_labels(both["receiver"], drop=("stack",)) == by_labels(both["prometheus"])

    try:
        wait_for("the receiver holding Prometheus' stage histograms", same, timeout_s=90)
    except AssertionError:
        expected, got = by_labels(both["prometheus"]), by_labels(both["receiver"], drop=("stack",))
        differ = sorted(set(expected.items()) ^ set(got.items()))[:6]
        raise AssertionError(f"at {at}: Prometheus has {len(expected)} stage bucket series, the receiver {len(got)}; "
                             f"first differences (labels, value): {differ}") from None
    expected, shipped = by_labels(both["prometheus"]), both["receiver"]
    stages = {dict(labels)["stage"] for labels in expected}
    assert {"queue", "embed", "retrieve_dense", "retrieve_bm25", "fuse", "generate"} <= stages, stages
    assert {dict(labels)["le"] for labels in expected} >= {"0.42", "+Inf"}
    # Prometheus' external labels go with every series, as they would to any long-term store.
    assert {r["metric"].get("stack") for r in shipped} == {"ragheat"}, shipped[:2]
    embed = sum(v for labels, v in by_labels(shipped, drop=("stack",)).items()
                if dict(labels)["stage"] == "embed" and dict(labels)["le"] == "+Inf")
    assert embed >= len(QUERIES)
    assert remote_storage(prometheus, "prometheus_remote_storage_samples_failed_total") == 0


def exponential_export(otlp: OtlpReceiver):
    """The API's latest OTLP metrics export holding its exponential stage histogram, or None."""
    for export in reversed(otlp.metrics):
        if any(m.name == STAGE_DURATION and m.exponential_histogram.data_points
               for rm in export.resource_metrics for sm in rm.scope_metrics for m in sm.metrics):
            return export
    return None


@pytest.mark.slow
def test_exemplars_and_native_histograms_are_sent_and_victoriametrics_keeps_neither(shipping_stack):
    """What docs/stack.md says VictoriaMetrics 1.79 keeps, measured: Prometheus (with send_exemplars and
    send_native_histograms) sends the stage histograms' trace-id exemplars and the API's exponential histograms,
    remote-written into it as compose's collector writes them (native histograms); the receiver answers for neither,
    while it holds the classic series they came with."""
    running = shipping_stack.processes
    prometheus, receiver = running["prometheus"]["url"], running["victoriametrics"]["url"]
    start = time.time() - 600
    exemplars = httpx.get(prometheus + "/api/v1/query_exemplars", timeout=10,
                          params={"query": STAGES, "start": f"{start:.3f}", "end": f"{time.time():.3f}"}).json()
    assert exemplars["data"], "Prometheus holds no exemplar: nothing would be sent"
    # The stack's Prometheus receives remote write too (compose's flag), as compose's collector uses it.
    export = wait_for("the API's exponential histograms over OTLP", lambda: exponential_export(shipping_stack.otlp))
    pushed = httpx.post(prometheus + "/api/v1/write", content=snappy_block(remote_write_request([export])),
                        timeout=10, headers={"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf",
                                             "X-Prometheus-Remote-Write-Version": "0.1.0"})
    assert pushed.status_code == 204, pushed.text
    assert query(prometheus, f"histogram_count({NATIVE})"), "Prometheus did not store the native histograms"
    wait_for("Prometheus sending the native histograms and the exemplars",
             lambda: remote_storage(prometheus, "prometheus_remote_storage_histograms_total") >= 1
             and remote_storage(prometheus, "prometheus_remote_storage_exemplars_total") >= 1)
    assert remote_storage(prometheus, "prometheus_remote_storage_histograms_failed_total") == 0
    assert remote_storage(prometheus, "prometheus_remote_storage_exemplars_failed_total") == 0
    # Accepted and dropped: the receiver has the classic series but no native one and no exemplar.
    assert query(receiver, STAGES)
    time.sleep(6)  # one more batch deadline: anything the receiver kept of the push would be there by now
    assert query(receiver, f'{{__name__="{NATIVE_NAME}"}}') == []
    kept = httpx.get(receiver + "/api/v1/query_exemplars", timeout=10,
                     params={"query": STAGES, "start": f"{start:.3f}", "end": f"{time.time():.3f}"})
    assert kept.status_code != 200 or kept.json().get("data") in ([], None), kept.text[:500]


def test_a_bad_receiver_url_is_refused_before_anything_starts(tmp_path):
    for url, problem in (("ftp://127.0.0.1:8428/api/v1/write", "its scheme is ftp, not http or https"),
                         ("http://127.0.0.1:99999/api/v1/write", "Port out of range"),
                         ("http:///api/v1/write", "it names no host")):
        up = stack_up(tmp_path, "--watch-url", "http://127.0.0.1:1/metrics", *WATCH_PORTS, "--remote-write-url", url,
                      timeout=120)
        assert up.returncode == 2, up.stdout + up.stderr
        assert f"--remote-write-url {url!r} is not a remote-write URL: {problem}" in up.stderr, up.stderr
        assert not (tmp_path / "state.json").exists()
    both = stack_up(tmp_path, "--watch-url", "http://127.0.0.1:1/metrics", *WATCH_PORTS, "--remote-write",
                    "--remote-write-url", "http://127.0.0.1:8428/api/v1/write", timeout=120)
    assert both.returncode == 2 and "give one of them" in both.stderr, both.stderr


@pytest.mark.slow
def test_a_receiver_that_is_down_neither_stops_scraping_nor_loses_what_was_queued(tmp_path):
    port = free_port()  # nothing listens there until the receiver is started below
    url = f"http://127.0.0.1:{port}/api/v1/write"
    up = stack_up(tmp_path / "stack", "--watch-url", "http://127.0.0.1:1/metrics", *WATCH_PORTS,
                  "--rules-profile", "test", "--remote-write-url", url, timeout=240)
    receiver = None
    try:
        assert up.returncode == 0, f"ragheat stack up failed:\n{up.stderr[-3000:]}"
        notes = json.loads((tmp_path / "stack" / "state.json").read_text())["notes"]
        assert any(f"remote write to {url}" in note for note in notes), notes
        assert "victoriametrics" not in processes(tmp_path / "stack")  # a receiver's URL: nothing more started
        prometheus = processes(tmp_path / "stack")["prometheus"]["url"]
        samples = 'count_over_time(up{job="alertmanager"}[10m])'
        first = wait_for("a scrape of Alertmanager", lambda: query(prometheus, samples))
        wait_for("Prometheus retrying the receiver",
                 lambda: remote_storage(prometheus, "prometheus_remote_storage_samples_retried_total") > 0)
        later = wait_for("scrapes going on while the receiver is down",
                         lambda: (now := query(prometheus, samples))
                         and float(now[0]["value"][1]) > float(first[0]["value"][1]) + 2 and now)
        assert query(prometheus, 'up{job="alertmanager"}')[0]["value"][1] == "1"
        assert remote_storage(prometheus, "prometheus_remote_storage_samples_pending") > 0, later
        down_since = time.time()
        receiver = ChildProcess("victoriametrics", VictoriaMetrics(
            victoriametrics_binary(), tmp_path / "receiver", f"127.0.0.1:{port}").argv(),
            log_path=tmp_path / "receiver.log", own_session=False, die_with_parent=True).start()
        receiver.wait_until_ok(f"http://127.0.0.1:{port}/health", 60)
        # Samples scraped while it was down arrive: Prometheus queued them and retried.
        window = f"{int(time.time() - down_since) + 60}s"  # back to before the first scrape
        wait_for("the queued samples in the receiver", lambda: query(
            f"http://127.0.0.1:{port}", f'count_over_time(up{{job="alertmanager"}}[{window}])', at=down_since),
            timeout_s=90)
    finally:
        if receiver is not None:
            receiver.stop()
        stack_down(tmp_path / "stack")


def test_compose_remote_write_variant_is_compose_config_plus_the_section(compose):
    """compose.remote-write.yaml, merged over compose.yaml by the real Compose engine, mounts
    deploy/prometheus/prometheus-remote-write.yml as Prometheus' config: compose's own config plus the section
    `stack up --remote-write` writes, shipping to the victoriametrics service, which Prometheus waits for, which
    publishes no port and runs the VictoriaMetrics release tested here (Debian's package)."""
    override = REPO / "compose.remote-write.yaml"
    result = compose.run("-f", str(override), "config", "--format", "json")
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    variant = REPO / "deploy" / "prometheus" / "prometheus-remote-write.yml"
    mounts = {v["target"]: v["source"] for v in services["prometheus"]["volumes"]}
    assert mounts["/etc/prometheus/prometheus.yml"] == str(variant)
    assert services["prometheus"]["depends_on"]["victoriametrics"]["condition"] == "service_healthy"
    assert yaml.safe_load(variant.read_text()) == with_remote_write(
        topology.load_yaml(topology.PROMETHEUS_CONFIG), "http://victoriametrics:8428/api/v1/write")
    check = subprocess.run([tool("promtool", "Debian's package prometheus"), "check", "config", "--syntax-only",
                            str(variant)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr  # the remote_write keys are Prometheus' own
    receiver = services["victoriametrics"]
    assert "ports" not in receiver and "healthcheck" in receiver  # compose's network only: closed by default
    installed = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "victoria-metrics"], capture_output=True,
                               text=True)
    assert installed.returncode == 0, "Debian's victoria-metrics is not installed (scripts/install.sh --test)"
    upstream = installed.stdout.split("+")[0]
    assert receiver["image"] == f"victoriametrics/victoria-metrics:v{upstream}", (receiver["image"], upstream)
