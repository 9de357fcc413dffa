"""Telemetry for ragheat: Prometheus metrics and OpenTelemetry traces built from the stage timings that
``rag/`` returns (``rag.types.StageTiming``). Nothing here yet: the metrics contract lands with the
telemetry issue, and ``rag/`` is kept free of any metrics library so that it can."""
