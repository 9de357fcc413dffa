"""Span export that can never slow a request: a bounded queue, one export thread, drops counted.

The SDK's ``BatchSpanProcessor`` also drops when its queue is full, but only logs it; here every
dropped span increments ``ragheat_telemetry_dropped_total`` so a dead collector is visible.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from typing import Callable

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

log = logging.getLogger("ragheat.telemetry")
OTLP_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                           "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")


def otlp_configured(environ=os.environ) -> bool:
    return any(environ.get(name) for name in OTLP_ENDPOINT_VARIABLES)


class BoundedSpanProcessor(SpanProcessor):
    """Queues finished spans (``put_nowait``: never blocks) and exports them on a daemon thread, in batches
    of whatever has queued up while the previous export ran (up to ``batch_size``).

    ``on_drop(reason, count)`` is called for spans lost to a full queue or a failed export.
    """

    def __init__(self, exporter: SpanExporter, on_drop: Callable[[str, int], None], max_queue: int = 2048,
                 batch_size: int = 256) -> None:
        self.exporter, self.on_drop = exporter, on_drop
        self.batch_size = batch_size
        self._queue: queue.Queue[ReadableSpan | None] = queue.Queue(maxsize=max_queue)
        self._flush_done = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="ragheat-span-export", daemon=True)
        self._thread.start()

    def on_start(self, span, parent_context=None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if not span.context.trace_flags.sampled:
            return
        try:
            self._queue.put_nowait(span)
        except queue.Full:
            self.on_drop("queue_full", 1)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            batch = [] if item is None else [item]
            stop = item is None
            while len(batch) < self.batch_size and not stop:  # whatever else is already waiting
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                stop = item is None
                if not stop:
                    batch.append(item)
            if batch:
                self._export(batch)
            with self._flush_done:
                for _ in range(len(batch) + stop):
                    self._queue.task_done()
                self._flush_done.notify_all()
            if stop:
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
        """Wait until every queued span has been exported or dropped (used by tests and at shutdown)."""
        with self._flush_done:
            return self._flush_done.wait_for(lambda: self._queue.unfinished_tasks == 0, timeout_millis / 1000)

    def shutdown(self) -> None:
        try:
            self._queue.put(None, timeout=1.0)
        except queue.Full:
            pass
        self._thread.join(timeout=5.0)
        self.exporter.shutdown()
