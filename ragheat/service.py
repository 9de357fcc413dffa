"""The served service, wired in one place: a warmed-up pipeline behind the generation switch that hot-swaps newer
index generations in, its HTTP app, telemetry around the app (rejections and reloads counted; /metrics on the API port
or on ``server.metrics_port``) and, optionally, the kernel probes on telemetry's registry. ``ragheat serve``,
``ragheat demo`` and the tests that run a real server build it here, so each runs exactly what production runs.

    with build_service(settings, pipeline) as service:      # pipeline warmed up here if it is not yet
        uvicorn.Server(service.uvicorn_config(host=..., port=...)).run()   # or BackgroundServer(service.app)
"""

from __future__ import annotations

import os
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, MutableMapping, Sequence

from rag.api.app import create_app
from rag.index_generations import IndexGenerationSwitch
from rag.pipeline import RagPipeline
from rag.settings import RagheatSettings
from rag.stages import QUALITY_LEVELS

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI
    from prometheus_client import CollectorRegistry

    from probes.inprocess import ProbeHandle
    from telemetry.recorder import Telemetry


@dataclass
class Service:
    """A pipeline served by its app, with the telemetry and probes wired around it. ``close()`` (or the end of a
    ``with`` block) stops the probes, the metrics port and the telemetry exporters; the app's lifespan closes the
    pipelines. ``pipeline`` is the generation served now (``generations`` swaps newer ones in)."""

    settings: RagheatSettings
    generations: IndexGenerationSwitch
    app: FastAPI
    telemetry: Telemetry | None = None
    probes: ProbeHandle | None = None
    metrics_url: str | None = None  # /metrics on server.metrics_port, when set
    _closing: ExitStack = field(default_factory=ExitStack, repr=False)

    @property
    def pipeline(self) -> RagPipeline:
        return self.generations.current

    def uvicorn_config(self, **options) -> "uvicorn.Config":
        """How to run ``app`` under uvicorn: slow and oversized clients cut off by the server settings' limits
        (``rag.api.connections``); ``options`` (host, port, log_level, ...) go to ``uvicorn.Config``."""
        from rag.api.connections import uvicorn_config

        return uvicorn_config(self.app, self.settings.server, **options)

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
                  environ: Mapping[str, str] | None = None, multiprocess_dir: str | None = None) -> Service:
    """Warm up ``pipeline`` (default: a new one over ``server.index_dir``; a missing or corrupt index raises
    ``IndexLoadError`` here, before anything binds), create its app and, with ``telemetry``, instrument it (metrics
    on ``registry``, spans to ``span_exporter``, OTLP settings from ``environ``). ``probes`` attaches the eBPF probes
    to this process and exports them on telemetry's registry (``probe_ports``: the TCP ports to watch; default
    ``server.port``); without privileges they log why and the service runs without them. ``multiprocess_dir``: this
    is one worker of ``ragheat serve --workers N`` and ``/metrics`` sums every worker's values from that folder."""
    from rag.placement import apply_process_placement

    # Before the models load: the threads they start inherit the cores (rag/placement.py).
    apply_process_placement(settings.placement.cpus, settings.placement.math_threads)
    if pipeline is None:
        settings = prepare_vllm_engine(settings)
        pipeline = RagPipeline(settings, settings.server.index_dir)
    app = create_app(settings, pipeline=pipeline)
    switch: IndexGenerationSwitch = app.state.generations
    switch.warm_up()
    service = Service(settings, switch, app)
    if telemetry:
        from telemetry import build_telemetry
        from telemetry.asgi import instrument_app

        options = {"registry": registry, "span_exporter": span_exporter}
        if environ is not None:
            options["environ"] = environ
        service.telemetry = build_telemetry(settings, pipeline, **options)
        service._closing.callback(service.telemetry.shutdown)
        metrics_port = settings.server.metrics_port if service.telemetry.metrics is not None else None
        aggregate = multiprocess_dir is not None and service.telemetry.metrics is not None
        instrument_app(service.app, service.telemetry, metrics_route=metrics_port is None and not aggregate)
        if aggregate:  # a worker of `ragheat serve --workers N`: every scrape sums all workers (ragheat/workers.py)
            from ragheat.workers import HIGH_WATER_FILE, ScrapeRegistry
            from telemetry.asgi import metrics_endpoint
            from telemetry.exemplars import ExemplarShare

            share = ExemplarShare(multiprocess_dir)  # its traced observations' exemplars, for every worker's scrape
            # The service's CPU is its supervisor's tree (this worker's parent: ragheat/workers.py), whichever worker
            # answers the scrape; their answers share one high-water mark, so the counter never steps back between
            # them.
            service.telemetry.host.root = os.getppid()
            service.telemetry.host.share_high_water(Path(multiprocess_dir) / HIGH_WATER_FILE)
            service.telemetry.metrics.share_exemplars(share)
            service._closing.callback(share.close)

            service.app.add_route("/metrics", metrics_endpoint(ScrapeRegistry(service.telemetry.registry,
                                                                              multiprocess_dir)),
                                  methods=["GET"], include_in_schema=False)
        if metrics_port is not None:
            service.metrics_url = _serve_metrics(service, metrics_port)
        _observe(service)
    if probes:
        if service.telemetry is None or service.telemetry.metrics is None:
            raise ValueError("probes are exported on telemetry's registry: they need telemetry with metrics on")
        from probes.inprocess import start as start_probes

        service.probes = start_probes(settings, service.telemetry.registry, tcp_ports=probe_ports)
        service._closing.callback(service.probes.close)
    return service


def _observe(service: Service) -> None:
    """Telemetry hears every refusal and reload, and follows the generation served (its corpus and model name the
    spans' data source; its answer cache's size is read at each scrape)."""
    telemetry, switch = service.telemetry, service.generations
    service.app.state.access.rejections.listeners.append(telemetry.rejected)
    admission = service.app.state.admission
    admission.listeners.append(telemetry.shed)
    admission.answered.listeners.append(lambda priority: telemetry.prioritized(priority, "answered"))
    admission.refused.listeners.append(lambda priority: telemetry.prioritized(priority, "shed"))
    if (steering := service.app.state.steering) is not None:
        steering.listeners.append(telemetry.level_changed)
        if telemetry.metrics:  # the rung now, from the first scrape
            telemetry.metrics.quality_level.set(QUALITY_LEVELS.index(steering.level))
    switch.on_reload.append(telemetry.reloaded)
    telemetry.watch_cache(lambda: switch.current.cache_stats())  # the served generation's cache, at scrape time

    def export_quality(pipeline: RagPipeline) -> None:  # the calibration the verdicts use: the drift reference
        if pipeline.quality is not None:
            telemetry.watch_quality(pipeline.quality.calibration, pipeline.quality.min_similarity,
                                    pipeline.quality.min_support)
        if pipeline.judge is not None:
            pipeline.judge.listeners.append(telemetry.judged)

    export_quality(switch.current)

    def follow(old: RagPipeline, new: RagPipeline) -> None:
        described = new.describe()
        telemetry.data_source, telemetry.model = described.corpus, described.embedding_model
        export_quality(new)

    switch.on_swap.append(follow)


def _serve_metrics(service: Service, port: int) -> str:
    """``/metrics`` on a port of its own (``server.metrics_port``, on ``server.host``), open: a scrape network apart
    from the API's clients. Stopped by ``service.close()``."""
    from prometheus_client import start_http_server

    host = service.settings.server.host
    httpd, thread = start_http_server(port, addr=host, registry=service.telemetry.registry)

    def stop() -> None:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)

    service._closing.callback(stop)
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}/metrics"
