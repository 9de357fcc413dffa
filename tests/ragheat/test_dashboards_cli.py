"""``ragheat dashboards``: render writes both profiles, check and snapshot succeed against a Prometheus scraping the
real service, mistakes get a sentence (not a traceback), and importing the commands stays light."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time

import pytest
from typer.testing import CliRunner

from dashboards import render, slo
from ragheat.cli import app


def test_cli_render_writes_both_profiles(tmp_path):
    runner = CliRunner()
    for profile in slo.PROFILES:
        result = runner.invoke(app, ["dashboards", "render", str(tmp_path / profile), "--profile", profile])
        assert result.exit_code == 0, result.output
        for relative, text in render.rendered_files(slo.PROFILES[profile]).items():
            assert (tmp_path / profile / relative).read_text(encoding="utf-8") == text


@pytest.fixture(scope="module")
def scraped(settings, pipeline, scifact_subset, tmp_path_factory):
    """The real service on loopback under light load, scraped every second by a real Prometheus that loads the
    test-profile rules; yields the Prometheus URL once every latency and SLO panel has data."""
    import httpx
    from prometheus_client import CollectorRegistry

    from dashboards.boards import all_boards
    from dashboards.promapi import PrometheusApi
    from dashboards.verify import check_boards
    from ragheat.service import build_service
    from stack.prometheus import LocalPrometheus
    from stack.servers import BackgroundServer

    folder = tmp_path_factory.mktemp("cli-rules")
    render.write(folder, slo.TEST)
    quiet = settings.model_copy(update={"telemetry": settings.telemetry.model_copy(update={"otlp": "off"})})
    service = build_service(quiet, pipeline, registry=CollectorRegistry())
    stop = threading.Event()
    try:
        with BackgroundServer(service.app) as url, \
                LocalPrometheus(url.removeprefix("http://"), scrape_interval_s=1,
                                extra_config=f"rule_files:\n  - {folder / render.RULES_FILE}\n") as prometheus:
            # Plain, graph and routed requests, so the graph and router panels have data too (a document title as
            # the query links its entity, so the graph stage runs).
            titles = [json.loads(line)["title"] for line in
                      (scifact_subset / "corpus.jsonl").read_text().splitlines()[:10]]
            bodies = [{"query": "Vitamin D deficiency and bone density"},
                      *({"query": t, "retrievers": ["dense", "bm25", "graph"]} for t in titles),
                      {"query": "Vitamin D deficiency and bone density", "retrievers": ["routed"]}]

            def load():
                with httpx.Client(base_url=url, timeout=30) as client:
                    for body in itertools.cycle(bodies):
                        if stop.wait(0.2):
                            return
                        try:
                            client.post("/v1/query", json=body)
                        except httpx.TransportError:  # the server stopping at teardown, before this thread
                            return

            threading.Thread(target=load, daemon=True).start()
            boards = [b for b in all_boards(slo.TEST) if b.slug in ("latency", "slo")]
            deadline = time.monotonic() + 120  # a loaded machine scrapes and evaluates late
            while not all(c.status == "ok" for c in check_boards(PrometheusApi(prometheus), boards, "5s")):
                assert time.monotonic() < deadline, "the latency and SLO panels never all had data"
                time.sleep(1)
            yield prometheus
    finally:
        stop.set()
        service.close()


@pytest.mark.slow
def test_cli_check_passes_against_a_live_prometheus(scraped):
    result = CliRunner().invoke(app, ["dashboards", "check", "--prometheus", scraped, "--profile", "test",
                                      "--boards", "latency,slo", "--rate-window", "5s"], terminal_width=240)
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if " / " in line]
    assert rows and all(line.split()[1] == "ok" for line in rows), result.output
    assert any("RAG latency / Stage latency" in line for line in rows)
    assert any("SLO / Latency SLI" in line for line in rows)


@pytest.mark.slow
def test_cli_snapshot_draws_the_latency_board(scraped, tmp_path):
    out = tmp_path / "png"
    result = CliRunner().invoke(app, ["dashboards", "snapshot", "--prometheus", scraped, "--profile", "test",
                                      "--boards", "latency", "--minutes", "0.5", "--step", "1", "--rate-window", "5s",
                                      "--out", str(out)], terminal_width=240)
    assert result.exit_code == 0, result.output
    png = out / "latency.png"
    assert f"wrote {png}" in " ".join(result.output.split())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


@pytest.mark.parametrize("args, message", [
    (["render", "{tmp}/out", "--profile", "staging"], "--profile must be one of production, test"),
    (["render", "{tmp}/file"], "exists and is not a folder"),
    (["check", "--prometheus", "http://127.0.0.1:9"], "cannot reach Prometheus at http://127.0.0.1:9"),
    (["snapshot", "--prometheus", "http://127.0.0.1:9", "--out", "{tmp}/png"], "cannot reach Prometheus"),
    (["snapshot", "--prometheus", "http://127.0.0.1:9", "--boards", "latency,grafana"], "no board called grafana"),
])
def test_cli_mistakes_get_a_sentence(tmp_path, args, message):
    (tmp_path / "file").write_text("")
    result = CliRunner().invoke(app, ["dashboards", *[a.format(tmp=tmp_path) for a in args]])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output


@pytest.mark.parametrize("module, heavy", [
    ("ragheat.commands.dashboards", {"grafanalib", "matplotlib", "httpx", "yaml"}),
    # the root app registers every command group: `ragheat --help` must not load what the commands use
    ("ragheat.cli", {"grafanalib", "matplotlib", "httpx", "yaml", "numpy", "faiss", "onnxruntime", "fastapi",
                     "uvicorn", "prometheus_client", "opentelemetry"}),
])
def test_importing_the_cli_stays_light(module, heavy):
    code = f"import sys, {module}; print(sorted(set({sorted(heavy)!r}) & {{m.split('.')[0] for m in sys.modules}}))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
