"""``ragheat explain`` on a live ``ragheat serve`` under constant load, scraped every second by a real Prometheus,
with faults injected one after another on one timeline: nothing (the explanation must say nothing is wrong), two
processes spinning on the host's cores (a neighbour taking the CPU), then the offered load multiplied (overload).
Each explanation covers the fault's seconds against the quiet seconds just before them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from ragheat.cli import app
from stack.prometheus import LocalPrometheus
from stack.servers import ServeProcess

pytestmark = pytest.mark.slow

QUERIES = Path(__file__).resolve().parents[2] / "datasets" / "scifact" / "queries.jsonl"
PHASE_S = 20
QUIET_QPS, OVERLOAD_QPS = 6.0, 120.0


class OpenLoop:
    """Requests sent at a fixed rate whatever the answers' speed (an open loop: a slow service queues them)."""

    def __init__(self, url: str, rate: float) -> None:
        self.url, self.rate = url, rate
        self.texts = [json.loads(line)["text"] for line in QUERIES.read_text().splitlines()]
        self.stop = threading.Event()
        self.sent = 0
        self.pool = ThreadPoolExecutor(96)
        self.client = httpx.Client(timeout=30, limits=httpx.Limits(max_connections=96))
        self.thread = threading.Thread(target=self._run, name="open-loop", daemon=True)

    def _ask(self, text: str) -> None:
        try:
            self.client.post(self.url + "/v1/query", json={"query": text})
        except httpx.HTTPError:
            pass  # a refused or timed-out request is the service's signal, counted on its side

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self.stop.is_set():
            self.pool.submit(self._ask, self.texts[self.sent % len(self.texts)])
            self.sent += 1
            next_at += 1.0 / self.rate
            time.sleep(max(0.0, next_at - time.monotonic()))

    def __enter__(self) -> "OpenLoop":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self.pool.shutdown(wait=True)
        self.client.close()


def explained(prometheus: str, at: float) -> dict:
    result = CliRunner().invoke(app, ["explain", "--prometheus", prometheus, "--window", f"{PHASE_S}s",
                                      "--baseline", f"{PHASE_S}s", "--at", f"{at:.3f}", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def wait_until(t: float) -> None:
    time.sleep(max(0.0, t - time.time()))


@pytest.fixture(scope="module")
def timeline(subset_index):
    """The service, its Prometheus and the three explanations: {"quiet": ..., "cpu_hog": ..., "overload": ...}."""
    env = {**os.environ, "RAGHEAT_CACHE__ENABLED": "false"}  # every request does the whole work, none is served again
    with ServeProcess(subset_index, env=env) as service, \
            LocalPrometheus(service.url.removeprefix("http://"), scrape_interval_s=1) as prometheus, \
            OpenLoop(service.url, QUIET_QPS) as load:
        explanations = {}
        start = time.time()
        quiet_end = start + 3 * PHASE_S  # the first seconds warm up; the last two phases are compared
        wait_until(quiet_end)
        explanations["quiet"] = explained(prometheus, quiet_end)
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
        try:
            wait_until(quiet_end + PHASE_S)
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
        explanations["cpu_hog"] = explained(prometheus, quiet_end + PHASE_S)
        calm_end = quiet_end + 2 * PHASE_S
        wait_until(calm_end)
        load.rate = OVERLOAD_QPS
        wait_until(calm_end + PHASE_S)
        load.rate = QUIET_QPS
        explanations["overload"] = explained(prometheus, calm_end + PHASE_S)
        yield explanations


def test_no_fault_says_nothing_is_wrong(timeline):
    quiet = timeline["quiet"]
    assert quiet["verdict"] == "ok" and not quiet["causes"], quiet["headline"]


def test_a_cpu_hog_on_the_host_is_named_first(timeline):
    hog = timeline["cpu_hog"]
    assert hog["verdict"] == "slower" and hog["causes"][0]["kind"] == "cpu_neighbour", json.dumps(hog, indent=1)


def test_overload_is_named_first(timeline):
    overload = timeline["overload"]
    assert overload["verdict"] == "slower" and overload["causes"][0]["kind"] == "overload", \
        json.dumps(overload, indent=1)
