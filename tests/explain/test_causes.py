"""The ranking on evidence written out by hand: each machine-wide source, each stage slowing on its own, and the
quiet cases (nothing changed, one outlier) that must name no cause."""

from __future__ import annotations

import dataclasses
import math

import pytest

from explain.causes import explain
from explain.report import as_json
from explain.signals import Evidence, Side, Span

STAGE_P99 = {"queue": 1.0, "embed": 6.0, "retrieve_dense": 1.0, "retrieve_bm25": 2.0, "fuse": 0.2, "rerank": 4.0,
             "generate": 1.0}


def quiet(**changes) -> Side:
    side = Side(answered_per_s=10.0, p99_ms=20.0, stage_p99_ms=dict(STAGE_P99),
                stage_ms_per_request={s: v / 2 for s, v in STAGE_P99.items()}, process_cores=0.3,
                host_busy_cores=0.5, host_cores=2.0, pressure={"cpu": 0.02, "memory": 0.0, "io": 0.01})
    return dataclasses.replace(side, **changes)


def slower(by: float, stages=("embed", "retrieve_dense", "retrieve_bm25", "rerank", "generate"), **changes) -> Side:
    p99 = {s: v * (by if s in stages else 1.0) for s, v in STAGE_P99.items()}
    return quiet(p99_ms=20.0 * by, stage_p99_ms=p99, stage_ms_per_request={s: v / 2 for s, v in p99.items()},
                 **changes)


def evidence(now: Side, before: Side | None = None, tail_share: float = 0.2, requests: float = 600.0,
             baseline_tail_share: float = 0.01) -> Evidence:
    return Evidence("svc", Span(60), Span(600, 60), 0.0, now, before or quiet(), tail_share=tail_share,
                    tail_requests=requests * tail_share, window_requests=requests,
                    baseline_tail_share=baseline_tail_share)


def top(explanation) -> str:
    assert explanation.verdict == "slower", explanation.headline
    return explanation.causes[0].kind


def test_nothing_changed_names_no_cause():
    result = explain(evidence(quiet(p99_ms=22.0), tail_share=0.012))
    assert result.verdict == "ok" and not result.causes and result.headline.startswith("nothing is wrong")


def test_one_outlier_moves_the_p99_but_is_not_a_fault():
    result = explain(evidence(quiet(p99_ms=60.0), tail_share=0.011))
    assert result.verdict == "ok", result.headline


def test_a_few_slow_requests_the_baselines_own_tail_explains_are_not_a_fault():
    """Six queries a second for 20 s: the baseline's P99 rests on its two or three slowest requests, so a quiet
    window often shows four above it (over the 3 % share), which its own rate above that bound gives by chance."""
    doubled = quiet(p99_ms=60.0)
    assert explain(evidence(doubled, tail_share=4 / 120, requests=120, baseline_tail_share=0.017)).verdict == "ok"
    assert explain(evidence(doubled, tail_share=12 / 120, requests=120, baseline_tail_share=0.017)).verdict == "slower"
    # An unknown baseline rate falls back to the quantile's own share.
    assert explain(evidence(doubled, tail_share=4 / 120, requests=120, baseline_tail_share=math.nan)).verdict == "ok"


def test_a_neighbour_taking_the_cpu():
    result = explain(evidence(slower(2.5, host_busy_cores=1.9, pressure={"cpu": 0.6})))
    assert top(result) == "cpu_neighbour" and "other processes" in result.headline
    assert set(result.causes[0].stages) == {"embed", "retrieve_dense", "retrieve_bm25", "rerank", "generate"}


def test_a_neighbour_on_a_host_already_busy_shows_as_waiting_for_a_cpu():
    before = quiet(process_cores=0.6, host_busy_cores=1.95, pressure={"cpu": 0.1, "memory": 0.0, "io": 0.01})
    now = slower(3.0, process_cores=0.45, host_busy_cores=1.97, pressure={"cpu": 0.7, "memory": 0.0, "io": 0.01})
    result = explain(evidence(now, before))
    assert top(result) == "cpu_neighbour", result.headline


def test_reclaiming_memory_is_kernel_cpu_outside_the_service_and_counts_as_memory_not_a_neighbour():
    before = quiet(host_system_cores=0.05)
    now = slower(4.0, host_busy_cores=1.15, host_system_cores=0.6,
                 pressure={"cpu": 0.08, "memory": 0.07, "io": 0.01})
    result = explain(evidence(now, before))
    assert top(result) == "memory", result.headline
    assert any("kernel CPU" in line for line in result.causes[0].evidence)
    # The same busy CPU in user space, with no memory stalls, is a neighbour.
    user = slower(4.0, host_busy_cores=1.15, host_system_cores=0.05)
    assert top(explain(evidence(user, before))) == "cpu_neighbour"


def test_the_service_burning_cpu_at_the_same_load():
    result = explain(evidence(slower(2.0, process_cores=1.3, host_busy_cores=1.5)))
    assert top(result) == "cpu_in_process", result.headline


def test_a_stage_hurt_most_by_a_busy_thread_in_the_process_is_its_victim_not_its_cause():
    now = slower(2.0, process_cores=1.3, host_busy_cores=1.5)
    now.stage_p99_ms["embed"] = 60.0  # the stage with the most lock hand-offs slows far more than the others
    result = explain(evidence(now))
    assert top(result) == "cpu_in_process", result.headline
    assert "embed" in result.causes[0].stages


def test_more_load_queues():
    now = slower(3.0, stages=("queue", "embed", "rerank"), answered_per_s=30.0, process_cores=0.9,
                 host_busy_cores=1.1)
    now.stage_p99_ms["queue"] = 80.0
    result = explain(evidence(now), knee_qps=18)
    assert top(result) == "overload" and "knee of 18" in result.headline
    assert all(c.kind == "overload" for c in result.causes)


def test_shedding_alone_is_overload():
    result = explain(evidence(quiet(shed_per_s=3.0), tail_share=0.01))
    assert result.verdict == "slower" and top(result) == "overload"


def test_answers_stepped_down_the_quality_ladder_are_overload_even_when_nothing_slowed():
    """With the load controller on, an overload is absorbed by cheaper answers: the P99 holds, nothing is refused."""
    stepped = quiet(answered_per_s=30.0, below_full_per_s=27.0)
    result = explain(evidence(stepped, tail_share=0.01))
    assert top(result) == "overload" and "90% of answers below full quality" in result.headline
    assert any("stepped the quality ladder down" in line for line in result.causes[0].evidence)
    assert explain(evidence(quiet(below_full_per_s=0.05), tail_share=0.01)).verdict == "ok", "noise is not a cause"


@pytest.mark.parametrize(("stage", "kind"), [("generate_prefill", "language_model"),
                                             ("retrieve_graph", "graph_store"), ("retrieve_bm25", "stage")])
def test_a_stage_slowing_on_its_own_is_charged_to_its_dependency_or_itself(stage, kind):
    before = quiet()
    before.stage_p99_ms[stage] = 5.0
    now = quiet(p99_ms=120.0)
    now.stage_p99_ms[stage] = 100.0
    result = explain(evidence(now, before))
    assert top(result) == kind and result.causes[0].stages == (stage,)


def test_answers_without_a_stage_point_at_its_dependency_even_when_nothing_slowed():
    """A Milvus server down with no fallback: the dense and BM25 stages are skipped, the answers come no later."""
    down = quiet(skipped_per_s={"retrieve_dense": 9.5, "retrieve_bm25": 9.5})
    result = explain(evidence(down, tail_share=0.01))
    assert top(result) == "vector_store" and result.causes[0].ms == 0.0
    assert result.causes[0].stages == ("retrieve_dense", "retrieve_bm25")
    assert "95% more answers without retrieve_dense (unavailable)" in result.headline
    # An optional stage is skipped by a near deadline too, and the counter does not say which: no cause from it.
    assert explain(evidence(quiet(skipped_per_s={"retrieve_graph": 4.0}), tail_share=0.01)).verdict == "ok"
    assert explain(evidence(quiet(skipped_per_s={"retrieve_dense": 0.05}), tail_share=0.01)).verdict == "ok", \
        "noise is not a cause"


def test_the_kernel_says_what_a_slow_stage_waits_on():
    before, now = quiet(), quiet(p99_ms=90.0)
    now.stage_p99_ms["retrieve_bm25"] = 70.0
    now.stage_ms_per_request["retrieve_bm25"] = 31.0
    now.kernel_ms_per_request[("retrieve_bm25", "syscall:futex")] = 28.0
    result = explain(evidence(now, before))
    assert top(result) == "lock", result.causes


def test_no_requests_in_the_window_or_the_baseline():
    assert explain(evidence(quiet(answered_per_s=0.0))).verdict == "no_data"
    assert explain(evidence(quiet(), quiet(answered_per_s=0.0, p99_ms=float("nan")))).verdict == "no_data"


def test_the_json_has_no_nan_and_shares_add_up():
    result = as_json(explain(evidence(slower(2.5, host_busy_cores=1.9))))
    assert result["verdict"] == "slower"
    assert abs(sum(c["share"] for c in result["causes"]) - 1.0) < 1e-6
    assert "NaN" not in repr(result) and "nan" not in repr(result)


def test_a_baseline_moved_earlier_reads_back_its_gap():
    """``--baseline-gap``: the baseline ends that long before the window starts (its PromQL offset is the window plus
    the gap), and the explanation says so."""
    moved = evidence(slower(2.5))
    moved.baseline = Span(600, 60 + 3600)
    assert moved.baseline.range() == "[600s] offset 3660s"
    assert as_json(explain(moved))["baseline_gap_s"] == 3600
    assert as_json(explain(evidence(slower(2.5))))["baseline_gap_s"] == 0
