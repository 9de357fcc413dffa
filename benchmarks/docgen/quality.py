"""Sections on retrieval quality: SciFact by retriever, the fusion grid, int8 against fp32 embeddings."""

from __future__ import annotations

import os
from typing import Mapping

from .stats import (bold, compare, count, difference_verdict, duration, join_words, num, paired_difference,
                    paired_ratios, signed, table, times, with_range)

METRICS = ("ndcg@10", "recall@10", "recall@100", "mrr@10")
LABELS = {"dense": "dense", "bm25": "bm25 (stemmed)", "hybrid": "hybrid (weighted RRF)"}
QUALITY_BAR = 0.01  # the nDCG@10 a cheaper embedding may cost (issue 3's bar for int8)


def _precision_label(model: dict) -> str:
    scheme = model.get("quantisation")
    return f"{model['precision']} ({scheme})" if scheme and model["precision"] != "fp32" else model["precision"]


def retrieval(results: Mapping[str, dict]) -> dict:
    report = results["eval-scifact"]
    rows = report["retrievers"]
    best = {m: max(r[m] for r in rows.values()) for m in METRICS}
    body = []
    for name, r in rows.items():
        label = LABELS.get(name, name)
        cells = [bold(f"{r[m]:.4f}") if r[m] == best[m] and len(rows) > 1 else f"{r[m]:.4f}" for m in METRICS]
        body.append([bold(label) if all(r[m] == best[m] for m in ("ndcg@10",)) else label, *cells])
    index, fusion, lexical = report["index"], report["fusion"], report.get("lexical") or {}
    dense_desc = index["kind"].upper() if index["kind"] != "hnsw" else (
        f"HNSW M={index.get('M')} efConstruction={index.get('efConstruction')} "
        f"efSearch={report.get('search', {}).get('hnsw_ef_search', '?')}")
    bm25 = lexical.get("bm25", {})
    out = {
        "queries": count(report["queries"]),
        "split": report["split"],
        "settings": (f"token windows of {report['chunking']['window_tokens']} word pieces with "
                     f"{report['chunking']['overlap_tokens']} overlap ({count(report['counts']['chunks'])} chunks), "
                     f"all-MiniLM-L6-v2 {_precision_label(report['model'])}, {dense_desc}, BM25 "
                     f"({bm25.get('method', '?')} variant, k1={bm25.get('k1', '?')}, b={bm25.get('b', '?')}, "
                     f"{lexical.get('stemmer', 'no')} stemming), weighted RRF k={fusion['rrf_k']:g}, weights dense "
                     f"{fusion['dense_weight']:g} / BM25 {fusion['bm25_weight']:g}"),
        "table": table(["retrievers", "nDCG@10", "recall@10", "recall@100", "MRR@10"], body, "lrrrr"),
    }
    if {"dense", "bm25", "hybrid"} <= set(rows):
        h, d, b = (rows[n]["ndcg@10"] for n in ("hybrid", "dense", "bm25"))
        beats = h > max(d, b)
        verb = "beats each of its parts" if beats else "does not beat both of its parts"
        out["hybrid_sentence"] = (f"The hybrid {verb} ({signed(h - d, 3)} over dense, {signed(h - b, 3)} over BM25 "
                                  f"in nDCG@10)." + (" `tests/rag/test_quality_scifact.py` asserts that ordering on "
                                                     "every CI run." if beats else " This contradicts "
                                                     "`tests/rag/test_quality_scifact.py`, which asserts it does."))
        out["parts_ndcg"] = f"{b:.3f} and {d:.3f}"
    return out


def fusion(results: Mapping[str, dict]) -> dict:
    data = results["fusion"]
    cells = {(c["rrf_k"], c["bm25_weight"]): c["ndcg@10"] for c in data["grid"]}
    ks = sorted({k for k, _ in cells})
    weights = sorted({w for _, w in cells})
    named = data["cells"]
    best_key = (named["best"]["rrf_k"], named["best"]["bm25_weight"])
    default_key = (named["default"]["rrf_k"], named["default"]["bm25_weight"])
    rows = []
    for k in ks:
        label = f"{k:g}" + (" (plain RRF)" if k == named["plain_rrf"]["rrf_k"] else "")
        row = [label]
        for w in weights:
            value = cells.get((k, w))
            text = "–" if value is None else f"{value:.4f}"
            if (k, w) == best_key:
                text = bold(text) + " (best)"
            if (k, w) == default_key:
                text += " (default)"
            row.append(text)
        rows.append(row)
    plain, best, default = (named[n]["ndcg@10"] for n in ("plain_rrf", "best", "default"))
    best_vs_default = paired_difference(named["best"]["per_query_ndcg@10"], named["default"]["per_query_ndcg@10"])
    default_vs_plain = paired_difference(named["default"]["per_query_ndcg@10"], named["plain_rrf"]["per_query_ndcg@10"])
    if best_key == default_key:
        choice = "The default is the best cell of this grid."
    elif best_vs_default["significant"]:
        choice = (f"The best cell (k={best_key[0]:g}, BM25 weight {best_key[1]:g}) is measurably ahead of the default "
                  f"(k={default_key[0]:g}, {default_key[1]:g}): "
                  + difference_verdict(best_vs_default, "it", "the default") + "; the default should be revisited.")
    else:
        choice = (f"The best cell (k={best_key[0]:g}, BM25 weight {best_key[1]:g}) and the default "
                  f"(k={default_key[0]:g}, {default_key[1]:g}) are paired on the same queries: "
                  + difference_verdict(best_vs_default, "the best cell", "the default")
                  + ". So the default is kept rather than chasing the best cell of one run.")
    return {
        "queries": count(data["queries"]),
        "depth": count(data["depth_chunks"]),
        "table": table(["rrf_k \\ BM25 weight", *(f"{w:g}" for w in weights)], rows, "l" + "r" * len(weights)),
        "plain": f"{plain:.4f}",
        "alone": f"dense alone {data['alone_ndcg@10']['dense']:.4f}, BM25 alone {data['alone_ndcg@10']['bm25']:.4f}",
        "default_vs_plain": difference_verdict(default_vs_plain, "The default", "plain RRF"),
        "choice": choice,
    }


def precision(results: Mapping[str, dict]) -> dict:
    low, full = results["eval-scifact"], results["eval-scifact-fp32"]
    corpus = os.path.normpath(low["beir"])
    ingest = {r["precision"]: r for r in results["ingest"]["runs"] if os.path.normpath(r["source"]) == corpus}
    query = results["query"]
    low_p = low["model"]["precision"]
    rows, figures = [], {}
    for report in (full, low):
        p = report["model"]["precision"]
        session = query.get(f"onnx_{p}_session_ms")
        run = ingest.get(p)
        figures[p] = {"dense": report["retrievers"]["dense"]["ndcg@10"], "hybrid": report["retrievers"]["hybrid"]["ndcg@10"],
                      "ingest": run["wall_s"] if run else None, "p50": session["p50"] if session else None}
        rows.append([_precision_label(report["model"]), f"{figures[p]['dense']:.4f}", f"{figures[p]['hybrid']:.4f}",
                     duration(run["wall_s"]) if run else "not measured",
                     f"{with_range(session['rounds']['p50'])} / {with_range(session['rounds']['p99'])} ms"
                     if session else "not measured"])
    f, q = figures["fp32"], figures[low_p]
    dense_cost = f["dense"] - q["dense"]
    hybrid_cost = f["hybrid"] - q["hybrid"]
    within = abs(dense_cost) <= QUALITY_BAR
    speed = []
    if f["p50"] and q["p50"]:
        # each round timed both sessions back to back: pair them, so a slower round slows both alike
        ratios = paired_ratios(query["onnx_fp32_session_ms"]["rounds"]["p50"],
                               query[f"onnx_{low_p}_session_ms"]["rounds"]["p50"])
        speed.append(f"its query embedding is {times(f['p50'], q['p50'])} at P50 (fp32 / {low_p} per round: "
                     f"{with_range(ratios, lambda v: f'×{v:.2f}')})")
    if f["ingest"] and q["ingest"]:
        speed.append(f"its ingestion {times(f['ingest'], q['ingest'])}")
    return {
        "precision": low_p,
        "table": table(["precision", "dense nDCG@10", "hybrid nDCG@10", "ingest of SciFact (no eval)",
                        "query embedding P50 / P99"], rows, "lrrrr"),
        "verdict": (f"{low_p} {compare(dense_cost, 0, 'costs', 'gains', 'costs')} {num(abs(dense_cost), 4)} nDCG@10 on "
                    f"dense retrieval ({'within' if within else 'over'} the bar of {QUALITY_BAR}) and "
                    f"{num(abs(hybrid_cost), 4)} on hybrid ("
                    + compare(hybrid_cost, 0, "lower than fp32", "higher than fp32", "the same as fp32") + ")"
                    + (f"; {join_words(speed)}" if speed else "") + "."),
    }
