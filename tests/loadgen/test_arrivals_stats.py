"""Arrival process, rate parsing, percentile maths and knee detection."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadgen.arrivals import parse_rates, poisson_offsets
from loadgen.stats import StepResult, find_knee, percentiles_ms


def test_poisson_offsets_have_exponential_gaps():
    rate, duration = 200.0, 100.0
    offsets = poisson_offsets(rate, duration, np.random.default_rng(7))
    gaps = np.diff(offsets)
    assert np.all(gaps > 0) and offsets[0] >= 0 and offsets[-1] < duration
    # Count: Poisson(20,000), sd ~141; mean gap 1/rate; P(gap < mean) = 1 - 1/e for an exponential.
    assert abs(len(offsets) - rate * duration) < 5 * math.sqrt(rate * duration)
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    assert (gaps < 1 / rate).mean() == pytest.approx(1 - math.exp(-1), abs=0.015)
    assert gaps.std() == pytest.approx(1 / rate, rel=0.05)  # exponential: sd equals mean (a fixed grid has 0)


def test_poisson_offsets_are_reproducible_and_seed_dependent():
    a = poisson_offsets(50, 10, np.random.default_rng(1))
    assert np.array_equal(a, poisson_offsets(50, 10, np.random.default_rng(1)))
    assert not np.array_equal(a, poisson_offsets(50, 10, np.random.default_rng(2)))


@pytest.mark.parametrize("rate,duration", [(0, 1), (-1, 1), (1, 0), (float("nan"), 1)])
def test_poisson_offsets_reject_bad_arguments(rate, duration):
    with pytest.raises(ValueError):
        poisson_offsets(rate, duration, np.random.default_rng(0))


@pytest.mark.parametrize("spec,expected", [
    ("5,10,20", [5, 10, 20]), ("5:20:5", [5, 10, 15, 20]), ("0.5:1.5:0.5", [0.5, 1.0, 1.5]), (" 7 ", [7]),
])
def test_parse_rates(spec, expected):
    assert parse_rates(spec) == expected


@pytest.mark.parametrize("spec", ["", "a,b", "5:1:1", "0,5", "1:5:0", "1:5", "-3"])
def test_parse_rates_rejects(spec):
    with pytest.raises(ValueError, match="--rates"):
        parse_rates(spec)


def test_percentiles_match_known_distributions():
    values = np.arange(1, 1001) / 1000.0  # 1 ms .. 1000 ms, uniform
    p = percentiles_ms(values)
    assert p["p50"] == pytest.approx(500.5)
    assert p["p99"] == pytest.approx(990.01)
    assert p["p99.9"] == pytest.approx(999.001)
    rng = np.random.default_rng(3)
    exponential = rng.exponential(0.010, size=200_000)  # P99 of Exp(mean 10 ms) = 10 ms * ln(100)
    assert percentiles_ms(exponential)["p99"] == pytest.approx(10 * math.log(100), rel=0.03)
    assert percentiles_ms([]) == {"p50": None, "p90": None, "p99": None, "p99.9": None}


def _step(rate, p99, errors=0, requests=1000, interrupted=False):
    return StepResult("open", rate, None, 10.0, requests, errors, rate, {"p50": 1.0, "p90": 1.0, "p99": p99,
                                                                          "p99.9": p99}, interrupted=interrupted)


def test_knee_is_the_last_rate_before_the_first_miss():
    steps = [_step(10, 50), _step(20, 120), _step(40, 400), _step(80, 900), _step(160, 300)]
    assert find_knee(steps, slo_ms=420) == 40  # 160 passing after 80 failed is noise, not capacity
    assert find_knee(list(reversed(steps)), slo_ms=420) == 40  # order of steps does not matter


def test_knee_respects_errors_and_edge_cases():
    assert find_knee([_step(10, 50), _step(20, 60, errors=2)], slo_ms=420) == 10  # 0.2 % > 0.1 %
    assert find_knee([_step(10, 50), _step(20, 60, errors=1)], slo_ms=420) == 20  # exactly 0.1 % passes
    assert find_knee([_step(10, 420.0)], slo_ms=420) == 10  # at the objective is within it
    assert find_knee([_step(10, 500)], slo_ms=420) is None
    assert find_knee([], slo_ms=420) is None
    assert find_knee([_step(10, 50), _step(20, 50, interrupted=True)], slo_ms=420) == 10
