"""Sections on time: query latency by part, ingestion, what telemetry costs a request, the semantic answer cache."""

from __future__ import annotations

import statistics

from .stats import (blocks, bold, count, duration, join_words, knee_rate, noise_verdict, num, pct, signed, spread,
                    table, with_range)

# Targets the project set itself: the query path, ingestion and telemetry's overhead.
EMBED_P50_MS, EMBED_P99_MS = 4.0, 8.0
HTTP_P50_MS, HTTP_P99_MS = 15.0, 30.0
INGEST_SCIFACT_S = 180.0
TELEMETRY_LOSS_PCT, TELEMETRY_P99_MS = 3.0, 0.5


def _met(ok: bool) -> str:
    return "met" if ok else bold("not met")


def query(d: dict) -> str:
    q = d["query"]
    p = q["model_precision"]
    parts = [
        (f"ONNX session alone, {p}, 1 thread (`session.run`)", f"onnx_{p}_session_ms", False),
        (f"`embed_query` {p} (tokenise + run)", f"embed_query_{p}_ms", True),
        *([("ONNX session alone, fp32, 1 thread", "onnx_fp32_session_ms", False)] if p != "fp32" else []),
        (f"FAISS {q['index']['kind'].upper()} search alone (k={q['candidates']})", "faiss_search_ms", False),
        (f"BM25 top-{q['candidates']} alone (analyse + score)", "bm25_search_ms", False),
        ("whole pipeline in-process (`RagPipeline.query`)", "pipeline_in_process_ms", False),
        (bold("`POST /v1/query` over HTTP, end to end"), "http_query_hybrid_ms", True),
    ]
    rows = []
    for label, key, strong in parts:
        p50, p99 = (with_range(q[key]["rounds"][k]) for k in ("p50", "p99"))
        rows.append([label, bold(p50) if strong else p50, bold(p99) if strong else p99])
    embed, http = q[f"embed_query_{p}_ms"], q["http_query_hybrid_ms"]
    raw = sum(q[k]["p50"] for k in (f"embed_query_{p}_ms", "faiss_search_ms", "bm25_search_ms"))
    stages = q["server_stage_p50_ms"]
    pipeline = "hybrid, reranked" if "rerank" in stages else "hybrid"  # what the served default ran
    return f"""\
{count(q['queries'])} SciFact claims (median {q['median_query_tokens']:g} word pieces), {count(q['rounds'])} rounds \
each. The server is a separate `ragheat serve` process (default telemetry on); the client sends one request at a time
with `top_k` {count(q['top_k'])}.

{table(["what (same run, same queries)", "P50 ms", "P99 ms"], rows, "lrr")}

Targets: query embedding P50 ≤ {EMBED_P50_MS:g} ms and P99 ≤ {EMBED_P99_MS:g} ms — \
{_met(embed['p50'] <= EMBED_P50_MS and embed['p99'] <= EMBED_P99_MS)} with {p}; `/v1/query` ({pipeline}) P50 ≤ \
{HTTP_P50_MS:g} ms and P99 ≤ {HTTP_P99_MS:g} ms — {_met(http['p50'] <= HTTP_P50_MS and http['p99'] <= HTTP_P99_MS)}.

Service overhead as a ratio: HTTP P50 / (embed + FAISS + BM25 raw P50s) = {num(http['p50'])} / {num(raw)} = \
{bold(num(q['http_p50_over_raw_stage_p50_sum'], 1) + '×')}. Inside the server the stages themselves take \
{num(sum(stages.values()), 1)} ms at P50 ({', '.join(f'{name} {num(ms)}' for name, ms in stages.items())}):
retrieval costs more than raw FAISS/BM25 because the query runs on a worker thread beside uvicorn's event loop
and turns every hit into an object for fusion. The remaining {num(http['p50'] - sum(stages.values()), 1)} ms at P50 is
HTTP, JSON (the passages' text in each response) and the client."""


def ingest(d: dict) -> str:
    data = d["ingest"]
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
    target = f"Target: SciFact under {duration(INGEST_SCIFACT_S)} — "
    if scifact is None:
        target += "not measured in this run."
    else:
        margin = INGEST_SCIFACT_S - scifact["wall_s"]
        target += (f"{_met(margin > 0)} ({duration(scifact['wall_s'])} at {default}, "
                   f"{'a margin of ' + duration(margin) if margin > 0 else duration(-margin) + ' over'}). Embedding is "
                   f"{pct(100 * scifact['embed_s'] / scifact['wall_s'], 0)} of the time, "
                   f"{num(scifact['chunks'] / scifact['embed_s'], 1)} chunks per second.")
    return f"""\
Each row is one `ragheat ingest --force` in its own process, nothing else inside it; peak RSS is the largest of
the ingest process and the children it waited for. {count(data['rounds'])} round(s) per row.

{table(["corpus", "precision", "documents", "chunks", "wall time", "of which embedding", "graph", "peak RSS"], rows,
       "llrrrrrr")}

{target} Chunking, FAISS and BM25 together are the small remainder; the graph column is building the
knowledge graph in the embedded store."""


TELEMETRY_HOW = """\
How the request path was kept this cheap (each step was measured when it was made; the figures are in the
commit messages, not re-measured here):

- **Spans are written straight to OTLP's wire format** (`telemetry/otlp_spans.py`), byte-for-byte the message
  the SDK's encoder builds (a test decodes both); attribute encodings are cached by (key, value).
- **Spans are built finished** rather than through the SDK's live-span path, and a request hands all of its
  spans over in one call to a `deque` the export thread drains.
- **The sampling decision is made before anything is built**; unsampled requests build no span at all.
- **OTLP histograms are ragheat's own base-2 aggregation** (`telemetry/otlp_metrics.py`), not the SDK's
  MeterProvider.
- **Batching**: spans go out 512 at a time or every 2 s; encoding yields the GIL every 32 spans.
- **Not telemetry, found while profiling it**: thread renames for the eBPF probes call `prctl` with the GIL
  held (`ctypes.PyDLL`), and `gc.freeze()` after warm-up keeps the collector off the index's objects."""


def telemetry(d: dict) -> str:
    t, rec = d["telemetry"], d["telemetry-recording"]
    lat, thr, summary, settings = t["latency_c1"], t["throughput"], t["summary"], t["settings"]
    labels = {"off": "off", "on_sampled": bold(f"on (default: metrics + spans + OTLP, "
                                               f"{settings['sample_ratio'] * 100:g} % traced)"),
              "on": "on, every request traced"}
    rows, p99_added = [], {}
    for name in ("off", "on_sampled", "on"):
        l, h = lat[name], thr[name]
        rps, cpu = with_range(h["rounds_rps"], lambda v: num(v, 1)), f"{count(h['server_cpu_us_per_request'])} µs"
        if name == "off":
            rows.append([labels[name], num(l["p50_ms"]), num(l["p99_ms"]), rps, "—", cpu])
            continue
        s = summary[name]
        p99_added[name] = [a - b for a, b in zip(l["rounds"]["p99_ms"], lat["off"]["rounds"]["p99_ms"])]
        rows.append([labels[name], f"{num(l['p50_ms'])} ({signed(s['p50_added_ms'])})",
                     f"{num(l['p99_ms'])} ({signed(s['p99_added_ms'])})", rps,
                     f"{pct(s['throughput_loss_pct'])} / {with_range(s['rounds_throughput_loss_pct_paired'], pct)}",
                     f"{cpu} ({signed(s['server_cpu_added_us_per_request'], 0)} µs)"])
    default, full = summary["on_sampled"], summary["on"]
    loss = default["throughput_loss_pct_paired_rounds"]
    costs = rec["recording_cost_us"]
    recording = [["Prometheus metrics only", num(costs["prometheus_metrics_only"], 1)],
                 ["+ OTLP exponential-histogram metrics", num(costs["plus_otlp_metrics"], 1)],
                 ["+ OTLP spans, 10 % of requests traced", num(costs["plus_otlp_spans_10pct"], 1)],
                 ["+ OTLP spans, every request traced", num(costs["plus_otlp_spans_100pct"], 1)]]
    return f"""\
Three `ragheat serve` processes on the same index run at once: **off** (`--no-telemetry`: no middleware, no
`/metrics`), **on** (Prometheus metrics with exemplars, a span for the request and each of its stages, OTLP/HTTP
export of spans and of exponential-histogram metrics every 10 s, default head sampling) and **on, every request
traced**. OTLP goes to a real OTLP/HTTP receiver in its own process, which received \
{count(t['otlp_received']['spans'])} spans and {count(t['otlp_received']['metric_requests'])} metric exports in this \
run. Latency: {count(lat['off']['n'])} requests per server at concurrency 1, interleaved request by request.
Throughput: {count(settings['clients'])} concurrent clients, {count(settings['rounds'])} rounds of \
{settings['round_s']:g} s per server, alternating off / on / on-100 %; "paired" is each round's loss against the "off"
round just before it. Server CPU per request is read from `/proc/<pid>/stat` over the same rounds.

{table(["server", "P50 ms", "P99 ms", "req/s (median, min–max)", "throughput loss (of medians / paired: median, "
        "min–max)", "server CPU per request"], rows, "lrrrrr")}

Against the targets (≤ {TELEMETRY_LOSS_PCT:g} % throughput, ≤ {TELEMETRY_P99_MS:g} ms at P99), the default \
configuration's paired loss of {pct(loss)} is {'within' if loss <= TELEMETRY_LOSS_PCT else 'over'} the first and its \
{signed(default['p99_added_ms'])} ms at P99 {'within' if default['p99_added_ms'] <= TELEMETRY_P99_MS else 'over'} the \
second; tracing every request costs {pct(full['throughput_loss_pct_paired_rounds'])} (paired median).

- {noise_verdict(default['rounds_throughput_loss_pct_paired'], 'Throughput loss of the default configuration, round '
                'by round')}
- {noise_verdict(full['rounds_throughput_loss_pct_paired'], 'Throughput loss with every request traced')}
- {noise_verdict(p99_added['on_sampled'], 'P99 added by the default configuration', lambda v: f'{signed(v)} ms')}

Cost of recording one request on the request path (`Telemetry.start` + `finish`, in-process, real stage
timings, same run): {num(t['recording_cost_us']['metrics_only'], 1)} µs for the Prometheus metrics alone, \
{num(t['recording_cost_us']['metrics_and_spans'], 1)} µs with a span for the request and every stage handed to an
in-memory exporter. The same, exporting to a real OTLP receiver ({count(rec['requests_per_configuration'])} requests
per configuration):

{table(["what is recorded per request (exporting to a real OTLP receiver)", "µs per request"], recording, "lr")}

{TELEMETRY_HOW}"""


def observe(d: dict) -> str:
    o = d["observe"]
    lat, thr, summary, settings, inner = o["latency_c1"], o["throughput"], o["summary"], o["settings"], o["in_process"]
    stages = settings["stages"]
    labels = {"off": "bare", "library": f"with `ragheat.observe` (middleware + {len(stages)} stage scopes)"}
    rows = []
    for name in ("off", "library"):
        l, h = lat[name], thr[name]
        rows.append([labels[name], with_range(l["rounds"]["p50_ms"]), with_range(l["rounds"]["p99_ms"]),
                     with_range(h["rounds_rps"], lambda v: num(v, 1)), f"{count(h['server_cpu_us_per_request'])} µs"])
    library, processor = inner["library"], inner["span_processor"]
    share = library["request_with_5_stages_us"] / 1000 / lat["off"]["p50_ms"] * 100
    return f"""\
The same small RAG service, written without ragheat (`benchmarks/plain_rag_service.py`: a hashed bag-of-words
embedding, a dense matrix-vector search and a BM25 over {count(settings['documents'])} SciFact abstracts,
reciprocal-rank fusion, an extractive answer, behind FastAPI), runs twice at once: bare, and with the library's
middleware and one stage scope per step ({', '.join(f'`{s}`' for s in stages)}, as its `/metrics` showed them;
Prometheus metrics with exemplars, threads named for the probes). Latency: {count(lat['off']['n'])} requests per
server at concurrency 1, interleaved request by request, {count(settings['rounds'])} rounds. Throughput:
{count(settings['clients'])} closed-loop clients, rounds of {settings['round_s']:g} s alternating between the two;
server CPU per request from `/proc/<pid>/stat`.

{table(["service", "P50 ms", "P99 ms", "req/s (median, min–max)", "server CPU per request (median)"], rows, "lrrrr")}

- {noise_verdict(summary['rounds_p50_added_ms'], 'P50 added by the library', lambda v: f'{signed(v)} ms')}
- {noise_verdict(summary['rounds_p99_added_ms'], 'P99 added by the library', lambda v: f'{signed(v)} ms')}
- {noise_verdict(summary['rounds_throughput_loss_pct_paired'], 'Throughput loss, round by round (paired)')}

In-process, the same run: one observed request with {count(library['stages'])} stages costs \
{num(library['request_with_5_stages_us'], 1)} µs (`Observer.request` and the stage scopes, thread renaming included),
{pct(share, 2)} of the bare service's P50; `StageSpanProcessor` adds {num(processor['processor_added_us'], 1)} µs to a
request the OpenTelemetry SDK already traces with {count(processor['spans_per_request'])} spans
({num(processor['sdk_request_us'], 1)} µs for the SDK alone, without an exporter)."""


def _f(v, digits: int = 1) -> str:
    return "-" if v is None or v == {} else f"{v:.{digits}f}"


def _pair(lat) -> str:
    return "-" if not lat else f"{_f(lat['p50'])} / {_f(lat['p99'])}"


RATE = ("none of the rates", " req/s")


def cache(d: dict) -> str:
    c = d["cache"]
    by_rate = {name: {r["offered_qps"]: r for r in c["steps"][name]} for name in ("no cache", "cache")}
    rows = []
    for rate in sorted(set(by_rate["no cache"]) | set(by_rate["cache"])):
        off, on = by_rate["no cache"].get(rate), by_rate["cache"].get(rate) or {}
        lookup = on.get("cache_lookup_ms") or {}
        rows.append([f"{rate:g}", _pair(off and off["latency_ms"]), _pair(on.get("latency_ms")),
                     "-" if on.get("hit_rate") is None else f"{on['hit_rate'] * 100:.1f}%", _pair(on.get("hit_ms")),
                     _pair(on.get("miss_ms")),
                     f"{_f(lookup.get('p50'), 2)} / {_f(lookup.get('p99'), 2)}" if lookup else "-"])
    lookups = [[f"{r['entries']:,}", f"{r['matrix_bytes'] / 2**20:.1f}",
                *(_f(r[k][p], 0) for k, p in (("get_us", "p50"), ("get_us", "p90"), ("get_us", "p99"),
                                               ("put_us", "p50"), ("blas_matvec_us", "p50"), ("blas_matvec_us", "p90")))]
               for r in c["lookup"]]
    knees = c["knee_qps"]
    return blocks(
        f"**Semantic cache at Zipf s = {c['zipf_s']:g}** over {c['queries']} {c['split']} claims (threshold "
        f"{c['threshold']:g}, top_k {c['top_k']}), knee search {c['duration_s']:g} s per step after "
        f"{c['warmup_s']:g} s warm-up, both configurations at each rate, alternating which goes first. Knee (P99 <= "
        f"{c['slo_ms']:g} ms): without the cache {knee_rate(knees['no cache'], *RATE)}, with it "
        f"{knee_rate(knees['cache'], *RATE)}. Load average "
        f"before: {c['load_average'][0]:.2f}. Latency from the intended send time; hit rate = hit / (hit + miss) of the "
        f"step's answers (the cache is carried across steps). One step per configuration and rate: a difference within "
        f"the step-to-step wobble of the no-cache column is noise; a hit still runs the embed stage, so it saves "
        f"retrieval and generation, not the model run.",
        table(["offered req/s", "no cache P50 / P99 ms", "cache P50 / P99 ms", "hit rate", "hits P50 / P99 ms",
               "misses P50 / P99 ms", "cache_lookup P50 / P99 ms"], rows, "rrrrrrr"),
        table(["entries", "matrix MiB", "get P50 us", "get P90 us", "get P99 us", "put P50 us", "BLAS matvec P50 us",
               "BLAS matvec P90 us"], lookups, "rrrrrrrr",
              f"`SemanticCache` alone: one lookup (a matrix-vector product over every {c['lookup'][0]['dim']}-d entry) "
              f"and one store, in microseconds, {c['lookups']} calls per size"))


QUIET_P50_MS, QUIET_P99_MS, QUIET_CPU_MS, QUIET_NDCG_LOSS = 9.0, 15.0, 9.0, 0.003


def quiet_case(d: dict) -> str:
    q = d["quiet-case"]
    enc, http = q["encoders"], q["http"]
    after_gap = all("idle_gap_p50_ms" in s["rounds"] for s in enc["sessions"].values())
    enc_rows = [[name, with_range(s["rounds"]["p50_ms"]), with_range(s["rounds"]["p99_ms"]),
                 with_range(s["rounds"]["cpu_ms"]), *([with_range(s["rounds"]["idle_gap_p50_ms"])] if after_gap else [])]
                for name, s in enc["sessions"].items()]
    gap_header = [f"P50 ms, each run after {num(enc['idle_gap_ms'], 0)} ms idle"] if after_gap else []
    first_set = next(iter(q["quality"].values()))
    passages, others = first_set["passages"], first_set["others"]
    quality_rows, worst = [], dict.fromkeys(others, 0.0)
    for name, s in q["quality"].items():
        for combo, at_passages in s["metrics"][passages].items():
            cells = []
            for other in others:
                diff = s["ndcg_difference"][other][combo]
                worst[other] = max(worst[other], -diff)
                cells.append(f"{num(s['metrics'][other][combo]['ndcg@10'], 4)} ({signed(diff, 4)})")
            quality_rows.append([name, combo, num(at_passages["ndcg@10"], 4), *cells])
    losses = join_words([f"{num(loss, 4)} at {other} ({_met(loss <= QUIET_NDCG_LOSS)})"
                         for other, loss in worst.items()])
    defaults_at = (http["configs"]["defaults"].get("embedding") or {}).get("queries")
    c1, loaded = http["concurrency_1"], http["closed_loop"]["servers"]
    http_rows = []
    for name, config in http["configs"].items():
        chosen = config["embedding"] or {}
        threads = chosen.get("lone_query_threads")  # what the server chose (older results: what it was told)
        if threads is None:
            threads = "1" if config["env"].get("RAGHEAT_EMBEDDING__QUIET_QUERY_THREADS") == "1" else "idle cores"
        http_rows.append([bold(name) if name == "defaults" else name, chosen.get("queries", "?"), str(threads),
                          with_range(c1[name]["rounds"]["p50_ms"]), with_range(c1[name]["rounds"]["p99_ms"]),
                          with_range([us / 1000 for us in loaded[name]["rounds_server_cpu_us_per_request"]]),
                          with_range(loaded[name]["rounds_rps"], lambda v: num(v, 0))])
    best = c1["defaults"]
    cpu = loaded["defaults"]["server_cpu_us_per_request"] / 1000
    def overlap(a: str, b: str) -> str:
        low_a, high_a = spread(c1[a]["rounds"]["p50_ms"])
        low_b, high_b = spread(c1[b]["rounds"]["p50_ms"])
        return "within" if low_a <= high_b and low_b <= high_a else "beyond"

    p50, p99 = (statistics.median(best["rounds"][k]) for k in ("p50_ms", "p99_ms"))
    return f"""\
{count(enc['queries'])} SciFact claims (median {enc['median_tokens']:g} word pieces), {count(len(next(iter(
        enc['sessions'].values()))['rounds']['p50_ms']))} rounds; every figure below is `median (lowest–highest round)`.

**The query encoder alone**, one query per run with its token states, as the service runs it (the quiet session's
threads do not spin between runs). Which precision is fastest depends on the CPU (which integer kernels it has, and
how fast: the machine's flags are in its line at the top of this page): int8 is the passages' scheme (8-bit weights in
blocks, activations per row and block, `MatMulNBits`), int8-row the query side's variant (one activation scale per
token, per-channel weights, `MatMulInteger`, inputs smoothed by factors fixed at build time and the FFN's
down-projection quantised over each row's own range; offered only on CPUs with VNNI or
AMX, where ONNX Runtime's uint8 x int8 product is exact); `embedding.query_precision`
`fastest` (the default) times the three at the first start on a CPU and keeps the fastest where it wins clearly over
the passages' precision. Whether the idle cores shorten a lone query depends on the machine too: a lone request leaves the model idle between its runs, the quiet
session's threads sleep meanwhile, and waking them may cost more than splitting the run saves (the last column, each
run after such a gap). `embedding.quiet_query_threads` 0 (the default) times the two sessions that way at the first
start on a CPU and keeps the idle cores only for a clear win.

{table(["session", "P50 ms", "P99 ms", "CPU ms per query", *gap_header], enc_rows, "lrrr" + "r" * len(gap_header))}

**Quality at each query precision**, passages embedded at {passages} in every column (nDCG@10, the same index; in
brackets the difference from queries at {passages}):

{table(["set", "retrievers", f"queries {passages}", *[f"queries {o}" for o in others]], quality_rows,
       "llr" + "r" * len(others))}

The largest loss from embedding queries at another precision than the passages' (target ≤ {QUIET_NDCG_LOSS:g}):
{losses}; the defaults chose {defaults_at or "?"} on this machine.

**Over HTTP**, one `ragheat serve` per configuration on `{q.get('index', 'data/index/scifact')}`, request by request in
turn across them (concurrency 1, {count(best['n'])} requests each), then closed-loop rounds of
{num(http['closed_loop']['round_s'], 0)} s with {count(http['closed_loop']['clients'])} clients for the server's CPU
per answer:

{table(["configuration", "queries at", "lone query's threads", "c=1 P50 ms", "c=1 P99 ms",
        f"CPU ms per answer ({count(http['closed_loop']['clients'])} clients)", "answers/s"], http_rows, "lllrrrr")}

At concurrency 1 the defaults' P50 differs from the reference's by {signed(p50 - statistics.median(
    c1['reference']['rounds']['p50_ms']))} ms, {overlap('defaults', 'reference')} the spread of the rounds' P50s; the
idle cores alone (`quiet-threads`) move it {overlap('quiet-threads', 'reference')} that spread.

Targets (concurrency 1, the default pipeline): P50 ≤ {QUIET_P50_MS:g} ms — {_met(p50 <= QUIET_P50_MS)}
({num(p50)}); P99 ≤ {QUIET_P99_MS:g} ms — {_met(p99 <= QUIET_P99_MS)} ({num(p99)});
service CPU per answer ≤ {QUIET_CPU_MS:g} ms — {_met(cpu <= QUIET_CPU_MS)} ({num(cpu)})."""
