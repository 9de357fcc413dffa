"""``ragheat demo`` end to end, as the README's first command runs it, on the first 60 Wikipedia summaries
(``--max-docs``) and a short sweep (``--sweep-seconds``) so it stays fast: ingest, serve over real HTTP, answer the
sample questions with citations from that corpus, per-stage timings, P99s from ``/metrics``, a sweep's report
and knee; the second run reuses the index."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rag.index.store import read_manifest
from rag.ingest.sources import load_wiki
from rag.stages import DEFAULT_STAGES
from ragheat.commands.demo import SAMPLE_QUESTIONS, SWEEP_RATES, stage_p99s

RAGHEAT = Path(sys.executable).parent / "ragheat"
DOCS = 60



def demo(cwd: Path, *args: str, command: str = "demo", **env: str) -> str:
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb", **env}
    done = subprocess.run([str(RAGHEAT), command, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout


@pytest.mark.slow
def test_demo_ingests_serves_answers_times_and_sweeps(tmp_path):
    index = tmp_path / "index"
    output = demo(tmp_path, "--max-docs", str(DOCS), "--index", str(index), "--sweep-seconds", "0.5")

    assert f"no usable index at {index}" in output, output
    assert f"ingesting the first {DOCS} documents of 'wiki'" in output, output
    manifest = read_manifest(index)
    assert manifest["counts"]["documents"] == DOCS and manifest["corpus"]["name"] == f"wiki-en-us-first-{DOCS}"
    assert f"indexed {DOCS} documents as {manifest['counts']['chunks']} chunks" in output

    # Every sample question is asked and answered, citing only documents of the ingested slice.
    first = {d.doc_id for d in load_wiki().documents[:DOCS]}
    for question in SAMPLE_QUESTIONS["wiki"]:
        block = output.split(f"Q: {question}\n", 1)[1].split("\n\n", 1)[0]
        assert block.startswith("A: ") and re.search(r" \[\d\]", block), block
        cited = re.findall(r"^ +\[\d\] .*\((.+), chars \d+-\d+\)$", block, flags=re.M)
        assert len(cited) == 3 and set(cited) <= first, (cited, block)

    # The timing table covers every stage over REPEATS x 5 HTTP queries; the P99s come from the server's /metrics.
    assert "per-stage latency over 100 HTTP" in output
    # The router decides per question whether the reranker runs and (for a question naming an entity) the graph.
    always = [stage for stage in DEFAULT_STAGES if stage != "rerank"]
    for stage in [*always, "end to end (HTTP)"]:
        assert re.search(rf"{re.escape(stage)} +[│|] +\d+\.\d\d +[│|] +\d+\.\d\d", output), stage
    # Only the stages that ran: the service registers every stage's series, the optional ones included.
    p99_line = next(line for line in output.splitlines() if line.startswith("P99 from GET /metrics"))
    assert "nan" not in p99_line, p99_line
    printed = re.findall(r"(\w+) <= ([^ ,]+) ms", p99_line)
    assert {"queue", *always} <= {stage for stage, _ in printed} <= {"queue", *DEFAULT_STAGES, "retrieve_graph"}, \
        p99_line
    assert all(float(ms) > 0 for _, ms in printed), p99_line

    # The sweep ran every rate against the demo's server and wrote its report.
    assert "the sweep failed" not in output, output
    report = Path(re.search(r"^report: (.+)$", output, flags=re.M).group(1))
    assert report == (tmp_path / "out" / "demo-bench" / "report.html").resolve() and report.is_file()
    results = json.loads((report.parent / "results.json").read_text())
    assert results["mode"] == "open" and [s["offered_qps"] for s in results["steps"]] == list(SWEEP_RATES)
    assert results["duration_s"] == 0.5 and all(s["requests"] > 0 for s in results["steps"]), results
    assert re.search(r"^knee: ", output, flags=re.M), output

    # Later runs reuse the index: no second ingest, the same generation.
    again = demo(tmp_path, "--max-docs", str(DOCS), "--index", str(index), "--sweep-seconds", "0.2")
    assert f"using index {index} ({manifest['counts']['chunks']} chunks of wiki-en-us-first-{DOCS})" in again, again
    assert "ingesting" not in again
    assert read_manifest(index)["generation"] == manifest["generation"]


@pytest.mark.slow
def test_demo_reingests_an_index_built_without_the_rerankers_token_vectors(tmp_path):
    """An index ingested with ``rerank.store_tokens`` off is rebuilt with them, not served into an error."""
    index = tmp_path / "index"
    source = tmp_path / "docs"
    source.mkdir()
    for d in load_wiki().documents[:12]:
        (source / f"{d.doc_id.replace('/', '_')}.txt").write_text(f"{d.title}\n\n{d.text}", encoding="utf-8")
    demo(tmp_path, str(source), "--index", str(index), command="ingest",
         RAGHEAT_RERANK__ENABLED="false", RAGHEAT_RERANK__STORE_TOKENS="false")
    assert not read_manifest(index).get("rerank")
    output = demo(tmp_path, "--source", str(source), "--index", str(index), "--sweep-seconds", "0.2")
    assert f"no usable index at {index} (it has no rerank token vectors)" in output, output
    assert read_manifest(index).get("rerank") and "rerank" in output


def test_the_p99_summary_leaves_out_the_stages_that_did_not_run():
    """The service registers every stage's histogram series at start-up: a stage that never ran has buckets that
    hold nothing and no P99 (not ``nan``)."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    registry = CollectorRegistry()
    hist = Histogram("ragheat_stage_duration_seconds", "t", ["stage"], buckets=(0.001, 0.01, 0.1), registry=registry)
    for stage in ("embed", "link_entities", "route"):
        hist.labels(stage)
    for _ in range(99):
        hist.labels("embed").observe(0.0005)
    hist.labels("embed").observe(0.05)
    hist.labels("retrieve_bm25").observe(0.005)

    assert stage_p99s(generate_latest(registry).decode()) == {"embed": 0.001, "retrieve_bm25": 0.01}
    assert stage_p99s("") == {}
