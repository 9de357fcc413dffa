"""Telemetry for ragheat: Prometheus metrics, OpenTelemetry traces and OTLP export, built from the stage
timings that ``rag/`` returns. ``rag/`` never imports this package; ``ragheat.service`` wires it in.

    telemetry = build_telemetry(settings, pipeline)   # after pipeline.warm_up()
    instrument_app(app, telemetry)                    # middleware + GET /metrics
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rag.pipeline import RagPipeline
    from rag.settings import RagheatSettings
    from telemetry.recorder import Telemetry


def build_telemetry(settings: RagheatSettings, pipeline: RagPipeline, **kwargs) -> Telemetry:
    """A ``Telemetry`` for a warmed-up pipeline; its ``describe()`` names the data source, the model and where an
    in-process engine writes its metrics."""
    from telemetry.recorder import Telemetry

    described = pipeline.describe()
    telemetry = Telemetry(settings.telemetry, data_source=described.corpus, model=described.embedding_model, **kwargs)
    metrics_dir = described.engine_metrics_dir
    if metrics_dir is not None and telemetry.metrics is not None:
        # The in-process vLLM engine runs its core in a child process that writes its metrics (vllm:* and the
        # plugin's ragheat_vllm_*) to this folder; serve them at our /metrics too.
        from prometheus_client.multiprocess import MultiProcessCollector

        MultiProcessCollector(telemetry.registry, path=str(metrics_dir))
    return telemetry
