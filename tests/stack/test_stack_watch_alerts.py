"""The page, for a service ragheat did not write: ``ragheat stack up --watch-url`` around a plain FastAPI app
observed with the library, whose keyword retriever sleeps a full second. Under load the fast-burn latency page must
fire for the watched job, reach the receiver through Alertmanager's page route and name the retriever's stage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rag.childproc import ChildProcess, free_port
from tests.stack.conftest import RAGHEAT
from tests.stack.test_stack_alerts import PAGE_WITHIN_S, fast_burn_page

pytestmark = pytest.mark.slow

APP = Path(__file__).with_name("slow_retriever_app.py")
JOB = "slow-rag"
FREE_PORTS = ["--prometheus-port", "0", "--alertmanager-port", "0", "--alert-receiver-port", "0",
              "--probes-port", "0"]


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    folder = tmp_path_factory.mktemp("watch-alerts")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with ChildProcess("slow-retriever app", [sys.executable, str(APP), str(port)], log_path=folder / "app.log",
                      env={**os.environ, "SLOW_RETRIEVER_DELAY_S": "1.0"}, die_with_parent=True) as app:
        app.wait_until_ok(url + "/metrics", 60)
        up = subprocess.run([RAGHEAT, "stack", "up", "--folder", str(folder / "stack"), *FREE_PORTS,
                             "--watch-url", url + "/metrics", "--watch-job", JOB, "--rules-profile", "test",
                             "--probes", "off"], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "COLUMNS": "200"})
        try:
            assert up.returncode == 0, f"ragheat stack up failed:\n{up.stderr[-3000:]}"
            state = json.loads((folder / "stack" / "state.json").read_text())
            yield url, {p["name"]: p["url"] for p in state["processes"]}
        finally:
            subprocess.run([RAGHEAT, "stack", "down", "--folder", str(folder / "stack")], capture_output=True,
                           timeout=120)


def test_a_slow_retriever_in_a_watched_service_pages_naming_its_job_and_stage(watched):
    from concurrent.futures import ThreadPoolExecutor

    url, stack = watched
    receiver = stack["alert-receiver"]
    started, page, stop = time.monotonic(), None, False

    def client(i: int) -> list[int]:
        statuses = []
        with httpx.Client(base_url=url, timeout=30) as http:
            while not stop:
                statuses.append(http.post("/query", json={"question": f"claim {i}"}).status_code)
        return statuses

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(client, i) for i in range(4)]
        try:
            while page is None and time.monotonic() - started < PAGE_WITHIN_S:
                time.sleep(1.0)
                page = fast_burn_page(receiver)
            named = None
            deadline = time.monotonic() + 60
            while page is not None and named is None and time.monotonic() < deadline:
                named = next((a for a in httpx.get(stack["prometheus"] + "/api/v1/alerts", timeout=10).json()
                              ["data"]["alerts"] if a["labels"].get("alertname") == "RagheatLatencyBudgetBurn"
                              and a["state"] == "firing" and a["annotations"].get("stage") not in (None, "unknown")),
                             None)
                time.sleep(1.0)
        finally:
            stop = True
        statuses = [s for f in futures for s in f.result()]
    assert page is not None, f"no fast-burn page within {PAGE_WITHIN_S} s ({len(statuses)} requests)"
    note, alert = page
    assert set(statuses) == {200}
    assert note["route"] == "page" and alert["labels"]["job"] == JOB, (note, alert)
    assert named is not None and named["labels"]["job"] == JOB, named
    assert named["annotations"]["stage"] == "retrieve_bm25", named
