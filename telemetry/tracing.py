"""Span export that can never slow a request: a bounded queue, one export thread, drops counted.

The SDK's ``BatchSpanProcessor`` also drops when its queue is full, but only logs it; here every
dropped span increments ``ragheat_telemetry_dropped_total`` so a dead collector is visible.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Callable

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

log = logging.getLogger("ragheat.telemetry")
OTLP_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                           "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")


def otlp_configured(environ=os.environ) -> bool:
    return any(environ.get(name) for name in OTLP_ENDPOINT_VARIABLES)


_WAKE = object()  # queued by force_flush to wake the export thread; not a span


class BoundedSpanProcessor(SpanProcessor):
    """Queues finished spans (``put_nowait``: never blocks) and exports them on a daemon thread.

    A batch is sent when ``batch_size`` spans are waiting or ``delay_s`` after its first span, whichever
    comes first: one OTLP request costs far more than encoding one more span, so exporting eagerly
    under load (a request per handful of spans) would cost the service real CPU.
    ``on_drop(reason, count)`` is called for spans lost to a full queue or a failed export.
    """

    def __init__(self, exporter: SpanExporter, on_drop: Callable[[str, int], None], max_queue: int = 2048,
                 batch_size: int = 512, delay_s: float = 2.0) -> None:
        self.exporter, self.on_drop = exporter, on_drop
        self.batch_size, self.delay_s = batch_size, delay_s
        self._queue: queue.Queue[ReadableSpan | None] = queue.Queue(maxsize=max_queue)
        self._flush_now = threading.Event()
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
            taken, batch, stop = 1, [], item is None
            if item is not None and item is not _WAKE:
                batch.append(item)
            deadline = time.monotonic() + self.delay_s
            while not stop and len(batch) < self.batch_size:
                try:
                    if self._flush_now.is_set():  # flushing: take what is there, wait for nothing
                        item = self._queue.get_nowait()
                    else:
                        wait = deadline - time.monotonic()
                        if wait <= 0:
                            break
                        item = self._queue.get(timeout=wait)
                except queue.Empty:
                    break
                taken += 1
                if item is None:
                    stop = True
                elif item is not _WAKE:
                    batch.append(item)
            if batch:
                self._export(batch)
            with self._flush_done:
                for _ in range(taken):
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
        """Export what is queued now and wait until every span has been exported or dropped."""
        self._flush_now.set()
        try:
            self._queue.put_nowait(_WAKE)  # end the worker's wait for a fuller batch
        except queue.Full:
            pass  # a full queue means the worker is busy exporting anyway
        try:
            with self._flush_done:
                return self._flush_done.wait_for(lambda: self._queue.unfinished_tasks == 0, timeout_millis / 1000)
        finally:
            self._flush_now.clear()

    def shutdown(self) -> None:
        try:
            self._queue.put(None, timeout=1.0)
        except queue.Full:
            pass
        self._thread.join(timeout=5.0)
        self.exporter.shutdown()
