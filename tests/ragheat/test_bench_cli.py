"""``ragheat bench`` as a command: ``--mode closed`` against a real served index (one step per client count, each
holding that many requests in flight: Little's law ties its throughput to its latency; no knee; the requests seen by
the server's own counter; results.json and report.html written), and the flags that describe another service's
request refused with one sentence naming the flag, before any load is sent (tests/loadgen/test_http_target.py loads
such a service)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from ragheat.cli import app
from ragheat.service import build_service
from stack.servers import BackgroundServer

RAGHEAT = Path(sys.executable).parent / "ragheat"
DURATION_S = 2.0


def served_requests(url: str) -> float:
    import httpx

    text = httpx.get(url + "/metrics", timeout=30).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "ragheat_requests_total" and s.labels.get("route") == "/v1/query")


@pytest.mark.slow
@pytest.mark.serial  # Little's law holds for a client that gets a CPU when its answer arrives: alone, not beside others
def test_bench_closed_loop_command(settings, pipeline, tmp_path):
    out = tmp_path / "bench"
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb"}
    with build_service(settings, pipeline, registry=CollectorRegistry(), environ={}) as service, \
            BackgroundServer(service.app) as url:
        before = served_requests(url)
        done = subprocess.run([str(RAGHEAT), "bench", "--url", url, "--mode", "closed", "--concurrency", "1,3",
                               "--duration", f"{DURATION_S:g}", "--warmup", "0.5", "--out", str(out)],
                              env=env, capture_output=True, text=True, timeout=300)
        served = served_requests(url) - before
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["mode"] == "closed" and results["knee_qps"] is None and not results["interrupted"]
    steps = results["steps"]
    assert [(s["mode"], s["concurrency"], s["offered_qps"]) for s in steps] == [("closed", 1, None), ("closed", 3, None)]
    for s in steps:
        assert s["requests"] > 0 and s["errors"] == 0, s
        assert s["achieved_qps"] == pytest.approx(s["requests"] / s["duration_s"], rel=0.01), s
        assert s["latency_ms"]["p50"] <= s["latency_ms"]["p99"], s["latency_ms"]
        # Little's law for clients with no think time: in flight = throughput x latency, so a loop that does not
        # keep `concurrency` requests in flight (or measures latency wrongly) lands far from it.
        e2e_ms = [sample[1] for sample in s["samples"]["requests"]] if "requests" in s["samples"] else None
        mean_s = (sum(e2e_ms) / len(e2e_ms) if e2e_ms else s["latency_ms"]["p50"]) / 1000
        assert 0.6 * s["concurrency"] <= s["achieved_qps"] * mean_s <= 1.2 * s["concurrency"], (s["concurrency"], s)
    # The server saw every measured request (and the unmeasured warm-up ones).
    assert served >= sum(s["requests"] for s in steps)
    assert (out / "report.html").is_file()
    assert "knee" not in done.stdout and f"wrote {out / 'results.json'}" in " ".join(done.stdout.split())


@pytest.mark.parametrize("flags, message", [
    (["--body", '{"question": '], "--body is not JSON: Expecting value: line 1 column 14"),
    (["--body", "@missing.json"], "--body @missing.json: cannot read the file (No such file or directory)"),
    (["--body", '{"question": ""}'], "--query-field 'query': the --body template has no such field (its fields: "
                                     "question)"),
    (["--body", '{"input": {"text": ""}}', "--query-field", "input.txt"], "--query-field 'input.txt'"),
    (["--expect-field", ".answer"], "--expect-field '.answer': give a dotted field path"),
    (["--header", "Authorization=Bearer x"], "--header 'Authorization=Bearer x': give 'Name: value'"),
    (["--method", "GET"], "--method 'GET': the query travels in a JSON body"),
    (["--path", "http://elsewhere/ask"], "--path 'http://elsewhere/ask': give the path on the --url server"),
])
def test_bench_refuses_a_bad_request_flag_naming_it(flags, message, tmp_path, monkeypatch):
    """Exit 2 and one line, as for the other bad flags; nothing listens on the --url: no request is sent."""
    monkeypatch.chdir(tmp_path)
    done = CliRunner(env={"COLUMNS": "400", "NO_COLOR": "1"}).invoke(
        app, ["bench", "--url", "http://127.0.0.1:9", *flags, "--out", str(tmp_path / "out")])
    assert done.exit_code == 2, done.output
    lines = done.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), done.output
    assert not (tmp_path / "out").exists()
