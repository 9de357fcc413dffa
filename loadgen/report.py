"""report.html and its PNG images, rendered from results.json alone (so any stored run can be redrawn).

Images: latency buckets × stage (heatmap), latency over time per stage (heatmaps), P50/P99 against
offered load with the SLO line and the knee, and what became of the offered queries (answered within the SLO,
answered late, shed by admission control, failed) with the goodput. Latency buckets are the telemetry bucket
edges, so the report reads like the Grafana heatmaps of the same service. When ``explain.steps`` explained the
steps past the knee, the table says why each was slower and a section lists its causes with their evidence (or the
report says why the steps are not explained).
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np

from rag.slo import SLO_MS, SLO_SECONDS
from rag.stages import QUALITY_LEVELS, STAGES
from telemetry.buckets import LATENCY_SECONDS

END_TO_END = "end to end"


def target_label(results: dict) -> str:
    """``POST http://host:port/path``, from results.json (older files hold the base URL alone)."""
    target = results.get("target")
    return f"{target['method']} {results['url'].rstrip('/')}{target['path']}" if target else results["url"]


def error_reasons(step: dict) -> str:
    """``HTTP 500 x3, timeout x1``: a step's failed requests by reason."""
    return ", ".join(f"{reason} x{n}" for reason, n in (step.get("error_reasons") or {}).items())


def level_label(step: dict) -> str:
    """``120 req/s`` or ``8 clients``."""
    return f"{step['offered_qps']:g} req/s" if step.get("offered_qps") is not None else f"{step['concurrency']} clients"


def causes_line(explanation: dict) -> str:
    """``overload 90%, stage (rerank) 6%, stage (embed) 4%``: an explanation's causes, most likely first, with their
    shares; a kind that several causes share (each stage slowed on its own) names their stages."""
    causes = explanation.get("causes") or ()
    kinds = [c["kind"] for c in causes]
    return ", ".join(c["kind"] + (f" ({', '.join(c.get('stages') or ())})" if kinds.count(c["kind"]) > 1 else "")
                     + ("" if c.get("share") is None else f" {c['share']:.0%}") for c in causes)


def step_why(step: dict) -> str | None:
    """What the report says of a step past the knee: the explanation's headline, or why it is not explained; None
    for a step that was not past it."""
    if step.get("explanation"):
        return step["explanation"]["headline"]
    return step.get("not_explained")


def explanation_lines(results: dict) -> list[str]:
    """The steps past the knee in words (``explain.steps`` wrote them into results.json): where the signals came
    from and the baseline step, then per step its headline and ranked causes; or why no step is explained. Empty
    for a closed-loop sweep (it has no knee) and for results written before the steps were explained."""
    explained = results.get("explained")
    if not explained or results["mode"] != "open":
        return []
    if explained.get("reason"):
        return [f"steps past the knee not explained: {explained['reason']}"]
    lines = [f"why, past the knee (each step against the one at {explained['baseline_qps']:g} req/s, from "
             f"{explained['source']}):"]
    for step in results["steps"]:
        why = step_why(step)
        if why is None:
            continue
        lines.append(f"step {level_label(step)}: {why}")
        causes = causes_line(step.get("explanation") or {})
        if causes:
            lines.append(f"    causes: {causes}")
    return lines


def _edges_ms() -> np.ndarray:
    return np.array([0.0, *(e * 1000 for e in LATENCY_SECONDS), np.inf])


def _bucket_labels() -> list[str]:
    return [f"<= {e * 1000:g}" for e in LATENCY_SECONDS] + [f"> {LATENCY_SECONDS[-1] * 1000:g}"]


def _series(results: dict) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per series (stages and end to end): values in ms, and their times on one sweep-wide axis."""
    values: dict[str, list[float]] = {}
    times: dict[str, list[float]] = {}
    offset = 0.0
    for step in results["steps"]:
        samples = step.get("samples") or {}
        t = samples.get("t_s", [])
        for name, series in [(END_TO_END, samples.get("latency_ms", [])), *samples.get("stages_ms", {}).items()]:
            for ti, v in zip(t, series):
                if v is not None:
                    values.setdefault(name, []).append(v)
                    times.setdefault(name, []).append(offset + ti)
        offset += max(step["duration_s"], (t[-1] if t else 0.0)) + results.get("warmup_s", 0.0)
    rank = {name: i for i, name in enumerate(STAGES)}  # pipeline order, not alphabetical
    order = sorted((n for n in values if n != END_TO_END), key=lambda n: (rank.get(n, len(rank)), n))
    order += [END_TO_END] if END_TO_END in values else []
    return {n: values[n] for n in order}, {n: times[n] for n in order}


def render_report(results_path: Path, out_dir: Path | None = None) -> Path:
    """Write ``report.html`` and its PNGs next to ``results.json``; returns the report's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    results = json.loads(Path(results_path).read_text())
    out_dir = Path(out_dir or Path(results_path).parent)
    out_dir.mkdir(parents=True, exist_ok=True)
    values, times = _series(results)
    edges, labels = _edges_ms(), _bucket_labels()
    images = []

    if values:  # 1. latency buckets x stage
        names = list(values)
        counts = np.array([np.histogram(values[n], bins=edges)[0] for n in names]).T
        share = counts / np.maximum(counts.sum(axis=0, keepdims=True), 1)
        fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(names), 8))
        mesh = ax.imshow(np.where(share > 0, share, np.nan), aspect="auto", origin="lower", cmap="inferno_r",
                         norm=LogNorm(vmin=1e-4, vmax=1))
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.axhline(list(LATENCY_SECONDS).index(SLO_SECONDS) + 0.5, color="tab:blue", lw=1, ls="--")
        ax.set_ylabel("latency bucket (ms)")
        ax.set_title(f"share of requests per latency bucket, whole sweep (--- = SLO {results['slo_ms']:g} ms)")
        fig.colorbar(mesh, ax=ax, label="share of the stage's requests")
        images.append(_save(fig, out_dir / "heatmap_stage_buckets.png", "Latency buckets by stage"))

    if values:  # 2. latency over time, one heatmap per series
        fig, axes = plt.subplots(len(values), 1, figsize=(11, 2.2 * len(values)), sharex=True, squeeze=False)
        horizon = max(max(t) for t in times.values()) if times else 1.0
        time_bins = np.linspace(0, horizon + 1e-9, min(120, max(10, int(horizon))) + 1)
        for ax, name in zip(axes[:, 0], values):
            grid, _, _ = np.histogram2d(times[name], values[name], bins=[time_bins, edges])
            ax.imshow(np.where(grid.T > 0, grid.T, np.nan), aspect="auto", origin="lower", cmap="viridis",
                      norm=LogNorm(vmin=1, vmax=max(1, grid.max())),
                      extent=[time_bins[0], time_bins[-1], 0, len(labels)])
            rows = list(LATENCY_SECONDS)
            ax.set_yticks([0.5, rows.index(0.01) + 0.5, rows.index(SLO_SECONDS) + 0.5],
                          ["0.5 ms", "10 ms", f"{SLO_MS:g} ms"], fontsize=7)
            ax.set_ylabel(name, rotation=0, ha="right", fontsize=8)
        axes[-1, 0].set_xlabel("seconds into the sweep (steps back to back, warm-ups left out)")
        fig.suptitle("latency over time per stage (colour: requests per cell)")
        images.append(_save(fig, out_dir / "heatmap_time_stage.png", "Latency over time per stage"))

    steps = [s for s in results["steps"] if s.get("offered_qps") is not None and s["latency_ms"]["p50"] is not None]
    if steps:  # 3. P50/P99 vs offered load
        rates = [s["offered_qps"] for s in steps]
        fig, ax = plt.subplots(figsize=(8, 5))
        ax.plot(rates, [s["latency_ms"]["p50"] for s in steps], "o-", label="P50")
        ax.plot(rates, [s["latency_ms"]["p99"] for s in steps], "s-", label="P99")
        ax.axhline(results["slo_ms"], color="tab:red", ls="--", label=f"SLO {results['slo_ms']:g} ms")
        if results.get("knee_qps") is not None:
            ax.axvline(results["knee_qps"], color="tab:green", ls=":", label=f"knee {results['knee_qps']:g} req/s")
        ax.set_yscale("log")
        ax.set_xlabel("offered load (req/s, open loop)")
        ax.set_ylabel("latency from intended send time (ms)")
        ax.legend()
        ax.grid(alpha=0.3)
        images.append(_save(fig, out_dir / "latency_vs_load.png", "P50 and P99 against offered load"))

    if steps:  # 4. outcomes per offered rate: shed apart from errors and from admitted latency
        images.append(_outcomes_figure(plt, steps, results, out_dir))

    if any(s.get("levels") for s in steps):  # 5. the quality ladder's rungs that answered, per offered rate
        images.append(_quality_figure(plt, steps, results, out_dir))

    page = out_dir / "report.html"
    page.write_text(_html(results, images))
    return page


def _outcomes_figure(plt, steps: list[dict], results: dict, out_dir: Path) -> tuple[str, str]:
    """Per offered rate, stacked: answers within the SLO (goodput), answers past it, shed queries, errors (req/s)."""
    rates = [s["offered_qps"] for s in steps]
    per_s = lambda s, n: n / s["duration_s"] if s["duration_s"] else 0.0  # noqa: E731
    good = [s.get("goodput_qps", 0.0) for s in steps]
    late = [max(0.0, s["achieved_qps"] - g) for s, g in zip(steps, good)]
    shed = [per_s(s, s.get("shed", 0)) for s in steps]
    errors = [per_s(s, s["errors"]) for s in steps]
    x = np.arange(len(rates))
    fig, ax = plt.subplots(figsize=(8, 5))
    bottom = np.zeros(len(rates))
    for values, label, colour in ((good, f"answered within {results['slo_ms']:g} ms (goodput)", "tab:green"),
                                  (late, "answered late", "tab:orange"), (shed, "shed (503)", "tab:gray"),
                                  (errors, "errors", "tab:red")):
        ax.bar(x, values, bottom=bottom, label=label, color=colour)
        bottom += np.asarray(values)
    ax.plot(x, rates, "k_", markersize=30, label="offered")
    ax.set_xticks(x, [f"{r:g}" for r in rates])
    ax.set_xlabel("offered load (req/s, open loop)")
    ax.set_ylabel("requests per second")
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, out_dir / "outcomes_vs_load.png",
                 "Goodput, late answers, shed queries and errors by offered load")


def _quality_figure(plt, steps: list[dict], results: dict, out_dir: Path) -> tuple[str, str]:
    """Per offered rate, stacked: the share of the answers each rung of the quality ladder served (a load controller
    steps down past the full-quality knee), beside the latency-against-load figure."""
    rates = [s["offered_qps"] for s in steps]
    x = np.arange(len(rates))
    fig, ax = plt.subplots(figsize=(8, 5))
    bottom = np.zeros(len(rates))
    colours = plt.get_cmap("viridis")
    for i, level in enumerate(QUALITY_LEVELS):
        shares = [s["levels"].get(level, 0) / max(1, sum(s["levels"].values())) for s in steps]
        if any(shares):
            ax.bar(x, shares, bottom=bottom, label=level, color=colours(i / max(1, len(QUALITY_LEVELS) - 1)))
            bottom += np.asarray(shares)
    full = results.get("full_quality_knee_qps")
    if full is not None and full in rates:
        ax.axvline(rates.index(full) + 0.5, color="tab:green", ls=":", label=f"full quality up to {full:g} req/s")
    ax.set_xticks(x, [f"{r:g}" for r in rates])
    ax.set_ylim(0, 1)
    ax.set_xlabel("offered load (req/s, open loop)")
    ax.set_ylabel("share of the answers")
    ax.legend(title="quality level", fontsize=8)
    return _save(fig, out_dir / "quality_vs_load.png", "Quality level of the answers by offered load")


def _save(fig, path: Path, title: str) -> tuple[str, str]:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path.name, title


def _cache_line(results: dict) -> str:
    """A paragraph with the semantic answer cache's hit rate per step (hit / (hit + miss)), when it was consulted."""
    rates = [(s["offered_qps"] if s["offered_qps"] is not None else f"{s['concurrency']} clients",
              s.get("cache_hit_rate")) for s in results["steps"]]
    if all(rate is None for _, rate in rates):
        return ""
    zipf = f" (queries drawn from a Zipf law, s = {results['zipf_s']:g})" if results.get("zipf_s") else ""
    cells = ", ".join(f"{level}: {'-' if rate is None else f'{rate * 100:.1f}%'}" for level, rate in rates)
    return f"\n<p>Answer cache hit rate per step{zipf}: {html.escape(cells)}.</p>"


def _why_section(results: dict) -> str:
    """Why each step past the knee was slower: the headline and, per cause, its evidence; or why no step is
    explained (nothing for a closed-loop sweep: it has no knee)."""
    explained = results.get("explained")
    if not explained or results["mode"] != "open":
        return ""
    if explained.get("reason"):
        return f"\n<p>Steps past the knee are not explained: {html.escape(explained['reason'])}.</p>"
    blocks = []
    for step in results["steps"]:
        explanation = step.get("explanation")
        if explanation:
            causes = "".join(f"<li><b>{html.escape(c['kind'])}</b>"
                             + ("" if c.get("share") is None else f" ({c['share']:.0%})")
                             + f": {html.escape(c['headline'])}"
                             + "".join(f"<br><small>{html.escape(line)}</small>" for line in c.get("evidence", ()))
                             + "</li>" for c in explanation.get("causes") or ())
            blocks.append(f"<h3>step {html.escape(level_label(step))}</h3><p>{html.escape(explanation['headline'])}"
                          f"</p>" + (f"<ol>{causes}</ol>" if causes else ""))
        elif step.get("not_explained"):
            blocks.append(f"<h3>step {html.escape(level_label(step))}</h3><p>not explained: "
                          f"{html.escape(step['not_explained'])}</p>")
    return (f"\n<h2>Why, past the knee</h2>\n<p>Each step past the knee against the step at "
            f"{explained['baseline_qps']:g} req/s, as <code>ragheat explain</code> reads them from "
            f"{html.escape(explained['source'])}.</p>" + "".join(blocks))


def _html(results: dict, images: list[tuple[str, str]]) -> str:
    explained = bool(results.get("explained")) and not results["explained"].get("reason")
    rows = []
    for s in results["steps"]:
        lat = s["latency_ms"]
        cell = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        level = s["offered_qps"] if s["offered_qps"] is not None else f"{s['concurrency']} clients"
        shed = ", ".join(f"{reason} {n}" for reason, n in (s.get("shed_reasons") or {}).items()) or "-"
        rows.append(f"<tr><td>{level}</td><td>{s['achieved_qps']:.1f}</td><td>{s.get('goodput_qps', 0.0):.1f}</td>"
                    f"<td>{s['error_rate'] * 100:.2f}%</td><td>{html.escape(error_reasons(s) or '-')}</td>"
                    f"<td>{s.get('shed_rate', 0.0) * 100:.2f}%</td>"
                    f"<td>{html.escape(shed)}</td><td>{cell((s.get('refusal_ms') or {}).get('p99'))}</td>"
                    f"<td>{cell((s.get('refusal_server_ms') or {}).get('p99'))}</td>"
                    + "".join(f"<td>{cell(lat[k])}</td>" for k in ("p50", "p90", "p99", "p99.9"))
                    + (f'<td class="why">{html.escape(step_why(s) or "-")}</td>' if explained else "") + "</tr>")
    knee = results.get("knee_qps")
    notes = "".join(f"\n<p>Note: {html.escape(n)}.</p>" for n in results.get("notes") or ())
    figures = "".join(f'<figure><img src="{html.escape(src)}" alt="{html.escape(t)}"><figcaption>{html.escape(t)}'
                      "</figcaption></figure>" for src, t in images)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>ragheat bench report</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}img{{max-width:100%}}
td.why{{text-align:left}}</style></head><body>
<h1>ragheat bench: {html.escape(target_label(results))}</h1>
<p>{html.escape(results['mode'])} loop, {results['duration_s']:g} s per step after {results['warmup_s']:g} s warm-up;
SLO: P99 &le; {results['slo_ms']:g} ms with errors &le; {results['max_error_rate'] * 100:g} %.
<b>Knee: {"none" if knee is None else f"{knee:g} req/s"}</b>{" (sweep interrupted)" if results.get("interrupted") else ""}</p>
<p>Latency percentiles are of answered queries; shed queries (503 from admission control, by reason) are neither
errors nor latency samples; refusal latency is of those shed at once (queue_full, deadline), as the client saw it
and as the service timed it (Server-Timing). Goodput: answers within the SLO per second.</p>{_cache_line(results)}{notes}
<table><tr><th>offered</th><th>achieved req/s</th><th>goodput req/s</th><th>errors</th><th>errors by reason</th><th>shed</th>
<th>shed by reason</th><th>refusal P99 ms (client)</th><th>refusal P99 ms (service)</th><th>P50 ms</th><th>P90 ms</th><th>P99 ms</th><th>P99.9 ms</th>{"<th>why (past the knee)</th>" if explained else ""}</tr>{"".join(rows)}</table>{_why_section(results)}{figures}</body></html>"""
