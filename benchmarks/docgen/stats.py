"""Honest figures for the benchmarks doc: numbers as text, one Markdown table, medians with their spread across
rounds, paired comparisons, and sentences that say so when the spread is larger than the effect reported.

Every function takes measured values (from a results file) and returns text; nothing here holds a figure.
"""

from __future__ import annotations

import math
import statistics
from typing import Callable, Mapping, Sequence

MINUS = "\u2212"


def num(value: float, digits: int = 2) -> str:
    """``1234.5`` -> ``1,234.50``; a negative sign is a real minus."""
    text = f"{value:,.{digits}f}"
    return MINUS + text[1:] if text.startswith("-") else text


def opt(value: float | None, digits: int = 2) -> str:
    """:func:`num`, or ``–`` where nothing was measured."""
    return "–" if value is None else num(value, digits)


def count(value: float) -> str:
    return f"{int(round(value)):,}"


def signed(value: float, digits: int = 2) -> str:
    """``+0.19`` / ``−0.02`` (zero is ``+0.00``)."""
    return (MINUS if value < 0 and round(abs(value), digits) > 0 else "+") + num(abs(value), digits)


def pct(value: float, digits: int = 1) -> str:
    return f"{num(value, digits)} %"


def duration(seconds: float) -> str:
    """``160.8`` -> ``2 min 41 s``; under a minute ``48.2 s``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def knee_rate(value: float | None, none: str = "none", unit: str = "") -> str:
    """A knee (an offered rate), or ``none`` where no rate met the SLO."""
    return none if value is None else f"{value:g}{unit}"


def bold(text: str) -> str:
    return f"**{text}**"


def table(header: Sequence[str], rows: Sequence[Sequence[object]], align: str = "", title: str = "") -> str:
    """The one way this doc draws a table: a header, rows of cells (``str()`` of each) and ``align``, one letter per
    column (``r`` right, anything else left); ``title``, a paragraph above it."""
    marks = ["---:" if align[i:i + 1] == "r" else "---" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(marks) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return (f"{title}\n\n" if title else "") + "\n".join(lines)


def blocks(*parts: str) -> str:
    """Paragraphs (and tables) one blank line apart; an empty part is left out."""
    return "\n\n".join(p for p in parts if p)


def join_words(items: Sequence[str]) -> str:
    items = list(items)
    return "".join(items) if len(items) <= 1 else ", ".join(items[:-1]) + " and " + items[-1]


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def spread(values: Sequence[float]) -> tuple[float, float]:
    """(min, max) across rounds."""
    return float(min(values)), float(max(values))


def with_range(values: Sequence[float], fmt: Callable[[float], str] = num) -> str:
    """``median (min–max)`` across rounds; one round prints its value alone."""
    if len(values) == 1:
        return fmt(values[0])
    low, high = spread(values)
    return f"{fmt(median(values))} ({fmt(low)}–{fmt(high)})"


def paired_ratios(treated: Sequence[float], control: Sequence[float]) -> list[float]:
    """Each round's treated / control, rounds paired in order (the control measured beside the treated)."""
    if len(treated) != len(control):
        raise ValueError(f"paired rounds differ in number: {len(treated)} vs {len(control)}")
    return [t / c for t, c in zip(treated, control)]


def noise_verdict(per_round: Sequence[float], what: str, fmt: Callable[[float], str] = pct) -> str:
    """One sentence on an effect measured once per round (a throughput loss, a latency difference): whether the
    rounds agree on its sign (if not, only a bound can be read), and whether their spread is larger than it."""
    values = list(per_round)
    if not values:
        raise ValueError(f"{what}: no rounds")
    mid, (low, high), n = median(values), spread(values), len(values)
    if n == 1:
        return f"{what}: {fmt(mid)} in the only round measured, so there is no spread to judge it by."
    if low < 0 < high:
        return (f"{what}: the {n} rounds disagree on its sign ({fmt(low)} to {fmt(high)}, median {fmt(mid)}), "
                f"so it is within this machine's noise: this run shows it is smaller than about "
                f"{fmt(max(abs(low), abs(high)))}, not what it is.")
    if high - low > abs(mid):
        return (f"{what}: median {fmt(mid)}, but single rounds range from {fmt(low)} to {fmt(high)}; the spread "
                f"across the {n} rounds is larger than the effect, so the median is a rough figure.")
    return f"{what}: {fmt(mid)} (every one of the {n} rounds between {fmt(low)} and {fmt(high)})."


def paired_difference(a: Mapping[str, float], b: Mapping[str, float]) -> dict:
    """Mean of a - b over the keys both have (queries scored both ways), its standard error and whether it is
    larger than twice that (a rough 95 % test on paired per-query scores)."""
    keys = sorted(set(a) & set(b))
    if len(keys) < 2:
        raise ValueError("a paired difference needs at least two shared keys")
    diffs = [a[k] - b[k] for k in keys]
    mean, se = statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs))
    return {"mean": mean, "se": se, "n": len(diffs), "significant": abs(mean) > 2 * se}


def difference_verdict(diff: dict, a_name: str, b_name: str, digits: int = 4) -> str:
    """``a`` vs ``b`` in one sentence from :func:`paired_difference`."""
    mean, se = diff["mean"], diff["se"]
    if not diff["significant"]:
        return (f"{a_name} and {b_name} differ by {signed(mean, digits)} nDCG@10 over {diff['n']:,} queries, within "
                f"twice its standard error ({num(2 * se, digits)}): no difference this data can show")
    return (f"{a_name} is {'ahead of' if mean > 0 else 'behind'} {b_name} by {num(abs(mean), digits)} nDCG@10 over "
            f"{diff['n']:,} queries, more than twice its standard error ({num(2 * se, digits)})")


def times(reference: float, value: float) -> str:
    """How ``value`` (a time) compares with ``reference``: ``2.1× faster`` or ``1.4× slower``."""
    if value <= 0 or reference <= 0:
        raise ValueError("times compares positive durations")
    ratio = reference / value
    if round(ratio, 1) == 1.0:
        return "about as fast (×1.0)"
    return f"{ratio:.1f}× faster" if ratio > 1 else f"{1 / ratio:.1f}× slower"


def compare(a: float, b: float, higher: str, lower: str, same: str = "matches") -> str:
    """A verb for ``a`` against ``b``: ``higher`` when a > b, ``lower`` when a < b."""
    return higher if a > b else lower if a < b else same
