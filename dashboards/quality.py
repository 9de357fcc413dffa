"""The quality SLO's PromQL: its bad share, and the annotations that name the signal that moved.

An answer is bad when its verdict (``contract.ANSWER_QUALITY``'s ``verdict``, ``rag.quality.signals``) is one of
``contract.BAD``; ``unscored`` answers (no dense search to judge by) count on neither side, so the denominator is every
other verdict. A burn-rate alert of this SLO names, instead of a stage:

- ``verdict``: the bad verdict with the most answers per second over the alert's short window, and
  ``verdict_evidence`` its rate against all scored answers. ``no_good_passage`` points at the traffic or the index
  (questions the corpus does not cover, vectors that no longer match the query encoder), ``fell_back`` at the language
  model, ``unsupported`` at the written answers.
- ``drift``: the live median best similarity over the same window against the calibration's (the training questions'
  median, the calibration gauge's ``p50`` point) and the threshold under which an answer has no good passage.

Its burn-rate alerts also need ``MIN_SCORED`` scored answers in their short window (a service's first answers are too
few to burn anything). A budget is slow to spend on purpose: with 5 % of answers allowed bad, the fast page needs
72 % of them bad for an hour. **Drift** pages in minutes instead (``drift_rules``, alert ``RagheatQualityDrift``):
the median of a signal over ``DRIFT_LONG_S`` and over ``DRIFT_SHORT_S`` below its reference point of the calibration
gauge, with at least ``DRIFT_MIN_ANSWERS`` answers in the long window. Three signals are watched (``DRIFT_SIGNALS``):
the best similarity (questions the corpus does not cover, an index built by another encoder) and the retriever
agreement (a dense index whose vectors no longer match their chunks: its hits are real passage vectors close to the
query, so the similarity stays, but the dense list stops resembling BM25's), each against the calibration's ``P05``
point (more than half the answers score lower than all but one in twenty of the training questions); and a written
answer's support against its ``THRESHOLD`` point, ``quality.min_support`` (more than half the written answers are
unsupported: a worse model behind the model server). Training questions have no written answers to calibrate on; the
support check's own threshold is the reference.

Every query keeps the scrape job (``KEPT``), as ``dashboards.slo``'s do; each annotation query is a ``printf`` format
run for the alert's own job, its label values passed as arguments (``%q``) so the format holds no quotes.
"""

from __future__ import annotations

from dataclasses import dataclass

from dashboards import contract
from dashboards.spec import JOB
from telemetry.buckets import UNIT_SCORES

MINUTE = 60
DRIFT_LONG_S, DRIFT_SHORT_S = 10 * MINUTE, 5 * MINUTE
"""The drift alert's windows: the long one says the median moved, the short one that it is still there."""
DRIFT_MIN_ANSWERS = 20
"""Fewer answers than this in the long window say nothing about a median."""
@dataclass(frozen=True)
class DriftSignal:
    """A signal the drift alert watches: what its drift points at (the ``points_at`` annotation), the calibration
    gauge's point its median is compared with, what that point is and how the description says it, and a margin under
    the point: a histogram only places a median within its bucket, so a signal whose reference is a bucket's edge pages
    only once its median falls a bucket below it (answers right at the threshold are not under it)."""

    points_at: str
    point: str
    what: str
    than: str
    margin: float = 0.0


_FROM_TRAINING = f"what all but one in twenty training questions score (calibration {contract.P05})"
_NEARLY_ALL = "than the calibration's training questions nearly all did"
DRIFT_SIGNALS = {
    contract.BEST_SIMILARITY: DriftSignal(
        "questions the corpus does not cover, or an index built by another encoder than the one embedding the queries",
        contract.P05, _FROM_TRAINING, _NEARLY_ALL),
    contract.RETRIEVER_AGREEMENT: DriftSignal(
        "the dense list no longer resembles BM25's: a dense index whose vectors no longer match their chunks "
        "(shuffled, or from another generation)", contract.P05, _FROM_TRAINING, _NEARLY_ALL),
    contract.ANSWER_SUPPORT: DriftSignal(
        "the language model: its sentences no longer say what the passages they cite say (a worse or broken model "
        "behind the model server, a prompt it does not follow)", contract.THRESHOLD,
        "the least share of supported sentences a written answer needs (quality.min_support), less one bucket",
        "than a written answer needs to count as supported", margin=UNIT_SCORES[0]),
}
"""Signal -> how its drift is read."""

KEPT = JOB
BAD_MATCH = "|".join(contract.BAD)
"""The bad verdicts as one regular expression (``verdict=~``)."""
SCORED = f'verdict!="{contract.UNSCORED}"'
BAD = f'verdict=~"{BAD_MATCH}"'


MIN_SCORED = 20
"""Scored answers a burn-rate alert's short window must hold: a service's first answers, one or two of them bad, would
otherwise read as a whole window burning."""


def scored(window: str) -> str:
    """PromQL: scored answers over ``window``, per job."""
    return f"sum by ({KEPT}) (increase({contract.ANSWER_QUALITY}{{{SCORED}}}[{window}]))"


def error_ratio(window: str) -> str:
    """PromQL: the share of scored answers judged bad over ``window``, per job."""
    def rate(selector: str) -> str:
        return f"sum by ({KEPT}) (rate({contract.ANSWER_QUALITY}{{{selector}}}[{window}]))"

    # A service that has not yet judged an answer bad may lack those series: its bad rate is 0, not missing.
    return f"({rate(BAD)} or 0 * {rate(SCORED)}) / {rate(SCORED)}"


def _in_job(query_format: str, *args: str) -> str:
    """A Go template action header ranging over ``query_format`` run for the alert's job, then ``args``."""
    return f'{{{{ range query (printf "{query_format}" $labels.{KEPT}{"".join(f" {a}" for a in args)}) }}}}'


def _quoted(value: str) -> str:
    """A Go template string argument."""
    return f'"{value}"'


def verdict_query(window: str) -> str:
    """The bad verdict with the most answers per second in one job: a ``printf`` format (``%q``: the job, then the
    bad verdicts' regular expression)."""
    return f"topk(1, sum by (verdict) (rate({contract.ANSWER_QUALITY}{{{KEPT}=%q, verdict=~%q}}[{window}])) > 0)"


def _top_verdict(window: str) -> str:
    return _in_job(verdict_query(window), _quoted(BAD_MATCH))


def verdict_template(window: str) -> str:
    """Annotation text: the dominant bad verdict over ``window``, or ``none``."""
    return f"{_top_verdict(window)}{{{{ .Labels.verdict }}}}{{{{ else }}}}none{{{{ end }}}}"


def verdict_evidence_template(window: str) -> str:
    """Annotation sentence: the dominant bad verdict's answers per second against every scored answer's."""
    rate = '{{ .Value | printf "%.3g" }}'
    scored_query = f"sum by ({KEPT}) (rate({contract.ANSWER_QUALITY}{{{KEPT}=%q, verdict!=%q}}[{window}]))"
    scored = f"{_in_job(scored_query, _quoted(contract.UNSCORED))}{rate}{{{{ else }}}}n/a{{{{ end }}}}"
    found = (f"{{{{ .Labels.verdict }}}}: {rate} answers/s of {scored} scored over {window}, more than any other bad "
             "verdict")
    return f"{_top_verdict(window)}{found}{{{{ else }}}}no bad verdict over {window}{{{{ end }}}}"


def median_similarity_query(window: str) -> str:
    """The live median best similarity in one job (a ``printf`` format: the job, then the signal)."""
    bucket = contract.bucket(contract.QUALITY_SCORE)
    # NaN (no answer observed in the window) fails the comparison: the template then reads n/a.
    return f"histogram_quantile(0.5, sum by ({KEPT}, le) (rate({bucket}{{{KEPT}=%q, signal=%q}}[{window}]))) >= 0"


def calibration_query() -> str:
    """One point of the calibration in one job (a ``printf`` format: the job, the signal, the point)."""
    return f"max by ({KEPT}) ({contract.CALIBRATION}{{{KEPT}=%q, signal=%q, point=%q}})"


def drift_template(window: str) -> str:
    """Annotation sentence: the live median best similarity over ``window`` against the calibration's median, and the
    threshold under which an answer has no good passage (``n/a`` where a value is missing)."""
    similarity = _quoted(contract.BEST_SIMILARITY)
    shown = '{{ .Value | printf "%.2f" }}{{ else }}n/a{{ end }}'

    def point(name: str) -> str:
        return f"{_in_job(calibration_query(), similarity, _quoted(name))}{shown}"

    return (f"median {contract.BEST_SIMILARITY} {_in_job(median_similarity_query(window), similarity)}{shown} over "
            f"{window} against {point(contract.MEDIAN)} on the training questions (calibration {contract.MEDIAN}); "
            f"answers under {point(contract.THRESHOLD)} have no good passage")


def median_expr(signal: str, window: str) -> str:
    """PromQL: the median of a unit-interval signal over ``window``, per job."""
    bucket = contract.bucket(contract.QUALITY_SCORE)
    return f'histogram_quantile(0.5, sum by ({KEPT}, le) (rate({bucket}{{signal="{signal}"}}[{window}])))'


def drift_expr(signal: str, long: str, short: str) -> str:
    """PromQL of the drift alert of ``signal`` (see the module): per job, the long window's median where it fires."""
    drift = DRIFT_SIGNALS[signal]
    reference = f'max by ({KEPT}) ({contract.CALIBRATION}{{signal="{signal}", point="{drift.point}"}})'
    if drift.margin:
        reference = f"({reference} - {drift.margin:g})"
    answers = f'sum by ({KEPT}) (increase({contract.count(contract.QUALITY_SCORE)}{{signal="{signal}"}}[{long}]))'
    return (f"{median_expr(signal, long)} < on ({KEPT}) {reference}\n"
            f"and on ({KEPT}) {median_expr(signal, short)} < on ({KEPT}) {reference}\n"
            f"and on ({KEPT}) {answers} >= {DRIFT_MIN_ANSWERS}")


DRIFT_ALERT = "RagheatQualityDrift"


def drift_rules(profile) -> dict:
    """The rule group of the drift alerts (``dashboards.slo.Profile`` divides their windows)."""
    long, short = profile.window(DRIFT_LONG_S), profile.window(DRIFT_SHORT_S)
    shown = '{{ .Value | printf "%.2f" }}{{ else }}n/a{{ end }}'

    def rule(signal: str, drift: DriftSignal) -> dict:
        point = f"{_in_job(calibration_query(), _quoted(signal), _quoted(drift.point))}{shown}"
        return {
            "alert": DRIFT_ALERT,
            "expr": drift_expr(signal, long, short),
            "labels": {"severity": "page", "slo": "quality", "signal": signal},
            "annotations": {
                "summary": f"{{{{ with $labels.{KEPT} }}}}{{{{ . }}}}: {{{{ end }}}}answers drifted: median {signal} "
                           f"{{{{ $value | printf \"%.2f\" }}}} over {long} and {short}, under {point}, {drift.what}",
                "description": f"More than half the answers score lower on {signal} {drift.than}. It points at: "
                               f"{drift.points_at}.",
                "signal": signal,
                "points_at": drift.points_at,
            },
        }

    return {"name": "ragheat-quality-drift", "rules": [rule(s, drift) for s, drift in DRIFT_SIGNALS.items()]}
