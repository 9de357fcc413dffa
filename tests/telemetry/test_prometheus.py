"""A real Prometheus (Debian's 2.42 binary) scraping a real server: quantiles and exemplars through PromQL,
and ``ragheat serve --prometheus`` starting and stopping its own Prometheus."""

from __future__ import annotations

import math
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rag.pipeline import RagPipeline
from rag.settings import FaultSettings
from rag.stages import CONDITIONAL_STAGES, DEFAULT_STAGES, STAGES
from rag.childproc import free_port
from stack.prometheus import LocalPrometheus
from telemetry.buckets import LATENCY_SECONDS
from telemetry_testkit import QUERIES, serve, trace_id, wait_for

RAGHEAT = Path(sys.executable).parent / "ragheat"
P99 = "histogram_quantile(0.99, sum by (le, stage) (rate(ragheat_stage_duration_seconds_bucket[1m])))"

DELAYED_STAGE, DELAY_MS = "fuse", 160  # injected (faults settings): every fuse observation lies above 0.16 s


@pytest.fixture(scope="module", autouse=True)
def prometheus_binary():
    if shutil.which("prometheus") is None:
        pytest.fail("the prometheus binary is missing: scripts/install.sh --test installs Debian's prometheus")


def bucket_bounds(low_s: float, high_s: float) -> tuple[float, float]:
    """The lower edge of the bucket holding ``low_s`` and the upper edge of the one holding ``high_s``: a
    histogram_quantile over observations in [low_s, high_s] lies between them, whatever rate() extrapolates."""
    below = [edge for edge in LATENCY_SECONDS if edge < low_s]
    above = [edge for edge in LATENCY_SECONDS if edge >= high_s]
    return (below[-1] if below else 0.0), (above[0] if above else math.inf)


def promql(base: str, query: str) -> list[dict]:
    body = httpx.get(base + "/api/v1/query", params={"query": query}, timeout=10).json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def up(base: str) -> bool:
    return any(r["value"][1] == "1" for r in promql(base, 'up{job="ragheat"}'))


def answers(base: str) -> bool:
    try:
        httpx.get(base + "/-/healthy", timeout=1)
        return True
    except httpx.TransportError:
        return False


@pytest.fixture(scope="module")
def monitored(settings, subset_index):
    """A server whose fuse stage sleeps DELAY_MS per request (faults settings, as the alert drill uses)."""
    delayed = settings.model_copy(update={"faults": FaultSettings(delay_stage=DELAYED_STAGE, delay_ms=DELAY_MS)})
    with serve(delayed, RagPipeline(delayed, subset_index), exporter=InMemorySpanExporter(), otlp="off") as s:
        with LocalPrometheus(f"127.0.0.1:{urlparse(s.url).port}", scrape_interval_s=1) as prometheus_url:
            yield s, prometheus_url


def test_prometheus_reads_stage_quantiles_and_exemplars(monitored):
    served, prom = monitored
    t0 = time.time() - 1
    wait_for(lambda: up(prom), 30, 0.5, what='up{job="ragheat"} == 1')
    observed: dict[str, list[float]] = {}  # each stage's own timings, as the responses report them
    start = time.monotonic()
    for i in range(40):  # >= 40 x 0.16 s: spread over >= 6 scrape intervals so rate() sees increases
        response = served.query(QUERIES[i % len(QUERIES)])
        assert response.status_code == 200, response.text
        for stage in response.json()["stages"]:
            observed.setdefault(stage["name"], []).append(stage["ms"] / 1000)
    assert time.monotonic() - start >= 40 * DELAY_MS / 1000
    assert min(observed[DELAYED_STAGE]) >= DELAY_MS / 1000

    def p99_per_stage():
        values = {r["metric"].get("stage"): float(r["value"][1]) for r in promql(prom, P99)}
        return values if all(math.isfinite(values.get(stage, math.nan)) for stage in ("queue", *DEFAULT_STAGES)) \
            else None

    values = wait_for(p99_per_stage, 30, 0.5, what="a finite P99 for every stage")
    # the stages only some requests run are there from the start, with no observations (a NaN quantile); rerank is
    # one of them but runs by default
    idle = {stage for stage, v in values.items() if math.isnan(v)}
    assert idle == set(CONDITIONAL_STAGES) - set(DEFAULT_STAGES), values
    values = {stage: v for stage, v in values.items() if stage not in idle}
    assert set(values) == {"queue", *DEFAULT_STAGES} == set(observed), values
    # Prometheus' P99 lies in the buckets of what this test sent: a stage mislabelled, a duration in the
    # wrong unit or a lost observation puts it elsewhere. The 1 us slack covers the responses' rounding.
    for stage, seconds in values.items():
        low, high = bucket_bounds(min(observed[stage]) - 1e-6, max(observed[stage]) + 1e-6)
        assert low <= seconds <= high, (stage, seconds, (low, high), sorted(observed[stage])[-3:])
    assert values[DELAYED_STAGE] >= 0.15  # the injected 160 ms: the bucket (0.15, 0.2] or above
    assert up(prom)

    def exemplars():
        body = httpx.get(prom + "/api/v1/query_exemplars", timeout=10, params={
            "query": "ragheat_stage_duration_seconds_bucket", "start": f"{t0:.3f}",
            "end": f"{time.time() + 1:.3f}"}).json()
        assert body["status"] == "success", body
        found = [(series["seriesLabels"], e) for series in body["data"] for e in series["exemplars"]]
        return found or None

    found = wait_for(exemplars, 30, 0.5, what="exemplars stored by Prometheus")
    assert {labels["stage"] for labels, _ in found} <= set(STAGES)
    ids = {e["labels"]["trace_id"] for _, e in found}
    assert all(set(e["labels"]) == {"trace_id"} for _, e in found)
    assert all(float(e["value"]) <= float(labels["le"]) for labels, e in found)
    served.telemetry.force_flush()
    exported = wait_for(lambda: (lambda have: have if ids <= have else None)(
        {trace_id(s) for s in served.exporter.get_finished_spans()}), 10, what="every exemplar trace among the spans")
    assert ids and ids <= exported


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return {**env, "COLUMNS": "1000", "NO_COLOR": "1", "TERM": "dumb"}


def _stop_orphan(base: str) -> None:
    """Clean up a Prometheus that outlived its parent: quit it through its lifecycle API, remove its folder."""
    try:
        flags = httpx.get(base + "/api/v1/status/flags", timeout=5).json()["data"]
        httpx.post(base + "/-/quit", timeout=5)
        folder = Path(flags["config.file"]).parent
        if folder.name.startswith("ragheat-prometheus-") and folder.parent == Path(tempfile.gettempdir()):
            wait_for(lambda: not answers(base), 15, 0.2, what="the orphaned prometheus to quit")
            shutil.rmtree(folder, ignore_errors=True)
    except (httpx.HTTPError, KeyError, AssertionError):
        pass


def test_serve_with_prometheus_starts_and_stops_it(subset_index):
    port = free_port()
    proc = subprocess.Popen([str(RAGHEAT), "serve", "--index", str(subset_index), "--port", str(port),
                             "--prometheus", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())
    lines: queue.Queue[str] = queue.Queue()
    output: list[str] = []

    def pump():
        for line in proc.stdout:
            output.append(line)
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    prom = None
    try:
        deadline = time.monotonic() + 90
        while prom is None:
            assert time.monotonic() < deadline and proc.poll() is None, "".join(output)
            try:
                match = re.search(r"prometheus: (http://[\d.]+:\d+)", lines.get(timeout=1))
            except queue.Empty:
                continue
            prom = match.group(1) if match else None
        assert httpx.get(prom + "/-/ready", timeout=5).status_code == 200
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: answers(base) and httpx.get(base + "/readyz", timeout=2).status_code == 200, 30,
                 what="the service to be ready")
        assert httpx.post(base + "/v1/query", json={"query": QUERIES[0]}, timeout=30).status_code == 200
        wait_for(lambda: up(prom), 20, 0.5, what=f'up{{job="ragheat"}} == 1 at {prom}')

        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        assert not answers(base)
        stopped = False
        try:
            stopped = wait_for(lambda: not answers(prom), 15, 0.2, what="the child prometheus to stop")
        except AssertionError:
            pass
        assert stopped, f"prometheus at {prom} outlived `ragheat serve` (exit {proc.returncode})"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if prom is not None and answers(prom):
            _stop_orphan(prom)


def test_serve_prometheus_needs_a_fixed_port(subset_index):
    result = subprocess.run([str(RAGHEAT), "serve", "--index", str(subset_index), "--port", "0", "--prometheus"],
                            capture_output=True, text=True, env=_env(), timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    message = " ".join((result.stdout + result.stderr).split())
    assert "--prometheus needs a fixed --port" in message
    assert "Traceback" not in result.stderr
