"""tuning/: how each step decides (placement's keep rule and knobs, the held-out split, step 1's choice of labels)
and how a run resumes (state.json)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from rag.placement import parse_cpu_list
from telemetry.host import read_processes
from tuning.labels import choose_labels
from tuning.model_server_load import pin_tree
from tuning.model_server_step import choose_model_limits
from tuning.pipeline import TuneState, digest, read_qrels, write_qrels
from tuning.placement_step import KNOBS, candidate_knobs, decide, merge, model_server_cpus, tune_placement
from tuning.reranker_step import MIN_HELD_OUT, split_queries


def summary(p50: list[float], p99: list[float]) -> dict:
    """A side's concurrency-1 summary as tuning.measure.Rounds.summary writes it."""
    def med(values):
        ordered = sorted(values)
        return {"median": ordered[len(ordered) // 2], "spread": max(values) - min(values), "rounds": values}
    return {"p50_ms": med(p50), "p99_ms": med(p99), "stages": {}}


def test_a_knob_is_kept_only_past_the_rounds_spread():
    base = summary([6.0, 6.2, 6.1], [10.0, 10.6, 10.3])
    kept, words = decide(base, summary([5.0, 5.1, 5.2], [8.0, 8.3, 8.1]))
    assert kept and words.startswith("kept: P99 10.30 -> 8.10")
    kept, words = decide(base, summary([6.1, 6.0, 6.2], [10.2, 10.4, 10.1]))
    assert not kept and words.startswith("no measurable effect")
    kept, words = decide(base, summary([7.5, 7.6, 7.4], [12.0, 12.4, 12.1]))
    assert not kept and words.startswith("not kept")
    # a lower P99 bought with a P50 worse than the noise is not kept either
    kept, _ = decide(base, summary([7.5, 7.6, 7.4], [8.0, 8.3, 8.1]))
    assert not kept


def test_a_knob_that_wins_alone_but_loses_under_load_is_not_kept():
    base = summary([6.0, 6.2, 6.1], [10.0, 10.6, 10.3])
    better = summary([5.0, 5.1, 5.2], [8.0, 8.3, 8.1])
    base["at_load"] = {"qps": 120.0, "p99_ms": {"median": 20.0, "spread": 2.0, "rounds": [19.0, 21.0]}}
    better["at_load"] = {"qps": 120.0, "p99_ms": {"median": 30.0, "spread": 3.0, "rounds": [28.5, 31.5]}}
    kept, words = decide(base, better)
    assert not kept and words.startswith("not kept, slower under load")
    assert "P99 at 120 req/s 20.0 -> 30.0 ms (spread 3.0)" in words
    kept, words = decide(summary([6.0, 6.2, 6.1], [10.0, 10.6, 10.3]) | {"at_load": base["at_load"]}, better)
    assert not kept and words.startswith("not kept, slower under load"), "a knob with no effect alone, worse loaded"
    better["at_load"]["p99_ms"] = {"median": 21.0, "spread": 3.0, "rounds": [19.5, 22.5]}
    assert decide(base, better)[0]


def capabilities(**lacks) -> dict:
    return {"lacks": lacks}


def test_knobs_follow_what_the_host_can_do():
    knobs, skipped = candidate_knobs(capabilities(), model_server=False)
    names = [k.name for k in knobs]
    assert names == ["lone_query_threads_1", "faiss_threads_1", "memory_lock", "memory_hugepages"]
    assert "no model server" in skipped["separate_cores"]
    assert skipped["blas_threads"].startswith("BLAS always runs on one thread")  # said, not measured
    knobs, skipped = candidate_knobs(capabilities(huge_pages="THP are never", memory_lock="limit 64 KiB",
                                                  isolated_cores="none isolated"), model_server=True)
    names = [k.name for k in knobs]
    assert "memory_hugepages" not in names and "memory_lock" not in names
    assert skipped["memory_hugepages"] == "THP are never" and skipped["memory_lock"] == "limit 64 KiB"
    assert skipped["isolated_cores"] == "none isolated"
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= 2:  # the service on the lower half, the model server on the rest
        split = next(k for k in knobs if k.name == "separate_cores")
        service = parse_cpu_list(split.settings["placement"]["cpus"])
        assert service == frozenset(cores[: len(cores) // 2])
        assert model_server_cpus(split.settings) == frozenset(cores) - service
        assert model_server_cpus({}) == frozenset(cores)  # without the split: every core
    else:
        assert "separate_cores" not in names and "a single core" in skipped["separate_cores"]


def test_only_the_knobs_asked_for_are_measured_and_the_others_say_so():
    knobs, skipped = candidate_knobs(capabilities(), model_server=True,
                                     asked=frozenset({"separate_cores", "memory_lock"}))
    assert [k.name for k in knobs] == [n for n in KNOBS if n in ("memory_lock", "separate_cores")
                                       and (n != "separate_cores" or len(os.sched_getaffinity(0)) >= 2)]
    assert skipped["lone_query_threads_1"] == skipped["faiss_threads_1"] == "not asked for (--knobs)"
    everything, _ = candidate_knobs(capabilities(), model_server=True)
    assert {k.name for k in everything} <= set(KNOBS)
    none, skipped = candidate_knobs(capabilities(), model_server=False, asked=frozenset())
    assert none == [] and {n for n, why in skipped.items() if why == "not asked for (--knobs)"} == set(KNOBS) - {
        "separate_cores"}  # the split is not a candidate without a model server, for its own reason


def test_placement_keeps_a_winning_knob_and_measures_the_next_against_it(monkeypatch):
    import tuning.placement_step as step

    monkeypatch.setattr(step, "host_capabilities", lambda: capabilities())
    seen = []
    fast, slow = summary([5.0, 5.1, 5.0], [8.0, 8.1, 8.0]), summary([6.0, 6.1, 6.0], [10.0, 10.1, 10.0])

    def measure_pair(base, candidate):
        seen.append((base, candidate))
        wins = candidate.get("placement", {}).get("math_threads") == 1 and "memory" not in candidate.get(
            "placement", {})
        return (slow, fast) if wins else (fast, fast)

    result = tune_placement({"rerank": {"candidates": 30}}, measure_pair, model_server=False)
    assert [k["knob"] for k in result["knobs"] if k["kept"]] == ["faiss_threads_1"]
    assert result["settings"] == {"rerank": {"candidates": 30}, "placement": {"math_threads": 1}}
    # the knobs after the kept one are measured on top of it
    assert seen[2][0] == {"rerank": {"candidates": 30}, "placement": {"math_threads": 1}}
    assert seen[2][1]["placement"] == {"math_threads": 1, "memory": "lock"}
    assert merge({"a": {"x": 1}}, {"a": {"y": 2}, "b": {"z": 3}}) == {"a": {"x": 1, "y": 2}, "b": {"z": 3}}


def test_the_lone_query_knob_is_skipped_where_the_encoder_timing_already_chose_its_threads(monkeypatch):
    import tuning.placement_step as step

    monkeypatch.setattr(step, "host_capabilities", lambda: capabilities())
    seen, same = [], summary([5.0, 5.1, 5.0], [8.0, 8.1, 8.0])

    def measure_pair(base, candidate):
        seen.append(candidate)
        return same, same

    def threads_timed(chosen: int):
        def lone(settings) -> int:  # quiet_query_threads 0 (the default): whatever the timing chose on this CPU
            return settings.get("embedding", {}).get("quiet_query_threads", 0) or chosen
        return lone

    asked = frozenset({"lone_query_threads_1"})
    result = tune_placement({}, measure_pair, model_server=False, asked=asked, lone_query_threads=threads_timed(1))
    assert seen == [] and result["knobs"] == []
    assert "already runs a lone query on 1 thread(s)" in result["skipped"]["lone_query_threads_1"]
    result = tune_placement({}, measure_pair, model_server=False, asked=asked, lone_query_threads=threads_timed(2))
    assert [k["knob"] for k in result["knobs"]] == ["lone_query_threads_1"] and len(seen) == 1


def test_step_three_takes_the_fastest_cell_that_met_the_objective_and_nothing_when_none_did():
    def cell(seqs: int, length: int, tokens: float, meets: bool, failure: str | None = None) -> dict:
        return {"max_num_seqs": seqs, "max_model_len": length, "tokens_per_s": tokens, "meets_slo": meets,
                "failure": failure}

    sweep = {"cells": [cell(1, 1024, 40.0, True), cell(8, 1024, 90.0, True), cell(16, 1024, 120.0, False),
                       cell(8, 2048, 150.0, True, failure="out of memory")]}
    chosen = choose_model_limits(sweep)
    assert chosen["settings"] == {"generation": {"vllm_max_num_seqs": 8, "vllm_max_model_len": 1024}}
    assert "90.0" in chosen["reason"]
    none = choose_model_limits({"cells": [cell(16, 1024, 120.0, False)]})
    assert "settings" not in none and "no cell of the sweep met" in none["reason"]


def test_pin_tree_moves_every_thread_of_a_process_and_its_children():
    """A real process tree (a parent and the child it starts): after ``pin_tree``, every thread of both runs on the
    one core given; the model server is pinned the same way between rounds."""
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); " \
           "time.sleep(30)"
    parent, children = subprocess.Popen([sys.executable, "-c", code]), []
    try:
        core = max(os.sched_getaffinity(0))
        deadline = time.monotonic() + 10
        while not children and time.monotonic() < deadline:  # the child is there once the parent started it
            children = [pid for pid, process in (read_processes() or {}).items() if process.ppid == parent.pid]
            time.sleep(0.05)
        assert children, "the parent never started its child"
        assert pin_tree(parent.pid, {core}) >= 2
        for pid in (parent.pid, *children):
            for task in os.listdir(f"/proc/{pid}/task"):
                assert os.sched_getaffinity(int(task)) == {core}, (pid, task)
    finally:
        for child in children:
            os.kill(child, signal.SIGKILL)
        parent.kill()
        parent.wait()


def test_the_held_out_split_is_seeded_disjoint_and_large_enough():
    qids = [f"q{i}" for i in range(100)]
    train, held = split_queries(qids, 0.25, seed=3)
    assert train.isdisjoint(held) and train | held == set(qids) and len(held) == 25
    assert split_queries(list(reversed(qids)), 0.25, seed=3) == (train, held)
    assert split_queries(qids, 0.25, seed=4)[1] != held
    assert len(split_queries(qids[:20], 0.1, seed=0)[1]) == MIN_HELD_OUT
    assert len(split_queries(qids[:6], 0.25, seed=0)[1]) == 2


def test_human_labels_are_used_as_they_are_when_no_judge_is_asked_for(tmp_path):
    human = {"1": {"d1": 1}, "2": {"d2": 1}}
    labels = choose_labels(human, {"1": "a", "2": "b"}, "auto", pipeline_factory=None, asker_factory=None,
                           judge_sample=0, seed=0, out_dir=tmp_path)
    assert labels.source == "human" and labels.qrels == human and labels.to_json()["relevant_pairs"] == 2
    labels = choose_labels(human, {"1": "a"}, "auto", pipeline_factory=None, asker_factory=None, judge_sample=5,
                           seed=0, out_dir=tmp_path)
    assert labels.source == "human" and "no language model" in labels.reason


def test_without_labels_or_a_model_step_one_says_what_is_needed(tmp_path):
    with pytest.raises(ValueError, match="no relevance labels and no language model"):
        choose_labels(None, {"1": "a"}, "auto", pipeline_factory=None, asker_factory=None, judge_sample=0, seed=0,
                      out_dir=tmp_path)
    with pytest.raises(ValueError, match="labels=human, but the query set has no relevance labels"):
        choose_labels(None, {"1": "a"}, "human", pipeline_factory=None, asker_factory=None, judge_sample=0, seed=0,
                      out_dir=tmp_path)
    with pytest.raises(ValueError, match="auto, human or judge"):
        choose_labels(None, {"1": "a"}, "mixed", pipeline_factory=None, asker_factory=None, judge_sample=0, seed=0,
                      out_dir=tmp_path)


def test_a_finished_step_is_reused_only_for_the_same_inputs(tmp_path):
    path = tmp_path / "state.json"
    state = TuneState.load(path)
    key = digest("labels", ["a", 1])
    assert state.done("labels", key) is None
    state.record("labels", key, {"source": "human"})
    again = TuneState.load(path)
    assert again.done("labels", key) == {"source": "human"}
    assert again.done("labels", digest("labels", ["a", 2])) is None
    path.write_text("{cut sho")  # killed mid-write: started again, not a crash
    assert TuneState.load(path).steps == {}
    qrels = {"q1": {"d1": 1, "d2": 0}, "q2": {"d3": 2}}
    write_qrels(tmp_path / "qrels.tsv", qrels)
    assert read_qrels(tmp_path / "qrels.tsv") == qrels


def test_the_code_digest_changes_with_any_measured_module(tmp_path):
    from tuning.pipeline import MEASURED_CODE, code_digest

    for package in MEASURED_CODE:
        (tmp_path / package / "sub").mkdir(parents=True)
        (tmp_path / package / "sub" / "m.py").write_text("X = 1\n")
    before = code_digest(tmp_path)
    assert code_digest(tmp_path) == before  # the same checkout: the same key, the steps are reused
    (tmp_path / "stack" / "sub" / "m.py").write_text("X = 2\n")
    assert code_digest(tmp_path) != before
    (tmp_path / "docs").mkdir()
    changed = code_digest(tmp_path)
    (tmp_path / "docs" / "x.py").write_text("not measured\n")
    assert code_digest(tmp_path) == changed


def test_a_measured_server_runs_the_file_not_an_environment_variable_that_would_win_over_it(tmp_path):
    from tuning.measure import MEASURED_ENV, measured_env, write_settings

    path = write_settings(tmp_path / "c.json", {"rerank": {"head": "/x/head.npz"}, "placement": {"memory": "lock"}})
    env = measured_env(path)
    assert env["RAGHEAT_RERANK__HEAD"] is None and env["RAGHEAT_PLACEMENT__MEMORY"] is None  # removed in the child
    assert env["RAGHEAT_SETTINGS_FILE"] == str(path.resolve()) and MEASURED_ENV.items() <= env.items()
    assert "RAGHEAT_CACHE__ENABLED" in env and env["RAGHEAT_CACHE__ENABLED"] == "false"
