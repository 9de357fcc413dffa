"""The load generator keeps each answer's quality level (the steering ladder's rung, the response's
``quality_level``), follows a schedule of the caller's own, and hands back every outcome for windows cut later."""

from __future__ import annotations

import asyncio
import json

import numpy as np
from aiohttp import web

from loadgen.report import render_report
from loadgen.runner import Outcome, _summarise, open_loop, window
from loadgen.stats import StepResult, find_knee


def _answer(start: float, latency_s: float, level: str | None) -> Outcome:
    return Outcome(start, start, start + latency_s, True, [{"name": "embed", "ms": 1.0}], level=level)


def test_a_step_counts_its_answers_by_quality_level_and_leaves_out_those_without_one():
    outcomes = ([_answer(i * 0.01, 0.01, "full") for i in range(5)] + [_answer(0.1, 0.01, "bm25_only")] * 3
                + [_answer(0.2, 0.01, None)] + [Outcome(0.3, 0.3, 0.301, False, None, "queue_full")])
    step = _summarise("open", outcomes, 1.0, 10.0, None, False)
    assert step.levels == {"bm25_only": 3, "full": 5}
    assert step.to_json()["levels"] == {"bm25_only": 3, "full": 5}


def test_window_summarises_the_outcomes_sent_within_it():
    outcomes = [_answer(float(t), 0.05, "full" if t < 5 else "no_rerank") for t in range(10)]
    early, late = window(outcomes, 0.0, 5.0, rate=1.0), window(outcomes, 5.0, 10.0)
    assert early.levels == {"full": 5} and late.levels == {"no_rerank": 5}
    assert early.duration_s == 5.0 and early.achieved_qps == 1.0 and early.offered_qps == 1.0


def test_open_loop_follows_a_given_schedule_and_keeps_the_levels_and_every_outcome():
    async def scenario(offsets, outcomes):
        calls = {"n": 0}

        async def handler(request):
            calls["n"] += 1
            level = "full" if calls["n"] % 2 else "shallow_rerank"
            return web.json_response({"answer": "a", "stages": [{"name": "embed", "ms": 0.5}], "quality_level": level})

        app = web.Application()
        app.router.add_post("/v1/query", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            return await open_loop(f"http://127.0.0.1:{port}/v1/query", ["q"], 20.0, 0.5, 0.1, offsets=offsets,
                                   outcomes=outcomes)
        finally:
            await runner.cleanup()

    offsets = np.array([0.0, 0.05, 0.1, 0.2, 0.3, 0.45])  # 2 in the warm-up, 4 measured
    outcomes: list[Outcome] = []
    step = asyncio.run(scenario(offsets, outcomes))
    assert step.requests == 4 and step.offered_qps == 20.0
    assert sum(step.levels.values()) == 4 and set(step.levels) <= {"full", "shallow_rerank"}
    assert len(outcomes) == len(offsets), "the warm-up's outcomes too, in schedule order"
    origin = outcomes[0].intended - offsets[0]
    assert np.allclose([o.intended - origin for o in outcomes], offsets)
    assert [o.level for o in outcomes].count("full") == 3


def _stepped(rate: float, levels: dict[str, int], p99_ms: float = 50.0) -> StepResult:
    answered = sum(levels.values()) or int(rate * 5)
    latency = {"p50": p99_ms / 2, "p90": p99_ms, "p99": p99_ms, "p99.9": p99_ms, "max": p99_ms}
    return StepResult("open", rate, None, 5.0, answered, 0, answered / 5.0, latency, levels=levels)


def test_the_full_quality_knee_is_where_the_answers_stopped_being_full_ones():
    """A controller that steps the ladder down keeps the latency knee past the full answers' capacity."""
    steps = [_stepped(50, {"full": 250}), _stepped(100, {"full": 498, "shallow_rerank": 2}),
             _stepped(200, {"full": 100, "bm25_only": 900}), _stepped(400, {"bm25_only": 2000})]
    assert find_knee(steps, 420.0) == 400
    assert find_knee(steps, 420.0, full_quality=True) == 100, "1 % of answers a rung below is still full quality"
    unlabelled = [_stepped(50, {}), _stepped(100, {})]
    assert find_knee(unlabelled, 420.0, full_quality=True) == 100, "responses that name no rung: latency alone"


def test_the_report_draws_the_quality_against_load(tmp_path):
    steps = [_stepped(50, {"full": 250}), _stepped(200, {"full": 100, "bm25_only": 900})]
    results = {"url": "http://127.0.0.1:8000", "mode": "open", "slo_ms": 420.0, "max_error_rate": 0.001,
               "duration_s": 5.0, "warmup_s": 1.0, "interrupted": False, "knee_qps": 200,
               "full_quality_knee_qps": 50, "steps": [s.to_json() for s in steps]}
    stored = tmp_path / "results.json"
    stored.write_text(json.dumps(results))
    page = render_report(stored, tmp_path / "report")
    png = tmp_path / "report" / "quality_vs_load.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and 'src="quality_vs_load.png"' in page.read_text()
