"""Each board's heatmaps drawn from a live Prometheus to PNG, for eyes where no Grafana server runs.

The queries are the panels' own (``dashboards.spec``), run as ``query_range`` with every variable at All
except the one a panel repeats over, which gets one picture per value, as Grafana would lay them out.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dashboards.promapi import PrometheusApi
from dashboards.spec import Board, Panel, expand
from dashboards.verify import family_present

COLUMNS = 3
CELL_IN = (4.6, 3.2)        # one heatmap with its labels, inches
GAP_IN = (0.8, 0.75)        # between cells: the y label and ticks; the x ticks and the next title
MARGIN_IN = (0.8, 0.45)     # left of the first column, below the last row
TITLE_IN = 0.7              # above the first row: the board's title
COLOURBAR_IN = 1.3          # right of the last column: the colour bar and its label


@dataclass(frozen=True)
class Heatmap:
    """Bucket rates over time for one heatmap panel, ready to draw."""

    title: str
    times: np.ndarray       # unix seconds, one per column
    edges: np.ndarray       # bucket boundaries, len(rows) + 1
    rates: np.ndarray       # (rows, columns): events per second in each bucket
    thresholds: tuple[float, ...]
    log_y: bool = True      # latency buckets grow geometrically; scores are evenly spaced


@dataclass(frozen=True)
class SnapshotResult:
    """The PNGs written, and the heatmaps skipped (each with why)."""

    written: list[Path]
    skipped: list[str]      # "board / panel: why", one per heatmap that had nothing to draw


def heatmap_from_result(title: str, result: list[dict], thresholds: tuple[float, ...] = (),
                        log_y: bool = True) -> Heatmap | None:
    """Cumulative ``le`` series (a ``sum by (le) (rate(..._bucket))`` range result) -> per-bucket rates.
    The ``+Inf`` bucket has no upper edge to draw and is left out."""
    by_le = {float(r["metric"]["le"]): r["values"] for r in result if "le" in r["metric"]}
    les = sorted(le for le in by_le if math.isfinite(le))
    if len(les) < 2:
        return None
    times = np.array(sorted({float(t) for values in by_le.values() for t, _ in values}))
    column = {t: i for i, t in enumerate(times)}
    cumulative = np.zeros((len(les), len(times)))
    for row, le in enumerate(les):
        for t, v in by_le[le]:
            value = float(v)
            cumulative[row, column[float(t)]] = value if math.isfinite(value) else 0.0
    rates = np.clip(np.diff(cumulative, axis=0, prepend=0.0), 0.0, None)
    if not rates.any():
        return None
    # The first bucket is drawn one ratio (a linear axis: one step) below its upper edge.
    first = les[0] * les[0] / les[1] if log_y else les[0] - (les[1] - les[0])
    return Heatmap(title, times, np.array([first, *les]), rates, thresholds, log_y)


def _panel_heatmaps(api: PrometheusApi, board: Board, panel: Panel, rate_window: str, start: float, end: float,
                    step_s: float, names: set[str], skipped: list[str]) -> list[Heatmap]:
    query = panel.queries[0]
    where = f"{board.title} / {panel.title}"
    if query.sources and not any(family_present(s, names) for s in query.sources):
        skipped.append(f"{where}: no series of {', '.join(query.sources)}")
        return []
    values: list[str | None] = [None]
    if panel.repeat:
        variable = next(v for v in board.variables if v.name == panel.repeat)
        values = sorted(api.label_values(variable.label, match=expand(variable.metric, rate_window))) or [None]
    found = []
    for value in values:
        chosen = {panel.repeat: value} if value is not None else {}
        title = panel.title.replace(f"${panel.repeat}", value) if value is not None else panel.title
        result = api.query_range(expand(query.expr, rate_window, chosen), start, end, step_s)
        heatmap = heatmap_from_result(title, result, panel.thresholds, panel.log_y)
        if heatmap is None:
            skipped.append(f"{board.title} / {title}: no observations in the range")
        else:
            found.append(heatmap)
    return found


def draw(board: Board, heatmaps: list[Heatmap], path: Path, unit: str = "s") -> Path:
    """Draw one board's heatmaps to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm
    from matplotlib.ticker import NullLocator

    rows = math.ceil(len(heatmaps) / COLUMNS)
    columns = min(COLUMNS, len(heatmaps))
    log_y = all(h.log_y for h in heatmaps)  # one shared log axis for latencies; scores of unlike scales each their own
    # Margins fixed in inches: a board repeats a panel per stage into dozens of axes, and a solved layout
    # (constrained or tight) measures every tick label of every axis, which takes most of the drawing time.
    width, height = CELL_IN[0] * columns + COLOURBAR_IN, CELL_IN[1] * rows + TITLE_IN
    fig, axes = plt.subplots(rows, columns, figsize=(width, height), squeeze=False, sharey=log_y,
                             gridspec_kw={"left": MARGIN_IN[0] / width, "right": 1 - COLOURBAR_IN / width,
                                          "bottom": MARGIN_IN[1] / height, "top": 1 - TITLE_IN / height,
                                          "wspace": GAP_IN[0] / (CELL_IN[0] - GAP_IN[0]),
                                          "hspace": GAP_IN[1] / (CELL_IN[1] - GAP_IN[1])})
    for ax in axes.flat[len(heatmaps):]:
        ax.set_visible(False)
    positive = np.concatenate([h.rates[h.rates > 0] for h in heatmaps])
    norm = LogNorm(vmin=max(positive.min(), 1e-3), vmax=positive.max())
    # Show the rows that hold data (one bucket of margin), not the whole 0.5 ms .. 10 s range.
    rows_used = [np.nonzero(h.rates.any(axis=1))[0] for h in heatmaps]
    low = min(h.edges[max(r.min() - 1, 0)] for h, r in zip(heatmaps, rows_used))
    high = max(h.edges[min(r.max() + 2, len(h.edges) - 1)] for h, r in zip(heatmaps, rows_used))
    mesh = None
    for ax, h in zip(axes.flat, heatmaps):
        x = mdates.date2num(np.concatenate([h.times, [h.times[-1] + (h.times[-1] - h.times[-2] if len(h.times) > 1
                                                                     else 1.0)]]).astype("datetime64[s]"))
        mesh = ax.pcolormesh(x, h.edges, np.ma.masked_less_equal(h.rates, 0), norm=norm, cmap="inferno",
                             shading="flat")
        for value in h.thresholds:
            ax.axhline(value, color="cyan", linestyle="--", linewidth=1)
            ax.annotate(f"{value * 1000:g} ms" if unit == "s" else f"{value:g}", (x[0], value), color="cyan",
                        fontsize=7, va="bottom")
        if log_y:
            ax.set_yscale("log")
            ax.yaxis.set_minor_locator(NullLocator())  # a decade's eight unlabelled marks, on every axis: slow
            ax.set_ylim(low, max((high, *h.thresholds)) * 1.2)
        ax.set_title(h.title, fontsize=9)
        ax.xaxis.set_major_locator(mdates.AutoDateLocator(minticks=3, maxticks=7))
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M"))
        ax.tick_params(labelsize=7)
        ax.set_ylabel("bucket upper edge" + (f" ({unit})" if unit != "none" else ""), fontsize=7)
    # the bar 0.25 in right of the last column, 0.15 in wide, as tall as the rows
    bar = fig.add_axes((1 - (COLOURBAR_IN - 0.25) / width, MARGIN_IN[1] / height, 0.15 / width,
                        1 - (MARGIN_IN[1] + TITLE_IN) / height))
    fig.colorbar(mesh, cax=bar, label="events per second in the bucket (UTC times)")
    fig.suptitle(f"{board.title}: {board.description}", fontsize=10, y=1 - 0.2 / height, va="top")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def snapshot(api: PrometheusApi, boards: tuple[Board, ...], out_dir: Path, minutes: float, rate_window: str,
             step_s: float | None = None, end: float | None = None) -> SnapshotResult:
    """One PNG per board with at least one heatmap holding data; every heatmap without data is named in
    ``skipped``."""
    end = end if end is not None else time.time()
    start = end - minutes * 60
    step_s = step_s or max(1.0, round(minutes * 60 / 240))
    names = api.metric_names()
    written, skipped = [], []
    for board in boards:
        heatmaps = []
        for panel in board.panels:
            if panel.kind == "heatmap":
                heatmaps += _panel_heatmaps(api, board, panel, rate_window, start, end, step_s, names, skipped)
        if heatmaps:
            unit = next(p.unit for p in board.panels if p.kind == "heatmap")
            written.append(draw(board, heatmaps, out_dir / f"{board.slug}.png", unit))
    return SnapshotResult(written, skipped)
