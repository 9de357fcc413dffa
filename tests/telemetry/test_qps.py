"""The request rate behind ``qps_bucket``: sliding-window maths on a fake clock, and the closed label set."""

from __future__ import annotations

import math
import threading
import time

import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from rag.settings import TelemetrySettings
from telemetry.qps import QpsBuckets, SlidingWindowRate
from telemetry.recorder import Telemetry


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def rate_with(window_s=10.0, resolution_s=0.25, now=1000.0):
    clock = FakeClock(now)
    return SlidingWindowRate(window_s, resolution_s, clock=clock), clock


# -- SlidingWindowRate ---------------------------------------------------------------------------

def test_idle_rate_is_zero():
    rate, _ = rate_with()
    assert rate.rate() == 0.0


def test_rate_is_requests_in_window_over_window():
    rate, clock = rate_with(window_s=10.0)
    for i in range(20):
        clock.now = 1000.0 + i * 0.1  # 20 requests spread over 2 s
        rate.record()
    assert rate.rate() == pytest.approx(20 / 10.0)


def test_record_returns_the_rate_including_this_request():
    rate, clock = rate_with(window_s=10.0)
    assert rate.record() == pytest.approx(1 / 10.0)
    assert rate.record() == pytest.approx(2 / 10.0)
    clock.now += 3.0
    assert rate.record() == pytest.approx(3 / 10.0)
    assert rate.rate() == pytest.approx(3 / 10.0)


def test_a_lone_request_is_not_a_burst():
    # Dividing by the time since the first request would give a huge rate here.
    rate, _ = rate_with(window_s=10.0)
    assert rate.record() == pytest.approx(0.1)


def test_old_slots_expire_after_the_window():
    rate, clock = rate_with(window_s=10.0, resolution_s=0.25, now=1000.0)
    for _ in range(5):
        rate.record()
    clock.now = 1009.9  # still inside the window
    assert rate.rate() == pytest.approx(0.5)
    clock.now = 1010.0  # exactly one window later: expired
    assert rate.rate() == 0.0
    clock.now = 1500.0
    assert rate.rate() == 0.0


def test_expiry_is_per_slot():
    rate, clock = rate_with(window_s=2.0, resolution_s=0.5, now=100.0)
    rate.record()                 # slot of t=100.0
    clock.now = 101.0
    rate.record(); rate.record()  # slot of t=101.0
    assert rate.rate() == pytest.approx(3 / 2.0)
    clock.now = 102.0             # the t=100 slot leaves the window, the t=101 slot stays
    assert rate.rate() == pytest.approx(2 / 2.0)
    clock.now = 103.0
    assert rate.rate() == 0.0


def test_ring_slots_are_reused_after_wrap_around():
    rate, clock = rate_with(window_s=1.0, resolution_s=0.25, now=0.0)  # a ring of 4 slots
    for _ in range(7):
        rate.record()             # ring entry 0 holds absolute slot 0
    clock.now = 1.0               # absolute slot 4 maps to the same ring entry 0
    assert rate.record() == pytest.approx(1 / 1.0)  # the 7 old requests were reset, not added to
    clock.now = 1.5
    rate.record()
    assert rate.rate() == pytest.approx(2 / 1.0)
    # Many windows later, every entry has wrapped several times; only the current slot counts.
    clock.now = 57.3
    for _ in range(3):
        rate.record()
    assert rate.rate() == pytest.approx(3 / 1.0)


def test_requests_in_every_slot_of_the_window_all_count():
    rate, clock = rate_with(window_s=1.0, resolution_s=0.25, now=0.0)
    for i in range(4):
        clock.now = i * 0.25
        rate.record()
    assert rate.rate() == pytest.approx(4.0)
    clock.now = 1.0  # the first slot leaves
    assert rate.rate() == pytest.approx(3.0)


@pytest.mark.parametrize("window_s,resolution_s", [(10.0, 0.25), (1.0, 0.1), (3.0, 1.0), (2.0, 2.0), (2.1, 0.3)])
def test_resolution_divides_the_window(window_s, resolution_s):
    """The window is ``window_s`` long whatever the resolution (``2.1 / 0.3`` is 7.000000000000001 in floats:
    that must still be a ring of 7 slots, not 8, or the window silently becomes 2.4 s)."""
    rate, clock = rate_with(window_s, resolution_s, now=0.0)
    for _ in range(21):
        rate.record()
    assert rate.rate() == pytest.approx(21 / window_s)
    clock.now = window_s + 1e-9
    assert rate.rate() == 0.0


def test_requests_within_one_slot_share_it():
    rate, clock = rate_with(window_s=1.0, resolution_s=1.0, now=5.0)
    rate.record()
    clock.now = 5.99
    rate.record()
    assert rate.rate() == pytest.approx(2.0)
    clock.now = 6.0
    assert rate.rate() == 0.0


@pytest.mark.parametrize("window_s,resolution_s", [
    (0.0, 0.25), (-1.0, 0.25), (10.0, 0.0), (10.0, -0.5), (1.0, 2.0),
    (math.nan, 0.25), (10.0, math.nan), (math.inf, 0.25),
])
def test_invalid_arguments_raise_value_error(window_s, resolution_s):
    with pytest.raises(ValueError):
        SlidingWindowRate(window_s, resolution_s)


def test_concurrent_records_are_all_counted():
    rate, _ = rate_with(window_s=10.0)
    barrier = threading.Barrier(4)

    def hammer():
        barrier.wait()
        for _ in range(1000):
            rate.record()

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert rate.rate() * 10.0 == pytest.approx(4000)


def test_default_clock_is_the_monotonic_clock():
    """A wall clock (time.time) jumps with NTP and DST: the rate must follow time.monotonic."""
    assert SlidingWindowRate(10.0).clock is time.monotonic
    assert Telemetry(TelemetrySettings(tracing=False, otlp="off"), registry=CollectorRegistry()).rate.clock \
        is time.monotonic


def test_default_clock_expires_a_request_after_one_real_window():
    window_s, resolution_s = 0.5, 0.125
    rate = SlidingWindowRate(window_s, resolution_s)
    recorded = time.monotonic()
    assert rate.record() == pytest.approx(1 / window_s)
    while rate.rate() > 0:  # bounded: the request leaves within one window (plus a loaded machine's lag)
        assert time.monotonic() - recorded < window_s + 10, "the request never left the window"
        time.sleep(0.01)
    # It stayed counted for at least the window less one slot (it may have landed at the end of its slot).
    assert time.monotonic() - recorded >= window_s - resolution_s


# -- QpsBuckets ----------------------------------------------------------------------------------

def test_default_edges_give_the_documented_labels():
    assert QpsBuckets([1, 10, 50, 200]).labels == ["0-1", "1-10", "10-50", "50-200", "200+"]


@pytest.mark.parametrize("value,label", [
    (0.0, "0-1"), (0.1, "0-1"), (0.999, "0-1"),
    (1.0, "1-10"), (9.99, "1-10"),
    (10.0, "10-50"), (49.9, "10-50"),
    (50.0, "50-200"), (199.99, "50-200"),
    (200.0, "200+"), (1e6, "200+"), (math.inf, "200+"),
])
def test_rate_equal_to_an_edge_goes_up(value, label):
    assert QpsBuckets([1.0, 10.0, 50.0, 200.0]).label(value) == label


def test_every_label_is_from_the_closed_set():
    buckets = QpsBuckets([1.0, 10.0, 50.0, 200.0])
    values = [i * 0.37 for i in range(2000)]
    assert {buckets.label(v) for v in values} == set(buckets.labels)


def test_custom_edges():
    buckets = QpsBuckets([0.5, 2.5, 1000])
    assert buckets.labels == ["0-0.5", "0.5-2.5", "2.5-1000", "1000+"]
    assert [buckets.label(v) for v in (0.2, 0.5, 2.4999, 2.5, 999, 1000)] == [
        "0-0.5", "0.5-2.5", "0.5-2.5", "2.5-1000", "2.5-1000", "1000+"]
    single = QpsBuckets([5])
    assert single.labels == ["0-5", "5+"]
    assert single.label(4.9) == "0-5" and single.label(5) == "5+"


@pytest.mark.parametrize("edges", [[], [0, 1], [-1, 1], [1, 1], [10, 1], [1, 10, 5], [math.nan], [1, math.nan]])
def test_invalid_edges_raise(edges):
    with pytest.raises(ValueError):
        QpsBuckets(edges)


@pytest.mark.parametrize("edges", [[1.0, math.nan], [math.nan]])
def test_settings_reject_nan_qps_edges(edges):
    with pytest.raises(ValidationError):
        TelemetrySettings(qps_edges=edges)


@pytest.mark.parametrize("window_s", [0.1, 0.25, 10.0, 60.0])
def test_every_valid_qps_window_setting_builds_a_telemetry(window_s):
    """``qps_window_s`` only has to be > 0; a window shorter than the default slot must still work."""
    clock = FakeClock(0.0)
    settings = TelemetrySettings(qps_window_s=window_s, tracing=False, otlp="off")
    telemetry = Telemetry(settings, registry=CollectorRegistry(), environ={}, clock=clock)
    assert telemetry.rate.window_s == window_s
    assert telemetry.start("/v1/query").qps_bucket == telemetry.buckets.label(1 / window_s)
    assert telemetry.rate.rate() == pytest.approx(1 / window_s)
    clock.now = window_s * 1.01
    assert telemetry.rate.rate() == 0.0


def test_a_stage_failure_after_a_streams_200_counts_as_a_server_error():
    from prometheus_client import generate_latest

    from rag.errors import StageError
    from rag.types import RequestRecord

    registry = CollectorRegistry()
    telemetry = Telemetry(TelemetrySettings(tracing=False, otlp="off"), registry=registry)
    scope = telemetry.start("/v1/query/stream")
    telemetry.finish(scope, 200, RequestRecord(error=StageError("generate_decode", RuntimeError("boom"))))
    text = generate_latest(registry).decode()
    assert 'ragheat_requests_total{route="/v1/query/stream",status_class="5xx"} 1.0' in text
    assert 'ragheat_stage_errors_total{stage="generate_decode"} 1.0' in text
