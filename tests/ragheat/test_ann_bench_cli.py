"""``ragheat ann-bench`` as a command (the one the entry point runs, in this process) on the SciFact subset's
index: every index and search setting in results.json, exact flat recall, the concurrency sweep at the default
settings, both plots, the table; and a clear refusal of bad flags."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from rag.index.store import read_manifest
from ragheat.cli import app

PNG = b"\x89PNG\r\n\x1a\n"

pytestmark = pytest.mark.slow


def ann_bench(cwd: Path, *args: str):
    """``ragheat ann-bench ARGS`` run from ``cwd``, on a wide console; a traceback would be an exception other
    than the exit (and exit code 1)."""
    with contextlib.chdir(cwd):
        done = CliRunner(env={"COLUMNS": "400", "NO_COLOR": "1"}).invoke(app, ["ann-bench", *args])
    assert done.exception is None or isinstance(done.exception, SystemExit), done.exception
    return done


def test_ann_bench_command_on_the_subset(scifact_subset, subset_index, tmp_path):
    out = tmp_path / "ann"
    done = ann_bench(tmp_path, "--beir", str(scifact_subset), "--index", str(subset_index), "--no-wiki",
                     "--threads", "1,2", "--seconds", "0.1", "--out", str(out))
    assert done.exit_code == 0, done.stdout + done.stderr
    n = read_manifest(subset_index)["counts"]["chunks"]
    queries = sum(1 for line in (scifact_subset / "queries.jsonl").read_text().splitlines() if line.strip())
    dataset = scifact_subset.resolve().name
    assert f"{dataset}: {n:,} vectors, {queries:,} queries" in done.stdout, done.stdout

    points = json.loads((out / "results.json").read_text())
    nlist = min(int(4 * np.sqrt(n)), n // 39)
    expected = [("flat", "exact")]
    expected += [(f"hnsw M={m}", f"efSearch={ef}") for m in (16, 32, 64) for ef in (16, 32, 64, 128, 256)]
    expected += [(f"ivfpq nlist={nlist} m=48", f"nprobe={p}") for p in (1, 4, 16, 64) if p <= nlist]
    assert [(p["index"], p["search"]) for p in points] == expected
    assert all(p["dataset"] == dataset and p["vectors"] == n for p in points)
    assert points[0]["recall_at_10"] == pytest.approx(1.0)
    swept = [p for p in points if p["concurrency"]]
    assert [(p["index"], p["search"]) for p in swept] == [
        ("flat", "exact"), *((f"hnsw M={m}", "efSearch=128") for m in (16, 32, 64)),
        *([(f"ivfpq nlist={nlist} m=48", "nprobe=16")] if nlist >= 16 else [])]  # fewer lists: no nprobe=16
    assert all(set(p["concurrency"]) == {"1", "2"} for p in swept)

    for name in (f"ann_{dataset}_recall_qps.png", f"ann_{dataset}_qps_p99.png"):
        with open(out / name, "rb") as fh:
            assert fh.read(8) == PNG, name
    # The table: one row per swept point, with its recall as results.json has it.
    for p in swept:
        row = next(line for line in done.stdout.splitlines() if p["index"] in line and p["search"] in line
                   and "QPS@1" not in line)
        assert f"{p['recall_at_10']:.4f}" in row, row
    assert f"wrote {out / 'results.json'}" in " ".join(done.stdout.split())


@pytest.mark.parametrize("threads", ["0", "two", ""])
def test_ann_bench_refuses_bad_threads(scifact_subset, tmp_path, threads):
    done = ann_bench(tmp_path, "--beir", str(scifact_subset), "--no-wiki", "--threads", threads)
    assert done.exit_code == 2, done.stdout + done.stderr
    assert "--threads takes positive whole numbers" in done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "data").exists(), "nothing is ingested before the flags are checked"
