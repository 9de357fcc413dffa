"""README features of the served API, over real HTTP on loopback: 503 until the index is loaded, refusing an
index built with other model weights, the mid-stream SSE ``error`` event (and its count as a server error),
the OpenAPI page at ``/docs``, and ``ragheat serve --no-telemetry``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
import uvicorn
from prometheus_client import CollectorRegistry

from index_copy import copy_index
from rag.api.app import create_app
from rag.errors import IndexLoadError
from rag.index.store import MANIFEST, resolve_generation
from rag.pipeline import RagPipeline
from rag.childproc import wait_until_ok
from ragheat.service import build_service
from stack.servers import BackgroundServer, ServeProcess

RAGHEAT = Path(sys.executable).parent / "ragheat"
QUERY = "0-dimensional biomaterials lack inductive properties."
REAL_WEIGHTS = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"  # sha256 of model.safetensors


def parse_sse(text: str) -> list[tuple[str, object]]:
    events = []
    for block in text.split("\n\n"):
        if block.strip():
            fields = dict(line.split(": ", 1) for line in block.splitlines())
            events.append((fields["event"], json.loads(fields["data"])))
    return events


def error_body(response: httpx.Response, status: int, error: str) -> dict:
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert body["error"] == error and len(body["reason"]) > 5, body
    return body


# -- 503 until the index is loaded ----------------------------------------------------------------------

def test_queries_get_503_until_the_index_is_loaded(no_graph_settings, subset_index):
    """``ragheat serve`` loads in the app's lifespan and binds only then; a host that serves the app without
    running its lifespan (or before warm_up has finished) must answer 503 with a reason, never a 500."""
    settings = no_graph_settings
    pipeline = RagPipeline(settings, subset_index)  # not warmed up
    app = create_app(settings, pipeline=pipeline)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until_ok(url + "/healthz", 60, thread.is_alive, "the server")
        with httpx.Client(base_url=url, timeout=60) as client:
            assert client.get("/healthz").json() == {"status": "ok"}  # alive, not ready
            for response in (client.get("/readyz"), client.post("/v1/query", json={"query": QUERY}),
                             client.post("/v1/query/stream", json={"query": QUERY})):
                assert "loading" in error_body(response, 503, "not_ready")["reason"]
            error_body(client.post("/v1/query", json={"query": ""}), 422, "invalid_request")  # bad input stays 4xx
            pipeline.warm_up()
            assert client.get("/readyz").status_code == 200
            answered = client.post("/v1/query", json={"query": QUERY, "top_k": 2})
            assert answered.status_code == 200 and len(answered.json()["citations"]) == 2
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        pipeline.close()


# -- an index built with other model weights --------------------------------------------------------------

@pytest.fixture
def other_weights_index(subset_index, tmp_path) -> Path:
    """A copy of the subset index whose manifest says it was embedded by other weights."""
    index = tmp_path / "index"
    copy_index(subset_index, index)
    path = resolve_generation(index) / MANIFEST
    manifest = json.loads(path.read_text())
    assert manifest["model"]["weights_sha256"] == REAL_WEIGHTS
    manifest["model"]["weights_sha256"] = "0badc0ffee" + "0" * 54
    path.write_text(json.dumps(manifest))
    return index


def test_pipeline_refuses_an_index_of_other_weights(settings, other_weights_index):
    with pytest.raises(IndexLoadError) as info:
        RagPipeline(settings, other_weights_index).warm_up()
    message = str(info.value)
    assert str(resolve_generation(other_weights_index)) in message
    assert "0badc0ffee00" in message and REAL_WEIGHTS[:12] in message, message


def test_serve_refuses_an_index_of_other_weights_before_binding(other_weights_index, tmp_path):
    with socket.socket() as probe:  # a port nobody listens on, so an answer there could only be ours
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "COLUMNS": "1000", "NO_COLOR": "1", "TERM": "dumb"}
    done = subprocess.run([str(RAGHEAT), "serve", "--index", str(other_weights_index), "--port", str(port)],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    output = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2, output
    assert "Traceback" not in done.stderr
    assert str(resolve_generation(other_weights_index)) in output and "model weights 0badc0ffee00" in output, output
    assert "Uvicorn running" not in output and "Application startup" not in output


# -- the mid-stream error event ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def instrumented(no_graph_settings, subset_index):
    """Its own pipeline (a test breaks one of its stages) served with telemetry on a private registry."""
    settings = no_graph_settings
    pipeline = RagPipeline(settings, subset_index)
    with build_service(settings, pipeline, registry=CollectorRegistry(), environ={}) as service, \
            BackgroundServer(service.app) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield pipeline, client


def counter(client: httpx.Client, name: str, **labels) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for family in text_string_to_metric_families(client.get("/metrics").text)
               for s in family.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def test_a_stage_failing_mid_stream_ends_it_with_an_error_event(instrumented):
    pipeline, client = instrumented
    generator = pipeline.generator

    def broken(*args, **kwargs):
        raise RuntimeError("generator crashed")

    server_errors = counter(client, "ragheat_requests_total", route="/v1/query/stream", status_class="5xx")
    stage_errors = counter(client, "ragheat_stage_errors_total", stage="generate")
    generator.generate = broken
    try:
        response = client.post("/v1/query/stream", json={"query": QUERY, "top_k": 3})
        plain = client.post("/v1/query", json={"query": QUERY, "top_k": 3})
    finally:
        del generator.generate  # the class's method again
    # The status line (200) and the sources had gone out when generation failed: the stream says so and ends.
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(response.text)
    assert [kind for kind, _ in events] == ["sources", "error"], events
    assert len(events[0][1]) == 3
    assert events[1][1] == {"error": "stage_failed", "reason": "the generate stage failed", "stage": "generate"}
    assert "generator crashed" not in response.text  # internals stay in the server's log
    # Without a stream, the same failure is a 500 naming the stage.
    assert error_body(plain, 500, "stage_failed")["stage"] == "generate"
    # Counted as a server error although its status was 200.
    assert counter(client, "ragheat_requests_total", route="/v1/query/stream", status_class="5xx") \
        == server_errors + 1
    assert counter(client, "ragheat_stage_errors_total", stage="generate") == stage_errors + 2
    # The pipeline is whole again.
    healed = parse_sse(client.post("/v1/query/stream", json={"query": QUERY, "top_k": 3}).text)
    assert healed[0][0] == "sources" and healed[-1][0] == "done" and {k for k, _ in healed[1:-1]} == {"answer"}


# -- /docs ----------------------------------------------------------------------------------------------------

def test_docs_page_serves_the_openapi_ui(instrumented):
    _, client = instrumented
    page = client.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "swagger-ui" in page.text and "/openapi.json" in page.text
    spec = client.get("/openapi.json").json()
    assert spec["info"]["title"] == "ragheat"
    assert {"/v1/query", "/v1/query/stream", "/healthz", "/readyz"} <= set(spec["paths"])
    assert "503" in spec["paths"]["/v1/query"]["post"]["responses"]


# -- serve --no-telemetry ---------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("telemetry", [True, False], ids=["telemetry", "no-telemetry"])
def test_serve_with_and_without_telemetry(subset_index, telemetry):
    flags = [] if telemetry else ["--no-telemetry"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    with ServeProcess(subset_index, extra_args=flags, env=env) as service, \
            httpx.Client(base_url=service.url, timeout=60) as client:
        answered = client.post("/v1/query", json={"query": QUERY})
        assert answered.status_code == 200 and answered.json()["citations"], answered.text
        assert client.get("/docs").status_code == 200
        metrics = client.get("/metrics")
        if telemetry:
            assert metrics.status_code == 200 and 'ragheat_requests_total{route="/v1/query"' in metrics.text
        else:
            error_body(metrics, 404, "not_found")
