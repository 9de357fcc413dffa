"""OTLP/HTTP span export with a direct protobuf wire encoder, far cheaper per span than the SDK's.

Why not ``OTLPSpanExporter``: its encoder builds a protobuf object per span, attribute and value, all of it CPU
taken from a saturated service (docs/benchmarks.md, Telemetry overhead). ragheat's
spans are few-shaped (a request span and five stage spans with a handful of repeating attributes), so
here each span is written straight to OTLP's wire format, and an attribute's encoded bytes are cached
by (key, value): the same ``rag.stage=embed`` is encoded once per process, not once per span.
``tests/telemetry/test_otlp_spans.py`` decodes the output with ``opentelemetry-proto`` and compares
it field by field with the SDK encoder's.
"""

from __future__ import annotations

import logging
import os
import struct
import time
from typing import Mapping, Sequence

import httpx
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

log = logging.getLogger("ragheat.telemetry")

_FLAGS_HAS_IS_REMOTE, _FLAGS_IS_REMOTE = 0x100, 0x200
_ATTRIBUTE_CACHE_LIMIT = 4096
_CACHEABLE_STR_LEN = 64
_YIELD_EVERY = 32  # longer strings (captured query text) are rarely repeated: not worth a cache slot


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 negatives are ten-byte varints
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _any_value(value) -> bytes:
    if isinstance(value, bool):  # before int: bool is an int
        return b"\x10" + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        return b"\x18" + _varint(value)
    if isinstance(value, float):
        return b"\x21" + struct.pack("<d", value)
    if isinstance(value, str):
        return _field(1, value.encode("utf-8", "replace"))
    if isinstance(value, bytes):
        return _field(7, value)
    if isinstance(value, (list, tuple)):
        return _field(5, b"".join(_field(1, _any_value(v)) for v in value))
    return _field(1, str(value).encode("utf-8", "replace"))


class SpanWireEncoder:
    """Encodes ``ReadableSpan`` batches as an ``ExportTraceServiceRequest`` (opentelemetry-proto's schema)."""

    def __init__(self) -> None:
        self._attributes: dict[tuple, bytes] = {}
        self._headers: dict[tuple, tuple] = {}  # (resource, scope) ids -> their encoded fields
        self._blocks: dict[tuple, bytes] = {}  # a span's attribute items -> its encoded attributes
        self._fields: dict[str, dict] = {"name_kind": {}, "status": {}}

    def key_value(self, key: str, value) -> bytes:
        """One ``KeyValue`` message body, cached for short scalar values."""
        cacheable = not isinstance(value, (list, tuple)) and not (
            isinstance(value, str) and len(value) > _CACHEABLE_STR_LEN)
        cache_key = (key, type(value), value) if cacheable else None
        if cache_key is not None:
            cached = self._attributes.get(cache_key)
            if cached is not None:
                return cached
        encoded = _field(1, key.encode()) + _field(2, _any_value(value))
        if cache_key is not None and len(self._attributes) < _ATTRIBUTE_CACHE_LIMIT:
            self._attributes[cache_key] = encoded
        return encoded

    def _attributes_field(self, number: int, attributes: Mapping | None) -> bytes:
        if not attributes:
            return b""
        return b"".join(_field(number, self.key_value(k, v)) for k, v in attributes.items())

    def _span_attributes(self, attributes: Mapping | None) -> bytes:
        """A span's whole attribute block, cached: ragheat's stage spans repeat the same few sets."""
        if not attributes:
            return b""
        try:
            # Types are part of the key: 1, 1.0 and True are equal and hash alike, but encode differently.
            key = (*attributes.items(), *map(type, attributes.values()))
            cached = self._blocks.get(key)
        except TypeError:  # an unhashable value (a list attribute)
            return self._attributes_field(9, attributes)
        if cached is None:
            cached = self._attributes_field(9, attributes)
            if len(self._blocks) < _ATTRIBUTE_CACHE_LIMIT and all(
                    not isinstance(v, str) or len(v) <= _CACHEABLE_STR_LEN for v in attributes.values()):
                self._blocks[key] = cached
        return cached

    def _small(self, kind: str, value, make) -> bytes:
        cache = self._fields[kind]
        encoded = cache.get(value)
        if encoded is None:
            encoded = make(value)
            if len(cache) < _ATTRIBUTE_CACHE_LIMIT:
                cache[value] = encoded
        return encoded

    def span(self, span: ReadableSpan) -> bytes:
        context, parent = span.context, span.parent
        out = b"\x0a\x10" + context.trace_id.to_bytes(16, "big") + b"\x12\x08" + context.span_id.to_bytes(8, "big")
        if context.trace_state:
            out += _field(3, context.trace_state.to_header().encode())
        if parent is not None:
            out += b"\x22\x08" + parent.span_id.to_bytes(8, "big")
        # name (5) and kind (6; the SDK's SpanKind is the proto's minus one), then the two fixed64 times
        out += self._small("name_kind", (span.name, span.kind.value),
                           lambda nk: _field(5, nk[0].encode()) + b"\x30" + _varint(nk[1] + 1))
        out += _TIMES.pack(0x39, span.start_time or 0, 0x41, span.end_time or 0)
        out += self._span_attributes(span.attributes)
        if span.dropped_attributes:
            out += b"\x50" + _varint(span.dropped_attributes)
        for event in span.events:
            body = b"\x09" + struct.pack("<Q", event.timestamp) + _field(2, event.name.encode())
            out += _field(11, body + self._attributes_field(3, event.attributes))
        for link in span.links:
            link_context = link.context
            body = (b"\x0a\x10" + link_context.trace_id.to_bytes(16, "big")
                    + b"\x12\x08" + link_context.span_id.to_bytes(8, "big")
                    + self._attributes_field(4, link.attributes))
            out += _field(13, body + b"\x35" + struct.pack("<I", _flags(link_context)))
        status = span.status
        if status is not None:
            out += self._small("status", (status.status_code.value, status.description), _status_field)
        return out + _FLAGS_FIELD[parent is not None and parent.is_remote]  # field 16, fixed32

    def _header(self, resource, scope) -> tuple:
        key = (id(resource), id(scope))
        cached = self._headers.get(key)
        if cached is None:
            resource_body = self._attributes_field(1, resource.attributes)
            scope_body = b""
            if scope is not None:
                scope_body = _field(1, scope.name.encode())
                if scope.version:
                    scope_body += _field(2, scope.version.encode())
                scope_body += self._attributes_field(3, scope.attributes)
            cached = ((_field(1, resource_body), resource.schema_url or ""),
                      (_field(1, scope_body) if scope is not None else b"", getattr(scope, "schema_url", "") or ""),
                      (resource, scope))  # kept alive with their encodings, so an id() is never reused meanwhile
            self._headers[key] = cached
        return cached

    def export_request(self, spans: Sequence[ReadableSpan]) -> bytes:
        """The ``ExportTraceServiceRequest`` bytes for ``spans``, grouped by resource and scope."""
        groups: dict[tuple, dict[tuple, list[bytes]]] = {}
        for n, span in enumerate(spans, 1):
            if n % _YIELD_EVERY == 0:
                time.sleep(0)  # let request threads have the GIL: a whole batch is a long stretch of pure Python
            resource_key, scope_key, _ = self._header(span.resource, span.instrumentation_scope)
            groups.setdefault(resource_key, {}).setdefault(scope_key, []).append(_field(2, self.span(span)))
        out = []
        for (resource_field, resource_schema), scopes in groups.items():
            body = [resource_field]
            for (scope_field, scope_schema), encoded in scopes.items():
                scope_body = scope_field + b"".join(encoded)
                if scope_schema:
                    scope_body += _field(3, scope_schema.encode())
                body.append(_field(2, scope_body))
            if resource_schema:
                body.append(_field(3, resource_schema.encode()))
            out.append(_field(1, b"".join(body)))
        return b"".join(out)


_TIMES = struct.Struct("<BQBQ")
_FLAGS_FIELD = {False: b"\x85\x01" + struct.pack("<I", _FLAGS_HAS_IS_REMOTE),
                True: b"\x85\x01" + struct.pack("<I", _FLAGS_HAS_IS_REMOTE | _FLAGS_IS_REMOTE)}


def _status_field(code_description: tuple) -> bytes:
    code, description = code_description
    body = _field(2, description.encode()) if description else b""
    if code:
        body += b"\x18" + _varint(code)
    return _field(15, body)


def _flags(parent) -> int:
    if parent is None:
        return _FLAGS_HAS_IS_REMOTE
    return _FLAGS_HAS_IS_REMOTE | (_FLAGS_IS_REMOTE if parent.is_remote else 0)


def traces_endpoint_from_env(environ: Mapping[str, str] = os.environ) -> str:
    """The traces URL the standard variables name; OTLP/HTTP's default when none is set."""
    specific = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if specific:
        return specific
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4318"
    return base.rstrip("/") + "/v1/traces"


def traces_headers_from_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """OTLP traces export headers from the standard variables (URL-decoded)."""
    from telemetry.otlp_metrics import parse_headers

    return parse_headers(environ.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or environ.get("OTEL_EXPORTER_OTLP_HEADERS"))


class OtlpHttpSpanExporter(SpanExporter):
    """POSTs ``SpanWireEncoder`` output to an OTLP/HTTP traces endpoint (``application/x-protobuf``).

    One attempt per batch within ``timeout_s``: the caller (``BoundedSpanProcessor``) counts a failed batch
    as dropped rather than retrying into a backlog that would cost the service CPU when it can least afford it.
    """

    def __init__(self, endpoint: str | None = None, *, headers: Mapping[str, str] | None = None,
                 timeout_s: float = 5.0, environ: Mapping[str, str] = os.environ) -> None:
        self.endpoint = endpoint or traces_endpoint_from_env(environ)
        self.encoder = SpanWireEncoder()
        self._client = httpx.Client(timeout=timeout_s, headers={
            "Content-Type": "application/x-protobuf", **(headers if headers is not None
                                                          else traces_headers_from_env(environ))})

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            response = self._client.post(self.endpoint, content=self.encoder.export_request(spans))
        except httpx.HTTPError as exc:
            log.debug("span export to %s failed: %s", self.endpoint, exc)
            return SpanExportResult.FAILURE
        if response.status_code // 100 != 2:
            log.debug("span export to %s answered %s", self.endpoint, response.status_code)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._client.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
