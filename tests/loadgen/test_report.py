"""The report renders from a stored results file alone, the explanations of the steps past the knee included."""

from __future__ import annotations

import html
import json
import re

import numpy as np

from loadgen.report import explanation_lines, render_report
from loadgen.stats import StepResult, find_knee, percentiles_ms


def _step(rate: float, scale_ms: float, rng) -> StepResult:
    n = int(rate * 5)
    t = np.sort(rng.uniform(0, 5, n))
    stages = {"embed": rng.exponential(scale_ms * 0.4, n), "retrieve_dense": rng.exponential(scale_ms * 0.1, n),
              "generate": rng.exponential(scale_ms * 0.1, n)}
    total = sum(stages.values()) + rng.exponential(scale_ms * 0.4, n)
    return StepResult("open", rate, None, 5.0, n, 0, rate, percentiles_ms(total / 1000), {},
                      {k: percentiles_ms(v / 1000) for k, v in stages.items()},
                      samples={"t_s": t.tolist(), "latency_ms": total.tolist(),
                               "stages_ms": {k: v.tolist() for k, v in stages.items()}})


def test_report_renders_every_image_from_results_json(tmp_path):
    rng = np.random.default_rng(0)
    steps = [_step(10, 5, rng), _step(40, 60, rng), _step(80, 400, rng)]
    results = {"url": "http://127.0.0.1:8000", "mode": "open", "slo_ms": 420.0, "max_error_rate": 0.001,
               "duration_s": 5.0, "warmup_s": 1.0, "interrupted": False,
               "knee_qps": find_knee(steps, 420.0), "steps": [s.to_json() for s in steps]}
    assert results["knee_qps"] == 40
    stored = tmp_path / "results.json"
    stored.write_text(json.dumps(results))
    page = render_report(stored, tmp_path / "report")
    text = page.read_text()
    for image in ("heatmap_stage_buckets.png", "heatmap_time_stage.png", "latency_vs_load.png"):
        png = tmp_path / "report" / image
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
        assert f'src="{image}"' in text
    assert "Knee: 40 req/s" in text and text.count("<tr>") == 1 + len(steps)


def test_report_of_a_closed_loop_run_skips_the_load_curve(tmp_path):
    rng = np.random.default_rng(1)
    step = _step(20, 5, rng)
    step.mode, step.offered_qps, step.concurrency = "closed", None, 4
    results = {"url": "u", "mode": "closed", "slo_ms": 420.0, "max_error_rate": 0.001, "duration_s": 5.0,
               "warmup_s": 0.0, "knee_qps": None, "steps": [step.to_json()],
               "explained": {"source": None, "job": None, "baseline_qps": None,
                             "reason": "a closed-loop sweep has no knee to explain steps past"}}
    stored = tmp_path / "results.json"
    stored.write_text(json.dumps(results))
    page = render_report(stored)
    assert not (tmp_path / "latency_vs_load.png").exists()
    assert (tmp_path / "heatmap_time_stage.png").exists() and "4 clients" in page.read_text()
    # It has no knee: neither the page nor the console speaks of steps past it.
    assert "past the knee" not in page.read_text() and explanation_lines(results) == []


def _explained_sweep(rng) -> dict:
    """Three steps, knee at the second; the third explained as ``explain.steps`` writes it."""
    steps = [s.to_json() for s in (_step(10, 5, rng), _step(40, 60, rng), _step(80, 400, rng))]
    steps[2]["explanation"] = {
        "verdict": "slower", "baseline_qps": 40,
        "headline": "P99 180.0 ms -> 1900.0 ms: overload: 80.0 req/s offered against 40.0 in the baseline and a knee "
                    "of 40; shed 22%",
        "causes": [{"kind": "overload", "ms": 1500.0, "share": 0.9,
                    "headline": "overload: 80.0 req/s offered against 40.0 in the baseline and a knee of 40; shed 22%",
                    "evidence": ["offered 40.00 -> 80.00 req/s (2.00x)", "queue P99 2.0 ms -> 1500.0 ms"]},
                   {"kind": "cpu_in_process", "ms": 166.7, "share": 0.1,
                    "headline": "the service's own process burns CPU its requests do not explain",
                    "evidence": ["CPU per answered request 9.0 -> 14.0 ms"]},
                   {"kind": "stage", "ms": 1.5, "share": 0.0009, "stages": ["rerank"],
                    "headline": "rerank itself got slower: rerank P99 20.0 ms -> 21.5 ms", "evidence": []},
                   {"kind": "stage", "ms": 0.5, "share": 0.0003, "stages": ["embed"],
                    "headline": "embed itself got slower: embed P99 5.0 ms -> 5.5 ms", "evidence": []}]}
    return {"url": "http://127.0.0.1:8000", "mode": "open", "slo_ms": 420.0, "max_error_rate": 0.001,
            "duration_s": 5.0, "warmup_s": 1.0, "interrupted": False, "knee_qps": 40, "steps": steps,
            "explained": {"source": "a local Prometheus scraping 127.0.0.1:8000/metrics every 1 s", "job": "ragheat",
                          "baseline_qps": 40, "reason": None}}


def test_the_report_says_why_each_step_past_the_knee_was_slower(tmp_path):
    results = _explained_sweep(np.random.default_rng(2))
    stored = tmp_path / "results.json"
    stored.write_text(json.dumps(results))
    text = render_report(stored).read_text()
    headline = results["steps"][2]["explanation"]["headline"]
    # The step's row carries its headline in the "why" column; the steps at or below the knee carry none.
    assert "<th>why (past the knee)</th>" in text
    rows = re.findall(r"<tr><td>.*?</tr>", text)
    assert len(rows) == 3 and f'<td class="why">{html.escape(headline)}</td>' in rows[2]
    assert all('<td class="why">-</td>' in row for row in rows[:2])
    # The section: the baseline step, the source, and each cause ranked with its share and evidence.
    section = text[text.index("<h2>Why, past the knee</h2>"):]
    assert "against the step at 40 req/s" in section and "a local Prometheus scraping 127.0.0.1:8000" in section
    assert "<h3>step 80 req/s</h3>" in section and "step 10 req/s" not in section
    assert section.index("<b>overload</b> (90%)") < section.index("<b>cpu_in_process</b> (10%)")
    assert "queue P99 2.0 ms -&gt; 1500.0 ms" in section
    assert explanation_lines(results) == [
        "why, past the knee (each step against the one at 40 req/s, from a local Prometheus scraping "
        "127.0.0.1:8000/metrics every 1 s):",
        f"step 80 req/s: {headline}",
        "    causes: overload 90%, cpu_in_process 10%, stage (rerank) 0%, stage (embed) 0%"]


def test_the_report_says_why_the_steps_are_not_explained(tmp_path):
    results = _explained_sweep(np.random.default_rng(3))
    del results["steps"][2]["explanation"]
    results["explained"] = {"source": None, "job": None, "baseline_qps": None,
                            "reason": "http://127.0.0.1:8000/metrics answered HTTP 404"}
    stored = tmp_path / "results.json"
    stored.write_text(json.dumps(results))
    text = render_report(stored).read_text()
    assert "<p>Steps past the knee are not explained: http://127.0.0.1:8000/metrics answered HTTP 404.</p>" in text
    assert "why (past the knee)" not in text and "Why, past the knee" not in text
    assert explanation_lines(results) == [
        "steps past the knee not explained: http://127.0.0.1:8000/metrics answered HTTP 404"]


def test_a_step_past_the_knee_that_could_not_be_explained_says_why(tmp_path):
    results = _explained_sweep(np.random.default_rng(4))
    del results["steps"][2]["explanation"]
    results["steps"][2]["not_explained"] = "measured for 1.2 s only: too few scrapes to compare"
    stored = tmp_path / "results.json"
    stored.write_text(json.dumps(results))
    text = render_report(stored).read_text()
    assert '<td class="why">measured for 1.2 s only: too few scrapes to compare</td>' in text
    assert "<h3>step 80 req/s</h3><p>not explained: measured for 1.2 s only" in text
    assert explanation_lines(results)[1:] == ["step 80 req/s: measured for 1.2 s only: too few scrapes to compare"]


def test_a_report_of_results_written_before_steps_were_explained_says_nothing_of_them(tmp_path):
    results = _explained_sweep(np.random.default_rng(5))
    del results["explained"], results["steps"][2]["explanation"]
    stored = tmp_path / "results.json"
    stored.write_text(json.dumps(results))
    text = render_report(stored).read_text()
    assert "past the knee" not in text and explanation_lines(results) == []
