"""The probes on the real RAG service: kernel time lands on the pipeline's stage labels (root, slow)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from rag.settings import ProbeSettings
from stack.servers import ServeProcess

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.serial]
QUERIES = ["0-dimensional biomaterials lack inductive properties.", "Vitamin D deficiency and bone density",
           "Antibiotic resistance in hospitals", "Obesity increases the risk of type 2 diabetes"]


def test_service_kernel_time_is_attributed_to_pipeline_stages(ebpf, subset_index):
    from probes.loader import KernelProbes

    with ServeProcess(subset_index) as service:
        url = service.url
        with KernelProbes.attach(service.pid, ProbeSettings(syscalls=True), tcp_ports=[service.port]) as probes:
            with httpx.Client(timeout=30) as client, ThreadPoolExecutor(4) as pool:
                def ask(i: int) -> int:
                    return client.post(url + "/v1/query", json={"query": QUERIES[i % len(QUERIES)]}).status_code
                assert set(pool.map(ask, range(40))) == {200}
            snap = probes.snapshot()
    # the event loop answers every request (rh:http); the embed stage runs in worker threads named rh:embed
    for stage in ("http", "embed"):
        seen = sum(h.count for (s, _), h in snap.offcpu.items() if s == stage)
        assert seen > 0, f"no off-CPU time on stage {stage}: {sorted(snap.offcpu)}"
    assert any(s == "http" and f in ("network", "poll") for s, f in snap.syscall), sorted(snap.syscall)
    assert sum(h.count for (s, _), h in snap.syscall.items() if s == "embed") > 0


def test_serve_with_probes_exports_kernel_metrics_on_its_own_metrics(ebpf, subset_index):
    from prometheus_client.parser import text_string_to_metric_families

    from telemetry.metrics import KERNEL_METRICS

    with ServeProcess(subset_index, ("--probes",)) as service, \
            httpx.Client(base_url=service.url, timeout=30) as client, ThreadPoolExecutor(4) as pool:
        # Concurrent queries: a lone query's embed thread may run its few ms without ever leaving the CPU.
        def ask(i: int) -> int:
            return client.post("/v1/query", json={"query": QUERIES[i % len(QUERIES)]}).status_code
        assert set(pool.map(ask, range(40))) == {200}
        text = client.get("/metrics").text
    counts = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == KERNEL_METRICS["offcpu"] + "_count":
                counts[sample.labels["stage"]] = counts.get(sample.labels["stage"], 0) + sample.value
    assert counts.get("http", 0) > 0 and counts.get("embed", 0) > 0, counts
    assert KERNEL_METRICS["runqueue"] + "_bucket" in text


def _offcpu_counts(text: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    from telemetry.metrics import KERNEL_METRICS

    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == KERNEL_METRICS["offcpu"] + "_count":
                counts[sample.labels["stage"]] = counts.get(sample.labels["stage"], 0) + sample.value
    return counts


def _probed_pids(log: str) -> set[int] | None:
    """The pids the exporter probes now, from the last of its lines that name them: ``serving kernel probes for pid
    A, B`` when it starts, then ``now probing pid A, B`` each time it follows the workers. Which lines there are
    depends on timing: it may start while one worker listens, then follow the second. None before it serves."""
    probed = None
    for line in log.splitlines():
        for prefix in ("serving kernel probes for pid ", "now probing pid "):
            if line.startswith(prefix):
                probed = {int(p) for p in line.removeprefix(prefix).split(" (")[0].split(", ")}
    return probed


def test_serve_workers_with_probes_counts_every_worker_and_follows_a_restart(ebpf, subset_index, tmp_path):
    """``serve --workers 2 --probes``: one exporter on probes.port probes both workers (found at the service's
    port), and a worker that dies is replaced in the probes by its successor."""
    import os
    import signal
    import sys
    import time
    from pathlib import Path

    from rag.childproc import ChildProcess, free_port

    port, probes_port = free_port(), free_port()
    url, probes_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{probes_port}/metrics"
    ragheat = str(Path(sys.executable).parent / "ragheat")
    env = {**os.environ, "RAGHEAT_PROBES__PORT": str(probes_port), "RAGHEAT_SERVER__WORKER_MIN_UPTIME_S": "1"}
    log = tmp_path / "serve.log"
    with ChildProcess("serve-workers", [ragheat, "serve", "--index", str(subset_index), "--host", "127.0.0.1",
                                        "--port", str(port), "--workers", "2", "--probes", "--log-level", "warning"],
                      log_path=log, die_with_parent=True, env=env) as parent:
        parent.wait_until_ok(f"{url}/readyz", 300)

        def serving_workers() -> set[int]:
            children = Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()
            return {int(p) for p in children if Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[2:3] == [b"serve"]}

        # Read again each turn: the probes sidecar starts once the service answers, and between its fork and its exec
        # it is a child with the parent's command line.
        workers = serving_workers()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and _probed_pids(log.read_text()) != workers:  # compiled, both probed
            time.sleep(0.5)
            workers = serving_workers()
        text = log.read_text()
        assert "serving kernel probes for pid " in text and _probed_pids(text) == workers, (workers, text[-3000:])

        def ask(i: int) -> int:  # a new connection each time: the kernel spreads connections over the workers
            with httpx.Client(timeout=30) as client:
                return client.post(url + "/v1/query", json={"query": QUERIES[i % len(QUERIES)]}).status_code

        with ThreadPoolExecutor(4) as pool:  # concurrent, so that the stages' threads leave the CPU
            assert set(pool.map(ask, range(40))) == {200}
        counts = _offcpu_counts(httpx.get(probes_url, timeout=10).text)
        assert counts.get("http", 0) > 0 and counts.get("embed", 0) > 0, counts

        victim = min(workers)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 300
        successor = set()
        while time.monotonic() < deadline and not successor:  # the successor bound the port and is probed
            time.sleep(0.5)
            pids = _probed_pids(log.read_text()) or set()
            successor = pids - workers if len(pids) == 2 else set()
        text = log.read_text()
        assert "restarting it" in text and successor, text[-3000:]
        assert successor <= serving_workers() and victim not in serving_workers()
        before = _offcpu_counts(httpx.get(probes_url, timeout=10).text)
        with ThreadPoolExecutor(4) as pool:
            assert set(pool.map(ask, range(40))) == {200}
        after = _offcpu_counts(httpx.get(probes_url, timeout=10).text)
        assert after["http"] > before["http"] and sum(after.values()) > sum(before.values()), (before, after)
