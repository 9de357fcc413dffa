"""Exemplars shared between the workers of ``serve --workers N`` (telemetry/exemplars.py): the latest per bucket,
whichever worker saw it, attached to the summed histogram's bucket samples and written out as OpenMetrics."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.openmetrics.exposition import generate_latest

from telemetry.exemplars import ExemplarShare, WithExemplars, read_exemplars

BOUNDS = (0.01, 0.1, float("inf"))


class Summed:
    """What MultiProcessCollector yields for one histogram: cumulative buckets with le labels."""

    def collect(self):
        family = HistogramMetricFamily("h_seconds", "a histogram", labels=["stage"])
        family.add_metric(["embed"], [("0.01", 2), ("0.1", 2), ("+Inf", 3)], 5.02)
        yield family


def test_the_latest_exemplar_per_bucket_across_workers_reaches_the_scrape(tmp_path):
    first, second = ExemplarShare(tmp_path, interval_s=60, pid=101), ExemplarShare(tmp_path, interval_s=60, pid=102)
    try:
        first.record("h_seconds", {"stage": "embed"}, BOUNDS, 0.005, "aa" * 16)
        first.flush()
        second.record("h_seconds", {"stage": "embed"}, BOUNDS, 0.007, "bb" * 16)  # later, same bucket: it wins
        second.record("h_seconds", {"stage": "embed"}, BOUNDS, 5.0, "cc" * 16)  # above the last bound: +Inf
        second.flush()
        registry = CollectorRegistry()
        registry.register(WithExemplars(Summed(), tmp_path))
        family = next(iter(registry.collect()))
        exemplars = {s.labels["le"]: s.exemplar for s in family.samples if s.name == "h_seconds_bucket"}
        assert exemplars["0.01"].labels == {"trace_id": "bb" * 16} and exemplars["0.01"].value == 0.007
        assert exemplars["0.1"] is None
        assert exemplars["+Inf"].labels == {"trace_id": "cc" * 16}
        text = generate_latest(registry).decode()
        assert f'h_seconds_bucket{{le="0.01",stage="embed"}} 2.0 # {{trace_id="{"bb" * 16}"}} 0.007' in text, text
    finally:
        first.close()
        second.close()


def test_a_worker_writes_only_when_something_changed_and_never_half_a_file(tmp_path):
    share = ExemplarShare(tmp_path, interval_s=60, pid=7)
    try:
        share.flush()
        assert list(tmp_path.iterdir()) == []  # nothing observed: nothing written
        share.record("h_seconds", {}, BOUNDS, 0.05, "dd" * 16)
        share.flush()
        written = json.loads((tmp_path / "exemplars_7.json").read_text())
        assert list(written) == ['h_seconds_bucket[["le","0.1"]]'] and written['h_seconds_bucket[["le","0.1"]]'][0] == "dd" * 16
        assert not list(tmp_path.glob("*.tmp"))
    finally:
        share.close()
