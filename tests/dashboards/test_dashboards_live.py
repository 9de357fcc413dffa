"""Proof against the live service: a real server, a real Prometheus loading the test-profile rules (every window
divided by 60), real load over loopback.

Run 1 (healthy): the service answers with a real (tiny) vLLM and runs the eBPF probes in-process, Prometheus
scrapes both the service and vLLM, and every panel's PromQL evaluates and returns data; a panel whose source is
absent (vLLM or eBPF not available) is skipped by name, never silently. Run 2 (same port, ``faults.delay_stage=fuse``): the fast-burn page goes to
firing in ``/api/v1/alerts`` and its annotations name the stage.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from dashboards import contract, render, slo
from dashboards.boards import all_boards
from dashboards.promapi import PrometheusApi
from dashboards.snapshot import snapshot
from dashboards.verify import QueryCheck, check_boards
from rag.pipeline import STAGES, RagPipeline
from rag.settings import FaultSettings
from ragheat.service import build_service
from stack.children import free_port
from stack.prometheus import LocalPrometheus
from stack.servers import BackgroundServer

pytestmark = pytest.mark.slow

PROFILE = slo.TEST
RATE_WINDOW = PROFILE.window(slo.QUANTILE_WINDOW_S)
DELAYED_STAGE = "fuse"  # cheap (well under a millisecond) when healthy, so blaming it cannot be an accident
DELAY_MS = 500.0
BOARDS = all_boards(PROFILE)
SERVICE_FAMILIES = set(contract.SERVICE.values())
QUERIES = {f"{b.slug}/{p.title}/{q.legend or i}": q for b in BOARDS for p in b.panels for i, q in enumerate(p.queries)}
assert len(QUERIES) == sum(len(p.queries) for b in BOARDS for p in b.panels), "query ids must be unique"


@dataclass
class LiveRun:
    checks: dict[str, QueryCheck] = field(default_factory=dict)
    stage_values: list[str] = field(default_factory=list)
    snapshot_written: list[Path] = field(default_factory=list)
    snapshot_skipped: list[str] = field(default_factory=list)
    alert: dict | None = None
    seconds_to_fire: float = 0.0
    statuses: dict[int, int] = field(default_factory=dict)


class Load:
    """``threads`` clients on loopback, each pacing itself to ``rate / threads`` requests per second."""

    def __init__(self, url: str, queries: list[str], rate: float, threads: int, statuses: dict[int, int]) -> None:
        self.url, self.queries, self.interval = url, queries, threads / rate
        self.stop, self.statuses, self.lock = threading.Event(), statuses, threading.Lock()
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(threads)]

    def _client(self, offset: int) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            i = offset
            while not self.stop.is_set():
                started = time.monotonic()
                status = client.post("/v1/query", json={"query": self.queries[i % len(self.queries)]}).status_code
                with self.lock:
                    self.statuses[status] = self.statuses.get(status, 0) + 1
                i += len(self.threads)
                self.stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def __enter__(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)


class Service:
    """The real app with telemetry wired in as ``ragheat serve`` does it, on a fixed loopback port."""

    def __init__(self, settings, pipeline, port: int, probes: bool = False) -> None:
        self.settings, self.pipeline, self.port, self.with_probes = settings, pipeline, port, probes

    def __enter__(self) -> str:
        # As `ragheat serve --probes` does: the kernel board's panels then have data wherever eBPF is allowed
        # (CI runs as root); elsewhere they are absent and skipped by name.
        self.service = build_service(self.settings, self.pipeline, registry=CollectorRegistry(),
                                     probes=self.with_probes, probe_ports=[self.port])
        self.server = BackgroundServer(self.service.app, port=self.port)
        return self.server.__enter__()

    def __exit__(self, *exc) -> None:
        self.server.__exit__(*exc)
        self.service.close()


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            if not value:
                raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
            return value
        time.sleep(interval_s)


def settled(check: QueryCheck, query) -> bool:
    """Has data, or reads only families that do not exist on this machine (the service's own always do,
    once requests have been served and scraped)."""
    return check.status == "ok" or (check.status == "absent" and not set(query.sources) & SERVICE_FAMILIES)


def fast_burn_alert(api: PrometheusApi) -> dict | None:
    return next((a for a in api.alerts() if a["labels"].get("alertname") == slo.alert_name(slo.LATENCY)
                 and a["labels"].get("burn") == "fast" and a["state"] == "firing"), None)


@pytest.fixture(scope="module")
def live(settings, subset_index, scifact_subset, vllm_server, tmp_path_factory) -> LiveRun:
    folder = tmp_path_factory.mktemp("dashboards-live")
    render.write(folder, PROFILE)
    queries = [json.loads(line)["text"] for line in (scifact_subset / "queries.jsonl").read_text().splitlines()][:50]
    quiet = settings.model_copy(update={"telemetry": settings.telemetry.model_copy(update={"otlp": "off"}),
                                        "probes": settings.probes.model_copy(update={"syscalls": True})})
    # Run 1 answers with the real (tiny) vLLM, so the vLLM board's panels have data too.
    written = quiet.model_copy(update={"generation": quiet.generation.model_copy(update={
        "generator": "openai", "base_url": vllm_server.url, "model": vllm_server.served_name, "max_tokens": 16,
        "passages": 1})})
    pipeline = RagPipeline(written, subset_index)
    pipeline.warm_up()
    faulty = quiet.model_copy(update={"faults": FaultSettings(delay_stage=DELAYED_STAGE, delay_ms=DELAY_MS)})
    delayed = RagPipeline(faulty, subset_index)
    delayed.warm_up()  # before the clock starts: loading the model is not what this test measures
    run, port = LiveRun(), free_port()
    rules = f"rule_files:\n  - {folder / render.RULES_FILE}\n"

    with contextlib.ExitStack() as stack:
        healthy = stack.enter_context(contextlib.ExitStack())
        url = healthy.enter_context(Service(written, pipeline, port, probes=True))
        vllm_target = vllm_server.metrics_url.removeprefix("http://").removesuffix("/metrics")
        prometheus = stack.enter_context(LocalPrometheus(f"127.0.0.1:{port}", scrape_interval_s=1, extra_config=rules,
                                                         extra_targets={"vllm": vllm_target}))
        api = PrometheusApi(prometheus)
        with Load(url, queries, rate=8, threads=2, statuses=run.statuses):
            def all_have_data():
                checks = check_boards(api, BOARDS, RATE_WINDOW)
                return checks if all(settled(c, q) for c, q in zip(checks, QUERIES.values())) else None
            try:
                found = wait_for(all_have_data, 40, "every present panel to return data")
            except AssertionError:
                found = check_boards(api, BOARDS, RATE_WINDOW)  # the per-panel tests say which ones failed
            run.checks = dict(zip(QUERIES, found))
            variable = next(v for v in BOARDS[0].variables if v.name == "stage")
            run.stage_values = api.label_values(variable.label, match=variable.metric)
            shot = snapshot(api, BOARDS, folder / "png", minutes=1, rate_window=RATE_WINDOW, step_s=1)
            run.snapshot_written, run.snapshot_skipped = shot.written, shot.skipped
        healthy.close()

        # Run 2 on the same port: the same Prometheus keeps scraping, and rate() reads the restart as a
        # counter reset, so the long window still holds the healthy minute before the fault.
        url = stack.enter_context(Service(faulty, delayed, port))
        started = time.monotonic()
        with Load(url, queries, rate=10, threads=8, statuses=run.statuses):
            run.alert = wait_for(lambda: fast_burn_alert(api), 60, "the fast-burn page to fire")
            run.seconds_to_fire = time.monotonic() - started
    return run


@pytest.mark.parametrize("query_id", list(QUERIES))
def test_panel_query_returns_data(live, query_id):
    check = live.checks[query_id]
    if check.status == "absent":
        assert not set(QUERIES[query_id].sources) & SERVICE_FAMILIES, f"{check.name}: the service's own metrics are missing: {check.detail}"
        pytest.skip(f"{check.name}: source absent on this machine ({check.detail})")
    assert check.status == "ok", f"{check.name}: {check.status}: {check.detail}\n{check.expr}"


def test_stage_variable_lists_pipeline_stages(live):
    assert live.stage_values and set(live.stage_values) <= set(STAGES), live.stage_values
    assert {"embed", DELAYED_STAGE} <= set(live.stage_values)


def test_snapshot_draws_latency_heatmaps(live):
    names = [p.name for p in live.snapshot_written]
    assert "latency.png" in names, (names, live.snapshot_skipped)
    assert all(p.stat().st_size > 10_000 for p in live.snapshot_written)
    with open(next(p for p in live.snapshot_written if p.name == "latency.png"), "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    # Heatmaps without data are named, never dropped silently (vLLM and the probes do not run here).
    for skipped in live.snapshot_skipped:
        assert " / " in skipped and (": no series of " in skipped or ": no observations" in skipped), skipped


def test_injected_delay_fires_the_fast_burn_page_naming_the_stage(live):
    alert = live.alert
    assert alert["labels"]["severity"] == "page"
    assert alert["labels"]["slo"] == "latency"
    assert alert["annotations"]["stage"] == DELAYED_STAGE, alert
    assert f"stage: {DELAYED_STAGE}" in alert["annotations"]["summary"]
    assert float(alert["value"]) > 14.4 * slo.LATENCY.budget
    assert set(live.statuses) == {200}, live.statuses
    print(f"fast-burn page fired {live.seconds_to_fire:.1f} s after the delayed service took load")
