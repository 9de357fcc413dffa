"""``ragheat dashboards``: render writes both profiles, check and snapshot succeed against a Prometheus scraping the
real service and, as a second job, a service whose only ragheat part is the instrumentation library; mistakes get a
sentence (not a traceback), and importing the commands stays light."""

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

LIBRARY_JOB = "rag-lib.v2"  # its dot must be matched literally by --job


def test_cli_render_writes_both_profiles(tmp_path):
    runner = CliRunner()
    for profile in slo.PROFILES:
        result = runner.invoke(app, ["dashboards", "render", str(tmp_path / profile), "--profile", profile])
        assert result.exit_code == 0, result.output
        for relative, text in render.rendered_files(slo.PROFILES[profile]).items():
            assert (tmp_path / profile / relative).read_text(encoding="utf-8") == text


class LibraryOnlyService:
    """A service whose only ragheat part is the instrumentation library, as Prometheus sees it: exactly the library's
    families (``dashboards.contract.LIBRARY``) on its metrics endpoint, under stage names of its own, fed ten requests
    a second from a thread. ``with LibraryOnlyService() as url:``."""

    def __enter__(self) -> str:
        from prometheus_client import CollectorRegistry
        from prometheus_client.asgi import make_asgi_app

        from dashboards.contract import LIBRARY
        from stack.servers import BackgroundServer
        from telemetry.metrics import create_metric, specs

        from telemetry.host import HostCollector

        registry = CollectorRegistry()
        registry.register(HostCollector())  # the host families, as every observed service has them
        by_name = {spec.name: spec for spec in specs("service").values()}
        self.families = {name: create_metric(by_name[name], registry) for name in LIBRARY if name in by_name}
        self.families["ragheat_requests_in_flight"].labels("/ask").set(0)
        self.families["ragheat_stage_errors_total"].labels("tool")  # at zero: none failed
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve_requests, daemon=True)
        self.thread.start()
        self.server = BackgroundServer(make_asgi_app(registry))
        return self.server.__enter__()

    def _serve_requests(self) -> None:
        stages, request = self.families["ragheat_stage_duration_seconds"], self.families["ragheat_request_duration_seconds"]
        while not self.stop.wait(0.1):
            for stage, seconds in (("retrieve", 0.02), ("tool", 0.01), ("other", 0.002)):
                stages.labels(stage, "1-10", "ok").observe(seconds)
            request.labels("/ask", "1-10", "ok", "none").observe(0.035)
            self.families["ragheat_requests_total"].labels("/ask", "2xx").inc()  # no 5xx series: none failed yet
            self.families["ragheat_qps"].set(10)

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.server.__exit__(*exc)
        self.thread.join(timeout=5)


@pytest.fixture(scope="module")
def scraped(settings, pipeline, scifact_subset, tmp_path_factory):
    """The real service on loopback under light load and a library-only service (job LIBRARY_JOB), scraped every
    second by a real Prometheus that loads the test-profile rules; yields the Prometheus URL once every latency and
    SLO panel has data, and every one of them the library-only service feeds has its data."""
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
        with BackgroundServer(service.app) as url, LibraryOnlyService() as library, \
                LocalPrometheus(url.removeprefix("http://"), scrape_interval_s=1,
                                extra_targets={LIBRARY_JOB: library.removeprefix("http://")},
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
            api = PrometheusApi(prometheus)
            while not (all(c.status == "ok" for c in check_boards(api, boards, "5s"))
                       and all(c.status in ("ok", "skipped") for c in
                               check_boards(api, boards, "5s", job=LIBRARY_JOB, service="library"))):
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


@pytest.fixture
def wide(monkeypatch):
    """The results console as wide as a long panel name needs, so each row of the check's table is one line."""
    from ragheat.clikit import out

    monkeypatch.setattr(out, "width", 400)


def _rows(output: str) -> dict[str, str]:
    """The check's table: panel name -> status."""
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) > 3 and cells[1] in ("ok", "empty", "error", "absent", "skipped"):
            rows[cells[2]] = cells[1]
    return rows


@pytest.mark.slow
def test_cli_check_asks_a_library_only_service_for_what_it_feeds(scraped, wide):
    """``--job J --service library``: the panels only ragheat's pipeline feeds are skipped and every other latency
    and SLO query of that one job has data (its own stage names, the SLIs of its rules); without ``--service library``
    the pipeline's stage heatmaps, which read a family the library exports, come back empty for it and fail."""
    base = ["dashboards", "check", "--prometheus", scraped, "--profile", "test", "--boards", "latency,slo",
            "--rate-window", "5s", "--job", LIBRARY_JOB]
    library = CliRunner().invoke(app, [*base, "--service", "library"], terminal_width=400)
    assert library.exit_code == 0, library.output
    rows = _rows(library.output)
    assert set(rows.values()) == {"ok", "skipped"}, library.output
    skipped = {name for name, status in rows.items() if status == "skipped"}
    assert any(name.startswith("RAG latency / Answer cache") for name in skipped), skipped
    assert any(name.startswith("RAG latency / Router latency: route") for name in skipped), skipped
    # on the SLO board only the load controller's panels (a library-only service has none); every objective has data
    steering = ("Quality level now", "Answers by quality level", "Quality level changes", "Queries by priority")
    assert {name.split(" [")[0] for name in skipped if name.startswith("SLO /")} == {f"SLO / {p}" for p in steering}, \
        skipped
    assert rows["SLO / Availability SLI (5s) [{{job}}]"] == "ok"  # no 5xx series at all: the ratio is 0, not missing
    as_ragheat = CliRunner().invoke(app, base, terminal_width=400)
    assert as_ragheat.exit_code == 1, as_ragheat.output
    assert _rows(as_ragheat.output)["RAG latency / Router latency: route [{{le}}]"] == "empty", as_ragheat.output


@pytest.mark.slow
def test_cli_check_of_one_job_reads_only_that_job(scraped, wide):
    """``--job ragheat`` passes on its own (every panel of the service's job); a job Prometheus does not scrape
    fails with a sentence, not with every panel absent; the job is matched literally, never as a regex."""
    base = ["dashboards", "check", "--prometheus", scraped, "--profile", "test", "--boards", "latency,slo",
            "--rate-window", "5s"]
    own = CliRunner().invoke(app, [*base, "--job", "ragheat"], terminal_width=400)
    assert own.exit_code == 0, own.output
    assert set(_rows(own.output).values()) == {"ok"}, own.output
    nobody = CliRunner().invoke(app, [*base, "--job", "rag-lib"], terminal_width=400)
    assert nobody.exit_code == 1, nobody.output
    assert "job 'rag-lib' has no series of any family these boards read" in " ".join(nobody.output.split())
    # As a regex, "rag-lib.v." would match rag-lib.v2; the library's queries must find nothing instead.
    pattern = CliRunner().invoke(app, [*base, "--job", "rag-lib.v.", "--service", "library"], terminal_width=400)
    assert pattern.exit_code == 1, pattern.output
    assert "ok" not in _rows(pattern.output).values() and "empty" in _rows(pattern.output).values(), pattern.output


@pytest.mark.slow
def test_cli_snapshot_draws_the_latency_board(scraped, tmp_path):
    out = tmp_path / "png"
    result = CliRunner().invoke(app, ["dashboards", "snapshot", "--prometheus", scraped, "--profile", "test",
                                      "--boards", "latency", "--minutes", "0.5", "--step", "1", "--rate-window", "5s",
                                      "--out", str(out)], terminal_width=240)
    assert result.exit_code == 0, result.output
    png = out / "latency.png"
    # The console folds a long path where it likes: compare without the whitespace.
    assert f"wrote{png}" in "".join(result.output.split()), result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


@pytest.mark.parametrize("args, message", [
    (["render", "{tmp}/out", "--profile", "staging"], "--profile must be one of production, test"),
    (["render", "{tmp}/file"], "exists and is not a folder"),
    (["check", "--prometheus", "http://127.0.0.1:9", "--service", "pipeline"], "--service must be one of ragheat, library"),
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
