"""A real Prometheus started beside the service: ``ragheat serve --prometheus`` and the integration tests.

It uses the ``prometheus`` binary (Debian's package ``prometheus``), a generated config that scrapes the
service, a throw-away TSDB folder, and exemplar storage enabled so trace ids on histogram buckets are kept.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from rag.errors import ConfigurationError
from rag.childproc import ChildProcess, free_port


def scrape_config(target: str, scrape_interval_s: float = 5.0, job: str = "ragheat",
                  extra_targets: dict[str, str] | None = None) -> str:
    """The generated prometheus.yml: one job scraping ``target`` (host:port), OpenMetrics preferred, plus a
    job per ``extra_targets`` entry (job name -> host:port), e.g. a vLLM server next to the service."""
    interval = f"{scrape_interval_s:g}s"
    jobs = {job: target, **(extra_targets or {})}
    return (
        "global:\n"
        f"  scrape_interval: {interval}\n"
        f"  evaluation_interval: {interval}\n"
        "scrape_configs:\n"
        + "".join(
            f"  - job_name: {name}\n"
            "    metrics_path: /metrics\n"
            "    scrape_protocols: [OpenMetricsText1.0.0, PrometheusText0.0.4]\n"
            f"    static_configs:\n      - targets: ['{host_port}']\n"
            for name, host_port in jobs.items())
    )


class LocalPrometheus:
    """``with LocalPrometheus("127.0.0.1:8000") as url:`` runs Prometheus on a free loopback port."""

    def __init__(self, target: str, scrape_interval_s: float = 5.0, port: int = 0, binary: str = "prometheus",
                 extra_config: str = "", extra_targets: dict[str, str] | None = None) -> None:
        self.binary = shutil.which(binary)
        if self.binary is None:
            raise ConfigurationError("the prometheus binary was not found: install Debian's package 'prometheus' "
                                     "(scripts/install.sh --test does)")
        self.target, self.scrape_interval_s = target, scrape_interval_s
        self.port = port or free_port()
        self.extra_config, self.extra_targets = extra_config, extra_targets
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> str:
        self.folder = Path(tempfile.mkdtemp(prefix="ragheat-prometheus-"))
        config = self.folder / "prometheus.yml"
        text = scrape_config(self.target, self.scrape_interval_s, extra_targets=self.extra_targets)
        # Prometheus 2.42 does not know scrape_protocols (2.49+); it always asks for OpenMetrics first.
        if not self._supports_scrape_protocols():
            text = "\n".join(line for line in text.splitlines() if "scrape_protocols" not in line) + "\n"
        config.write_text(text + self.extra_config)
        # Same process group (no session of its own) but stopped by Linux if this process dies first:
        # no Prometheus outlives the server it scrapes.
        self.child = ChildProcess(
            "prometheus", [self.binary, f"--config.file={config}", f"--storage.tsdb.path={self.folder / 'data'}",
                           f"--web.listen-address=127.0.0.1:{self.port}", "--enable-feature=exemplar-storage",
                           "--enable-feature=native-histograms", "--web.enable-lifecycle"],
            log_path=self.folder / "prometheus.log", own_session=False, die_with_parent=True).start()
        try:
            self.child.wait_until_ok(self.url + "/-/ready", 30.0)
            self._wait_first_scrape()
        except BaseException:
            self.__exit__()
            raise
        return self.url

    def _supports_scrape_protocols(self) -> bool:
        version = subprocess.run([self.binary, "--version"], capture_output=True, text=True).stdout.split()
        try:
            major, minor = (int(x) for x in version[2].split("+")[0].split(".")[:2])
        except (IndexError, ValueError):
            return False
        return (major, minor) >= (2, 49)

    def _wait_first_scrape(self, timeout_s: float = 30.0) -> None:
        """Prometheus hands new targets to its scrapers only every 5 s; until the first scrape an ``up``
        series does not exist and every query is empty, so wait for it (up or down, it says which)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.query('up{job="ragheat"}'):
                return
            time.sleep(0.2)
        raise TimeoutError(f"prometheus at {self.url} did not scrape {self.target} within {timeout_s} s")

    def query(self, promql: str) -> list[dict]:
        """An instant PromQL query; the result vector (a list of series)."""
        body = httpx.get(self.url + "/api/v1/query", params={"query": promql}, timeout=10).json()
        if body.get("status") != "success":
            raise RuntimeError(f"{promql}: {body.get('error')}")
        return body["data"]["result"]

    def __exit__(self, *exc) -> None:
        self.child.stop()
        shutil.rmtree(self.folder, ignore_errors=True)
