"""N API replicas make one SLO, not N: the committed recording and alert rules sum over the ``replica`` and
``instance`` labels, so the burn-rate alerts fire once for the service, with the same labels and numbers as one
process serving all the traffic. Checked by ``promtool test rules`` on the burn scenarios of
tests/dashboards/test_slo_rules.py, their traffic split between two scraped replicas."""

from __future__ import annotations

import re
import sys

import pytest

from tests.dashboards.test_slo_rules import H, SCENARIOS, fires, promtool_test, quiet

REPLICAS = ({"instance": "10.0.0.2:8000", "replica": "10.0.0.2:8000"},
            {"instance": "10.0.0.3:8000", "replica": "10.0.0.3:8000"})


def split_between_replicas(series: list[dict]) -> list[dict]:
    """Each counter series as two replicas' series whose sum is the original at every sample (the first takes
    the floor of half the count, the second the rest: both stay monotonic, as counters must)."""
    out = []
    for s in series:
        values = [int(v) for v in s["values"].split()]
        halves = ([v // 2 for v in values], [v - v // 2 for v in values])
        for labels, part in zip(REPLICAS, halves):
            extra = ", ".join(f'{k}="{v}"' for k, v in labels.items())
            series_name = s["series"]
            name = re.sub(r"}$", f", {extra}}}", series_name) if series_name.endswith("}") else f"{series_name}{{{extra}}}"
            out.append({"series": name, "values": " ".join(map(str, part))})
    return out


BURNS = ["fast latency burn pages within 10 minutes, naming the stage",
         "availability fast burn pages, naming the failing stage", "healthy service stays quiet"]


@pytest.mark.parametrize("scenario", BURNS)
def test_two_replicas_page_once_like_one_process(scenario, tmp_path):
    series, alert_tests = SCENARIOS[scenario]
    split = split_between_replicas(series)
    assert len(split) == 2 * len(series)
    # promtool compares the whole list of firing alerts: a per-replica alert would be a second, unexpected one.
    result = promtool_test(tmp_path, scenario, split, alert_tests)
    assert result.returncode == 0, f"{scenario}:\n{result.stdout}{result.stderr}"


def test_rules_that_kept_the_replica_apart_would_page_twice(tmp_path, monkeypatch):
    """The test above can fail: the same rules grouping by ``instance`` fire once per replica."""
    kit = sys.modules[promtool_test.__module__]  # the module whose RULES promtool_test copies

    rules = tmp_path / "per-instance.yml"
    text = kit.RULES.read_text()
    rules.write_text(text.replace("sum by (job) (rate(", "sum by (job, instance) (rate("))
    assert rules.read_text() != text
    monkeypatch.setattr(kit, "RULES", rules)
    (tmp_path / "run").mkdir()
    series, _ = SCENARIOS[BURNS[0]]
    result = promtool_test(tmp_path / "run", BURNS[0], split_between_replicas(series),
                           [*quiet("latency", H - 1), fires("latency", H + 10, "fuse", **_fast_and_slow())])
    assert result.returncode != 0
    assert "instance" in result.stdout + result.stderr


def _fast_and_slow() -> dict:
    from tests.dashboards.test_slo_rules import OVER

    return {"fast": OVER.format(stage="fuse", rate="10", window="5m"),
            "slow": OVER.format(stage="fuse", rate="0.278", window="6h")}
