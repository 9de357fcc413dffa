"""Sections added with issues 14, 19 and 16: the knowledge graph and router on hotpotqa-dev, the embedding
quantisation schemes side by side, and vLLM's own latency against the client's."""

from __future__ import annotations

from typing import Mapping

from .stats import (bold, count, difference_verdict, noise_verdict, num, paired_difference, signed, table,
                    with_range)

GRAPH_SETS = ("dense", "bm25", "hybrid", "graph", "hybrid+graph", "routed")
HTTP_VARIANTS = ("hybrid", "hybrid+graph", "routed")


def _ms(values: list[float]) -> str:
    return with_range(values, lambda v: num(v, 2))


def graph(results: Mapping[str, dict]) -> dict:
    data = results["graph"]
    quality = data["quality"]
    rows_q = quality["retrievers"]
    best = max(r["ndcg@10"] for r in rows_q.values())
    body = []
    for name in [n for n in GRAPH_SETS if n in rows_q]:
        r = rows_q[name]
        ndcg = f"{r['ndcg@10']:.4f}"
        body.append([bold(name) if r["ndcg@10"] == best else name, bold(ndcg) if r["ndcg@10"] == best else ndcg,
                     f"{r['recall@10']:.4f}", f"{r['recall@100']:.4f}", f"{r['mrr@10']:.4f}",
                     f"{100 * r['graph_ran_share']:.0f} %", num(r["latency_ms"]["p50"]), num(r["latency_ms"]["p99"])])
    hybrid = rows_q["hybrid"]["per_query_ndcg@10"]
    verdicts = [difference_verdict(paired_difference(rows_q[name]["per_query_ndcg@10"], hybrid), name, "hybrid") + "."
                for name in ("hybrid+graph", "routed") if name in rows_q]
    rg = data["retrieve_graph"]
    ingest = data["ingest"]
    out = {
        "queries": count(quality["queries"]),
        "split": quality["split"],
        "settings": ", ".join(f"{k}={v}" for k, v in sorted(data["graph_settings"].items())),
        "quality_table": table(["retrievers", "nDCG@10", "recall@10", "recall@100", "MRR@10", "graph ran",
                                "in-process P50 ms", "P99 ms"], body, "lrrrrrrr"),
        "quality_verdict": " ".join(verdicts),
        "stage_table": table(["what (same run, every question, concurrency 1)", "P50 ms", "P99 ms"], [
            ["`retrieve_graph`, Cypher on the embedded store (served default)",
             _ms(rg["retrieve_graph_cypher_ms"]["rounds_p50"]), _ms(rg["retrieve_graph_cypher_ms"]["rounds_p99"])],
            ["`retrieve_graph`, in-process adjacency", _ms(rg["retrieve_graph_adjacency_ms"]["rounds_p50"]),
             _ms(rg["retrieve_graph_adjacency_ms"]["rounds_p99"])],
            ["`link_entities` alone", _ms(rg["link_entities_ms"]["rounds_p50"]),
             _ms(rg["link_entities_ms"]["rounds_p99"])],
            ["the store's own execution time (Cypher `run_time_ms`)", num(rg["store_execution_ms"]["p50"]),
             num(rg["store_execution_ms"]["p99"])],
            ["PING on the store's socket (the IPC floor)", num(rg["socket_ping_ms"]["p50"], 3),
             num(rg["socket_ping_ms"]["p99"], 3)]], "lrr"),
        "linked": f"{count(rg['linked_queries'])} of {count(rg['queries'])}",
        "ingest": (f"building the graph took {_s(ingest['graph_wall_s_all'])} s for {count(ingest['chunks'])} chunks "
                   f"({count(ingest['counts'].get('entities', 0))} entities), against "
                   f"{num(ingest['ingest_without_graph_s (manifest)'], 1)} s for the rest of the index's ingest "
                   f"(its manifest): ×{num(ingest['ratio_with_graph'], 2)} in all"),
    }
    http = data.get("http_concurrency_1")
    if http is None:
        raise ValueError("graph.json has no http_concurrency_1 part (run bench_graph.py without --skip-http)")
    base = http["hybrid"]
    rows_h, added = [], {}
    for name in HTTP_VARIANTS:
        r = http[name]
        extra = [b - a for a, b in zip(base["rounds_p50"], r["rounds_p50"])]
        added[name] = extra
        rows_h.append([name, _ms(r["rounds_p50"]), _ms(r["rounds_p99"]),
                       "—" if name == "hybrid" else with_range(extra, signed)])
    out["http_queries"] = count(base["n"])
    out["http_rounds"] = count(base["rounds"])
    out["http_table"] = table(["`/v1/query` retrievers", "P50 ms", "P99 ms", "P50 added to hybrid, ms (per round)"],
                              rows_h, "lrrr")
    out["http_verdict"] = " ".join(
        noise_verdict(added[n], f"{n} against hybrid at P50", lambda v: f"{signed(v)} ms") for n in HTTP_VARIANTS[1:])
    return out


def _s(values: list[float]) -> str:
    return with_range(values, lambda v: num(v, 2))


def embedding(results: Mapping[str, dict]) -> dict:
    data = results["embedding"]
    schemes = data["schemes"]
    fp32 = schemes["fp32"]
    fp32_bulk = fp32["bulk_word_pieces_per_s"]["median"]
    fp32_query = fp32["query_ms"]["p50"]
    shipped = data["setup"].get("int8_scheme")
    setup = data["setup"]
    single = setup["rounds"] == 1

    def ranged(median: float, low_high: list[float], fmt=num) -> str:
        return fmt(median) if single else f"{fmt(median)} ({fmt(low_high[0])}–{fmt(low_high[1])})"
    with_cpu = all("bulk_cpu_s" in r for r in schemes.values())  # CPU seconds: fair on a shared machine
    rows = []
    for name, r in schemes.items():
        q, b, bi, ag = r["query_ms"], r["bulk_word_pieces_per_s"], r["batch_independence"], r["agreement_with_fp32"]
        label = f"{name} (`precision=int8`)" if name == "int8" else name
        rows.append([bold(label) if name == "int8" else label, num(r["size_mib"], 1), f"{bi['min_cosine']:.6f}",
                     f"{ag['median']:.5f} / {ag['min']:.5f}",
                     ranged(q["p50"], q["p50_spread"]), ranged(q["p99"], q["p99_spread"]),
                     ranged(b["median"], b["spread"], count),
                     *([ranged(r["bulk_cpu_s"]["median"], r["bulk_cpu_s"]["spread"], lambda v: num(v, 1))]
                       if with_cpu else []),
                     f"×{num(b['median'] / fp32_bulk)}", f"×{num(fp32_query / q['p50'])}",
                     f"{r['dense_ndcg@10']:.4f}" if "dense_ndcg@10" in r else "—"])
    overlaps = [name for name, r in schemes.items() if name != "fp32"
                and r["bulk_word_pieces_per_s"]["spread"][0] <= fp32["bulk_word_pieces_per_s"]["spread"][1]]
    if single:
        noise = "One speed round only: there is no spread to judge the speed-ups by."
    elif overlaps:
        noise = (f"The bulk ranges of {', '.join(overlaps)} overlap fp32's, so their bulk speed-up is within this "
                 f"run's noise.")
    else:
        noise = "Every other scheme's bulk range across rounds lies clear of fp32's."
    return {
        "table": table(["scheme", "MiB", "batch min cos", "fp32 cos median / min", "query P50 ms", "query P99 ms",
                        "bulk word pieces/s", *(["bulk CPU s"] if with_cpu else []), "bulk vs fp32",
                        "query vs fp32", "dense nDCG@10"], rows, "l" + "r" * (10 if with_cpu else 9)),
        "rounds": count(setup["rounds"]), "queries_per_round": count(setup["queries_per_round"]),
        "bulk_chunks": count(setup["bulk_chunks"]), "bulk_threads": count(setup["bulk_threads"]),
        "probes": count(setup["probes"]), "mixes": count(setup["mixes"]), "agree": count(setup["agree"]),
        "shipped": f"`{shipped}`" if shipped else "the `int8` row", "noise": noise,
    }


def vllm_ttft(results: Mapping[str, dict]) -> dict:
    data = results["vllm-ttft"]
    rows = data["rows"]

    def mean(key: str) -> str:
        return "—" if rows[key]["mean_ms"] is None else num(rows[key]["mean_ms"])
    body = [[r["what"], count(r["n"]), mean(key), r["p50"], r["p99"]] for key, r in rows.items()]
    client, server = rows["ttft_client"]["mean_ms"], rows["ttft_vllm"]["mean_ms"]
    gap = (f"The client sees the first token {num(client - server)} ms later than vLLM records it "
           f"({num(client)} vs {num(server)} ms mean)" if client is not None and server is not None
           else "No answer was timed on one side, so the two cannot be compared")
    ic, iv = rows["inter_token_client"], rows["inter_token_vllm"]
    inter = (f"Inter-token means: {mean('inter_token_client')} ms (client, {count(ic['n'])} gaps) against "
             f"{mean('inter_token_vllm')} ms (vLLM, {count(iv['n'])} gaps)")
    return {"table": table(["what", "observations", "mean ms", "P50 ms", "P99 ms"], body, "lrrrr"),
            "queries": count(data["queries"]), "timed": count(data["timed"]), "max_tokens": count(data["max_tokens"]),
            "server": ", ".join(f"`{k}` {v}" for k, v in data["server"].items()),
            "ttft_gap": gap, "inter_token": inter}
