"""``ragheat stack up --watch-url``: the stack around a service ragheat did not start. A plain Starlette app serving
one ``ragheat_requests_total`` series (prometheus_client) is watched under a chosen job, beside a URL where nothing
listens; the real Prometheus the stack started has the app's target up with the series queryable under that job,
the dead URL's target down after a warning, and no ragheat API running. Flags that cannot work are refused before
anything starts, a dead pid among them; ``--watch-pid`` runs the real probes on a live one (root)."""

from __future__ import annotations

import json
import os
import subprocess
import time

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from rag.childproc import free_port
from stack.local import prometheus_report, wait_for_scrapes
from stack.watch import target_group
from tests.stack.conftest import RAGHEAT

JOB = "rag-service"
REQUESTS = 7
# Watch mode starts no API or vLLM, so only these ports are asked for.
FREE_PORTS = ["--prometheus-port", "0", "--alertmanager-port", "0", "--alert-receiver-port", "0",
              "--probes-port", "0"]


def metrics_app() -> Starlette:
    """A service that is not ragheat: its own registry, one ragheat family, served by prometheus_client."""
    registry = CollectorRegistry()
    requests = Counter("ragheat_requests_total", "API requests by HTTP status class", ["route", "status_class"],
                       registry=registry)
    requests.labels("/v1/query", "2xx").inc(REQUESTS)

    def metrics(_request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[Route("/metrics", metrics), Route("/readyz", lambda _r: PlainTextResponse("ok"))])


def stack_up(folder, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([RAGHEAT, "stack", "up", "--folder", str(folder), *FREE_PORTS, *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "COLUMNS": "200"})


def stack_down(folder) -> None:
    subprocess.run([RAGHEAT, "stack", "down", "--folder", str(folder)], capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def service():
    from stack.servers import BackgroundServer

    with BackgroundServer(metrics_app()) as url:
        yield url


@pytest.mark.slow
def test_the_stack_scrapes_a_watched_service_under_the_chosen_job(service, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}/metrics"  # nothing listens there
    up = stack_up(tmp_path, "--watch-url", service + "/metrics", "--watch-url", dead, "--watch-job", JOB)
    try:
        assert up.returncode == 0, f"ragheat stack up failed:\n{up.stderr[-3000:]}"
        assert f"WARNING: --watch-url {dead} did not answer" in up.stderr, up.stderr
        state = json.loads((tmp_path / "state.json").read_text())
        processes = {p["name"]: p for p in state["processes"]}
        assert not {"api", "vllm", "nginx", "probes"} & set(processes), sorted(processes)
        prometheus = processes["prometheus"]["url"]
        targets = wait_for_scrapes(prometheus)
        watched = {t["health"] for t in targets if t["job"] == JOB}
        assert watched == {"up", "down"}, targets  # the app, and the URL where nothing listens
        assert "ragheat-api" not in {t["job"] for t in targets}
        query = f'ragheat_requests_total{{job="{JOB}", route="/v1/query"}}'
        deadline = time.monotonic() + 20
        while not (seen := httpx.get(prometheus + "/api/v1/query", params={"query": query},
                                     timeout=10).json()["data"]["result"]) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert [float(s["value"][1]) for s in seen] == [REQUESTS], seen
        _, groups = prometheus_report(prometheus)  # the SLO rules are loaded as for the stack's own API
        assert "ragheat-slo-burn-alerts" in {g["name"] for g in groups}
    finally:
        stack_down(tmp_path)
    assert httpx.get(service + "/metrics", timeout=10).status_code == 200  # `down` never touches the service


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("args, reason", [
    (lambda url: ["--watch-url", url, "--watch-pid", str(_dead_pid())], "no process with that pid is running"),
    (lambda url: ["--watch-url", "127.0.0.1:8000/metrics"], "is not an http(s) URL with a host"),
    (lambda url: ["--watch-url", url, "--watch-job", "prometheus"], "is a job the stack itself scrapes"),
    (lambda url: ["--watch-url", url, "--replicas", "2"], "--replicas runs ragheat's own API"),
    (lambda url: ["--watch-url", url, "--vllm-model", "dummy"], "--vllm-model and --llm-url choose the answers"),
], ids=["dead-pid", "no-scheme", "taken-job", "replicas", "vllm-model"])
def test_a_watch_that_cannot_work_is_refused_before_anything_starts(args, reason, service, tmp_path):
    up = stack_up(tmp_path, *args(service + "/metrics"), timeout=60)
    assert up.returncode == 2 and reason in up.stdout + up.stderr, up.stdout + up.stderr
    assert not (tmp_path / "state.json").exists()


def test_watched_urls_keep_their_own_scheme_path_and_query():
    assert target_group("https://rag.internal:9443/custom/metrics?format=prometheus") == {
        "targets": ["rag.internal:9443"],
        "labels": {"__scheme__": "https", "__metrics_path__": "/custom/metrics", "__param_format": "prometheus"}}
    assert target_group("http://[::1]/")["targets"] == ["[::1]:80"]


@pytest.mark.slow
@pytest.mark.root
def test_watch_pid_runs_the_probes_on_the_watched_process(tmp_path):
    """The watched process here is a plain ``sleep``: the probes attach to any live pid."""
    watched = subprocess.Popen(["sleep", "300"])
    try:
        up = stack_up(tmp_path, "--watch-pid", str(watched.pid))
        assert up.returncode == 0, f"ragheat stack up failed:\n{up.stderr[-3000:]}"
        state = json.loads((tmp_path / "state.json").read_text())
        processes = {p["name"]: p for p in state["processes"]}
        assert "api" not in processes and ["--pid", str(watched.pid)] == \
            processes["probes"]["argv"][processes["probes"]["argv"].index("--pid"):][:2]
        targets = wait_for_scrapes(processes["prometheus"]["url"])
        assert [t["health"] for t in targets if t["job"] == "ragheat-probes"] == ["up"], targets
    finally:
        stack_down(tmp_path)
        watched.kill()
        watched.wait()
