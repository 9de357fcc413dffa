"""The served service, wired in one place: a warmed-up pipeline, its HTTP app, telemetry around the app and,
optionally, the kernel probes on telemetry's registry. ``ragheat serve``, ``ragheat demo`` and the tests that run a
real server build it here, so each runs exactly what production runs.

    with build_service(settings, pipeline) as service:      # pipeline warmed up here if it is not yet
        uvicorn.run(service.app, ...)                        # or stack.servers.BackgroundServer(service.app)
"""

from __future__ import annotations

import os
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, MutableMapping, Sequence

from rag.api.app import create_app
from rag.pipeline import RagPipeline
from rag.settings import RagheatSettings

if TYPE_CHECKING:
    from fastapi import FastAPI
    from prometheus_client import CollectorRegistry

    from probes.inprocess import ProbeHandle
    from telemetry.recorder import Telemetry


@dataclass
class Service:
    """A pipeline served by its app, with the telemetry and probes wired around it. ``close()`` (or the end of a
    ``with`` block) stops the probes and the telemetry exporters; the app's lifespan closes the pipeline."""

    settings: RagheatSettings
    pipeline: RagPipeline
    app: FastAPI
    telemetry: Telemetry | None = None
    probes: ProbeHandle | None = None
    _closing: ExitStack = field(default_factory=ExitStack, repr=False)

    def close(self) -> None:
        """Stop the probes, then flush and stop the telemetry exporters."""
        self._closing.close()

    def __enter__(self) -> "Service":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def prepare_vllm_engine(settings: RagheatSettings, environ: MutableMapping[str, str] = os.environ) -> RagheatSettings:
    """For ``generation.generator=vllm``: the folder where the in-process engine's core process writes its metrics
    (``generation.vllm_metrics_dir``; else the operator's ``PROMETHEUS_MULTIPROC_DIR``; else a fresh one), exported
    to this process's environment, which the core process inherits when ``warm_up`` spawns it, with spawned rather
    than forked workers: a fork would inherit this process's in-memory metrics (and its threads), and the plugin's
    values would never reach the folder. Other generators: ``settings`` unchanged."""
    generation = settings.generation
    if generation.generator != "vllm":
        return settings
    folder = generation.vllm_metrics_dir or environ.get("PROMETHEUS_MULTIPROC_DIR") \
        or tempfile.mkdtemp(prefix="ragheat-vllm-metrics-")
    Path(folder).mkdir(parents=True, exist_ok=True)
    environ["PROMETHEUS_MULTIPROC_DIR"] = str(folder)
    environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    return settings.model_copy(update={"generation": generation.model_copy(update={"vllm_metrics_dir": Path(folder)})})


def build_service(settings: RagheatSettings, pipeline: RagPipeline | None = None, *, telemetry: bool = True,
                  probes: bool = False, probe_ports: Sequence[int] | None = None,
                  registry: CollectorRegistry | None = None, span_exporter=None,
                  environ: Mapping[str, str] | None = None) -> Service:
    """Warm up ``pipeline`` (default: a new one over ``server.index_dir``; a missing or corrupt index raises
    ``IndexLoadError`` here, before anything binds), create its app and, with ``telemetry``, instrument it (metrics
    on ``registry``, spans to ``span_exporter``, OTLP settings from ``environ``). ``probes`` attaches the eBPF probes
    to this process and exports them on telemetry's registry (``probe_ports``: the TCP ports to watch; default
    ``server.port``); without privileges they log why and the service runs without them."""
    if pipeline is None:
        settings = prepare_vllm_engine(settings)
        pipeline = RagPipeline(settings, settings.server.index_dir)
    pipeline.warm_up()
    service = Service(settings, pipeline, create_app(settings, pipeline=pipeline))
    if telemetry:
        from telemetry import build_telemetry
        from telemetry.asgi import instrument_app

        options = {"registry": registry, "span_exporter": span_exporter}
        if environ is not None:
            options["environ"] = environ
        service.telemetry = build_telemetry(settings, pipeline, **options)
        service._closing.callback(service.telemetry.shutdown)
        instrument_app(service.app, service.telemetry)
    if probes:
        if service.telemetry is None or service.telemetry.metrics is None:
            raise ValueError("probes are exported on telemetry's registry: they need telemetry with metrics on")
        from probes.inprocess import start as start_probes

        service.probes = start_probes(settings, service.telemetry.registry, tcp_ports=probe_ports)
        service._closing.callback(service.probes.close)
    return service
