"""Shed queries (503 from admission control) are reported apart from errors and from admitted latency, goodput counts
answers within the SLO, and the report and the table show both."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from loadgen.report import render_report
from loadgen.runner import Outcome, _summarise, open_loop
from loadgen.stats import find_knee
from loadgen.sweep import results_table


def _outcome(start: float, latency_s: float, ok: bool = True, shed: str | None = None) -> Outcome:
    return Outcome(start, start, start + latency_s, ok, [{"name": "queue", "ms": 1.0}] if ok else None, shed)


def test_shed_is_neither_an_error_nor_a_latency_sample_and_goodput_counts_answers_within_the_slo():
    outcomes = ([_outcome(i * 0.01, 0.1) for i in range(6)] + [_outcome(0.5, 0.6)]  # 6 in time, 1 late
                + [_outcome(0.6, 0.002, False, "deadline")] * 2 + [_outcome(0.7, 0.001, False, "queue_full")]
                + [_outcome(0.8, 10.0, False)])  # one real failure (a timeout)
    step = _summarise("open", outcomes, 2.0, 5.0, None, False, slo_ms=420.0)
    assert step.requests == 11 and step.errors == 1 and step.shed == 3
    assert step.shed_reasons == {"deadline": 2, "queue_full": 1}
    assert step.achieved_qps == 7 / 2.0 and step.goodput_qps == 6 / 2.0
    assert step.latency_ms["p99"] < 610, "only answered queries are latency samples"
    assert 0.9 <= step.refusal_ms["p50"] <= 2.1
    assert step.to_json()["shed_rate"] == 3 / 11


def test_a_step_that_sheds_more_than_the_allowance_is_past_the_knee():
    fine = _summarise("open", [_outcome(i * 0.01, 0.05) for i in range(100)], 1.0, 100.0, None, False)
    shedding = _summarise("open", [_outcome(i * 0.01, 0.05) for i in range(90)]
                          + [_outcome(0.95, 0.001, False, "deadline")] * 10, 1.0, 200.0, None, False)
    assert shedding.latency_ms["p99"] < 420 and shedding.errors == 0
    assert find_knee([fine, shedding], 420.0) == 100.0


def test_the_runner_reads_the_shed_reason_from_the_503_body():
    async def scenario():
        calls = {"n": 0}

        async def handler(request):
            calls["n"] += 1
            if calls["n"] % 3 == 0:
                return web.json_response({"error": "queue_full", "reason": "overloaded"}, status=503,
                                         headers={"Retry-After": "1", "Server-Timing": "queue;dur=0.250"})
            if calls["n"] % 3 == 1:
                return web.json_response({"error": "not_ready", "reason": "loading"}, status=503)
            return web.json_response({"answer": "a", "stages": [{"name": "queue", "ms": 0.5}]})

        app = web.Application()
        app.router.add_post("/v1/query", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            return await open_loop(f"http://127.0.0.1:{port}/v1/query", ["q"], 60.0, 1.0, 0.0, seed=1)
        finally:
            await runner.cleanup()

    step = asyncio.run(scenario())
    assert step.requests > 20
    assert step.shed == step.shed_reasons["queue_full"] and step.shed > 0
    assert step.refusal_server_ms["p50"] == pytest.approx(0.25) and step.expired_ms["p50"] is None
    assert step.errors > 0, "a 503 without a shed reason (not ready) is an error"
    assert step.requests == step.shed + step.errors + round(step.achieved_qps * step.duration_s)


def test_report_and_table_show_goodput_and_shed(tmp_path):
    step = _summarise("open", [_outcome(i * 0.01, 0.05) for i in range(50)]
                      + [_outcome(0.6, 0.002, False, "deadline")] * 5, 1.0, 55.0, None, False)
    results = {"url": "http://x", "mode": "open", "slo_ms": 420.0, "max_error_rate": 0.001, "duration_s": 1.0,
               "warmup_s": 0.0, "interrupted": False, "knee_qps": None, "steps": [step.to_json()]}
    stored = tmp_path / "results.json"
    stored.write_text(json.dumps(results))
    text = render_report(stored, tmp_path / "report").read_text()
    assert "goodput" in text and "deadline 5" in text and 'src="outcomes_vs_load.png"' in text
    assert (tmp_path / "report" / "outcomes_vs_load.png").read_bytes()[:4] == b"\x89PNG"
    columns = [c.header for c in results_table(results).columns]
    assert {"goodput", "shed", "refusal P99 ms"} <= set(columns)
