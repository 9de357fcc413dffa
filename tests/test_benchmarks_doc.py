"""docs/benchmarks.md is reproduced, not copied: rendered byte for byte from the committed results files
(benchmarks/render_docs.py, the page in benchmarks/docgen/page.py), every section measured, every figure on it moving
when its results do. The honest-statistics helpers are tested on small fixtures, so a bug in them cannot hide behind
a doc rendered by the same bug."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.docgen import stats
from benchmarks.docgen.capacity import probes
from benchmarks.docgen.page import IMAGES, SECTIONS, render, render_images, step, wrap_command
from benchmarks.docgen.quality import fusion

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DOC = REPO / "docs" / "benchmarks.md"
RENDER = [sys.executable, str(REPO / "benchmarks" / "render_docs.py")]


def committed() -> dict[str, dict]:
    return {path.stem: json.loads(path.read_text(encoding="utf-8")) for path in sorted(RESULTS.glob("*.json"))}


def test_the_doc_is_its_rendering_byte_for_byte_and_every_section_is_measured():
    text, missing = render(RESULTS)
    assert not missing, "sections without results (measure them on a quiet machine, then render):\n" + "\n".join(
        f"  {name}: bash benchmarks/run_all.sh {' '.join(step(f) for f in files)}" for name, files in missing.items())
    assert DOC.read_text(encoding="utf-8") == text, (
        "docs/benchmarks.md is not what its results files render: edit benchmarks/docgen/ (not the doc), then run "
        ".venv/bin/python benchmarks/render_docs.py")


def test_the_images_are_their_rendering_and_on_the_page():
    images = render_images(RESULTS)
    assert set(images) == set(IMAGES), "an image whose results files are not committed"
    doc = DOC.read_text(encoding="utf-8")
    for name, svg in images.items():
        path = DOC.parent / "images" / name
        assert path.read_text(encoding="utf-8") == svg, f"{path} is not what its results render: run render_docs.py"
        assert f"](images/{name})" in doc, f"{name} is not on the page"
        assert svg.startswith("<svg ") and svg.rstrip().endswith("</svg>")


def test_every_results_file_is_on_the_page_and_made_by_a_run_all_step():
    steps = subprocess.run(["bash", str(REPO / "benchmarks" / "run_all.sh"), "--list"], capture_output=True,
                           text=True, check=True, timeout=30).stdout.split()
    files = {f for section in SECTIONS for f in section.files}
    assert files == set(committed()), "a results file no section reads, or a section with no committed file"
    assert {step(f) for f in files} <= set(steps)
    assert len({s.name for s in SECTIONS}) == len(SECTIONS)


def test_each_section_names_its_command_and_provenance():
    doc = DOC.read_text(encoding="utf-8")
    bash_blocks = "\n".join(block.split("```", 1)[0] for block in doc.split("```bash\n")[1:])
    for name, document in committed().items():
        assert wrap_command(document["command"]) in bash_blocks, f"{name}: its command is not shown"
        assert f"*`benchmarks/results/{name}.json`: " in doc, f"{name}: no provenance line"
        assert document["git"]["commit"][:7] in doc


def _strings(value):
    if isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, str):
        yield value


def test_results_files_hold_data_not_ready_made_text():
    for name, document in committed().items():
        data = document["data"]
        assert "doc_tables" not in data, f"{name}: a table belongs to the renderer, not the results file"
        assert not [s for s in _strings(data) if re.search(r"(^|\n)\s*\|.*\|", s)], f"{name}: Markdown in its data"


NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?")
# Numbers the page's own text may hold: settings, thresholds, buckets, a model's name, cited published figures and
# the SVG namespace's year (plots.py).
# None is a measurement of ours: a measured figure belongs in a results file and reaches the page as data.
PROSE_NUMBERS = {"0", "0.5", "0.645", "0.686", "0.717", "0.98", "0.99", "0.999", "1", "1.0", "1.5", "2", "4", "5", "8",
                 "10", "16", "20", "32", "48", "60", "63", "64", "95", "100", "117", "128", "135", "256", "384", "512",
                 "768", "1521", "1842", "2000", "2105", "4096"}


def test_the_page_text_holds_no_measured_figure():
    """The numbers in the strings of benchmarks/docgen/ (docstrings aside) are the prose's own, listed above."""
    found = set()
    for path in sorted((REPO / "benchmarks" / "docgen").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
                      and isinstance(node.body[0], ast.Expr)}
        found |= {(n.rstrip(",").replace(",", ""), path.name) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                  for n in NUMBER.findall(node.value)}
    assert not {f for f in found if f[0] not in PROSE_NUMBERS}, "figures in the page's text: render them from data"


def _scaled(value, factor: float):
    if isinstance(value, float):
        return value * factor
    if isinstance(value, dict):
        return {k: _scaled(v, factor) for k, v in value.items()}
    if isinstance(value, list):
        return [_scaled(v, factor) for v in value]
    return value


def test_every_section_moves_with_its_results():
    """Scale every measured value in a section's results files: its text must change, so it is drawn from them."""
    documents = committed()
    for section in SECTIONS:
        data = {f: documents[f]["data"] for f in section.files}
        assert section.body(data) != section.body(_scaled(data, 1.37)), f"section {section.name}: nothing moved"


def test_render_docs_fails_clearly_on_a_missing_or_malformed_results_file(tmp_path):
    for name, document in committed().items():
        (tmp_path / f"{name}.json").write_text(json.dumps(document))
    script = [*RENDER, "--results", str(tmp_path), "--out", str(tmp_path / "doc.md")]
    done = subprocess.run(script, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "doc.md").read_text() == DOC.read_text()
    (tmp_path / "query.json").write_text('{"schema": "ragheat-benchmark-results/1", "data": ')
    done = subprocess.run(script, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2 and "query.json: not a readable JSON results file" in done.stderr, done.stderr
    (tmp_path / "query.json").unlink()
    done = subprocess.run([*script, "--check"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 1
    assert "section 'query' has no results: query.json (bash benchmarks/run_all.sh query)" in done.stderr
    subprocess.run(script, capture_output=True, text=True, cwd=REPO, timeout=120, check=True)
    assert "\n> **Not yet measured.** `benchmarks/results/query.json` is missing; `bash benchmarks/run_all.sh query` " \
           "measures it.\n" in (tmp_path / "doc.md").read_text()
    (tmp_path / "judge.json").write_text(json.dumps({**committed()["judge"], "data": {"sets": {}}}))
    done = subprocess.run(script, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2 and "section judge: its results (judge) do not have what it renders" in done.stderr


def test_wrap_command_breaks_long_lines_before_an_argument():
    assert wrap_command("a " + "b" * 120 + " c") == "a \\\n    " + "b" * 120 + " \\\n    c"


# --- honest statistics ---------------------------------------------------------------------------------------

def test_noise_verdict_says_when_the_rounds_do_not_support_the_effect():
    # rounds disagree on the sign: only a bound can be read
    text = stats.noise_verdict([0.6, -3.1, 4.2, 1.0], "Loss")
    assert "disagree on its sign" in text and "−3.1 %" in text and "4.2 %" in text and "smaller than about 4.2 %" in text
    # all positive, but the spread is larger than the effect
    text = stats.noise_verdict([0.2, 1.1, 3.5], "Loss")
    assert "median 1.1 %" in text and "larger than the effect" in text
    # a steady effect
    assert stats.noise_verdict([5.4, 5.7, 5.5], "Loss") == \
        "Loss: 5.5 % (every one of the 3 rounds between 5.4 % and 5.7 %)."
    assert "only round" in stats.noise_verdict([1.0], "Loss")


def test_paired_difference_separates_a_real_gap_from_noise():
    a = {str(i): 0.5 + 0.01 * (i % 3) for i in range(100)}
    shifted = {k: v + 0.02 for k, v in a.items()}
    noisy = {k: v + (0.3 if int(k) % 2 else -0.29) for k, v in a.items()}
    assert stats.paired_difference(shifted, a)["significant"]
    assert not stats.paired_difference(noisy, a)["significant"]
    assert "no difference this data can show" in stats.difference_verdict(stats.paired_difference(noisy, a), "x", "y")


def test_number_formatting_and_the_table():
    assert stats.num(-1234.5, 1) == "−1,234.5" and stats.signed(0.19) == "+0.19" and stats.signed(-0.001) == "+0.00"
    assert stats.duration(160.8) == "2 min 41 s" and stats.duration(48.24) == "48.2 s"
    assert stats.times(7.0, 3.5) == "2.0× faster" and stats.times(3.0, 4.5) == "1.5× slower"
    assert stats.with_range([2.0, 1.0, 3.0]) == "2.00 (1.00–3.00)" and stats.with_range([2.0]) == "2.00"
    with pytest.raises(ValueError):
        stats.paired_ratios([1.0], [1.0, 2.0])
    assert stats.table(["a", "b"], [[1, "x"]], "lr", "Things") == "Things\n\n| a | b |\n|---|---:|\n| 1 | x |"


def probe_data(scheduler_losses: list[float]) -> dict:
    off = [100.0] * len(scheduler_losses)
    on = [100.0 * (1 - loss / 100) for loss in scheduler_losses]
    row = {"rps_rounds": off, "rounds_throughput_loss_pct": [0.0] * len(off), "p50_ms": 7.0,
           "rounds_p99_ms": [20.0] * len(off), "requests": 1000}
    return {"service": {"off": row, "scheduler": {**row, "rps_rounds": on, "rounds_throughput_loss_pct": scheduler_losses},
                        "scheduler+syscalls": {**row, "rounds_service_syscalls_per_s": [13000.0]}},
            "scheduler": {"runs": {"off": [5000.0], "on": [6600.0]}, "probe_cost_ns_round_trip": 1600.0},
            "syscall": {"runs": {"off": [200.0], "on_target": [700.0], "on_other_process": [350.0]},
                        "ns_per_call_median": {"off": 200.0, "on_target": 700.0, "on_other_process": 350.0},
                        "probe_cost_ns_target": 500.0, "probe_cost_ns_other_process": 150.0},
            "settings": {"rounds": "4", "round_s": "4.0", "clients": "2", "syscall_runs": "1"}}


def test_probe_overhead_is_not_claimed_when_rounds_differ_by_more_than_it():
    noisy = probes({"probes": probe_data([0.6, -4.0, 5.0, 0.5])})
    budget = next(line for line in noisy.splitlines() if line.startswith("- The budget"))
    assert "Throughput loss with the scheduler probes: the 4 rounds disagree on its sign" in noisy
    assert "cannot promise it" in budget and "0.6 %" not in budget.split("median round")[0]
    steady = probes({"probes": probe_data([0.5, 0.7, 0.6, 0.8])})
    assert "every one of the 4 rounds" in steady and "every round stayed within it" in steady
    assert "13,000 system calls per second" in steady and "0.65 % of a core" in steady


def test_fusion_keeps_the_default_unless_the_best_cell_is_ahead_beyond_noise():
    queries = [str(i) for i in range(200)]
    base = {q: 0.6 + 0.1 * (i % 5) for i, q in enumerate(queries)}

    def data(best_gain: dict) -> dict:
        grid = [{"rrf_k": 1.0, "bm25_weight": 1.0, "ndcg@10": 0.70}, {"rrf_k": 5.0, "bm25_weight": 1.2, "ndcg@10": 0.69},
                {"rrf_k": 60.0, "bm25_weight": 1.0, "ndcg@10": 0.66}]
        cells = {"best": {"rrf_k": 1.0, "bm25_weight": 1.0, "ndcg@10": 0.70, "per_query_ndcg@10": best_gain},
                 "default": {"rrf_k": 5.0, "bm25_weight": 1.2, "ndcg@10": 0.69, "per_query_ndcg@10": base},
                 "plain_rrf": {"rrf_k": 60.0, "bm25_weight": 1.0, "ndcg@10": 0.66, "per_query_ndcg@10": base}}
        return {"fusion": {"grid": grid, "cells": cells, "queries": 200, "depth_chunks": 300,
                           "alone_ndcg@10": {"dense": 0.6, "bm25": 0.6}}}

    tied = fusion(data({q: v + (0.2 if i % 2 else -0.19) for i, (q, v) in enumerate(base.items())}))
    assert "the default is kept" in tied and "**0.7000** (best)" in tied
    assert "should be revisited" in fusion(data({q: v + 0.03 for q, v in base.items()}))
