"""Remote write from the stack's Prometheus to a long-term store: the receiver to ship to, the ``remote_write``
section added to the Prometheus config, and VictoriaMetrics (Debian's package ``victoria-metrics``) as the receiver
``ragheat stack up --remote-write`` starts on loopback.

What the receiver keeps is its own business: VictoriaMetrics stores every float sample (counters, gauges, classic
histogram buckets) and drops native histograms and exemplars; Prometheus still sends both, so a receiver that
keeps them (Mimir, Thanos Receive, another Prometheus) gets them from the same section (docs/stack.md, "Remote
write").
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from rag.errors import ConfigurationError

VICTORIAMETRICS_BINARY = "victoria-metrics"
"""The binary Debian's ``victoria-metrics`` package installs (upstream names it ``victoria-metrics-prod``)."""
WRITE_PATH = "/api/v1/write"
"""VictoriaMetrics' Prometheus remote-write endpoint."""
LOCAL = "local"
"""``StackOptions.remote_write`` for a VictoriaMetrics started by the stack; otherwise a receiver's URL."""
FLUSH_DEADLINE = "10s"
"""How long Prometheus keeps sending its queue once asked to stop: under ``stack down``'s 20 s before SIGKILL, so a
receiver that is down cannot turn every stop into a kill."""


def check_url(url: str) -> str:
    """``url`` if it can be a remote-write endpoint (http or https, a host, a valid port, no spaces);
    ``ConfigurationError`` saying what is wrong with it otherwise."""
    problem = ""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a port that is not a number from 0 to 65535
    except ValueError as exc:
        parts, port, problem = None, None, str(exc)
    if parts is not None:
        if any(c.isspace() for c in url):
            problem = "it contains white space"
        elif parts.scheme not in ("http", "https"):
            problem = f"its scheme is {parts.scheme or 'missing'}, not http or https"
        elif not parts.hostname:
            problem = "it names no host"
        elif port == 0:
            problem = "its port is 0"
    if problem:
        raise ConfigurationError(f"--remote-write-url {url!r} is not a remote-write URL: {problem} (e.g. "
                                 f"http://127.0.0.1:8428{WRITE_PATH} for VictoriaMetrics, "
                                 f"https://mimir.example/api/v1/push for Mimir)")
    return url


def remote_write_section(url: str) -> dict:
    """One ``remote_write`` entry shipping every series to ``url``, with exemplars and native histograms (Prometheus
    sends them to receivers that keep them; VictoriaMetrics drops them). Its queue is Prometheus' default: a batch
    waits at most 5 s, and a receiver that is down is retried at least every 5 s."""
    return {"url": url, "send_exemplars": True, "send_native_histograms": True}


def with_remote_write(config: dict, url: str) -> dict:
    """A Prometheus config (compose's or the stack's) that also ships to ``url``; the rest is unchanged."""
    return {**config, "remote_write": [*config.get("remote_write", []), remote_write_section(url)]}


def local_write_url(address: str) -> str:
    """The remote-write URL of a VictoriaMetrics listening at ``address`` (host:port)."""
    return f"http://{address}{WRITE_PATH}"


def victoriametrics_binary() -> str:
    """The VictoriaMetrics binary's path; ``ConfigurationError`` naming the package when it is missing."""
    binary = shutil.which(VICTORIAMETRICS_BINARY)
    if binary is None:
        raise ConfigurationError("--remote-write starts VictoriaMetrics, and the victoria-metrics binary was not "
                                 "found: install Debian's package 'victoria-metrics' (scripts/install.sh --test "
                                 "does), or ship to a receiver already running with --remote-write-url URL")
    return binary


@dataclass(frozen=True)
class VictoriaMetrics:
    """The receiver the stack starts: its binary, its data folder (under the stack's folder) and its loopback
    address. ``write_url`` goes into Prometheus' config, ``health_url`` is waited on, ``url`` answers PromQL."""

    binary: str
    data: Path
    address: str

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    @property
    def write_url(self) -> str:
        return local_write_url(self.address)

    @property
    def health_url(self) -> str:
        return self.url + "/health"

    def argv(self) -> list[str]:
        # Its own /metrics is served on the same address; nothing listens beyond loopback.
        return [self.binary, f"-storageDataPath={self.data}", f"-httpListenAddr={self.address}",
                "-loggerLevel=WARN"]
