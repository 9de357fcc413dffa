"""``ragheat tune-vllm`` end to end: a 2-cell sweep starts a real vLLM per cell, drives it and reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_two_cell_sweep_reports_every_cell_and_a_heatmap(tiny_model, vllm_python, tmp_path):
    out = tmp_path / "tune"
    ragheat = Path(sys.executable).parent / "ragheat"
    run = subprocess.run([str(ragheat), "tune-vllm", "--model", str(tiny_model), "--max-num-seqs", "1,8",
                          "--max-model-len", "256", "--block-size", "32", "--rate", "8", "--duration", "2",
                          "--prompt-tokens", "32", "--max-tokens", "16", "--load-format", "dummy",
                          "--slo-ttft-ms", "60000", "--slo-e2e-ms", "60000", "--out", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    results = json.loads((out / "results.json").read_text())
    cells = results["cells"]
    assert [(c["max_num_seqs"], c["max_model_len"]) for c in cells] == [(1, 256), (8, 256)]
    for c in cells:
        assert c["failure"] is None and c["requests"] > 0 and c["errors"] == 0, c
        assert c["tokens_per_s"] > 0 and 0 < c["ttft_p99_ms"] <= c["e2e_p99_ms"] and c["meets_slo"], c
    assert (out / "heatmap-block32.png").stat().st_size > 1000
    assert "vLLM tuning at 8 req/s" in run.stdout and "cell seqs=8 len=256" in run.stderr


def test_tune_vllm_rejects_a_block_size_the_cpu_cannot_use(tiny_model, tmp_path):
    ragheat = Path(sys.executable).parent / "ragheat"
    run = subprocess.run([str(ragheat), "tune-vllm", "--model", str(tiny_model), "--block-size", "16",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "multiple of 32" in run.stderr and "Traceback" not in run.stderr
