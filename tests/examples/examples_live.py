"""The example services as live processes: uvicorn on a free loopback port, one process per form, over the first
``DOCS`` SciFact abstracts, with every request traced so the scrape carries exemplars: form (i) samples at
trace_sample_ratio 1.0 and exports its spans to an in-process OTLP receiver (ragheat traces only what it exports);
form (ii)'s spans are the framework's, recorded by the SDK's default sampler."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from stack.otlp_receiver import OtlpReceiver

REPO = Path(__file__).resolve().parents[2]
SCIFACT = REPO / "datasets" / "scifact"
DOCS = 100  # eight train claims find all their abstracts among them
START_TIMEOUT_S = 120.0  # imports, the model and embedding DOCS abstracts, on a loaded two-core machine
STAGE_H = "ragheat_stage_duration_seconds"
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Service:
    """One example form running as its own process."""

    name: str
    argv: list[str]
    port: int
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = None
    client: httpx.Client = field(init=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "Service":
        env = {**os.environ, "EXAMPLES_SCIFACT_DOCS": str(DOCS), "EXAMPLES_SCIFACT_DIR": str(SCIFACT),
               "RAGHEAT_TELEMETRY__TRACE_SAMPLE_RATIO": "1.0", "PYTHONPATH": str(REPO),
               # two such processes start side by side: one thread each keeps them off each other's core
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        for key in [k for k in env if k.startswith("OTEL_")]:
            del env[key]  # nothing leaves the machine from a test
        env.update(self.env)
        self.process = subprocess.Popen(self.argv, cwd=REPO, env=env, stdout=open(self.log, "wb"),
                                        stderr=subprocess.STDOUT, start_new_session=True)
        self.client = httpx.Client(base_url=self.url, timeout=30.0)
        return self

    def wait_ready(self) -> "Service":
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"{self.name} exited with {self.process.returncode} before serving:\n{self.tail()}")
            try:
                if self.client.get("/metrics").status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        pytest.fail(f"{self.name} did not serve within {START_TIMEOUT_S:.0f} s:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        self.client.close()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def query(self, question: str) -> dict:
        response = self.client.post("/query", json={"question": question})
        assert response.status_code == 200, response.text
        return response.json()

    def scrape(self, openmetrics: bool = False) -> list:
        response = self.client.get("/metrics", headers={"Accept": OPENMETRICS} if openmetrics else {})
        assert response.status_code == 200, response.text
        parse = openmetrics_families if openmetrics else text_string_to_metric_families
        if openmetrics:
            assert response.headers["content-type"].startswith("application/openmetrics-text")
        return list(parse(response.text))


def forms(framework: str, tmp_path_factory, otlp_receiver: OtlpReceiver) -> dict[str, Service]:
    """Form (i), the app with ragheat's lines, and form (ii), the plain app under the OpenTelemetry launcher,
    started together (their imports and embedding overlap) and returned once both serve."""
    logs = tmp_path_factory.mktemp(f"{framework}-logs")
    services = {
        "ragheat": Service(f"{framework} app_ragheat", [sys.executable, "-m", "uvicorn",
                                                        f"examples.{framework}.app_ragheat:app", "--host",
                                                        "127.0.0.1", "--port", str(port := free_port())],
                           port, logs / "app_ragheat.log",
                           {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver.endpoint}),
        "otel": Service(f"{framework} serve_otel", [sys.executable, "-m", f"examples.{framework}.serve_otel",
                                                    "--port", str(port2 := free_port())],
                        port2, logs / "serve_otel.log"),
    }
    try:
        for service in services.values():
            service.start()
        for service in services.values():
            service.wait_ready()
    except BaseException:
        for service in services.values():
            service.stop()
        raise
    return services


@dataclass(frozen=True)
class Claim:
    text: str
    relevant: frozenset[str]
