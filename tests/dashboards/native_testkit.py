"""The collector -> Prometheus leg of the OTLP path, for tests: a real Prometheus with its remote-write receiver,
and the translation the OTel Collector's ``prometheusremotewrite`` exporter applies to the exponential histograms
the service pushes (the collector itself cannot run here; everything on either side of it is real).

The translation follows the contrib exporter (pkg/translator/prometheusremotewrite, ``histograms.go`` and
``helper.go``): one native-histogram series per data point, named by ``telemetry.otlp_metrics.prometheus_name``,
labelled with the point's attributes, ``job`` = ``service.name``, ``instance`` = ``service.instance.id`` when set and
(``resource_to_telemetry_conversion``) every resource attribute; schema = the OTLP scale; bucket index + 1 (OTLP
bucket i is ``(base**i, base**(i+1)]``, Prometheus bucket i is ``(base**(i-1), base**i]``), counts delta-encoded;
each OTLP exemplar becomes a remote-write exemplar labelled ``trace_id`` and ``span_id`` (hex).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from telemetry.otlp_metrics import prometheus_name

_F = descriptor_pb2.FieldDescriptorProto


def _remote_write_messages() -> dict[str, type]:
    """prometheus/prompb WriteRequest, TimeSeries, Label, Sample, Exemplar, Histogram, BucketSpan (field numbers as in
    prompb/remote.proto and prompb/types.proto), built at run time: nothing here ships those generated classes."""
    file = descriptor_pb2.FileDescriptorProto(name="ragheat_test_prompb.proto", package="prometheus", syntax="proto3")

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        m = file.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            f = m.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                f.type_name = f".prometheus.{type_name}"

    one, many = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
    message("Label", ("name", 1, _F.TYPE_STRING, one, ""), ("value", 2, _F.TYPE_STRING, one, ""))
    message("Sample", ("value", 1, _F.TYPE_DOUBLE, one, ""), ("timestamp", 2, _F.TYPE_INT64, one, ""))
    message("Exemplar", ("labels", 1, _F.TYPE_MESSAGE, many, "Label"), ("value", 2, _F.TYPE_DOUBLE, one, ""),
            ("timestamp", 3, _F.TYPE_INT64, one, ""))
    message("BucketSpan", ("offset", 1, _F.TYPE_SINT32, one, ""), ("length", 2, _F.TYPE_UINT32, one, ""))
    message("Histogram", ("count_int", 1, _F.TYPE_UINT64, one, ""), ("sum", 3, _F.TYPE_DOUBLE, one, ""),
            ("schema", 4, _F.TYPE_SINT32, one, ""), ("zero_threshold", 5, _F.TYPE_DOUBLE, one, ""),
            ("zero_count_int", 6, _F.TYPE_UINT64, one, ""),
            ("positive_spans", 11, _F.TYPE_MESSAGE, many, "BucketSpan"),
            ("positive_deltas", 12, _F.TYPE_SINT64, many, ""), ("timestamp", 15, _F.TYPE_INT64, one, ""))
    message("TimeSeries", ("labels", 1, _F.TYPE_MESSAGE, many, "Label"), ("samples", 2, _F.TYPE_MESSAGE, many, "Sample"),
            ("exemplars", 3, _F.TYPE_MESSAGE, many, "Exemplar"),
            ("histograms", 4, _F.TYPE_MESSAGE, many, "Histogram"))
    message("WriteRequest", ("timeseries", 1, _F.TYPE_MESSAGE, many, "TimeSeries"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {m.name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"prometheus.{m.name}"))
            for m in file.message_type}


PROMPB = _remote_write_messages()


def snappy_block(data: bytes) -> bytes:
    """``data`` in snappy's block format as literal runs only (valid snappy, no compression), which is what
    Prometheus's remote-write receiver decodes."""
    out, n = bytearray(), len(data)
    while True:  # the uncompressed length, varint
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            break
    for start in range(0, len(data), 65536):
        chunk = data[start:start + 65536]
        size = len(chunk) - 1
        if size < 60:
            out.append(size << 2)
        else:
            width = (size.bit_length() + 7) // 8
            out.append((59 + width) << 2)
            out += size.to_bytes(width, "little")
        out += chunk
    return bytes(out)


def _value(any_value) -> str:
    return str(getattr(any_value, any_value.WhichOneof("value")))


def _sanitize(key: str) -> str:
    return "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in key)


def _spans_and_deltas(offset: int, counts: list[int]) -> tuple[list[tuple[int, int]], list[int]]:
    """OTLP dense buckets -> Prometheus spans (gaps of more than two empty buckets start a new span) and deltas."""
    spans: list[list[int]] = []
    deltas: list[int] = []
    previous, last_index = 0, None
    for i, count in enumerate(counts):
        if count == 0:
            continue
        index = offset + i + 1
        if last_index is None:
            spans.append([index, 0])
        elif index - last_index - 1 > 2:
            spans.append([index - last_index - 1, 0])
        else:
            for _ in range(index - last_index - 1):
                spans[-1][1] += 1
                deltas.append(0 - previous)
                previous = 0
        spans[-1][1] += 1
        deltas.append(count - previous)
        previous, last_index = count, index
    return [tuple(s) for s in spans], deltas


def remote_write_request(exports: list) -> bytes:
    """OTLP ``ExportMetricsServiceRequest``s (as a receiver got them) -> one serialized prompb ``WriteRequest``
    holding every exponential-histogram point as a native histogram sample, with its exemplars."""
    request = PROMPB["WriteRequest"]()
    for export in exports:
        for rm in export.resource_metrics:
            resource = {kv.key: _value(kv.value) for kv in rm.resource.attributes}
            base = {_sanitize(k): v for k, v in resource.items()}
            base["job"] = resource.get("service.name", "")
            if "service.instance.id" in resource:
                base["instance"] = resource["service.instance.id"]
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.WhichOneof("data") != "exponential_histogram":
                        continue
                    for dp in metric.exponential_histogram.data_points:
                        labels = {**base, **{_sanitize(kv.key): _value(kv.value) for kv in dp.attributes},
                                  "__name__": prometheus_name(metric.name, metric.unit)}
                        series = request.timeseries.add()
                        for name in sorted(labels):
                            series.labels.add(name=name, value=labels[name])
                        spans, deltas = _spans_and_deltas(dp.positive.offset, list(dp.positive.bucket_counts))
                        h = series.histograms.add(count_int=dp.count, sum=dp.sum, schema=dp.scale,
                                                  zero_threshold=1e-128, zero_count_int=dp.zero_count,
                                                  timestamp=dp.time_unix_nano // 1_000_000)
                        for offset, length in spans:
                            h.positive_spans.add(offset=offset, length=length)
                        h.positive_deltas.extend(deltas)
                        for e in dp.exemplars:
                            exemplar = series.exemplars.add(value=e.as_double, timestamp=e.time_unix_nano // 1_000_000)
                            exemplar.labels.add(name="trace_id", value=e.trace_id.hex())
                            exemplar.labels.add(name="span_id", value=e.span_id.hex())
    return request.SerializeToString()


class RemoteWritePrometheus:
    """Debian's Prometheus with the remote-write receiver, native histograms and exemplar storage on, on a free
    loopback port, scraping nothing: what the OTel Collector writes to in compose."""

    def __init__(self, port: int) -> None:
        self.binary = shutil.which("prometheus")
        self.url = f"http://127.0.0.1:{port}"
        self.port = port

    def __enter__(self) -> "RemoteWritePrometheus":
        if self.binary is None:
            raise AssertionError("the prometheus binary is missing: install Debian's package 'prometheus'")
        self.folder = Path(tempfile.mkdtemp(prefix="ragheat-remote-write-"))
        (self.folder / "prometheus.yml").write_text("global:\n  evaluation_interval: 1s\n")
        self.log = open(self.folder / "prometheus.log", "wb")
        self.process = subprocess.Popen(
            [self.binary, f"--config.file={self.folder / 'prometheus.yml'}", f"--storage.tsdb.path={self.folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-remote-write-receiver",
             "--enable-feature=native-histograms,exemplar-storage"], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/-/ready", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.process.poll() is not None:
                break
            time.sleep(0.2)
        self.__exit__()
        raise AssertionError(f"prometheus did not become ready: {(self.folder / 'prometheus.log').read_text()[-2000:]}")

    def write(self, body: bytes) -> httpx.Response:
        return httpx.post(self.url + "/api/v1/write", content=snappy_block(body), timeout=10, headers={
            "Content-Encoding": "snappy", "Content-Type": "application/x-protobuf",
            "X-Prometheus-Remote-Write-Version": "0.1.0"})

    def exemplars(self, query: str, start: float, end: float) -> list[dict]:
        body = httpx.get(self.url + "/api/v1/query_exemplars",
                         params={"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}"}, timeout=10).json()
        assert body["status"] == "success", body
        return body["data"]

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)
