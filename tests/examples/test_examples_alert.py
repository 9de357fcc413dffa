"""The page, for a framework service ragheat did not write: ``ragheat stack up --watch-url`` around the Haystack
example (form i) whose BM25 retriever is made slow from outside. Under load the fast-burn latency page must fire
for the watched job, reach the receiver through Alertmanager's page route and name the retriever's stage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from examples_live import Service, free_port  # tests/examples/examples_live.py, beside this file
from tests.stack.conftest import RAGHEAT
from tests.stack.test_stack_alerts import PAGE_WITHIN_S, fast_burn_page

pytestmark = pytest.mark.slow

LAUNCHER = Path(__file__).with_name("slow_bm25_haystack.py")
JOB = "haystack-rag"
FREE_PORTS = ["--prometheus-port", "0", "--alertmanager-port", "0", "--alert-receiver-port", "0",
              "--probes-port", "0"]


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    folder = tmp_path_factory.mktemp("watch-alerts")
    port = free_port()
    service = Service("haystack with a slow BM25", [sys.executable, str(LAUNCHER), str(port)], port,
                      folder / "app.log", {"SLOW_BM25_DELAY_S": "1.0"}).start()
    try:
        service.wait_ready()
        up = subprocess.run([RAGHEAT, "stack", "up", "--folder", str(folder / "stack"), *FREE_PORTS,
                             "--watch-url", service.url + "/metrics", "--watch-job", JOB, "--rules-profile", "test",
                             "--probes", "off"], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "COLUMNS": "200"})
        assert up.returncode == 0, f"ragheat stack up failed:\n{up.stderr[-3000:]}"
        state = json.loads((folder / "stack" / "state.json").read_text())
        yield service, {p["name"]: p["url"] for p in state["processes"]}
    finally:
        subprocess.run([RAGHEAT, "stack", "down", "--folder", str(folder / "stack")], capture_output=True,
                       timeout=120)
        service.stop()


def firing_with_stage(prometheus: str) -> dict | None:
    alerts = httpx.get(prometheus + "/api/v1/alerts", timeout=10).json()["data"]["alerts"]
    return next((a for a in alerts if a["labels"].get("alertname") == "RagheatLatencyBudgetBurn"
                 and a["state"] == "firing" and a["annotations"].get("stage") not in (None, "unknown")), None)


def test_a_slow_retriever_in_a_watched_haystack_service_pages_naming_its_job_and_stage(watched):
    service, stack = watched
    started, page, named, stop = time.monotonic(), None, None, False

    def client(i: int) -> list[int]:
        statuses = []
        with httpx.Client(base_url=service.url, timeout=30) as http:
            while not stop:
                statuses.append(http.post("/query", json={"question": f"vitamin D and bone density {i}"})
                                .status_code)
        return statuses

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(client, i) for i in range(4)]
        try:
            while page is None and time.monotonic() - started < PAGE_WITHIN_S:
                time.sleep(1.0)
                page = fast_burn_page(stack["alert-receiver"])
            # The annotation is a query at each evaluation over the short window: while the retriever's series is
            # younger than two scrapes (it appears with its first request), an older series (the start-up index's
            # embed) can top it; the firing alert must name the slow retriever once the window holds it.
            deadline = time.monotonic() + 60
            while page is not None and time.monotonic() < deadline:
                named = firing_with_stage(stack["prometheus"]) or named
                if named is not None and named["annotations"]["stage"] == "retrieve_bm25":
                    break
                time.sleep(1.0)
        finally:
            stop = True
        statuses = [s for f in futures for s in f.result()]
    assert page is not None, f"no fast-burn page within {PAGE_WITHIN_S} s ({len(statuses)} requests)"
    note, alert = page
    assert statuses and set(statuses) == {200}, sorted(set(statuses))
    assert note["route"] == "page" and alert["labels"]["job"] == JOB, (note, alert)
    assert named is not None and named["labels"]["job"] == JOB, named
    assert named["annotations"]["stage"] == "retrieve_bm25", named
