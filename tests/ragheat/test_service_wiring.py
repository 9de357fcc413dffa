"""``ragheat.service``: the one wiring of pipeline, app, telemetry and probes, and the vLLM engine's metrics
folder handed over through the environment rather than by the generator."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from ragheat.service import build_service, prepare_vllm_engine
from stack.servers import BackgroundServer


def vllm_settings(settings, **update):
    generation = settings.generation.model_copy(update={"generator": "vllm", "model": "m", **update})
    return settings.model_copy(update={"generation": generation})


def test_other_generators_leave_settings_and_environment_alone(settings):
    environ: dict[str, str] = {}
    assert prepare_vllm_engine(settings, environ) is settings and environ == {}


def test_the_vllm_engine_gets_a_fresh_metrics_folder_exported_with_spawned_workers(settings):
    environ: dict[str, str] = {}
    prepared = prepare_vllm_engine(vllm_settings(settings), environ)
    folder = prepared.generation.vllm_metrics_dir
    assert folder is not None and folder.is_dir() and not any(folder.iterdir())
    assert environ == {"PROMETHEUS_MULTIPROC_DIR": str(folder), "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    folder.rmdir()


def test_a_configured_or_operator_folder_is_kept(settings, tmp_path):
    environ = {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}
    prepared = prepare_vllm_engine(vllm_settings(settings, vllm_metrics_dir=tmp_path / "mine"), environ)
    assert prepared.generation.vllm_metrics_dir == tmp_path / "mine" and (tmp_path / "mine").is_dir()
    assert environ == {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "mine"), "VLLM_WORKER_MULTIPROC_METHOD": "fork"}
    operator = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "operator")}
    assert prepare_vllm_engine(vllm_settings(settings), operator).generation.vllm_metrics_dir == tmp_path / "operator"


def test_the_service_serves_queries_with_metrics_and_closes_its_telemetry(settings, pipeline):
    quiet = settings.model_copy(update={"telemetry": settings.telemetry.model_copy(update={"otlp": "off"})})
    with build_service(quiet, pipeline, registry=CollectorRegistry()) as service:
        with BackgroundServer(service.app) as url, httpx.Client(base_url=url, timeout=30) as client:
            assert client.post("/v1/query", json={"query": "vitamin D and bone density"}).status_code == 200
            assert 'ragheat_requests_total{route="/v1/query",status_class="2xx"} 1.0' in client.get("/metrics").text
        assert service.probes is None
    without = build_service(quiet, pipeline, telemetry=False)
    assert without.telemetry is None
    with pytest.raises(ValueError, match="need telemetry"):
        build_service(quiet, pipeline, telemetry=False, probes=True)


def test_a_missing_index_fails_before_anything_is_built(settings, tmp_path):
    from rag.errors import IndexLoadError

    missing = settings.model_copy(update={"server": settings.server.model_copy(update={"index_dir": tmp_path / "x"})})
    with pytest.raises(IndexLoadError, match=str(Path(tmp_path / "x"))):
        build_service(missing)
