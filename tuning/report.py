"""``ragheat tune``'s report: after every step, the service's figures beside the ones before it, what the step did
and why, as ``report.json`` and a self-contained ``report.html``."""

from __future__ import annotations

import html
import json
from pathlib import Path

STEP_TITLES = {"baseline": "0. the service as it was", "labels": "1. relevance labels",
               "reranker": "2. the reranker's head", "model_server": "3. the model server's batch limits",
               "placement": "4. hardware-aware placement",
               "reranker-before": "   before step 2, served beside it",
               "placement-before": "   before step 4, served beside it"}
BESIDE = "the configuration before the step, served and loaded beside it in the same minutes"
SIDES = {"before": "before step 3", "after": "after step 3"}


def written_rows(report: dict) -> list[dict]:
    """Step 3's written answers (``tuning.written_answers``), one row per side: the model server's limits, the whole
    answer's P50/P99 at concurrency 1, the wait for the model's first token (stage ``generate_prefill``), the P99
    under load at the step's rate, and the answers by who wrote them. Empty when the step did not measure them."""
    written = report["model_server"].get("written")
    if not written:
        return []
    rows = []
    for side, figures in written["sides"].items():
        first = figures["stages"].get("generate_prefill", {})
        load = figures.get("at_load", {}).get("p99_ms", {})
        rows.append({"side": "before and after step 3 (the limits it left)" if written["same"] else SIDES[side],
                     "limits": figures["limits"], "p50_ms": figures["p50_ms"]["median"],
                     "p99_ms": figures["p99_ms"]["median"], "p99_spread_ms": figures["p99_ms"]["spread"],
                     "first_token_p50_ms": first.get("p50_ms"), "first_token_p99_ms": first.get("p99_ms"),
                     "p99_at_rate_ms": load.get("median"), "p99_at_rate_spread_ms": load.get("spread"),
                     "rate": written["rate"],
                     "answers": figures.get("answers", {})})
    return rows


def answers_words(answers: dict) -> str:
    """``{"openai": 50, "extractive (slow)": 10}`` as "openai 50, extractive (slow) 10"."""
    return ", ".join(f"{writer} {n}" for writer, n in sorted(answers.items(), key=lambda kv: -kv[1])) or "–"


def _step_3_figures(report: dict) -> str:
    """What the figures in step 3's row are: step 2's, since the limits are the model server's; its own are elsewhere."""
    own = "its sweep" + ("; the service writing its answers through it: step 3's own figures"
                         if written_rows(report) else "")
    return (f"; the figures are step 2's: the limits are the model server's, and the measured services answer "
            f"extractively (the model server's own figures: {own})")


def step_rows(report: dict) -> list[dict]:
    """One row per step: its figures (the service after it) and what it did."""
    baseline = report["baseline"]
    rows = [{"step": "baseline", "did": "measured as given", "figures": baseline},
            {"step": "labels", "did": report["labels"]["reason"], "figures": baseline}]
    if "before" in report["reranker"]:
        rows.append({"step": "reranker-before", "did": BESIDE, "figures": report["reranker"]["before"]})
    rows += [{"step": "reranker", "did": report["reranker"]["reason"], "figures": report["reranker"]["figures"]},
             {"step": "model_server", "did": report["model_server"]["reason"]
              + (_step_3_figures(report) if report["model_server"].get("ran") else ""),
              "figures": report["reranker"]["figures"]}]
    if "before" in report["placement"]:
        rows.append({"step": "placement-before", "did": BESIDE, "figures": report["placement"]["before"]})
    rows.append({"step": "placement", "did": _placement_words(report["placement"]),
                 "figures": report["placement"]["figures"]})
    return rows


def _placement_words(placement: dict) -> str:
    kept = [k["knob"] for k in placement["knobs"] if k["kept"]]
    tried = len(placement["knobs"])
    beside = placement.get("model_server_load")
    load = (f"; measured with the model server beside the services, {beside['in_flight']} completions at a time "
            f"({_fmt(beside['tokens_per_s'])} tokens/s, {beside['errors']} failed)" if beside else "")
    return (f"{tried} knob(s) measured, kept: {', '.join(kept) if kept else 'none'}; "
            f"not tried: {', '.join(sorted(placement['skipped'])) or 'none'}{load}")


def _fmt(value, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _knee(h: dict) -> str:
    return ("≥ " if h["knee_at_least"] else "") + _fmt(h["knee_qps"], 0)


def headline(figures: dict) -> dict:
    """The row's figures: nDCG@10, the whole request's P50/P99 at concurrency 1, the knee, P99 at the target."""
    c1 = figures["concurrency_1"]
    return {"ndcg@10": figures.get("ndcg10"), "ndcg@10_held_out": figures.get("ndcg10_held_out"),
            "p50_ms": c1["p50_ms"]["median"], "p99_ms": c1["p99_ms"]["median"],
            "p99_spread_ms": c1["p99_ms"]["spread"], "knee_qps": figures.get("knee_qps"),
            "knee_at_least": bool(figures.get("knee_is_lower_bound")),
            "target_qps": figures.get("target_qps"), "p99_at_target_ms": figures.get("p99_at_target_ms")}


def lines(report: dict) -> list[str]:
    """The report in a few lines for the terminal."""
    out = []
    previous = None
    for row in step_rows(report):
        h = headline(row["figures"])
        same = previous is not None and row["figures"] is previous
        out.append(f"{STEP_TITLES[row['step']]}: {row['did']}")
        if not same:
            out.append(f"    nDCG@10 {_fmt(h['ndcg@10'], 4)} (held out {_fmt(h['ndcg@10_held_out'], 4)}) | c=1 P50 "
                       f"{_fmt(h['p50_ms'], 2)} ms, P99 "
                       f"{_fmt(h['p99_ms'], 2)} ms | knee {_knee(h)} req/s | P99 at "
                       f"{_fmt(h['target_qps'], 0)} req/s {_fmt(h['p99_at_target_ms'])} ms")
        previous = row["figures"]
        if row["step"] == "model_server":
            out += [f"    written answers, {w['side']} ({w['limits']['max_num_seqs']} x "
                    f"{w['limits']['max_model_len']}): c=1 P50 {_fmt(w['p50_ms'], 0)} ms, P99 {_fmt(w['p99_ms'], 0)} ms"
                    f" | first token P50 {_fmt(w['first_token_p50_ms'], 0)} ms | P99 at {w['rate']:g} req/s "
                    f"{_fmt(w['p99_at_rate_ms'], 0)} ms | answers: {answers_words(w['answers'])}"
                    for w in written_rows(report)]
    return out


def render_html(report: dict) -> str:
    esc = html.escape
    rows, stages_seen = [], []
    for row in step_rows(report):
        h = headline(row["figures"])
        rows.append(f"<tr><td>{esc(STEP_TITLES[row['step']])}</td><td>{_fmt(h['ndcg@10'], 4)}</td>"
                    f"<td>{_fmt(h['ndcg@10_held_out'], 4)}</td>"
                    f"<td>{_fmt(h['p50_ms'], 2)}</td><td>{_fmt(h['p99_ms'], 2)} (±{_fmt(h['p99_spread_ms'], 2)})</td>"
                    f"<td>{_knee(h)}</td><td>{_fmt(h['p99_at_target_ms'])}</td>"
                    f"<td>{esc(row['did'])}</td></tr>")
        for stage in row["figures"]["concurrency_1"]["stages"]:
            if stage not in stages_seen:
                stages_seen.append(stage)
    stage_rows = []
    for row in step_rows(report):
        stages = row["figures"]["concurrency_1"]["stages"]
        cells = "".join(f"<td>{_fmt(stages[s]['p50_ms'], 2)} / {_fmt(stages[s]['p99_ms'], 2)}</td>" if s in stages
                        else "<td>–</td>" for s in stages_seen)
        stage_rows.append(f"<tr><td>{esc(STEP_TITLES[row['step']])}</td>{cells}</tr>")
    knob_rows = [f"<tr><td>{esc(k['knob'])}</td><td>{esc(k['what'])}</td><td>{esc(k['verdict'])}</td></tr>"
                 for k in report["placement"]["knobs"]]  # the verdict carries both sides' figures
    knob_rows += [f"<tr><td>{esc(name)}</td><td>not tried</td><td>{esc(why)}</td></tr>"
                  for name, why in sorted(report["placement"]["skipped"].items())]
    target = report["request"]["target_qps"]
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>ragheat tune</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin-bottom:2em}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left}}</style></head><body>
<h1>ragheat tune: {esc(report['request']['beir'])} ({esc(report['request']['split'])})</h1>
<p>Labels: {esc(report['labels']['reason'])}. Settings written to <code>{esc(report['settings_file'])}</code>
(<code>ragheat serve --settings</code>).</p>
<h2>After each step</h2>
<table><tr><th>step</th><th>nDCG@10</th><th>nDCG@10, held-out questions</th><th>c=1 P50 ms</th>
<th>c=1 P99 ms (rounds' spread)</th><th>knee req/s</th>
<th>P99 ms at {target:g} req/s</th><th>what the step did</th></tr>{''.join(rows)}</table>
<h2>Stages at concurrency 1 (P50 / P99 ms, median of the rounds)</h2>
<table><tr><th>step</th>{''.join(f'<th>{esc(s)}</th>' for s in stages_seen)}</tr>{''.join(stage_rows)}</table>
{_written_html(report)}<h2>Placement knobs (side by side, {report['request']['rounds']} rounds each)</h2>
<table><tr><th>knob</th><th>what</th><th>verdict</th></tr>{''.join(knob_rows)}</table>
<h2>Host</h2><pre>{esc(json.dumps(report['placement']['capabilities'], indent=2))}</pre>
</body></html>"""


def _written_html(report: dict) -> str:
    rows = written_rows(report)
    if not rows:
        return ""
    esc = html.escape
    cells = "".join(
        f"<tr><td>{esc(w['side'])}</td><td>{w['limits']['max_num_seqs']} x {w['limits']['max_model_len']}</td>"
        f"<td>{_fmt(w['p50_ms'], 0)}</td><td>{_fmt(w['p99_ms'], 0)} (±{_fmt(w['p99_spread_ms'], 0)})</td>"
        f"<td>{_fmt(w['first_token_p50_ms'], 0)} / {_fmt(w['first_token_p99_ms'], 0)}</td>"
        f"<td>{_fmt(w['p99_at_rate_ms'], 0)}</td><td>{esc(answers_words(w['answers']))}</td></tr>" for w in rows)
    return (f"<h2>Step 3: the service writing its answers through the model server</h2><table><tr><th>side</th>"
            f"<th>max_num_seqs x max_model_len</th><th>c=1 P50 ms</th><th>c=1 P99 ms (rounds' spread)</th>"
            f"<th>first token P50 / P99 ms</th><th>P99 ms at {rows[0]['rate']:g} req/s</th>"
            f"<th>answers by writer</th></tr>{cells}</table>")


def write_report(report: dict, folder: Path) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    json_path, html_path = folder / "report.json", folder / "report.html"
    json_path.write_text(json.dumps(report, indent=2, sort_keys=True, default=str))
    html_path.write_text(render_html(report))
    return json_path, html_path
