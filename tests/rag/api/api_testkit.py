"""Helpers for the hardening tests: the service as ``ragheat serve`` runs it (``ragheat.service.build_service`` under
uvicorn with ``Service.uvicorn_config``: the guarded connection protocol), on loopback, in a thread of this process."""

from __future__ import annotations

import logging
import socket
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import uvicorn
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from rag.childproc import wait_until_ok
from rag.settings import RagheatSettings
from ragheat.service import Service, build_service

KEYS = {name: f"rh_test-{name}-" + "k" * 24 for name in ("main", "alt", "limited", "spans", "admin", "contract")}
"""API keys for the tests, one per test that spends tokens of its bucket (the rate limit is per key)."""


def with_sections(settings: RagheatSettings, **sections) -> RagheatSettings:
    """``settings`` with each named section updated, validated again (``server={"api_keys": [...]}``)."""
    data = settings.model_dump()
    for name, update in sections.items():
        data[name] = {**data[name], **update}
    return RagheatSettings.model_validate(data)


@dataclass
class Live:
    url: str
    service: Service
    port: int


@contextmanager
def serve_live(settings: RagheatSettings, pipeline=None, **build_options):
    """A real uvicorn on a free loopback port serving ``build_service(settings, pipeline)``; yields ``Live``."""
    build_options.setdefault("registry", CollectorRegistry())
    service = build_service(settings, pipeline, **build_options)
    del pipeline  # the switch holds it now: a hot swap test checks that nothing else keeps a retired one alive
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(service.uvicorn_config(log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="harden-uvicorn", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ok(url + "/readyz", 120, thread.is_alive, "the server")
        yield Live(url, service, port)
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        service.close()
        sock.close()


def metric_values(text: str, name: str, label: str) -> dict[str, float]:
    """``{label value: sample value}`` of the samples called ``name`` in a Prometheus text scrape."""
    return {s.labels[label]: s.value for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == name}


class LogCapture(logging.Handler):
    """Every record any logger emits (any thread) while installed on the root logger, formatted with its args and
    exception text, so a secret anywhere in a log line is found."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))

    @contextmanager
    def installed(self):
        root = logging.getLogger()
        level = root.level
        root.addHandler(self)
        root.setLevel(logging.DEBUG)
        try:
            yield self
        finally:
            root.removeHandler(self)
            root.setLevel(level)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def span_text(exporter) -> str:
    """Every span's name, attributes, events and status, as one string to search for secrets and content."""
    parts = []
    for span in exporter.get_finished_spans():
        parts.append(span.name)
        parts.extend(f"{k}={v}" for k, v in (span.attributes or {}).items())
        for event in span.events:
            parts.append(event.name)
            parts.extend(f"{k}={v}" for k, v in (event.attributes or {}).items())
        parts.append(str(span.status.description))
        parts.extend(f"{k}={v}" for k, v in (span.resource.attributes or {}).items())
    return "\n".join(parts)
