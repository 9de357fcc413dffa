"""The rest of ragheat's observing half on a framework service it did not write: the Haystack example (form i,
unchanged), scraped by a real Prometheus as its own job with the SLO rules loaded. The boards find every series a
library-only service feeds (``ragheat dashboards check --job haystack-rag --service library``), a short ``ragheat
bench`` sweep finds its knee (or says there is none), and, as root, the eBPF probes charge its kernel time to the
stages its framework hook names."""

from __future__ import annotations

import itertools
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from typer.testing import CliRunner

from dashboards import render, slo
from dashboards.boards import all_boards
from dashboards.promapi import PrometheusApi
from dashboards.verify import check_boards
from examples_live import SCIFACT, STAGE_H, Service, free_port  # tests/examples/examples_live.py, beside this file
from ragheat.cli import app
from stack.prometheus import LocalPrometheus
from tests.probes.conftest import ebpf  # noqa: F401 - the fixture: working eBPF, or a failure naming what is missing

pytestmark = pytest.mark.slow

FRAMEWORK, JOB = "haystack", "haystack-rag"  # the fastest of the three to start, with the others' small corpus
LOAD = 20  # answers, the claims asked again in turn
PROFILE = slo.PROFILES["production"]  # what `dashboards check` reads by default; its windows cover the whole module
DATA_BOARDS = ("latency", "slo")  # the boards the library's families feed (vLLM and kernel panels have no source)
REQUEST_H = "ragheat_request_duration_seconds"
STATUSES = ("ok", "empty", "error", "absent", "skipped")


@pytest.fixture(scope="module")
def observed(tmp_path_factory, claims):
    """The example serving, a Prometheus scraping it every second as job JOB (its rules loaded), and LOAD answers
    already given; yields the service and the Prometheus URL."""
    folder = tmp_path_factory.mktemp("examples-boards")
    render.write(folder / "rules", PROFILE)
    port, prometheus_port = free_port(), free_port()
    argv = [sys.executable, "-m", "uvicorn", f"examples.{FRAMEWORK}.app_ragheat:app", "--host", "127.0.0.1",
            "--port", str(port)]
    service = Service(f"{FRAMEWORK} app_ragheat", argv, port, folder / "app_ragheat.log").start()
    try:
        service.wait_ready()
        # LocalPrometheus names its first job `ragheat`: pointed at Prometheus itself, so the example's series are
        # under JOB alone.
        with LocalPrometheus(f"127.0.0.1:{prometheus_port}", port=prometheus_port, scrape_interval_s=1,
                             extra_targets={JOB: f"127.0.0.1:{port}"},
                             extra_config=f"rule_files:\n  - {folder / 'rules' / render.RULES_FILE}\n") as prometheus:
            # A counter's increase is seen only from its second sample on, and the request series appear with the
            # first answer: one answer, then the load once Prometheus holds that answer's series, so the load's
            # answers are an increase on a sample already taken.
            assert service.query(claims[0].text)["answer"]
            api, deadline = PrometheusApi(prometheus), time.monotonic() + 60
            while not api.query(f'{REQUEST_H}_count{{job="{JOB}"}}'):
                assert time.monotonic() < deadline, f"Prometheus never scraped {JOB}'s request series"
                time.sleep(0.5)
            for claim in itertools.islice(itertools.cycle(claims), 1, LOAD):
                assert service.query(claim.text)["answer"]
            yield service, prometheus
    finally:
        service.stop()


@pytest.fixture
def wide(monkeypatch):
    """The results console as wide as a long panel name needs, so each row of the check's table is one line."""
    from ragheat.clikit import out

    monkeypatch.setattr(out, "width", 400)


def check_rows(output: str) -> dict[str, str]:
    """``dashboards check``'s table: panel name -> status."""
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) > 3 and cells[1] in STATUSES:
            rows[cells[2]] = cells[1]
    return rows


def reported_stages(service: Service) -> set[str]:
    return {s.labels["stage"] for family in service.scrape() for s in family.samples
            if s.name == STAGE_H + "_count" and s.value > 0}


def test_dashboards_check_passes_for_the_example_as_a_library_only_service(observed, wide):
    service, prometheus = observed
    api = PrometheusApi(prometheus)
    boards = [b for b in all_boards(PROFILE) if b.slug in DATA_BOARDS]
    window = PROFILE.window(slo.QUANTILE_WINDOW_S)
    deadline = time.monotonic() + 60  # scrapes, then a rule evaluation, on a loaded machine
    while pending := [c.name for c in check_boards(api, boards, window, job=JOB, service="library")
                      if c.status not in ("ok", "skipped")]:
        assert time.monotonic() < deadline, f"panels without data for job {JOB}: {pending}"
        time.sleep(1)
    result = CliRunner().invoke(app, ["dashboards", "check", "--prometheus", prometheus, "--job", JOB,
                                      "--service", "library"], terminal_width=400)
    assert result.exit_code == 0, result.output
    rows = check_rows(result.output)
    titles = {b.slug: b.title for b in all_boards(PROFILE)}
    for slug in DATA_BOARDS:
        board = {name: status for name, status in rows.items() if name.startswith(titles[slug] + " /")}
        assert "ok" in board.values() and set(board.values()) <= {"ok", "skipped"}, (slug, board)
    others = {name: status for name, status in rows.items()
              if not name.startswith(tuple(titles[s] + " /" for s in DATA_BOARDS))}
    assert set(others.values()) <= {"absent", "skipped"}, others  # no vLLM, no probes exporter here
    # The stage panels see the framework's own stages, as the service reports them.
    seen = {r["metric"]["stage"] for r in api.query(f'sum by (stage) ({STAGE_H}_count{{job="{JOB}"}}) > 0')}
    assert seen == reported_stages(service) and len(seen) > 1, seen


def test_a_short_bench_sweep_finds_the_knee_or_says_there_is_none(observed, tmp_path):
    service, _ = observed
    out = tmp_path / "bench"
    rates = [4.0, 8.0]
    result = CliRunner().invoke(app, [
        "bench", "--url", service.url, "--path", "/query", "--body", '{"question": ""}', "--query-field", "question",
        "--expect-field", "answer", "--rates", ",".join(f"{r:g}" for r in rates), "--duration", "2", "--warmup", "0.5",
        "--queries", str(SCIFACT / "queries.jsonl"), "--server-pid", str(service.process.pid), "--out", str(out)],
        terminal_width=240)
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    assert (out / "report.html").is_file()
    assert [s["offered_qps"] for s in results["steps"]] == rates and not results["interrupted"]
    assert all(s["requests"] and s["cpu_ms_per_answer"] for s in results["steps"]), results["steps"]
    said = " ".join(result.output.split())
    knee = results["knee_qps"]
    assert (f"knee: {knee:g} req/s" if knee is not None else "knee: none of the offered rates met the SLO") in said


@pytest.mark.root
def test_the_probes_charge_kernel_time_to_the_stages_the_framework_hook_names(observed, ebpf, claims):  # noqa: F811
    from probes.loader import KernelProbes
    from rag.settings import ProbeSettings

    service, _ = observed
    with KernelProbes.attach(service.process.pid, ProbeSettings(syscalls=True)) as probes:
        with ThreadPoolExecutor(4) as pool:
            assert all(pool.map(lambda claim: service.query(claim.text)["answer"],
                                itertools.islice(itertools.cycle(claims), LOAD)))
        snap = probes.snapshot()
    offcpu = {stage for (stage, _), h in snap.offcpu.items() if h.count}
    syscalls = {stage for (stage, _), h in snap.syscall.items() if h.count}
    stages = reported_stages(service)
    # The components run on a worker thread named after the stage open at the moment, so its waits and system
    # calls are that stage's; what runs elsewhere (the event loop, the model's own threads) is charged to no stage.
    assert stages and stages <= syscalls, (sorted(syscalls), sorted(stages))
    assert offcpu & stages, (sorted(offcpu), sorted(stages))
    assert (offcpu | syscalls) <= stages | {"event_loop", "http", "other"}, (sorted(offcpu), sorted(syscalls))
