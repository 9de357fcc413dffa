"""The quality SLO's drill (loadgen/quality_drill.py) against real ``ragheat serve`` processes, a real Prometheus
evaluating the test-profile rules (every window divided by 60) and steady load over loopback: after a healthy
stretch that pages nobody, index generations whose dense vectors come from another space or were shuffled among their
chunks are published into two services' index folders (hot-swapped), the third's questions turn to another corpus,
and a fourth, answering extractively, is redeployed to write its answers with the shared vLLM server's random-weight
model; each fault pages for quality within what stands for minutes, first by the drift alert naming the signal that
moved, and no latency page ever fires (the tiny model writes an answer in well under the SLO)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dashboards import quality, render, slo
from index_copy import copy_index
from loadgen.quality_drill import BREAKERS, HEALTHY, OUT_OF_DOMAIN, RANDOM_MODEL, run_drill, written_answers_env
from telemetry.metrics import QUALITY_METRICS

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # detection times, on the machine's two cores

OTHER_QUESTIONS = Path(__file__).resolve().parents[2] / "datasets" / "hotpotqa-dev" / "queries.jsonl"
DRIFT_LONG_S = quality.DRIFT_LONG_S // slo.TEST.divisor
FAST_LONG_S = next(a for a in slo.BURN_ALERTS if a.speed == "fast").long_s // slo.TEST.divisor
FIRE_BY_S = 4 * DRIFT_LONG_S  # a fault that is every answer moves both drift windows' medians within one long window
MOVED = {"another_encoder": {"best_similarity", "retriever_agreement"}, "shuffled_vectors": {"retriever_agreement"},
         OUT_OF_DOMAIN: {"best_similarity", "retriever_agreement"}, RANDOM_MODEL: {"answer_support"}}
"""The signals each fault moves: shuffled vectors leave the best similarity where it was; a worse model moves only
what it writes."""
FAULTS = [*BREAKERS, OUT_OF_DOMAIN, RANDOM_MODEL]


@pytest.fixture(scope="module")
def drill(subset_index, scifact_subset, vllm_server, tmp_path_factory):
    folder = tmp_path_factory.mktemp("quality-drill")
    render.write(folder / "rules", slo.TEST)
    broken = {fault: copy_index(subset_index, folder / fault) for fault in BREAKERS}  # healthy until published
    # Plain questions: no graph store to start four times; a broken generation is served a second after it is published.
    env = {**os.environ, "RAGHEAT_GRAPH__ENABLED": "false", "RAGHEAT_SERVER__RELOAD_POLL_S": "1"}
    written = {**env, **written_answers_env(vllm_server.url)}  # the shared server's context is 512 tokens
    return run_drill(subset_index, broken, scifact_subset / "queries.jsonl", OTHER_QUESTIONS,
                     folder / "rules" / render.RULES_FILE,
                     quality_alerts=[quality.DRIFT_ALERT, slo.alert_name(slo.QUALITY)],
                     latency_alert=slo.alert_name(slo.LATENCY), verdict_family=QUALITY_METRICS["answer_quality"],
                     redeploys={RANDOM_MODEL: written}, healthy_s=FAST_LONG_S + 5, fire_by_s=FIRE_BY_S, env=env)


def test_the_healthy_stretch_pages_nobody(drill):
    assert drill.before == [], drill.before
    assert all(verdicts["good"] > 0 for verdicts in drill.healthy_verdicts.values()), drill.healthy_verdicts


@pytest.mark.parametrize("fault", FAULTS)
def test_each_fault_pages_for_quality_naming_what_moved(drill, fault):
    seconds = drill.fired_after_s[fault]
    assert seconds is not None and seconds <= FIRE_BY_S, (fault, drill.fired_after_s, drill.by_alert_s)
    alert = drill.alerts[fault]
    labels = alert["labels"]
    assert labels["job"] == (HEALTHY if fault == OUT_OF_DOMAIN else fault), alert
    # After a healthy past a budget burns over its long window; a median drifts within its short one.
    assert labels["alertname"] == quality.DRIFT_ALERT and labels["signal"] in MOVED[fault], alert
    paged = {key for key in drill.by_alert_s[fault] if key.startswith(quality.DRIFT_ALERT)}
    assert paged <= {f"{quality.DRIFT_ALERT}{{{signal}}}" for signal in MOVED[fault]}, drill.by_alert_s


def test_answers_another_encoders_index_serves_have_no_good_passage(drill):
    verdicts = drill.fault_verdicts("another_encoder")  # the answers before its reload poll swapped are good
    assert verdicts["no_good_passage"] > verdicts["good"], verdicts


def test_every_answer_the_random_weight_model_writes_is_bad(drill):
    verdicts = drill.fault_verdicts(RANDOM_MODEL)  # its new process's answers only
    retrieved_well = sum(verdicts.values()) - verdicts["no_good_passage"] - verdicts["unscored"]
    assert verdicts["good"] == 0 and verdicts["fell_back"] + verdicts["unsupported"] == retrieved_well > 0, verdicts
    assert drill.healthy_verdicts[RANDOM_MODEL]["fell_back"] == 0, drill.healthy_verdicts  # extractive before


def test_the_latency_slo_stays_green_throughout(drill):
    assert drill.latency_pages == [], drill.latency_pages
