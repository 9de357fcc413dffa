"""The quality SLO's drill (loadgen/quality_drill.py) against real ``ragheat serve`` processes, a real Prometheus
evaluating the test-profile rules (every window divided by 60) and steady load over loopback: index generations
whose dense vectors come from another space or were shuffled among their chunks, and out-of-domain questions, each
page for quality within what stands for minutes, naming what moved (the drift alert its signal; a budget burning from
the first answer, its verdict); the service's own questions page nobody, and no latency page ever fires."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dashboards import quality, render, slo
from index_copy import copy_index
from loadgen.quality_drill import BREAKERS, HEALTHY, OUT_OF_DOMAIN, run_drill
from telemetry.metrics import QUALITY_METRICS

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # detection times, on the machine's two cores

OTHER_QUESTIONS = Path(__file__).resolve().parents[2] / "datasets" / "hotpotqa-dev" / "queries.jsonl"
DRIFT_LONG_S = quality.DRIFT_LONG_S // slo.TEST.divisor
FAST_LONG_S = next(a for a in slo.BURN_ALERTS if a.speed == "fast").long_s // slo.TEST.divisor
FIRE_BY_S = 4 * DRIFT_LONG_S  # a fault that is every answer moves both drift windows' medians within one long window
MOVED = {"another_encoder": "best_similarity", "shuffled_vectors": "retriever_agreement",
         OUT_OF_DOMAIN: "best_similarity"}


@pytest.fixture(scope="module")
def drill(subset_index, scifact_subset, tmp_path_factory):
    folder = tmp_path_factory.mktemp("quality-drill")
    render.write(folder / "rules", slo.TEST)
    broken = {}
    for fault, breaks in BREAKERS.items():
        broken[fault] = copy_index(subset_index, folder / fault)
        breaks(broken[fault])
    env = {**os.environ, "RAGHEAT_GRAPH__ENABLED": "false"}  # plain questions: no graph store to start thrice
    return run_drill(subset_index, broken, scifact_subset / "queries.jsonl", OTHER_QUESTIONS,
                     folder / "rules" / render.RULES_FILE,
                     quality_alerts=[quality.DRIFT_ALERT, slo.alert_name(slo.QUALITY)],
                     latency_alert=slo.alert_name(slo.LATENCY), verdict_family=QUALITY_METRICS["answer_quality"],
                     healthy_s=FAST_LONG_S + 5, fire_by_s=FIRE_BY_S, env=env)


def test_the_services_own_questions_page_nobody(drill):
    assert drill.before == [], drill.before
    assert drill.verdicts[HEALTHY]["good"] > 0, drill.verdicts


@pytest.mark.parametrize("fault", [*BREAKERS, OUT_OF_DOMAIN])
def test_each_fault_pages_for_quality_naming_what_moved(drill, fault):
    seconds = drill.fired_after_s[fault]
    assert seconds is not None and seconds <= FIRE_BY_S, (fault, drill.fired_after_s, drill.by_alert_s)
    alert = drill.alerts[fault]
    labels = alert["labels"]
    assert labels["job"] == (HEALTHY if fault == OUT_OF_DOMAIN else fault), alert
    if labels["alertname"] == quality.DRIFT_ALERT:
        assert labels["signal"] == MOVED[fault], alert
    else:  # a generation bad from its first answer has no healthy history: its budget burns as fast as it drifts
        assert labels["alertname"] == slo.alert_name(slo.QUALITY) and fault != "shuffled_vectors", alert
        assert alert["annotations"]["verdict"] == "no_good_passage", alert


def test_answers_another_encoders_index_serves_have_no_good_passage(drill):
    verdicts = drill.verdicts["another_encoder"]
    assert verdicts["no_good_passage"] > verdicts["good"], drill.verdicts


def test_the_latency_slo_stays_green_throughout(drill):
    assert drill.latency_pages == [], drill.latency_pages
