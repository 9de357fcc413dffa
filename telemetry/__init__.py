"""Telemetry for ragheat: Prometheus metrics, OpenTelemetry traces and OTLP export, built from the stage
timings that ``rag/`` returns. ``rag/`` never imports this package; the command line wires it in.

    telemetry = build_telemetry(settings, pipeline)   # after pipeline.warm_up()
    instrument_app(app, telemetry)                    # middleware + GET /metrics
"""

from __future__ import annotations


def build_telemetry(settings, pipeline, **kwargs):
    """A ``Telemetry`` for a warmed-up pipeline (its manifest names the data source and the model)."""
    from telemetry.recorder import Telemetry

    manifest = pipeline.index.manifest
    telemetry = Telemetry(settings.telemetry, data_source=manifest["corpus"]["name"], model=manifest["model"]["name"],
                          **kwargs)
    metrics_dir = getattr(getattr(pipeline, "llm", None), "metrics_dir", None)
    if metrics_dir and telemetry.metrics is not None:
        # The in-process vLLM engine runs its core in a child process that writes its metrics (vllm:* and the
        # plugin's ragheat_vllm_*) to this folder; serve them at our /metrics too.
        from prometheus_client.multiprocess import MultiProcessCollector

        MultiProcessCollector(telemetry.registry, path=metrics_dir)
    return telemetry
