"""``ragheat bench`` against a live ``ragheat serve``: a step well within the service's capacity and one far past it,
scraped by the local Prometheus the bench starts; the step past the knee is explained against the one below it,
overload first, in results.json, report.html and the console."""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from explain.steps import knee_of
from stack.servers import ServeProcess

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # it compares the latency of two steps: others' load blurs it

RAGHEAT = Path(sys.executable).parent / "ragheat"
QUERIES = Path(__file__).resolve().parents[2] / "datasets" / "scifact" / "queries.jsonl"
QUIET_QPS, OVERLOAD_QPS = 4, 400  # far past any machine's full-quality capacity on the subset


def test_bench_explains_the_step_past_the_knee(subset_index, tmp_path):
    out = tmp_path / "bench"
    env = {**os.environ, "RAGHEAT_CACHE__ENABLED": "false"}  # every request does the whole work
    with ServeProcess(subset_index, env=env) as service:
        done = subprocess.run([str(RAGHEAT), "bench", "--url", service.url, "--rates", f"{QUIET_QPS},{OVERLOAD_QPS}",
                               "--duration", "8", "--warmup", "1", "--slo-ms", "1000", "--queries", str(QUERIES),
                               "--out", str(out)], env={**env, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb"},
                              capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((out / "results.json").read_text())
    quiet, overloaded = results["steps"]
    # The load controller (on by default) may keep the latency within the SLO at the overload by cheaper answers:
    # then the full-quality knee is the one the step past it is explained against.
    assert knee_of(results) == QUIET_QPS, [(s["offered_qps"], s["latency_ms"]["p99"], s["levels"])
                                           for s in results["steps"]]
    assert results["explained"]["reason"] is None and results["explained"]["baseline_qps"] == QUIET_QPS
    assert results["explained"]["source"].startswith("a local Prometheus scraping 127.0.0.1:")
    assert "explanation" not in quiet and "not_explained" not in quiet
    explanation = overloaded["explanation"]
    assert explanation["verdict"] == "slower" and explanation["causes"][0]["kind"] == "overload", \
        json.dumps(explanation, indent=1)
    assert f"a knee of {QUIET_QPS}" in explanation["headline"]
    # Both windows lie inside their steps: the step's measured seconds, and whole seconds of the quiet step.
    assert explanation["window_s"] == 8 and 7 <= explanation["baseline_s"] <= 8
    said = " ".join(done.stdout.split())
    assert f"step {OVERLOAD_QPS} req/s: {explanation['headline']}" in said and "causes: overload" in said
    assert html.escape(explanation["headline"]) in (out / "report.html").read_text()
