"""Plots for the benchmarks page, written as SVG text by hand: the same results always give the same bytes, so the
committed image is checked against its rendering like the page (benchmarks/render_docs.py)."""

from __future__ import annotations

import math
from html import escape
from typing import Callable, Sequence

from .scale import growth_measures, growth_sizes, loglog_slope
from .stats import count

SVG_NAMESPACE = "http://www.w3.org/2000/svg"
PANEL_W, PANEL_H, COLUMNS = 250, 170, 4
LEFT, RIGHT, TOP, BOTTOM = 46, 12, 34, 30  # margins inside a panel: the axes' labels, the title
TITLE_PX, SLOPE_PX, TICK_PX, CAPTION_PX = 11, 10, 9, 11
FOOT = CAPTION_PX * 5  # the caption's two lines under the panels
INK, GRID, CODED = "black", "gainsboro", "firebrick"
THIN, LINE = 0.8, 1.5  # stroke widths: the frame, the curves
DOT, RING = 3, 4  # radii: a corpus stored like the smallest, one stored otherwise


def _attributes(**attributes) -> str:
    """SVG attributes: ``font_size`` is written ``font-size``, numbers with ``:g``, a tuple of numbers spaced."""
    def value(v) -> str:
        return " ".join(f"{x:g}" for x in v) if isinstance(v, tuple) else f"{v:g}" if isinstance(v, (int, float)) else v

    return " ".join(f'{k.replace("_", "-")}="{value(v)}"' for k, v in attributes.items())


def _el(tag: str, body: str | None = None, **attributes) -> str:
    """An SVG element (``_attributes``), its text escaped."""
    written = _attributes(**attributes)
    return f"<{tag} {written}/>" if body is None else f"<{tag} {written}>{escape(body, quote=False)}</{tag}>"


def _log_ticks(low: float, high: float) -> list[float]:
    """Powers of ten (and their 2 and 5 multiples on a short axis) within [low, high]."""
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    steps = (1, 2, 5) if last - first <= 2 else (1,)
    ticks = [m * 10 ** e for e in range(first, last + 1) for m in steps]
    return [t for t in ticks if low <= t <= high] or [low, high]


def _label(value: float) -> str:
    for size, suffix in ((1e6, "M"), (1e3, "k")):
        if value >= size:
            return f"{value / size:g}{suffix}"
    return f"{value:g}"


def _panel(x0: float, y0: float, title: str, points: list[tuple[float, float]], coded: list[tuple[float, float]],
           slope: float | None) -> list[str]:
    """One log-log panel: the corpora stored alike joined by a line, the others as hollow marks."""
    every = points + coded
    xs, ys = [p[0] for p in every], [p[1] for p in every]
    x_low, x_high = min(xs) / 1.5, max(xs) * 1.5
    y_low, y_high = min(ys) / 1.6, max(ys) * 1.6
    width, height = PANEL_W - LEFT - RIGHT, PANEL_H - TOP - BOTTOM
    left, top = x0 + LEFT, y0 + TOP

    def at(x: float, y: float) -> tuple[float, float]:
        fx = (math.log(x) - math.log(x_low)) / (math.log(x_high) - math.log(x_low))
        fy = (math.log(y) - math.log(y_low)) / (math.log(y_high) - math.log(y_low))
        return round(left + fx * width, 1), round(top + (1 - fy) * height, 1)

    middle = left + width / 2
    out = [_el("text", title, x=middle, y=y0 + TITLE_PX + 2, text_anchor="middle", font_size=TITLE_PX),
           _el("text", "" if slope is None else f"log-log slope {slope:.2f}", x=middle,
               y=y0 + TITLE_PX + SLOPE_PX + 5, text_anchor="middle", font_size=SLOPE_PX),
           _el("rect", x=left, y=top, width=width, height=height, fill="none", stroke=INK, stroke_width=THIN)]
    for tick in _log_ticks(y_low, y_high):
        _, y = at(x_low, tick)
        out += [_el("line", x1=left, y1=y, x2=left + width, y2=y, stroke=GRID),
                _el("text", _label(tick), x=left - TICK_PX / 2, y=y + TICK_PX / 3, text_anchor="end",
                    font_size=TICK_PX)]
    for tick in _log_ticks(x_low, x_high):
        x, _ = at(tick, y_low)
        out += [_el("line", x1=x, y1=top, x2=x, y2=top + height, stroke=GRID),
                _el("text", _label(tick), x=x, y=top + height + TICK_PX + TICK_PX / 3, text_anchor="middle",
                    font_size=TICK_PX)]
    if len(points) > 1:
        out.append(_el("polyline", points=" ".join(f"{x:g},{y:g}" for x, y in (at(*p) for p in points)), fill="none",
                       stroke=INK, stroke_width=LINE))
    out += [_el("circle", cx=x, cy=y, r=DOT, fill=INK) for x, y in (at(*p) for p in points)]
    out += [_el("circle", cx=x, cy=y, r=RING, fill="none", stroke=CODED, stroke_width=LINE)
            for x, y in (at(*p) for p in coded)]
    return out


def loglog_panels(measures: Sequence[tuple[str, Callable[[dict], float | None]]], sizes: list[dict],
                  coded: list[dict], slopes: Sequence[float | None], caption: str, coded_caption: str) -> str:
    """Small multiples, one log-log panel a measure against the corpus's chunks; a measure with a missing or
    non-positive value at some size leaves that point out, and one with fewer than two points its panel."""
    drawn = [(name, value, slope) for (name, value), slope in zip(measures, slopes)
             if sum(1 for s in sizes + coded if (value(s) or 0) > 0) >= 2]
    rows = math.ceil(len(drawn) / COLUMNS)
    width, height = PANEL_W * COLUMNS, PANEL_H * rows + FOOT
    root = _attributes(xmlns=SVG_NAMESPACE, width=width, height=height, viewBox=(0, 0, width, height),
                       font_family="sans-serif", fill=INK)
    parts = [f"<svg {root}>",
             _el("rect", width=width, height=height, fill="white")]
    for i, (name, value, slope) in enumerate(drawn):
        points = [(s["chunks"], value(s)) for s in sizes if (value(s) or 0) > 0]
        hollow = [(s["chunks"], value(s)) for s in coded if (value(s) or 0) > 0]
        parts += _panel(PANEL_W * (i % COLUMNS), PANEL_H * (i // COLUMNS), name, points, hollow, slope)
    bottom = PANEL_H * rows
    parts.append(_el("text", caption, x=LEFT / 6, y=bottom + CAPTION_PX * 2, font_size=CAPTION_PX))
    if coded:
        parts += [_el("circle", cx=LEFT / 3, cy=bottom + CAPTION_PX * 4 - CAPTION_PX / 3, r=RING, fill="none",
                      stroke=CODED, stroke_width=LINE),
                  _el("text", coded_caption, x=LEFT / 2, y=bottom + CAPTION_PX * 4, font_size=CAPTION_PX)]
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def growth_svg(d: dict) -> str:
    """docs/images/growth.svg: the growth curve's measures against the corpus size, log-log (the stages' own rows stay
    in the table: the plot keeps what a reader sizes a machine by)."""
    sizes, coded, stored = growth_sizes(d["growth"])
    measures = [(name, value) for name, value, _ in growth_measures(stages=False)]
    slopes = [loglog_slope(sizes, value) for _, value in measures]
    caption = (f"x: chunks ({', '.join(count(s['chunks']) for s in sizes)}, {stored} token vectors, joined); the "
               f"log-log slope from the smallest to the largest of them")
    coded_caption = "; ".join(f"{count(s['chunks'])} chunks, token vectors {s['token_dtype']}" for s in coded)
    return loglog_panels(measures, sizes, coded, slopes, caption, coded_caption)
