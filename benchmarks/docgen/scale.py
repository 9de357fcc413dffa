"""Sections about growing the corpus: what the reranker's stored token vectors cost at scale, compressed, and the
passages on a Milvus server."""

from __future__ import annotations

import math
from typing import Callable

from rag.settings import RerankSettings

from .stats import bold, count, join_words, num, opt, signed, table, with_range


def token_codes(d: dict) -> str:
    t = d["token-codes"]
    codes, sets, choice = t["codes"], t["sets"], t["choice"]
    at = t["at_chunks"]
    rows = []
    for name, s in sets.items():
        for dtype in ["int8", *codes]:
            size, quality = s["sizes"][dtype], s["quality"][dtype]
            wall, cpu = s["rerank_ms"][dtype], s["rerank_cpu_ms"][dtype]
            diff = "–" if dtype == "int8" else (
                f"{signed(quality['difference'], 4)} ± {num(quality['difference_se'], 4)} "
                f"({count(quality['better'])} / {count(quality['worse'])})")
            rows.append([name, bold(dtype) if dtype == choice["smallest_within"] else dtype,
                         count(size["bytes_per_token"]), num(size["bytes_per_chunk"] / 1024, 1),
                         num(size[f"gib_at_{at}"], 1), num(quality["ndcg@10"], 4), diff,
                         f"{num(wall['p50'])} / {num(wall['p99'])}", f"{num(cpu['p50'])} / {num(cpu['p99'])}",
                         "–" if dtype == "int8" else num(size["build_s"], 0)])
    first = next(iter(sets.values()))
    within = join_words([f"`{c}`" for c in choice["within"]]) or "none"
    smallest = choice["smallest_within"]
    # A loss within the target by less than its standard error may be past it on other questions.
    close = [name for name, s in sets.items() if smallest and
             choice["max_loss"] + s["quality"][smallest]["difference"] < s["quality"][smallest]["difference_se"]]
    caution = (f" On {join_words(close)} its loss is within the target by less than its standard error:\non other "
               f"questions it may be past it, and the next larger code within the target is the safer choice."
               if close else "")
    return f"""\
The reranker keeps every chunk's token vectors (`rerank.store_tokens`); at int8 they are most of an index, and
a corpus of {count(at)} chunks would not fit this machine's memory. Product codes (`rerank.token_dtype` `pq64`,
`pq32`, `pq16`: bytes a token, after a learnt rotation, as ColBERTv2 and PLAID compress theirs) are learnt here from
the same index's int8 vectors, as `ragheat ingest` learns them, and served by the same reranker on the same fused
candidates ({count(first['candidates'])} a query), with the shipped head. nDCG@10 of hybrid + rerank over every
judged query, the difference against int8 paired query by query (± its standard error; queries better / worse);
the rerank stage alone, P50 / P99 ms, wall and this thread's CPU, the dtypes interleaved. The size at
{count(at)} chunks is arithmetic (this set's mean tokens per chunk times the bytes a token), not a run.

{table(["set", "token vectors", "bytes a token", "KiB a chunk", f"GiB at {count(at)} chunks", "nDCG@10",
        "difference", "rerank ms", "rerank CPU ms", "build s"], rows, "llrrrrlrrr")}

Within {num(choice['max_loss'], 3)} nDCG@10 of int8 on every set: {within}; the smallest of them is
{bold(smallest or 'none')}.{caution} The default is `{RerankSettings().token_dtype}`; docs/scale.md says when to
switch."""


def loglog_slope(sizes: list[dict], value) -> float | None:
    """The log-log slope of ``value(size)`` from the smallest corpus to the largest (0 constant, 1 linear)."""
    first, last = sizes[0], sizes[-1]
    a, b = value(first), value(last)
    if not a or not b or last["chunks"] == first["chunks"]:
        return None
    return math.log(b / a) / math.log(last["chunks"] / first["chunks"])


def _growth_word(slope: float | None) -> str:
    if slope is None:
        return "–"
    if slope < 0.15:
        return "constant"
    if slope < 0.85:
        return "sub-linear"
    if slope <= 1.15:
        return "linear"
    return "super-linear"


def growth_sizes(g: dict) -> tuple[list[dict], list[dict], str]:
    """(the corpora whose token vectors are stored as the smallest one's, by size; the others; that storage)."""
    every = sorted(g["sizes"].values(), key=lambda s: s["chunks"])
    stored = every[0].get("token_dtype", "int8")
    sizes = [s for s in every if s.get("token_dtype", "int8") == stored]  # the slopes compare like with like
    coded = [s for s in every if s.get("token_dtype", "int8") != stored]
    return sizes, coded, stored


def growth_measures(stages: bool = True) -> list[tuple[str, Callable[[dict], float | None], int]]:
    """The growth curve's rows: (name, its value at a corpus, digits); with ``stages``, each stage's own too."""
    mib = 2**20
    names = ("embed", "retrieve_dense", "retrieve_bm25", "fuse", "rerank", "generate") if stages else ()

    def stage(name: str, at: str) -> Callable[[dict], float | None]:
        return lambda s: (s["stage_ms"].get(name) or {}).get(at)

    return [
        ("dense index, MiB", lambda s: s["disk_bytes"]["dense"] / mib, 1),
        ("BM25, MiB", lambda s: s["disk_bytes"]["bm25"] / mib, 1),
        ("chunk text, MiB", lambda s: s["disk_bytes"]["chunks"] / mib, 1),
        ("token vectors, MiB", lambda s: s["disk_bytes"]["rerank_tokens"] / mib, 1),
        ("service memory once ready, MiB", lambda s: s["rss_bytes"] / mib, 0),
        ("start-up until ready, s", lambda s: s["startup_s"], 1),
        ("c=1 end to end P50, ms", lambda s: s["e2e_ms"]["p50"], 2),
        ("c=1 end to end P99, ms", lambda s: s["e2e_ms"]["p99"], 2),
        *[(f"c=1 {name} P50, ms", stage(name, "p50"), 2) for name in names],
        *[(f"c=1 {name} P99, ms", stage(name, "p99"), 2) for name in names],
        ("service CPU per answer, ms", lambda s: s["closed_loop"]["cpu_ms_per_answer"], 2),
        ("answers/s", lambda s: s["closed_loop"]["answers_per_s"], 0),
        ("knee, req/s (open loop)", lambda s: (s.get("knee") or {}).get("knee_qps"), 0),
        ("hot swap until served, s", lambda s: s["hot_swap"]["swap_s"], 1),
        ("slowest request during the swap, ms", lambda s: s["hot_swap"]["slowest_ms"], 1),
    ]


def growth(d: dict) -> str:
    g = d["growth"]
    sizes, coded, stored = growth_sizes(g)
    measures = growth_measures()
    rows = []
    for name, value, digits in measures:
        slope = loglog_slope(sizes, value)
        rows.append([name, *[opt(value(s), digits) for s in sizes], opt(slope, 2), _growth_word(slope),
                     *[opt(value(s), digits) for s in coded]])
    header = ["at", *[f"{count(s['chunks'])} chunks{' (grown)' if s['grown'] else ''}" for s in sizes],
              "log-log slope", "grows",
              *[f"{count(s['chunks'])} chunks (grown, token vectors {s['token_dtype']})" for s in coded]]
    largest, million = sizes[-1], 1_000_000
    # Memory is a fixed part plus a part per chunk: extrapolated from the increment between the two largest corpora.
    before = sizes[-2] if len(sizes) > 1 else None
    per_chunk = ((largest["rss_bytes"] - before["rss_bytes"]) / (largest["chunks"] - before["chunks"])
                 if before is not None and largest["chunks"] > before["chunks"] else None)
    at_million = ((largest["rss_bytes"] + per_chunk * (million - largest["chunks"])) / 2**30
                  if per_chunk is not None and per_chunk > 0 else None)
    tokens_at_million = largest["disk_bytes"]["rerank_tokens"] * million / largest["chunks"] / 2**30
    return f"""\
One `ragheat serve` at a time on each corpus (the graph off), the same SciFact claims; the slope is that of the
log-log line from the smallest corpus to the largest (0: constant, 1: linear in the corpus). The grown corpora's
costs are representative, their relevance is not: no quality figure is reported for them (how they are grown:
`benchmarks/bench_growth.py`).

{table(header, rows, "l" + "r" * (len(sizes) + 1) + "l" + "r" * len(coded))}

![Each measure against the corpus size, log-log](images/growth.svg)
{_knee_sentence(sizes + coded)}{_coded_sentence(coded, stored)}
Extrapolated, not measured: at {count(million)} chunks the service's memory once ready would be about
{opt(at_million, 1)} GiB (the memory each chunk added between the two largest corpora, times the chunks still to
come), of which the {stored} token vectors {num(tokens_at_million, 1)} GiB; the machine has
{num(g['memory_gib'], 1)} GiB. The token vectors are the first wall: product codes
(the next section) shrink them.

{_ingest_sentence(d["ingest"], [s["chunks"] for s in sizes + coded if s["grown"]])}"""


def _ingest_sentence(ingest: dict, grown: list[int]) -> str:
    """The real ingest's rate ("Ingestion"), and what it makes of the grown corpora's sizes: extrapolated."""
    run = next((r for r in ingest["runs"] if r["precision"] == ingest["default_precision"]), None)
    if run is None:
        raise ValueError(f"no ingest run at the default precision ({ingest['default_precision']})")
    rate = run["chunks"] / run["wall_s"]
    at = join_words([f"{count(n)} chunks about {num(n / rate / 3600, 1)} h" for n in grown])
    return (f"Ingest, extrapolated, not measured: the real ingest of `{run['source']}` ({count(run['chunks'])} "
            f"chunks, {run['precision']}, \"Ingestion\") ran {num(rate, 1)} chunks/s on its machine (its line above), "
            f"{num(100 * run['embed_s'] / run['wall_s'], 0)} % of it the encoder, whose work grows with the chunks: "
            f"at that rate {at}. The grown corpora above are built from the real index's vectors instead "
            f"(`benchmarks/bench_growth.py`), which is why they exist here.")


def _knee_sentence(sizes: list[dict]) -> str:
    """How the knee row was measured, every step's P99 and refusals, and which corpora met the SLO at every rate tried
    (their knee is a floor)."""
    measured = [s for s in sizes if s.get("knee")]
    if not measured:
        return ""
    k = measured[0]["knee"]
    rates = sorted({step["offered_qps"] for s in measured for step in s["knee"]["steps"]})
    floors = [count(s["chunks"]) for s in measured
              if s["knee"]["knee_qps"] is not None and s["knee"]["knee_qps"] == s["knee"]["steps"][-1]["offered_qps"]]
    floor = (f" At {', '.join(floors)} chunks every step met it: the knee shown is the highest rate tried, a floor."
             if floors else "")

    def cell(size: dict, rate: float) -> str:
        step = next((x for x in size["knee"]["steps"] if x["offered_qps"] == rate), None)
        if step is None:
            return "–"
        refused = f", {num(100 * step['shed_rate'], 1)} % refused" if step["shed_rate"] else ""
        return f"{opt(step['p99_ms'], 0)}{refused}"

    rows = [[f"{count(s['chunks'])}{'' if s.get('token_dtype', 'int8') == 'int8' else ' (' + s['token_dtype'] + ')'}",
             *[cell(s, r) for r in rates]] for s in measured]
    return (f"\nThe knee: open-loop Poisson steps of {num(k['step_s'], 0)} s from {num(rates[0], 0)} req/s up, to the "
            f"first that misses the SLO (P99 over {num(k['slo_ms'], 0)} ms, or errors or refusals over "
            f"{num(100 * k['max_error_rate'], 1)} %); the knee is the highest rate met with every lower one met too."
            f"{floor} One step a rate: a step's P99 near the knee moves by its own noise (each step's P99, ms, and "
            f"refusals below), so a knee one step apart between sizes is not a difference.\n\n"
            f"{table(['chunks', *[f'{num(r, 0)} req/s' for r in rates]], rows, 'l' + 'r' * len(rates))}\n")


def _coded_sentence(coded: list[dict], stored: str) -> str:
    if not coded:
        return ""
    served = " ".join(
        f"With its token vectors as {s['token_dtype']}, the {count(s['chunks'])}-chunk corpus is served by one process "
        f"in {num(s['rss_bytes'] / 2**30, 1)} GiB once ready: c=1 P50 {num(s['e2e_ms']['p50'])} ms, P99 "
        f"{num(s['e2e_ms']['p99'])} ms, {num(s['closed_loop']['answers_per_s'], 0)} answers/s; its hot swap takes "
        f"{num(s['hot_swap']['swap_s'], 1)} s, and the slowest request meanwhile {num(s['hot_swap']['slowest_ms'], 0)} "
        f"ms (the new generation loads on the same cores)." for s in coded)
    return (f"\nThe last column{'s' if len(coded) > 1 else ''} stores the token vectors as product codes instead of "
            f"{stored} (learnt from the grown {stored} vectors, as an ingest learns them): measured, outside the "
            f"slopes, which compare corpora stored alike. {served}\n")


MILVUS_PARITY = 0.01  # the largest nDCG@10 difference between the backends that counts as the same retrieval


def milvus(d: dict) -> str:
    m = d["milvus"]
    publish, quality, stages = m["publish"], m["quality"], m["stages"]
    block = publish["vector_store"]
    rows = [[combo, num(quality["local"][combo]["ndcg@10"], 4), num(quality["milvus"][combo]["ndcg@10"], 4),
             signed(quality["milvus"][combo]["ndcg@10"] - quality["local"][combo]["ndcg@10"], 4),
             num(quality["local"][combo]["recall@10"], 4), num(quality["milvus"][combo]["recall@10"], 4),
             f"{count(m['same_top10'][combo])} of {count(m['questions'])}" if combo in m["same_top10"] else "–"]
            for combo in quality["local"]]
    worst = max(abs(quality["milvus"][c]["ndcg@10"] - quality["local"][c]["ndcg@10"]) for c in quality["local"])
    stage_rows = [[f"retrieve_{name}", backend, with_range(stages[backend][name]["p50_ms"]),
                   with_range(stages[backend][name]["p99_ms"])]
                  for name in ("dense", "bm25") for backend in ("local", "milvus")]
    parts = ", ".join(f"{k} {num(v, 1)} s" for k, v in block["timings_s"].items())
    how = "from the generation's own vectors, nothing embedded again" if publish["reused"] else "embedded anew"
    hnsw = ("" if block["dense_index"] != "HNSW" else " Evaluation asks each retriever for the fused candidates, a "
            "deeper search: there two HNSW graphs built\napart (FAISS's here, the server's there) may order the top "
            "ten differently, which an exact (`flat`) index would not.")
    return f"""\
`vector_store.backend=milvus` (docs/scale.md): the index's current generation ({count(m['chunks'])} chunks) published
into a collection ({block['dense_index']} dense index, BM25 over ragheat's analysed terms) on a milvus-lite server
started for the run, {how}: {num(publish['wall_s'], 1)} s in all ({parts}).

Quality, `ragheat eval`'s code on the {count(m['questions'])} judged {m['split']} questions, both backends over the
same generation; "same top 10": questions whose retriever, asked for ten hits, returned the same ten passages in the
same order from both.{hnsw}

{table(["retrievers", "nDCG@10 local", "nDCG@10 Milvus", "difference", "recall@10 local", "recall@10 Milvus",
        "same top 10"], rows, "lrrrrrr")}

The largest nDCG@10 difference: {num(worst, 4)} (target ≤ {MILVUS_PARITY:g}: {'met' if worst <= MILVUS_PARITY else
'**not met**'}).

The two stages at concurrency 1, each search as the pipeline times it ({count(m['latency_queries'])} questions,
{count(m['hits'])} hits each, the backends in turn), ms:

{table(["stage", "backend", "P50", "P99"], stage_rows, "llrr")}

milvus-lite serves Milvus' protocol from a Python engine over gRPC on loopback: these latencies are what the
backend costs on one machine without Milvus, not what a Milvus cluster costs.{milvus_memory(m)}"""


def milvus_memory(m: dict) -> str:
    """The memory part of ``bench_milvus`` (absent from results files written before it)."""
    held = m.get("memory")
    if not held:
        return ""
    servers = held["servers"]
    rows = [[name, num(v["ready_mib"], 1), num(v["answered_mib"], 1),
             signed(v["answered_mib"] - servers["local"]["answered_mib"], 1)] for name, v in servers.items()]
    disk = held["on_disk_mib"]
    return f"""

Memory: one `ragheat serve` per configuration on the same generation (the defaults otherwise), each answering the
{count(m['latency_queries'])} questions over HTTP once; resident memory (VmRSS), MiB. `milvus-files` keeps the
generation's own dense and BM25 indexes in memory to answer while the server is down (`vector_store.fallback`
files, the default); `milvus-none` leaves them on disk (dense {num(disk['dense'], 1)} MiB and BM25
{num(disk['bm25'], 1)} MiB here), its dense and BM25 stages skipped while the server is down.

{table(["configuration", "ready", "after answering", "against local"], rows, "lrrr")}

At this size the reranker's token vectors, the models and the runtime are most of a process's memory; what
`fallback=none` saves grows with the corpus as the dense and BM25 indexes do (the growth curve above)."""
