"""``ragheat tune`` (in this process; the measured services are real ``ragheat serve`` children) over the SciFact
subset: every step runs and reports (step 3 sweeps a real vLLM serving a tiny random-weight Llama, and step 4
measures the knobs with that model server beside the services, under load, the split of the cores included), the
settings file it writes is what ``ragheat serve --settings`` reads, and a second run with the same inputs reuses
every step."""

from __future__ import annotations

import json
import os

import pytest

from rag.settings import SETTINGS_FILE_ENV, RagheatSettings
from tuning.placement_step import merge
from tuning.written_answers import MIN_LOAD_REQUESTS
from test_calibrate_quality_cli import run_cli

VERDICTS = ("kept: ", "not kept: ", "not kept, slower under load: ", "no measurable effect: ")


@pytest.mark.slow
def test_a_tune_run_reports_every_step_and_writes_settings_the_service_reads(scifact_subset, subset_index, tmp_path,
                                                                            kept_ingest_outputs, monkeypatch):
    from stack.tiny_llama import build_tiny_llama

    texts = [json.loads(line)["text"] for line in (scifact_subset / "corpus.jsonl").read_text().splitlines()]
    model = build_tiny_llama(tmp_path / "tiny-llama", texts[:500])
    out = tmp_path / "tune"
    args = ["tune", "--beir", str(scifact_subset), "--split", "train", "--index", str(subset_index), "--out",
            str(out), "--queries", "30", "--judge-sample", "0", "--rounds", "3", "--rates", "10,20",
            "--duration", "1", "--target-qps", "10", "--epochs", "2", "--llm-model", str(model),
            "--llm-load-format", "dummy", "--llm-max-num-seqs", "2", "--llm-max-model-len", "2048",
            "--llm-duration", "2", "--llm-questions", "4", "--llm-rate", "5",
            "--knobs", "lone_query_threads_1,separate_cores"]
    result = run_cli(*args, cwd=tmp_path)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())

    assert report["labels"]["source"] == "human" and report["labels"]["queries"] == 30
    baseline = report["baseline"]
    assert 0 < baseline["ndcg10"] <= 1
    c1 = baseline["concurrency_1"]
    assert c1["p99_ms"]["median"] >= c1["p50_ms"]["median"] > 0 and len(c1["p99_ms"]["rounds"]) == 3
    assert {"embed", "retrieve_dense", "retrieve_bm25", "rerank"} <= set(c1["stages"])
    assert [s["offered_qps"] for s in baseline["sweep"]][:1] == [10.0] and baseline["target_qps"] == 10.0

    reranker = report["reranker"]
    held = reranker["held_out_ndcg@10"]
    assert reranker["ran"] and reranker["held_out_queries"] + reranker["train_queries"] <= 30
    assert reranker["kept"] == (reranker["gain"] > reranker["gain_standard_error"])
    assert abs(reranker["gain"] - (held["trained_head"] - held["current_head"])) < 1e-9
    if reranker["kept"]:
        assert (out / "artefacts" / "rerank-head.npz").is_file() and reranker["figures"]["index"] == str(out / "index")
    else:
        assert reranker["figures"] == baseline and reranker["reason"].startswith("not kept")

    # Step 3: the cell swept (the choice among several: tests/tuning); the tiny model meets the objective.
    llm = report["model_server"]
    assert llm["ran"] and [(c["max_num_seqs"], c["max_model_len"]) for c in llm["sweep"]["cells"]] == [(2, 2048)]
    assert llm["settings"]["generation"]["vllm_max_num_seqs"] == llm["chosen"]["max_num_seqs"]
    # Step 3's own figures: the service writing its answers through the model server. The one cell chosen is the
    # limits the model server starts with, so one side is measured; the random-weight model is asked (its first
    # token timed) and every answer is counted by who wrote it.
    written = llm["written"]
    assert written["same"] and list(written["sides"]) == ["before"] and written["deadline_ms"] == 10000.0
    side = written["sides"]["before"]
    assert side["limits"] == {"max_num_seqs": 2, "max_model_len": 2048}
    assert sum(side["answers"].values()) == 4 * 3 and not any("unavailable" in w for w in side["answers"]), side

    assert side["stages"]["generate_prefill"]["p50_ms"] > 0 and side["p99_ms"]["median"] >= side["p50_ms"]["median"]
    assert side["at_load"]["qps"] == 5.0 and len(side["at_load"]["p99_ms"]["rounds"]) == 2
    assert side["at_load"]["answered"] >= 2 * MIN_LOAD_REQUESTS * 0.5, side["at_load"]
    assert "written answers, before and after step 3" in result.output
    assert "the service writing its answers through the model server" in (out / "report.html").read_text()
    placement = report["placement"]
    measured = [k["knob"] for k in placement["knobs"]]
    # Where the encoder's own timing already runs a lone query on one thread here, that knob would serve the same
    # configuration twice: skipped, saying so.
    lone_skipped = placement["skipped"].get("lone_query_threads_1", "")
    assert measured == (["separate_cores"] if "already runs a lone query on 1 thread" in lone_skipped
                        else ["lone_query_threads_1", "separate_cores"]), (measured, placement["skipped"])
    assert all(k["verdict"].startswith(VERDICTS) for k in placement["knobs"])
    assert placement["skipped"]["faiss_threads_1"] == "not asked for (--knobs)"
    assert all(k["kept"] == k["verdict"].startswith("kept") for k in placement["knobs"])
    # Each knob under load too: at the knee measured with the model server beside the service (it takes cores).
    assert "knee_beside_model_server" in placement
    load_qps = placement["knee_beside_model_server"] or 10.0
    assert placement["load_qps"] == load_qps
    assert all(side["at_load"]["qps"] == load_qps and len(side["at_load"]["p99_ms"]["rounds"]) == 2
               for k in placement["knobs"] for side in (k["with"], k["without"]))
    # Step 4 with the model server beside the services, answering completions all along.
    split = next(k for k in placement["knobs"] if k["knob"] == "separate_cores")
    assert split["settings"]["placement"]["cpus"] and "model server" in split["what"]
    load = placement["model_server_load"]
    assert load["requests"] > 0 and load["errors"] == 0 and load["tokens_per_s"] > 0, load
    # One model server for steps 3 and 4: the sweep's (its one cell has the limits step 3 starts with and chooses),
    # kept up for the written answers and then step 4, so no other launch.
    assert (out / "logs" / "sweep" / "cell-2x2048" / "vllm.log").is_file()
    assert sorted(p.name for p in (out / "logs").glob("model-server-*")) == []
    assert placement["before"]["settings"] == merge(reranker["figures"]["settings"], llm["settings"])

    # The settings file: what ragheat serve --settings reads, the kept knobs in it.
    monkeypatch.setenv(SETTINGS_FILE_ENV, report["settings_file"])
    served = RagheatSettings()
    assert served.server.index_dir == (out / "index" if reranker["kept"] else subset_index).resolve()
    for knob in placement["knobs"]:
        for section, fields in knob["settings"].items():
            for name, value in fields.items():
                if knob["kept"]:
                    assert getattr(getattr(served, section), name) == value, knob["knob"]
    page = (out / "report.html").read_text()
    assert "After each step" in page and "4. hardware-aware placement" in page and "separate_cores" in page

    # The same inputs again: every step is reused, nothing is measured anew.
    finished = {name: step["finished_at"] for name, step in json.loads((out / "state.json").read_text())["steps"]
                .items()}
    assert set(finished) == {"labels", "baseline", "reranker", "model_server", "placement"}
    again = run_cli(*args, cwd=tmp_path)
    assert again.exit_code == 0, again.output
    assert "measuring the service" not in again.output and "step 4: hardware-aware placement" not in again.output
    assert "step 3: sweeping" not in again.output
    state = json.loads((out / "state.json").read_text())["steps"]
    assert {name: step["finished_at"] for name, step in state.items()} == finished
    assert json.loads((out / "report.json").read_text())["placement"] == placement


@pytest.mark.parametrize("extra, words", [(["--labels", "mixed"], "--labels must be auto, human or judge"),
                                          (["--rates", "ten"], "--rates takes '5,10,20' or 'start:stop:step'"),
                                          (["--rates", "0,10"], "--rates must be positive"),
                                          (["--knobs", "memory_lock,turbo"], "--knobs takes all, none or some of")])
def test_bad_flags_exit_2_with_a_sentence(scifact_subset, tmp_path, extra, words):
    result = run_cli("tune", "--beir", str(scifact_subset), "--out", str(tmp_path / "t"), *extra, cwd=tmp_path)
    assert result.exit_code == 2 and words in result.output, result.output


def test_the_help_names_every_knob(tmp_path):
    from tuning.placement_step import KNOBS

    result = run_cli("tune", "--help", cwd=tmp_path)
    assert result.exit_code == 0 and all(name in " ".join(result.output.split()) for name in KNOBS), result.output


def test_a_folder_without_the_corpus_is_named(tmp_path):
    (tmp_path / "queries.jsonl").write_text('{"_id": "1", "text": "q"}\n')
    result = run_cli("tune", "--beir", str(tmp_path), cwd=tmp_path)
    assert result.exit_code == 2 and "corpus.jsonl and queries.jsonl are needed" in result.output, result.output
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.slow
def test_a_head_that_wins_on_held_out_questions_is_kept_and_served_from_a_new_index(
        scifact_subset, subset_index, tmp_path, kept_ingest_outputs, monkeypatch):
    """The service runs a head that ranks backwards (the shipped one with its weights negated: the same projection,
    so the index's token vectors still fit it); the head step 2 trains wins on the held-out questions, is kept, the
    index is ingested anew with its token vectors, and the step is measured beside the service before it."""
    from rag.rerank.head import DEFAULT_HEAD, RerankHead

    shipped = RerankHead.load(DEFAULT_HEAD)
    backwards = tmp_path / "backwards.npz"
    RerankHead(shipped.projection, -shipped.weights, -shipped.bias, shipped.mean, shipped.std,
               {**shipped.meta, "data": {}}).save(backwards)
    monkeypatch.setenv("RAGHEAT_RERANK__HEAD", str(backwards))  # this process's pipelines and the served children
    out = tmp_path / "tune"
    result = run_cli("tune", "--beir", str(scifact_subset), "--index", str(subset_index), "--out", str(out),
                     "--queries", "40", "--judge-sample", "0", "--rounds", "3", "--rates", "10", "--duration", "1",
                     "--target-qps", "10", "--epochs", "3", "--knobs", "none", cwd=tmp_path)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    reranker = report["reranker"]
    assert reranker["kept"] and reranker["held_out_ndcg@10"]["trained_head"] > reranker["held_out_ndcg@10"][
        "current_head"], reranker["reason"]
    assert reranker["figures"]["index"] == str(out / "index") and (out / "index").is_dir()
    before, after = reranker["before"], reranker["figures"]
    assert before["index"] == str(subset_index) and before["settings"] == {}
    assert after["settings"] == {"rerank": {"head": str((out / "artefacts" / "rerank-head.npz").resolve())}}
    assert after["ndcg10_held_out"] > before["ndcg10_held_out"], (before["ndcg10_held_out"], after["ndcg10_held_out"])
    monkeypatch.delenv("RAGHEAT_RERANK__HEAD")
    monkeypatch.setenv(SETTINGS_FILE_ENV, report["settings_file"])
    served = RagheatSettings()
    assert served.rerank.head == (out / "artefacts" / "rerank-head.npz").resolve()
    assert served.server.index_dir == (out / "index").resolve()
    page = (out / "report.html").read_text()
    assert "before step 2, served beside it" in page
    assert report["placement"]["knobs"] == [] and report["placement"]["figures"] == after  # --knobs none
