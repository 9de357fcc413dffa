"""``ragheat measure-ladder`` (in this process) over the SciFact subset's index: it measures every rung the default
settings run, writes the ladder file the controller loads, and its rungs cost less as they go down."""

from __future__ import annotations

import json

from rag.steering.ladder import Ladder
from test_calibrate_quality_cli import run_cli


def test_every_rung_of_the_default_service_is_measured_and_loadable(scifact_subset, subset_index, tmp_path):
    out = tmp_path / "ladder.json"
    result = run_cli("measure-ladder", "--beir", str(scifact_subset), "--split", "train", "--index",
                     str(subset_index), "--rounds", "1", "--limit", "20", "--out", str(out), cwd=tmp_path)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert list(data["levels"]) == ["full", "no_graph", "shallow_rerank", "no_rerank", "light_search",
                                   "bm25_only"]
    row = data["levels"]["bm25_only"]["corpora"][scifact_subset.name]
    assert row["queries"] == 20 and 0 <= row["ndcg@10"] <= 1 and row["p99_ms"] >= row["p50_ms"] > 0
    ladder = Ladder.load(out)
    assert ladder.cpu_ms["bm25_only"] < ladder.cpu_ms["full"], "BM25 alone never runs the encoder or the reranker"
    assert data["source"]["command"].startswith("ragheat measure-ladder --beir")


def test_a_split_without_labels_exits_2_with_a_sentence(scifact_subset, tmp_path):
    result = run_cli("measure-ladder", "--beir", str(scifact_subset), "--split", "nosuch", cwd=tmp_path)
    assert result.exit_code == 2, result.output
