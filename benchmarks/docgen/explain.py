"""The fault matrix of ``ragheat explain`` (benchmarks/bench_explain.py): per fault, how often the top-ranked cause
was the right one, the false alarms where nothing (or nothing the service depends on) was wrong, and how long a
correct explanation took."""

from __future__ import annotations

from collections import Counter

from .stats import num, opt, pct, table

WHAT = {"none": "nothing injected", "cpu_hog": "a process spinning on every core beside the service",
        "overload": "the offered load multiplied past the knee",
        "gil_hog": "a thread spinning in Python inside the service",
        "graph_slow": "the graph store stopped part of every second",
        "cold_cache": "the service's memory cgroup squeezed below its use, its index files evicted from the page "
                      "cache",
        "memory": "a neighbour taking the host's free memory",
        "disk_writes": "a neighbour writing to the disk, syncing every megabyte",
        "none_llm": "nothing injected, a language model answering",
        "llm_slow": "the model server stopped part of every second",
        "llm_stopped": "the model server stopped"}


def _lines(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.rstrip().splitlines())


def _answers(rows: list[dict]) -> str:
    """What the explanations said at the end of the window, most frequent first."""
    said = Counter((r["causes"][0] if r["causes"] else "nothing is wrong") if r["verdict"] != "no_data" else "no data"
                   for r in rows)
    return ", ".join(f"{what} ×{n}" for what, n in said.most_common())


MATRIX_FILES = ("explain", "explain-cold-cache")
"""The matrix's results: the faults run together, then the memory cgroup's (its own run: it needs root)."""


def _top(rows: list[dict], key: str) -> float:
    return sum(bool(r[key]) for r in rows) / len(rows) if rows else 0.0


def matrix(d: dict[str, dict]) -> str:
    params = d["explain"]["params"]
    faults = {f: s for name in MATRIX_FILES for f, s in d[name]["summary"]["faults"].items()}
    rows = [r for name in MATRIX_FILES for r in d[name]["rows"]]
    lines = []
    for fault, s in faults.items():
        mine = [r for r in rows if r["fault"] == fault]
        expected = s["expected"] or "nothing is wrong"
        lines.append([f"`{fault}`", WHAT.get(fault, ""), expected, str(s["runs"]), pct(100 * s["top1"], 0),
                      pct(100 * s["top2"], 0), str(s["false_alarms"]) if s["expected"] is None else "–",
                      opt(s["median_seconds_to_correct"], 0), opt(s["max_seconds_to_correct"], 0), _answers(mine)])
    faulty = [r for r in rows if r["expected"] is not None]
    quiet = [r for r in rows if r["expected"] is None]
    false_alarms = sum(bool(r["false_alarm"]) for r in rows)
    text = [table(["fault", "injected", "expected top cause", "runs", "top-1", "top-2", "false alarms",
                   "seconds to correct (median)", "(max)", "top cause said"], lines),
            f"Over the {len(faulty)} runs with a fault: top-1 **{pct(100 * _top(faulty, 'top1'), 0)}**, top-2 "
            f"{pct(100 * _top(faulty, 'top2'), 0)}; **{false_alarms} false alarm"
            f"{'s' if false_alarms != 1 else ''}** in {len(quiet)} runs where the service "
            f"had nothing to blame. Each fault's window is {params['window_s']} s against the {params['window_s']} "
            f"quiet seconds before it, Prometheus scraping every {num(params['scrape_s'], 1)} s, `explain` run every "
            f"{params['every_s']} s from the fault's start; the load is {num(params['quiet_qps'], 0)} req/s "
            f"({num(params['llm_qps'], 0)} with the model), overload {num(params['overload_qps'], 0)} req/s. A "
            "fault's *seconds to correct* is from its start to the first explanation whose top cause was right; "
            "the faults are held for at least the window, so the last explanation covers the fault alone."]
    wrong = [r for r in faulty if not r["top1"]] + [r for r in rows if r["false_alarm"]]
    if wrong:
        text.append("The runs it got wrong, and what it said:\n\n" + "\n".join(
            f"- `{r['fault']}` (run {r['run'] + 1}): {r['headline']}" for r in wrong))
    return "\n\n".join(text)


def _every(d: dict[str, dict]) -> str:
    return str(d["explain-example"]["params"]["every_s"])


def example(d: dict[str, dict]) -> str:
    """One fault's first run as an engineer paged would see it: the latency board, then ``ragheat explain``."""
    rows = [r for r in d["explain-example"]["rows"] if r.get("printed")]
    parts = []
    for r in rows:
        parts.append(f"`{r['fault']}`: {WHAT.get(r['fault'], r['fault'])}. The latency board's heatmaps over the "
                     "drill (the quiet baseline, the fault, the recovery), drawn from the same Prometheus by "
                     "`dashboards/snapshot.py`:")
        if r.get("picture"):
            parts.append(f"![the latency board over the {r['fault']} drill]({r['picture'].removeprefix('docs/')})")
        took = (f"its top cause was right {opt(r['seconds_to_correct'], 0)} s after the fault began"
                if r["seconds_to_correct"] is not None else "its top cause was never right")
        parts.append(f"Over the fault's window the end-to-end P99 went from {opt(r['baseline_p99_ms'], 1)} ms to "
                     f"{opt(r['p99_ms'], 1)} ms; with `explain` run every {_every(d)} s, {took}.")
        parts.append(f"What `ragheat explain` printed at the end of the fault:\n\n```text\n{_lines(r['printed'])}\n```")
    return "\n\n".join(parts)
