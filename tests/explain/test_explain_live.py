"""``ragheat explain`` on a live ``ragheat serve`` under constant load, scraped every second by a real Prometheus,
with faults injected one after another on one timeline: nothing (the explanation must say nothing is wrong), a
process spinning on each of the host's cores (a neighbour taking the CPU), then the offered load multiplied
(overload). Each explanation covers the fault's seconds against quiet seconds: those just before them, or for the
overload, which follows the neighbour, those before the neighbour (``--baseline-gap``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from loadgen.faults import CpuHog, OpenLoop, wait_until
from ragheat.cli import app
from stack.prometheus import LocalPrometheus
from stack.servers import ServeProcess

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # a neighbour's CPU is one of the causes it tells apart

QUERIES = Path(__file__).resolve().parents[2] / "datasets" / "scifact" / "queries.jsonl"
PHASE_S = 20
QUIET_QPS, OVERLOAD_QPS = 6.0, 400.0  # far past any machine's full-quality capacity on the subset


def explained(prometheus: str, at: float, *gap: str) -> dict:
    result = CliRunner().invoke(app, ["explain", "--prometheus", prometheus, "--window", f"{PHASE_S}s",
                                      "--baseline", f"{PHASE_S}s", "--at", f"{at:.3f}", "--json", *gap])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def settled_at_full_quality(url: str, seconds: float, timeout_s: float = 180.0) -> float:
    """The instant the service has answered at full quality, with no change of its level, for the ``seconds`` just
    before it. A start on a busy machine may step the level controller down for a while; quiet against quiet means
    the same rung on both sides."""
    deadline, since, last = time.time() + timeout_s, None, None
    while time.time() < deadline:
        samples = [s for f in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text)
                   for s in f.samples if s.name.startswith("ragheat_quality_level")]
        level = max((s.value for s in samples if s.name == "ragheat_quality_level"), default=None)
        changes = sum(s.value for s in samples if s.name == "ragheat_quality_level_changes_total")
        if level != 0 or changes != last:
            since, last = None, changes
        elif since is None:
            since = time.time()
        elif time.time() - since >= seconds:
            return time.time()
        time.sleep(1.0)
    pytest.fail(f"the service did not settle at full quality within {timeout_s:g} s: {samples}")


@pytest.fixture(scope="module")
def timeline(subset_index):
    """The service, its Prometheus and the three explanations: {"quiet": ..., "cpu_hog": ..., "overload": ...}."""
    env = {**os.environ, "RAGHEAT_CACHE__ENABLED": "false"}  # every request does the whole work, none is served again
    with ServeProcess(subset_index, env=env) as service, \
            LocalPrometheus(service.url.removeprefix("http://"), scrape_interval_s=1) as prometheus, \
            OpenLoop(service.url, QUIET_QPS, QUERIES) as load:
        explanations = {}
        # The seconds it settled over are the first quiet phase: the second is compared with them.
        start = settled_at_full_quality(service.url, PHASE_S)
        quiet_end = start + PHASE_S
        wait_until(quiet_end)
        explanations["quiet"] = explained(prometheus, quiet_end)
        with CpuHog():  # one spinning process per core
            wait_until(quiet_end + PHASE_S)
        explanations["cpu_hog"] = explained(prometheus, quiet_end + PHASE_S)
        # The overload at once, compared with the quiet phase before the neighbour (the baseline a gap earlier).
        load.rate = OVERLOAD_QPS
        wait_until(quiet_end + 2 * PHASE_S)
        load.rate = QUIET_QPS
        explanations["overload"] = explained(prometheus, quiet_end + 2 * PHASE_S, "--baseline-gap", f"{PHASE_S}s")
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
    assert overload["baseline_gap_s"] == PHASE_S and overload["baseline_s"] == PHASE_S
