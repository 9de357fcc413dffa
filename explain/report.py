"""An explanation for a person (one line first, then the ranked causes and the stages) or as JSON."""

from __future__ import annotations

import dataclasses
import math

from explain.causes import Explanation


def _number(value: float) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 3)


def as_json(explanation: Explanation) -> dict:
    """Every field of the explanation; NaN and infinity become null."""
    total = sum(c.ms for c in explanation.causes)
    return {
        "verdict": explanation.verdict, "headline": explanation.headline, "job": explanation.job,
        "window_s": explanation.window_s, "baseline_s": explanation.baseline_s,
        "baseline_gap_s": explanation.baseline_gap_s,
        "p99_ms": _number(explanation.p99_ms), "baseline_p99_ms": _number(explanation.baseline_p99_ms),
        "causes": [{**dataclasses.asdict(c), "ms": _number(c.ms), "share": _number(c.ms / total) if total else None,
                    "stages": list(c.stages)} for c in explanation.causes],
        "stages": [{"stage": s.stage, "before_p99_ms": _number(s.before_p99_ms), "now_p99_ms": _number(s.now_p99_ms),
                    "before_ms_per_request": _number(s.before_ms_per_request),
                    "now_ms_per_request": _number(s.now_ms_per_request), "growth_ms": _number(s.growth_ms)}
                   for s in explanation.stages],
        "slowest_traces": [{"seconds": _number(v), "trace_id": t} for v, t in explanation.slowest_traces],
    }


def render(explanation: Explanation, console) -> None:
    """The headline, then (when something is wrong) the ranked causes with their evidence, the stages and the
    slowest requests' trace ids, on a rich ``console``."""
    from rich.table import Table

    colour = {"ok": "green", "slower": "red", "no_data": "yellow"}[explanation.verdict]
    console.print(f"[bold {colour}]{explanation.headline}[/]", highlight=False)
    if explanation.verdict != "slower":
        return
    total = sum(c.ms for c in explanation.causes) or 1.0
    causes = Table("#", "cause", "ms of stage P99 growth", "share", "evidence", title="causes, most likely first")
    for rank, cause in enumerate(explanation.causes, 1):
        causes.add_row(str(rank), cause.kind, f"{cause.ms:.1f}", f"{cause.ms / total:.0%}",
                       "\n".join([cause.headline, *cause.evidence]))
    console.print(causes)
    stages = Table("stage", "P99 before", "P99 now", "ms/request before", "ms/request now", title="stages")
    for s in explanation.stages:
        stages.add_row(s.stage, *(("-" if not math.isfinite(v) else f"{v:.1f}") for v in (
            s.before_p99_ms, s.now_p99_ms, s.before_ms_per_request, s.now_ms_per_request)))
    console.print(stages)
    if explanation.slowest_traces:
        console.print("slowest requests' traces: " + ", ".join(
            f"{t} ({v * 1e3:.0f} ms)" for v, t in explanation.slowest_traces), highlight=False)
