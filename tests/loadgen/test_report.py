"""The report renders from a stored results file alone."""

from __future__ import annotations

import json

import numpy as np

from loadgen.report import render_report
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
               "warmup_s": 0.0, "knee_qps": None, "steps": [step.to_json()]}
    stored = tmp_path / "results.json"
    stored.write_text(json.dumps(results))
    page = render_report(stored)
    assert not (tmp_path / "latency_vs_load.png").exists()
    assert (tmp_path / "heatmap_time_stage.png").exists() and "4 clients" in page.read_text()
