"""Kernel probes inside the service process, registered on its own ``/metrics`` registry.

    handle = probes.inprocess.start(settings, telemetry.registry)   # never raises
    ...
    handle.close()

The service must never fail because probes are unavailable: without privileges, BCC or headers this logs
one warning naming what is missing and returns a handle whose ``close()`` does nothing.
"""

from __future__ import annotations

import logging
import os
from typing import Sequence

from prometheus_client import CollectorRegistry

from rag.settings import RagheatSettings

log = logging.getLogger(__name__)


class ProbeHandle:
    """Attached probes and their collector (``active``), or nothing; ``close()`` detaches and unregisters."""

    def __init__(self, probes=None, collector=None, registry: CollectorRegistry | None = None,
                 reason: str = "") -> None:
        self._probes, self._collector, self._registry = probes, collector, registry
        self.reason = reason

    @property
    def active(self) -> bool:
        return self._probes is not None

    def close(self) -> None:
        if self._collector is not None and self._registry is not None:
            self._registry.unregister(self._collector)
            self._collector = None
        if self._probes is not None:
            self._probes.close()
            self._probes = None

    def __enter__(self) -> "ProbeHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def start(settings: RagheatSettings, registry: CollectorRegistry, pid: int | None = None,
          tcp_ports: Sequence[int] | None = None) -> ProbeHandle:
    """Attach the probes ``settings.probes`` enables to this process (or ``pid``) and register their collector
    on ``registry``. ``tcp_ports`` defaults to ``settings.server.port`` (the service binds after this runs)."""
    from probes.collector import KernelCollector
    from probes.environment import ProbesUnavailable
    from probes.loader import KernelProbes

    if tcp_ports is None:
        tcp_ports = (settings.server.port,) if settings.server.port else ()
    try:
        probes = KernelProbes.attach(pid or os.getpid(), settings.probes, tcp_ports=tuple(tcp_ports))
    except ProbesUnavailable as exc:
        log.warning("kernel probes are off: %s", exc)
        return ProbeHandle(reason=str(exc))
    except Exception as exc:  # noqa: BLE001 - instrumentation never takes the service down
        log.warning("kernel probes are off: attaching them failed: %s", exc, exc_info=True)
        return ProbeHandle(reason=str(exc))
    options = probes.options
    collector = KernelCollector(probes.snapshot, scheduler=options.scheduler, syscalls=options.syscalls,
                                tcp_retransmits=options.tcp_retransmits)
    try:
        registry.register(collector)
    except ValueError as exc:  # the registry already has these names (probes started twice)
        probes.close()
        log.warning("kernel probes are off: %s", exc)
        return ProbeHandle(reason=str(exc))
    return ProbeHandle(probes, collector, registry)
