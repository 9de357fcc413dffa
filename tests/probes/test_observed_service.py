"""The probes on a service ragheat did not write: its kernel time lands on the stages its library scopes name, and
the asyncio loop's own time is labelled event_loop, never charged to a stage that merely entered last (root)."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from rag.childproc import ChildProcess, free_port
from rag.settings import ProbeSettings

pytestmark = [pytest.mark.root, pytest.mark.serial]
APP = Path(__file__).with_name("observed_app.py")


def test_kernel_time_of_an_observed_service_is_attributed_to_its_stages(ebpf, tmp_path):
    from probes.loader import KernelProbes

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with ChildProcess("observed app", [sys.executable, str(APP), str(port)], log_path=tmp_path / "app.log",
                      die_with_parent=True) as app:
        app.wait_until_ok(url + "/metrics", 60)
        with KernelProbes.attach(app.pid, ProbeSettings(syscalls=True)) as probes:
            with httpx.Client(timeout=30) as client, ThreadPoolExecutor(4) as pool:
                def ask(i: int) -> int:
                    route = "/search" if i % 2 else "/answer"
                    return client.post(url + route, json={"question": f"q{i}"}).status_code
                assert set(pool.map(ask, range(40))) == {200}
            snap = probes.snapshot()
        metrics = httpx.get(url + "/metrics").text

    def syscalls(stage: str, family: str | None = None) -> int:
        return sum(h.count for (s, f), h in snap.syscall.items() if s == stage and family in (None, f))

    def offcpu(stage: str) -> int:
        return sum(h.count for (s, _), h in snap.offcpu.items() if s == stage)

    # The sync stage's fsyncs on its worker thread; the decorated coroutine's blocking sleeps inside its steps.
    assert syscalls("retrieve_bm25", "file") > 0 or syscalls("retrieve_bm25", "write") > 0, sorted(snap.syscall)
    assert offcpu("retrieve_bm25") > 0 and offcpu("generate") > 0, sorted(snap.offcpu)
    # The loop's network and polling are event_loop's; the block entered on the loop (rerank) is charged nothing.
    assert syscalls("event_loop") > 0 and offcpu("event_loop") > 0
    assert syscalls("rerank") == 0 and offcpu("rerank") == 0
    # The same request's histograms are on the service's own /metrics.
    assert 'stage="retrieve_bm25"' in metrics and 'stage="rerank"' in metrics and 'route="/answer"' in metrics
