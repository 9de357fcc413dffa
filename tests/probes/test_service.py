"""The probes on the real RAG service: kernel time lands on the pipeline's stage labels (root, slow)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from rag.settings import ProbeSettings
from stack.servers import ServeProcess

pytestmark = [pytest.mark.root, pytest.mark.slow]
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
            httpx.Client(base_url=service.url, timeout=30) as client:
        for i in range(20):
            assert client.post("/v1/query", json={"query": QUERIES[i % len(QUERIES)]}).status_code == 200
        text = client.get("/metrics").text
    counts = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == KERNEL_METRICS["offcpu"] + "_count":
                counts[sample.labels["stage"]] = counts.get(sample.labels["stage"], 0) + sample.value
    assert counts.get("http", 0) > 0 and counts.get("embed", 0) > 0, counts
    assert KERNEL_METRICS["runqueue"] + "_bucket" in text
