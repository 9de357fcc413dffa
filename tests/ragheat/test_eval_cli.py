"""``ragheat eval`` (the command the entry point runs, in this process): it ingests a fresh index, scores
dense/BM25/hybrid on the SciFact subset's train claims and writes a JSON report; bad arguments exit 2 with a
sentence, not a traceback."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ragheat.cli import app

METRICS = ("ndcg@10", "recall@10", "recall@100", "mrr@10")


def run_cli(*args: str, cwd: Path):
    """``ragheat ARGS`` run from ``cwd``; a wide console, so that rich wraps no path. A traceback would be an
    exception other than the exit (and exit code 1)."""
    with contextlib.chdir(cwd):
        result = CliRunner(env={"COLUMNS": "1000", "NO_COLOR": "1"}).invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def judged_queries(beir: Path, split: str = "train") -> int:
    lines = (beir / "qrels" / f"{split}.tsv").read_text().splitlines()[1:]
    qids = {line.split("\t")[0] for line in lines if line.strip() and int(line.split("\t")[2]) > 0}
    return len(qids & {json.loads(q)["_id"] for q in (beir / "queries.jsonl").read_text().splitlines() if q})


@pytest.mark.slow
def test_eval_ingests_a_fresh_index_and_reports_every_retriever(scifact_subset, tmp_path, kept_ingest_outputs):
    index, report_path = tmp_path / "fresh-index", tmp_path / "out" / "report.json"
    result = run_cli("eval", "--beir", str(scifact_subset), "--index", str(index), "--split", "train",
                     "--retrievers", "dense,bm25,hybrid", "--json", str(report_path), cwd=tmp_path)
    assert result.exit_code == 0, result.stderr[-3000:]

    # It built the index first: a published generation behind the `current` link.
    assert (index / "current").is_symlink() and (index / "current" / "manifest.json").is_file()
    manifest = json.loads((index / "current" / "manifest.json").read_text())
    assert manifest["counts"]["documents"] == 300 and manifest["counts"]["chunks"] >= 300

    report = json.loads(report_path.read_text())
    assert report["split"] == "train" and report["beir"] == str(scifact_subset)
    assert report["queries"] == judged_queries(scifact_subset) > 0
    assert report["index"] == manifest["dense"] and report["model"] == manifest["model"]
    assert set(report["retrievers"]) == {"dense", "bm25", "hybrid"}
    for name, m in report["retrievers"].items():
        for metric in METRICS:
            assert 0.0 <= m[metric] <= 1.0, (name, metric, m[metric])
        assert m["recall@100"] >= m["recall@10"], (name, m)
        # 300 abstracts is an easy corpus: a working retriever finds most relevant ones.
        assert m["ndcg@10"] > 0.3 and m["recall@100"] > 0.6, (name, m)
        lat = m["latency_ms"]
        assert 0 < lat["p50"] <= lat["p99"], (name, lat)
    assert "hybrid" in result.stdout and "nDCG@10" in result.stdout


@pytest.mark.parametrize("spec", ["dense,splade", "DENSE", "", "dense bm25"])
def test_eval_bad_retrievers_exit_2(scifact_subset, tmp_path, spec):
    index = tmp_path / "never-built"
    result = run_cli("eval", "--beir", str(scifact_subset), "--index", str(index), "--retrievers", spec,
                     cwd=tmp_path)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert "--retrievers" in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not index.exists(), "nothing should be built when the arguments are wrong"


def test_eval_missing_split_exit_2_naming_the_qrels_path(scifact_subset, tmp_path):
    index = tmp_path / "never-built"
    result = run_cli("eval", "--beir", str(scifact_subset), "--index", str(index), "--split", "test",
                     cwd=tmp_path)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert str(scifact_subset / "qrels" / "test.tsv") in result.stderr, result.stderr
    assert "train" in result.stderr, "the message should list the splits that exist"
    assert "Traceback" not in result.stderr and not index.exists()


def test_eval_missing_beir_folder_exit_2(tmp_path):
    missing = tmp_path / "no-beir"
    result = run_cli("eval", "--beir", str(missing), "--index", str(tmp_path / "idx"), cwd=tmp_path)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert str(missing) in result.stderr and "Traceback" not in result.stderr, result.stderr
