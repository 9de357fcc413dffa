"""Span export that can never slow a request: a bounded hand-off, one export thread, drops counted.

The SDK's ``BatchSpanProcessor`` also drops when its queue is full, but only logs it; here every
dropped span increments ``ragheat_telemetry_dropped_total`` so a dead collector is visible.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from typing import Callable, Sequence

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

log = logging.getLogger("ragheat.telemetry")
OTLP_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                           "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")


def otlp_configured(environ=os.environ) -> bool:
    """True when an ``OTEL_EXPORTER_OTLP_*ENDPOINT`` variable is set."""
    return any(environ.get(name) for name in OTLP_ENDPOINT_VARIABLES)


class BoundedSpanProcessor(SpanProcessor):
    """Collects finished spans without blocking and exports them in batches on a daemon thread.

    A batch is sent when ``batch_size`` spans are waiting or ``delay_s`` after the previous export, whichever
    comes first: one OTLP request costs far more than encoding one more span, so exporting eagerly under
    load (a request per handful of spans) would cost the service real CPU. The hand-off is a ``deque``
    (``extend`` and ``popleft`` are atomic under the GIL): a request hands over all its spans in one call
    that takes no lock, where a ``queue.Queue`` costs a lock and a condition per span. Spans beyond ``max_queue``
    waiting are dropped, and so are batches the exporter fails; ``on_drop(reason, count)`` hears of both.
    """

    def __init__(self, exporter: SpanExporter, on_drop: Callable[[str, int], None], max_queue: int = 2048,
                 batch_size: int = 512, delay_s: float = 2.0) -> None:
        self.exporter, self.on_drop = exporter, on_drop
        self.max_queue, self.batch_size, self.delay_s = max_queue, batch_size, delay_s
        self._spans: deque[ReadableSpan] = deque()
        self._wake = threading.Event()
        self._done = threading.Condition()
        self._busy = False  # the worker holds spans that are neither exported nor dropped yet
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="ragheat-span-export", daemon=True)
        self._thread.start()

    def on_start(self, span, parent_context=None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if span.context.trace_flags.sampled:
            self.add((span,))

    def add(self, spans: Sequence[ReadableSpan]) -> None:
        """Hand over finished (sampled) spans; never blocks. Drops what does not fit, counted."""
        room = self.max_queue - len(self._spans)
        if room < len(spans):
            self.on_drop("queue_full", len(spans) - max(room, 0))
            spans = spans[: max(room, 0)]
        if spans:
            self._spans.extend(spans)
            if len(self._spans) >= self.batch_size:
                self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.delay_s)
            self._wake.clear()
            self._busy = True  # before taking any span, so a flush never sees "nothing waiting, nothing held"
            while self._spans:
                batch = [self._spans.popleft() for _ in range(min(self.batch_size, len(self._spans)))]
                self._export(batch)
            with self._done:
                self._busy = False
                self._done.notify_all()
            if self._stopping:
                return

    def _export(self, batch: list[ReadableSpan]) -> None:
        try:
            result = self.exporter.export(batch)
        except Exception:  # an exporter bug must not kill the export thread
            log.exception("span export raised")
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self.on_drop("export_failed", len(batch))

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export what is waiting now and wait until it has been exported or dropped."""
        self._wake.set()
        deadline = time.monotonic() + timeout_millis / 1000
        with self._done:
            while self._spans or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._wake.set()
                self._done.wait(min(left, 0.05))
        return True

    def shutdown(self) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=5.0)
        self.exporter.shutdown()
