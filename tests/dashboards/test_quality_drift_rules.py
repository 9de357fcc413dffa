"""The quality drift alert (``dashboards.quality.drift_rules``), unit-tested by ``promtool test rules`` on synthetic
series of one job: a signal's histogram as the service exports it (``ragheat_quality_score``) and the calibration
gauge. The alert pages when more than half the answers score under the signal's reference point over both of its
windows (the calibration's 5th percentile; for a written answer's support, the least supported share it needs), with
enough answers; not before, not on a few answers, not on another signal."""

from __future__ import annotations

import pytest
from prometheus_client.utils import floatToGoString

from dashboards import contract, quality
from telemetry.buckets import UNIT_SCORES
from tests.dashboards.promtool_kit import promtool_test

JOB = "ragheat"
PER_MINUTE = 600  # answers a minute (10/s), each observing every signal
REFERENCE = {contract.BEST_SIMILARITY: 0.47, contract.RETRIEVER_AGREEMENT: 0.1, contract.ANSWER_SUPPORT: 0.5}
NORMAL = {contract.BEST_SIMILARITY: 0.62, contract.RETRIEVER_AGREEMENT: 0.4, contract.ANSWER_SUPPORT: 1.0}
DRIFTED = {contract.BEST_SIMILARITY: 0.22, contract.RETRIEVER_AGREEMENT: 0.0, contract.ANSWER_SUPPORT: 0.0}
HEALTHY = 30  # minutes of normal answers before the fault
FROM_TRAINING = "what all but one in twenty training questions score (calibration p05)"
WHAT = {contract.BEST_SIMILARITY: FROM_TRAINING, contract.RETRIEVER_AGREEMENT: FROM_TRAINING,
        contract.ANSWER_SUPPORT: "the least share of supported sentences a written answer needs (quality.min_support), "
                                 "less one bucket"}
NEARLY_ALL = "than the calibration's training questions nearly all did"
THAN = {contract.BEST_SIMILARITY: NEARLY_ALL, contract.RETRIEVER_AGREEMENT: NEARLY_ALL,
        contract.ANSWER_SUPPORT: "than a written answer needs to count as supported"}


def histogram(signal: str, phases: list[tuple[int, float, int]]) -> list[dict]:
    """promtool series of one signal: ``phases`` of (minutes, the value every answer scores, answers a minute)."""
    edges = [floatToGoString(e) for e in UNIT_SCORES] + ["+Inf"]
    series = {le: ["0"] for le in edges}
    count, total = ["0"], 0
    running = dict.fromkeys(edges, 0)
    for minutes, value, answers in phases:
        for _ in range(minutes):
            for le in edges:
                running[le] += answers if float(le) >= value - 1e-9 else 0
                series[le].append(str(running[le]))
            total += answers
            count.append(str(total))
    selector = f'job="{JOB}", signal="{signal}"'
    minutes = sum(p[0] for p in phases)
    return [*({"series": f'{contract.bucket(contract.QUALITY_SCORE)}{{{selector}, le="{le}"}}', "values": " ".join(v)}
              for le, v in series.items()),
            {"series": f"{contract.count(contract.QUALITY_SCORE)}{{{selector}}}", "values": " ".join(count)},
            {"series": f'{contract.CALIBRATION}{{{selector}, point="{quality.DRIFT_SIGNALS[signal].point}"}}',
             "values": f"{REFERENCE[signal]}+0x{minutes}"}]


def fires(minute: int, *signals: str) -> dict:
    return {"eval_time": f"{minute}m", "alertname": quality.DRIFT_ALERT, "exp_alerts": [
        {"exp_labels": {"severity": "page", "slo": "quality", "signal": s, "job": JOB},
         "exp_annotations": {"signal": s, "points_at": quality.DRIFT_SIGNALS[s].points_at,
                             "summary": f"{JOB}: answers drifted: median {s} {{median}} over 10m and 5m, under "
                                        f"{REFERENCE[s]:.2f}, {WHAT[s]}",
                             "description": f"More than half the answers score lower on {s} {THAN[s]}. It points at: "
                                            f"{quality.DRIFT_SIGNALS[s].points_at}."}}
        for s in signals]}


def with_median(test: dict, medians: dict[str, str]) -> dict:
    for alert in test["exp_alerts"]:
        alert["exp_annotations"]["summary"] = alert["exp_annotations"]["summary"].format(
            median=medians[alert["exp_labels"]["signal"]])
    return test


def series(drifting: str | None, answers: int = PER_MINUTE, fault_minutes: int = 20,
           normal: dict[str, float] = NORMAL) -> list[dict]:
    return [*(s for signal in (contract.BEST_SIMILARITY, contract.RETRIEVER_AGREEMENT, contract.ANSWER_SUPPORT)
              for s in histogram(signal, [(HEALTHY, normal[signal], answers),
                                          (fault_minutes, DRIFTED[signal] if signal == drifting else normal[signal],
                                           answers)]))]


# A value v scored by every answer sits in its bucket (lower, upper]; with a share s > 1/2 of the window's answers
# there, the median interpolates to lower + 0.05 / (2 s). From the fault, the 10 m window is past half after 5
# minutes, the 5 m one after 2.5: the page fires at fault + 6 (s = 0.6 over 10 m: 0.2 + 0.0417 for the similarity,
# 0 + 0.0417 for the agreement) and not at fault + 4; at fault + 19 (s = 1) the similarity's median is 0.225.
SCENARIOS = {
    "questions the corpus does not cover: the similarity drifts": (
        series(contract.BEST_SIMILARITY),
        [fires(HEALTHY - 1), fires(HEALTHY + 4),
         with_median(fires(HEALTHY + 6, contract.BEST_SIMILARITY), {contract.BEST_SIMILARITY: "0.24"}),
         with_median(fires(HEALTHY + 19, contract.BEST_SIMILARITY), {contract.BEST_SIMILARITY: "0.23"})]),
    "shuffled vectors: the agreement drifts, the similarity does not": (
        series(contract.RETRIEVER_AGREEMENT),
        [fires(HEALTHY + 4),
         with_median(fires(HEALTHY + 6, contract.RETRIEVER_AGREEMENT), {contract.RETRIEVER_AGREEMENT: "0.04"})]),
    "a worse model writes the answers: their support drifts, the retrieval's does not": (
        series(contract.ANSWER_SUPPORT),
        [fires(HEALTHY + 4),
         with_median(fires(HEALTHY + 6, contract.ANSWER_SUPPORT), {contract.ANSWER_SUPPORT: "0.04"})]),
    "written answers right at the threshold (half their sentences supported) are not under it": (
        series(None, normal={**NORMAL, contract.ANSWER_SUPPORT: 0.5}),
        [fires(HEALTHY + 10), fires(HEALTHY + 19)]),
    "too few answers to read a median": (
        series(contract.BEST_SIMILARITY, answers=1),
        [fires(HEALTHY + 10)]),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_promtool_unit_tests_of_the_drift_alert(scenario, tmp_path):
    input_series, alert_tests = SCENARIOS[scenario]
    result = promtool_test(tmp_path, scenario, input_series, alert_tests)
    assert result.returncode == 0, f"{scenario}:\n{result.stdout}{result.stderr}"
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_of_the_drift_alert_can_fail(tmp_path):
    """A drift that the alert is expected to miss fails the run: the scenarios above could not pass by accident."""
    input_series, _ = SCENARIOS["questions the corpus does not cover: the similarity drifts"]
    result = promtool_test(tmp_path, "wrong", input_series, [fires(HEALTHY + 10)])
    assert result.returncode != 0 and "signal=\"best_similarity\"" in result.stdout + result.stderr
