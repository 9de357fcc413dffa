"""The windows a sweep's step past the knee is explained over, which step it is compared with, and the sentence
that says why no step is explained (the live explanation: tests/ragheat/test_bench_explain.py)."""

from __future__ import annotations

import pytest

from dashboards.promapi import PrometheusQueryError
from explain.steps import baseline_step, explain_sweep, spans, steps_past_the_knee


def step(qps: float, start: float, end: float, interrupted: bool = False, requests: int = 100) -> dict:
    return {"offered_qps": qps, "requests": requests, "interrupted": interrupted, "measured_unix": [start, end]}


@pytest.mark.parametrize("base, past", [((1000.3, 1008.3), (1010.6, 1018.6)),
                                        ((1000.0, 1010.0), (1012.0, 1022.0)),
                                        ((500.9, 505.95), (530.2, 540.1))])
def test_both_windows_lie_inside_their_steps(base, past):
    at, window, before = spans(step(120, *past), step(5, *base))
    assert at == past[1] and window.offset_s == 0
    assert past[0] <= at - window.seconds and past[1] - past[0] - window.seconds < 1
    baseline_end = at - before.offset_s
    assert base[0] <= baseline_end - before.seconds and baseline_end <= base[1]
    assert base[1] - base[0] - before.seconds < 2  # at most a second lost at each end to whole seconds


def test_the_baseline_is_the_last_step_at_or_below_the_knee():
    steps = [step(5, 0, 8), step(10, 10, 18), step(20, 20, 28), step(40, 30, 38), step(80, 40, 48)]
    results = {"knee_qps": 10, "steps": steps}
    assert baseline_step(results) is steps[1]
    assert steps_past_the_knee(results, steps[1]) == steps[2:]


def test_without_a_knee_every_step_above_the_lowest_is_compared_with_it():
    steps = [step(20, 0, 8), step(5, 10, 18, requests=0), step(10, 20, 28), step(40, 30, 38)]
    results = {"knee_qps": None, "steps": steps}
    assert baseline_step(results) is steps[2]  # the lowest that answered anything
    assert steps_past_the_knee(results, steps[2]) == [steps[0], steps[3]]


def test_a_closed_loop_sweep_has_no_baseline():
    closed = {"offered_qps": None, "concurrency": 4, "requests": 10, "interrupted": False, "measured_unix": [0, 8]}
    assert baseline_step({"knee_qps": None, "steps": [closed]}) is None


class Unreachable:
    """A Prometheus API that cannot be reached; records that it was asked."""

    asked = 0

    def label_values(self, *args, **kwargs):
        self.asked += 1
        raise PrometheusQueryError("cannot reach Prometheus at http://127.0.0.1:9: connection refused")


class TwoJobs:
    """Prometheus holding two jobs' requests, none scraped at the sweep's target."""

    def label_values(self, label, match=None):
        return [] if "instance=" in match else ["api-a", "api-b"]


def sweep(knee: float | None, *steps: dict) -> dict:
    return {"knee_qps": knee, "steps": list(steps)}


@pytest.mark.parametrize("results, reason", [
    (sweep(20, step(5, 0, 8), step(20, 10, 18)), "every step met the SLO: none is past the knee"),
    (sweep(None, step(40, 0, 8)), "no step above the lowest was measured: nothing to compare it with"),
    (sweep(None, step(5, 0, 8, requests=0)), "no step answered a request at an offered rate"),
])
def test_a_sweep_with_nothing_past_the_knee_says_so_without_asking_prometheus(results, reason):
    api = Unreachable()
    explain_sweep(results, api, instance="127.0.0.1:8000", source="the Prometheus at P")
    assert results["explained"] == {"source": None, "job": None, "baseline_qps": None, "reason": reason}
    assert api.asked == 0 and not any("explanation" in s or "not_explained" in s for s in results["steps"])


@pytest.mark.parametrize("api, reason", [
    (Unreachable(), "the Prometheus at P: cannot reach Prometheus at http://127.0.0.1:9: connection refused"),
    (TwoJobs(), "the Prometheus at P: no scrape jobs of 127.0.0.1:8000 hold ragheat_request_duration_seconds_count "
                "series, and 2 jobs in all (api-a, api-b): is it scraping the service under that address?"),
])
def test_a_prometheus_that_cannot_tell_says_which_and_why(api, reason):
    results = sweep(5, step(5, 0, 8), step(40, 10, 18))
    explain_sweep(results, api, instance="127.0.0.1:8000", source="the Prometheus at P")
    assert results["explained"]["reason"] == reason
    assert "explanation" not in results["steps"][1]
