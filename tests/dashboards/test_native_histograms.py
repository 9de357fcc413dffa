"""The dashboards' ``native`` source against real native histograms: the service's OTLP exponential histograms
(encoded by the real pusher, received by a real OTLP/HTTP receiver) are remote-written, as the OTel Collector's
``prometheusremotewrite`` exporter writes them (tests/dashboards/native_testkit.py), into a real Prometheus (Debian
2.42, remote-write receiver, native histograms and exemplar storage on). Every latency and SLO panel query of that
source must return data; the heatmap, quantile and SLI queries must read the values that were recorded, and the
exemplars must name the traces that were recorded."""

from __future__ import annotations

import math
import time

import pytest

from dashboards import contract, slo
from dashboards.boards import GRAPH_STAGES, OWN_HEATMAP_STAGES, all_boards
from dashboards.promapi import PrometheusApi
from dashboards.spec import NATIVE, SOURCE, SOURCE_VALUES, expand
from dashboards.verify import check_boards
from rag.childproc import free_port
from stack.otlp_receiver import OtlpReceiver
from telemetry.otlp_metrics import REQUEST_DURATION, STAGE_DURATION, OtlpHistogramPusher
from tests.dashboards.native_testkit import RemoteWritePrometheus, remote_write_request

BASE = 2 ** (2 ** -4)  # the pusher's scale 4
PUSHES, PER_PUSH = 4, 40
TRACES = [(0x5B8EFFF798038103D269B633813FC60C + i, 0xEEE19B7EC3C1B170 + i) for i in range(PUSHES * PER_PUSH)]


@pytest.fixture(scope="module")
def native():
    """Four exports of the same cumulative histograms, a second apart, each remote-written as the collector would:
    per request, fuse takes 0.5 s, embed 10 ms, each graph and router stage 2 ms, and 1 request in 10 takes 0.6 s
    end to end (the rest 0.1 s). Every fuse observation is traced; the first export's exemplars are lost, as in
    Prometheus a series must exist before an exemplar can be stored against it."""
    receiver = OtlpReceiver()
    with receiver as endpoint, RemoteWritePrometheus(free_port()) as prometheus:
        pusher = OtlpHistogramPusher(endpoint + "/v1/metrics", service_name="ragheat", service_version="test",
                                     interval_s=3600, timeout_s=5, on_drop=lambda n: None)
        load = (("qps_bucket", "10-50"), ("outcome", "ok"))
        try:
            for push in range(PUSHES):
                for i in range(PER_PUSH):
                    n = push * PER_PUSH + i
                    pusher.record(STAGE_DURATION, 0.5, (("stage", "fuse"), *load), TRACES[n])
                    pusher.record(STAGE_DURATION, 0.010, (("stage", "embed"), *load))
                    for stage in (*GRAPH_STAGES, *OWN_HEATMAP_STAGES):  # the stages with heatmaps of their own
                        pusher.record(STAGE_DURATION, 0.002, (("stage", stage), *load))
                    pusher.record(REQUEST_DURATION, 0.6 if i % 10 == 0 else 0.1, (("route", "/v1/query"), *load))
                assert pusher.push()
                written = prometheus.write(remote_write_request([receiver.metrics[-1]]))
                assert written.status_code == 204, written.text
                time.sleep(1.0)
        finally:
            pusher.shutdown()
        yield PrometheusApi(prometheus.url), prometheus


def run(api: PrometheusApi, expr: str, stage: str = "fuse") -> list[dict]:
    """``expr`` as Grafana sends it with $source at native and $stage at ``stage`` (a regex)."""
    return api.query(expand(expr, "5m", {SOURCE: SOURCE_VALUES[NATIVE], "stage": stage}))


def panel(board_slug: str, title_start: str):
    board = next(b for b in all_boards(slo.PRODUCTION) if b.slug == board_slug)
    return next(p for p in board.panels if p.title.startswith(title_start))


def test_every_native_panel_query_returns_data(native):
    api, _ = native
    boards = [b for b in all_boards(slo.PRODUCTION) if b.slug in ("latency", "slo")]
    checks = check_boards(api, boards, "5m", source=NATIVE)
    native_ids = {(b.title, p.title, q.legend) for b in boards for p in b.panels for q in p.queries
                  if q.histograms == NATIVE}
    ran = [c for c in checks if (c.board, c.panel, c.legend) in native_ids]
    assert len(ran) == len(native_ids) >= 10
    bad = [f"{c.name}: {c.status} {c.detail}\n{c.expr}" for c in ran if c.status != "ok"]
    assert not bad, "\n".join(bad)
    # Nothing of the scraped source ran, and the counters this Prometheus lacks are reported absent, by name.
    assert not any(c.expr.endswith("(vector(1) == 0)") for c in checks)
    assert all(c.status in ("ok", "absent") for c in checks), [c for c in checks if c.status not in ("ok", "absent")]


def test_the_stage_heatmap_draws_the_recorded_latency_from_exponential_buckets(native):
    api, _ = native
    heatmap = next(q for q in panel("latency", "Stage latency").queries if q.histograms == NATIVE)
    [series] = run(api, heatmap.expr)
    _, histogram = series["histogram"]
    buckets = [(float(low), float(high), float(count)) for _, low, high, count in histogram["buckets"]]
    assert len(buckets) == 1, buckets  # every fuse observation is 0.5 s: one bucket, (0.5 / 2^(1/16), 0.5]
    low, high, rate = buckets[0]
    assert high == 0.5 and high / low == pytest.approx(BASE)
    assert rate > 0 and float(histogram["count"]) == pytest.approx(rate)


def test_native_quantiles_and_sli_read_the_recorded_values(native):
    api, _ = native
    p99 = next(q for q in panel("latency", "P99 by stage").queries if q.histograms == NATIVE)
    by_stage = {r["metric"]["stage"]: float(r["value"][1]) for r in run(api, p99.expr, stage=".*")}
    assert by_stage["fuse"] == pytest.approx(0.5, rel=BASE - 1)  # within one 4.4 % bucket
    assert by_stage["embed"] == pytest.approx(0.010, rel=BASE - 1)
    e2e = {q.legend.rpartition(" ")[2]: q for q in panel("latency", "End-to-end latency P50").queries
           if q.histograms == NATIVE}
    [p50], [p99_e2e] = run(api, e2e["P50"].expr), run(api, e2e["P99"].expr)
    assert p50["metric"] == {"job": "ragheat"}  # per job: the collector's job is the service.name
    assert float(p50["value"][1]) == pytest.approx(0.1, rel=BASE - 1)
    assert float(p99_e2e["value"][1]) == pytest.approx(0.6, rel=BASE - 1)
    # The latency SLI: 9 requests in 10 within 420 ms, and no observation in the bucket holding 420 ms, so the
    # interpolation of histogram_fraction costs nothing here.
    sli = next(q for q in panel("slo", "Latency SLI").queries if q.histograms == NATIVE)
    [good] = run(api, sli.expr)
    assert float(good["value"][1]) == pytest.approx(0.9, abs=1e-9)
    over = next(q for q in panel("latency", "Stage alone over").queries if q.histograms == NATIVE)
    per_stage = {r["metric"]["stage"]: float(r["value"][1]) for r in run(api, over.expr, stage=".*")}
    assert per_stage["embed"] == 0 and per_stage["fuse"] > 0


def test_exemplars_of_the_native_histograms_open_the_recorded_traces(native):
    _, prometheus = native
    found = prometheus.exemplars(f'{contract.NATIVE_STAGE_DURATION}{{stage="fuse"}}', time.time() - 600, time.time() + 1)
    exemplars = [e for series in found for e in series["exemplars"]]
    assert exemplars, "no exemplar stored"
    recorded = {(format(t, "032x"), format(s, "016x")) for t, s in TRACES}
    for e in exemplars:
        assert (e["labels"]["trace_id"], e["labels"]["span_id"]) in recorded
        assert float(e["value"]) == 0.5 and math.isfinite(float(e["timestamp"]))
    assert {e["labels"]["trace_id"] for e in exemplars} <= {format(t, "032x") for t, _ in TRACES[PER_PUSH:]}


def test_cli_check_reads_the_source_it_is_given(native):
    """``ragheat dashboards check --source native`` passes against native histograms alone; the default (scraped) finds
    no classic buckets there and fails naming the empty panels; an unknown source gets a sentence."""
    from typer.testing import CliRunner

    from ragheat.cli import app

    _, prometheus = native
    base = ["dashboards", "check", "--prometheus", prometheus.url, "--boards", "latency,slo", "--rate-window", "5m"]
    runner = CliRunner()
    chosen = runner.invoke(app, [*base, "--source", "native"], terminal_width=240)
    assert chosen.exit_code == 0, chosen.output
    statuses = [line.split()[1] for line in chosen.output.splitlines() if line.startswith("│") and line.split()[1]
                in ("ok", "absent", "empty", "error")]
    assert "ok" in statuses and set(statuses) <= {"ok", "absent"}, chosen.output
    default = runner.invoke(app, base, terminal_width=240)
    assert default.exit_code == 1, default.output
    assert "returned nothing or failed" in " ".join(default.output.split())
    assert any(line.split()[1:2] == ["empty"] and "Stage latency" in line for line in default.output.splitlines())
    wrong = runner.invoke(app, [*base, "--source", "otlp"])
    assert wrong.exit_code == 2 and "--source must be one of scraped, native" in " ".join(wrong.output.split())
