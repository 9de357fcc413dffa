"""Sections on time: query latency by part, ingestion, and what telemetry costs a request."""

from __future__ import annotations

from typing import Mapping

from .stats import bold, count, duration, noise_verdict, num, pct, signed, spread, table, with_range

# Targets from the issues that set them (query path: issue 3; ingest: issue 2; telemetry: issue 5).
EMBED_P50_MS, EMBED_P99_MS = 4.0, 8.0
HTTP_P50_MS, HTTP_P99_MS = 15.0, 30.0
INGEST_SCIFACT_S = 180.0
TELEMETRY_LOSS_PCT, TELEMETRY_P99_MS = 3.0, 0.5


def _ms(values: list[float]) -> str:
    return with_range(values, lambda v: num(v, 2))


def _met(ok: bool) -> str:
    return "met" if ok else bold("not met")


def _pipeline(q: Mapping) -> str:
    """What the served default ran when the file was made: hybrid, reranked when the server timed a rerank stage."""
    return "hybrid, reranked" if "rerank" in q["server_stage_p50_ms"] else "hybrid"


def query(results: Mapping[str, dict]) -> dict:
    q = results["query"]
    p = q["model_precision"]
    rows_spec = [
        (f"ONNX session alone, {p}, 1 thread (`session.run`)", f"onnx_{p}_session_ms", False),
        (f"`embed_query` {p} (tokenise + run)", f"embed_query_{p}_ms", True),
        *([("ONNX session alone, fp32, 1 thread", "onnx_fp32_session_ms", False)] if p != "fp32" else []),
        (f"FAISS {q['index']['kind'].upper()} search alone (k={q['candidates']})", "faiss_search_ms", False),
        (f"BM25 top-{q['candidates']} alone (analyse + score)", "bm25_search_ms", False),
        ("whole pipeline in-process (`RagPipeline.query`)", "pipeline_in_process_ms", False),
        (bold("`POST /v1/query` over HTTP, end to end"), "http_query_hybrid_ms", True),
    ]
    rows = []
    for label, key, strong in rows_spec:
        r = q[key]
        p50, p99 = _ms(r["rounds"]["p50"]), _ms(r["rounds"]["p99"])
        rows.append([label, bold(p50) if strong else p50, bold(p99) if strong else p99])
    embed, http = q[f"embed_query_{p}_ms"], q["http_query_hybrid_ms"]
    raw = {k: q[k]["p50"] for k in (f"embed_query_{p}_ms", "faiss_search_ms", "bm25_search_ms")}
    stages = q["server_stage_p50_ms"]
    stage_sum = sum(stages.values())
    return {
        "queries": count(q["queries"]),
        "rounds": count(q["rounds"]),
        "median_tokens": f"{q['median_query_tokens']:g}",
        "top_k": count(q["top_k"]),
        "table": table(["what (same run, same queries)", "P50 ms", "P99 ms"], rows, "lrr"),
        "targets": (f"Targets: query embedding P50 ≤ {EMBED_P50_MS:g} ms and P99 ≤ {EMBED_P99_MS:g} ms — "
                    f"{_met(embed['p50'] <= EMBED_P50_MS and embed['p99'] <= EMBED_P99_MS)} with {p}; `/v1/query` "
                    f"({_pipeline(q)}) P50 ≤ {HTTP_P50_MS:g} ms and P99 ≤ {HTTP_P99_MS:g} ms — "
                    f"{_met(http['p50'] <= HTTP_P50_MS and http['p99'] <= HTTP_P99_MS)}."),
        "overhead": (f"HTTP P50 / (embed + FAISS + BM25 raw P50s) = {num(http['p50'])} / {num(sum(raw.values()))} = "
                     f"{bold(num(q['http_p50_over_raw_stage_p50_sum'], 1) + '×')}"),
        "stages": (f"{num(stage_sum, 1)} ms at P50 ("
                   + ", ".join(f"{name} {num(ms)}" for name, ms in stages.items()) + ")"),
        "remainder": num(http["p50"] - stage_sum, 1),
    }


def ingest(results: Mapping[str, dict]) -> dict:
    data = results["ingest"]
    rows = []
    for r in data["runs"]:
        walls = [x["wall_s"] for x in r["rounds"]]
        wall = duration(r["wall_s"]) + (f" ({num(r['wall_s'], 1)} s)" if r["wall_s"] >= 60 else "")
        if len(walls) > 1:
            low, high = spread(walls)
            wall += f", rounds {num(low, 1)}–{num(high, 1)} s"
        rows.append([r["source"], r["precision"], count(r["documents"]), count(r["chunks"]), wall,
                     f"{num(r['embed_s'], 1)} s", f"{num(r['graph_s'], 1)} s", f"{num(r['peak_rss_mib'] / 1024, 2)} GiB"])
    default = data["default_precision"]
    scifact = next((r for r in data["runs"] if r["source"].rstrip("/").endswith("scifact") and r["precision"] == default),
                   None)
    out = {"table": table(["corpus", "precision", "documents", "chunks", "wall time", "of which embedding", "graph",
                           "peak RSS"], rows, "llrrrrrr"),
           "rounds": count(data["rounds"])}
    if scifact is None:
        out["target"] = f"Target: SciFact under {duration(INGEST_SCIFACT_S)} — not measured in this run."
    else:
        margin = INGEST_SCIFACT_S - scifact["wall_s"]
        out["target"] = (f"Target: SciFact under {duration(INGEST_SCIFACT_S)} — "
                         f"{_met(margin > 0)} ({duration(scifact['wall_s'])} at {default}, "
                         f"{'a margin of ' + duration(margin) if margin > 0 else duration(-margin) + ' over'}). "
                         f"Embedding is {pct(100 * scifact['embed_s'] / scifact['wall_s'], 0)} of the time, "
                         f"{num(scifact['chunks'] / scifact['embed_s'], 1)} chunks per second.")
    return out


def telemetry(results: Mapping[str, dict]) -> dict:
    t, rec = results["telemetry"], results["telemetry-recording"]
    lat, thr, summary = t["latency_c1"], t["throughput"], t["summary"]
    settings = t["settings"]
    labels = {"off": "off", "on_sampled": bold(f"on (default: metrics + spans + OTLP, "
                                               f"{settings['sample_ratio'] * 100:g} % traced)"),
              "on": "on, every request traced"}
    rows = []
    p99_added_rounds = {}
    for name in ("off", "on_sampled", "on"):
        l, h = lat[name], thr[name]
        if name == "off":
            rows.append([labels[name], num(l["p50_ms"]), num(l["p99_ms"]), with_range(h["rounds_rps"], lambda v: num(v, 1)),
                         "—", f"{count(h['server_cpu_us_per_request'])} µs"])
            continue
        s = summary[name]
        p99_added_rounds[name] = [a - b for a, b in zip(l["rounds"]["p99_ms"], lat["off"]["rounds"]["p99_ms"])]
        paired = s["rounds_throughput_loss_pct_paired"]
        rows.append([labels[name], f"{num(l['p50_ms'])} ({signed(s['p50_added_ms'])})",
                     f"{num(l['p99_ms'])} ({signed(s['p99_added_ms'])})",
                     with_range(h["rounds_rps"], lambda v: num(v, 1)),
                     f"{pct(s['throughput_loss_pct'])} / {with_range(paired, lambda v: pct(v))}",
                     f"{count(h['server_cpu_us_per_request'])} µs ({signed(s['server_cpu_added_us_per_request'], 0)} µs)"])
    default = summary["on_sampled"]
    full = summary["on"]
    loss_ok = default["throughput_loss_pct_paired_rounds"] <= TELEMETRY_LOSS_PCT
    p99_ok = default["p99_added_ms"] <= TELEMETRY_P99_MS
    costs = rec["recording_cost_us"]
    return {
        "requests": count(lat["off"]["n"]),
        "clients": count(settings["clients"]),
        "rounds": count(settings["rounds"]),
        "round_s": f"{settings['round_s']:g}",
        "spans": count(t["otlp_received"]["spans"]),
        "metric_exports": count(t["otlp_received"]["metric_requests"]),
        "table": table(["server", "P50 ms", "P99 ms", "req/s (median, min–max)",
                        "throughput loss (of medians / paired: median, min–max)", "server CPU per request"], rows,
                       "lrrrrr"),
        "verdict": (f"Against the targets (≤ {TELEMETRY_LOSS_PCT:g} % throughput, ≤ {TELEMETRY_P99_MS:g} ms at P99), the "
                    f"default configuration's paired loss of {pct(default['throughput_loss_pct_paired_rounds'])} is "
                    f"{'within' if loss_ok else 'over'} the first and its {signed(default['p99_added_ms'])} ms at P99 "
                    f"{'within' if p99_ok else 'over'} the second; tracing every request costs "
                    f"{pct(full['throughput_loss_pct_paired_rounds'])} (paired median)."),
        "noise_default": noise_verdict(default["rounds_throughput_loss_pct_paired"],
                                       "Throughput loss of the default configuration, round by round"),
        "noise_full": noise_verdict(full["rounds_throughput_loss_pct_paired"],
                                    "Throughput loss with every request traced"),
        "noise_p99": noise_verdict(p99_added_rounds["on_sampled"], "P99 added by the default configuration",
                                   lambda v: f"{signed(v)} ms"),
        "recording_metrics": num(t["recording_cost_us"]["metrics_only"], 1),
        "recording_spans": num(t["recording_cost_us"]["metrics_and_spans"], 1),
        "recording_table": table(
            ["what is recorded per request (exporting to a real OTLP receiver)", "µs per request"],
            [["Prometheus metrics only", num(costs["prometheus_metrics_only"], 1)],
             ["+ OTLP exponential-histogram metrics", num(costs["plus_otlp_metrics"], 1)],
             ["+ OTLP spans, 10 % of requests traced", num(costs["plus_otlp_spans_10pct"], 1)],
             ["+ OTLP spans, every request traced", num(costs["plus_otlp_spans_100pct"], 1)]], "lr"),
        "recording_requests": count(rec["requests_per_configuration"]),
    }

