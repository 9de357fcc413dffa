"""Knowledge-graph costs, side by side, in one command:

    .venv/bin/python benchmarks/bench_graph.py --beir datasets/hotpotqa-dev --index data/index/hotpotqa-dev \
        [--rounds 3] [--http-queries 200] [--ingest-both]

Writes benchmarks/results/graph.json (--json elsewhere) through loadgen/resultsfile.py.

0. Quality on the split's judged questions, through the same code as ``ragheat eval`` (``run_retrieval``,
   ``score_run``): dense, bm25, hybrid, graph, hybrid+graph and routed, with each question's nDCG@10 kept so the
   doc can pair hybrid+graph and routed against hybrid question by question (and say whether the gap is noise).
1. Ingest: the graph part of the index (the same code ``ragheat ingest`` runs: build, embedded-store start, load,
   save, stop) rebuilt ``--rounds`` times into a scratch folder, wall and CPU (this process + the store's), against
   the index's own ingest time without it (manifest timings). ``--ingest-both`` also runs two full ingests from
   scratch, with and without the graph (the embeddings dominate: minutes).
2. ``retrieve_graph`` at concurrency 1 over every query of the split, as the pipeline times the stage: the per-query
   Cypher round trip on the embedded store (``graph.execution=cypher``, served by default) and the in-process
   adjacency (``adjacency``); linking alone; the store's own execution time; a PING on its socket (the IPC floor);
   CPU per query of this process and of the store.
3. ``/v1/query`` at concurrency 1 against a ``ragheat serve`` child process: hybrid (graph off), hybrid+graph and
   routed, interleaved query by query so that load changes hit all three alike.

Each measurement is repeated ``--rounds`` times; the median of the per-round percentiles is reported, with every
round's own percentiles beside it (``rounds_p50`` / ``rounds_p99``) so the doc can show the spread and pair the
three HTTP variants round by round. The results file records how busy the machine was.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from loadgen.resultsfile import BenchmarkRun
from rag.eval.beir import load_qrels, load_queries, ndcg_at, score_run
from rag.eval.runner import parse_retriever_sets, run_retrieval
from rag.graph.cypher import EXPANSION, ID_BASE
from rag.graph.ingest import build_generation_graph
from rag.graph.retriever import AdjacencyGraphRetriever
from rag.index.chunks import read_chunks
from rag.index.store import read_manifest, resolve_generation
from rag.pipeline import RagPipeline
from rag.settings import RagheatSettings
from stack.servers import ServeProcess


def ms(values) -> dict:
    a = np.asarray(values) * 1000.0
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)), "mean": float(a.mean()),
            "n": int(a.size)} if a.size else {"n": 0}


def median_of(rounds: list[dict]) -> dict:
    keys = [k for k in rounds[0] if k != "n"]
    return {**{k: statistics.median(r[k] for r in rounds) for k in keys}, "n": rounds[0]["n"],
            "rounds": len(rounds), "spread_p99": [min(r["p99"] for r in rounds), max(r["p99"] for r in rounds)],
            "rounds_p50": [r["p50"] for r in rounds], "rounds_p99": [r["p99"] for r in rounds]}


def cpu_of(pid: int) -> float:
    """utime + stime of a process (all threads), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


QUALITY_SETS = "dense,bm25,hybrid,graph,hybrid+graph,routed"


def bench_quality(settings: RagheatSettings, index: Path, beir: Path, split: str) -> dict:
    qrels = load_qrels(beir, split)
    judged = {qid: text for qid, text in load_queries(beir).items() if qid in qrels}
    pipeline = RagPipeline(settings, index)
    pipeline.warm_up()
    out: dict = {"split": split, "queries": len(judged), "retrievers": {}}
    try:
        for name, retrievers in parse_retriever_sets(QUALITY_SETS).items():
            run, latencies, runs = run_retrieval(pipeline, judged, retrievers)
            metrics = score_run(run, qrels)
            metrics["per_query_ndcg@10"] = {q: ndcg_at(run.get(q, []), qrels[q], 10) for q in judged}
            metrics["latency_ms"] = ms(latencies)
            metrics["graph_ran_share"] = sum(1 for r in runs if "graph" in r.retrieved) / max(1, len(runs))
            out["retrievers"][name] = metrics
    finally:
        pipeline.close()
    return out


def bench_ingest(settings: RagheatSettings, index: Path, rounds: int) -> dict:
    folder = resolve_generation(index)
    manifest = read_manifest(index)
    chunks = list(read_chunks(folder / "chunks.jsonl"))  # walked several times: parsed once
    timings = manifest["timings_s"]
    without = timings["total"] - timings.get("graph", 0.0)
    walls, cpus = [], []
    for _ in range(rounds):
        scratch = Path(tempfile.mkdtemp(prefix="bench-graph-"))
        try:
            wall, cpu = time.perf_counter(), time.process_time()
            block = build_generation_graph(scratch, "bench", chunks, settings.graph)
            walls.append(time.perf_counter() - wall)
            # The store's own CPU is gone with its process: count this process's only, and say so.
            cpus.append(time.process_time() - cpu)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    graph_wall = statistics.median(walls)
    return {"chunks": len(chunks), "ingest_without_graph_s (manifest)": without,
            "ingest_embed_s (manifest)": timings.get("embed"), "graph_wall_s": graph_wall,
            "graph_wall_s_all": walls, "graph_client_cpu_s": statistics.median(cpus),
            "graph_steps_s (last)": block["timings_s"], "counts": block["counts"],
            "ratio_with_graph": (without + graph_wall) / without if without else None}


def bench_ingest_both(beir: Path, settings: RagheatSettings) -> dict:
    from rag.ingest.pipeline import ingest

    out = {}
    for label, enabled in (("without_graph", False), ("with_graph", True)):
        scratch = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
        try:
            s = settings.model_copy(update={"graph": settings.graph.model_copy(update={"enabled": enabled})})
            wall, cpu = time.perf_counter(), time.process_time()
            report = ingest(str(beir), scratch / "index", s, force=True)
            out[label] = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
                          "timings_s": report.manifest["timings_s"]}
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    out["ratio_wall"] = out["with_graph"]["wall_s"] / out["without_graph"]["wall_s"]
    return out


def graph_stage_times(pipeline: RagPipeline, queries: list[str]) -> tuple[list[float], list[float]]:
    """Seconds of the retrieve_graph and link_entities stages per query, as the pipeline times them."""
    graph, link = [], []
    for q in queries:
        for s in pipeline.retrieve(q, 300, ["graph"]).stages:
            (graph if s.name == "retrieve_graph" else link).append(s.seconds)
    return graph, link


def bench_retrieve_graph(settings: RagheatSettings, index: Path, queries: list[str], rounds: int) -> dict:
    out: dict = {}
    pipeline = RagPipeline(settings, index)
    pipeline.warm_up()
    try:
        store = pipeline.graph.store
        linked = [pipeline.linker.link(q) for q in queries]
        out["queries"], out["linked_queries"] = len(queries), sum(1 for x in linked if x.seeds)
        graph_rounds, link_rounds = [], []
        for _ in range(rounds + 1):  # the first pass warms plans and pages, and is not counted
            client0, store0 = time.process_time(), cpu_of(store.child.pid)
            graph, link = graph_stage_times(pipeline, queries)
            client_cpu, store_cpu = time.process_time() - client0, cpu_of(store.child.pid) - store0
            graph_rounds.append(ms(graph))
            link_rounds.append(ms(link))
        out["retrieve_graph_cypher_ms"] = median_of(graph_rounds[1:])
        out["link_entities_ms"] = median_of(link_rounds[1:])
        out["cpu_ms_per_linked_query"] = {"client (whole retrieve call)": client_cpu * 1000 / out["linked_queries"],
                                          "store": store_cpu * 1000 / out["linked_queries"]}
        executions = []
        cypher = EXPANSION[settings.graph.hops]
        generation = pipeline.index.manifest["graph"]["generation"]
        for x in linked:
            if x.seeds:
                result = store._graph.ro_query(cypher, {"g": generation, "top_n": settings.graph.top_n,
                                                        "decay": settings.graph.decay, "k": 300,
                                                        "seeds": [{"id": e + ID_BASE, "w": w} for e, w in x.seeds.items()]})
                executions.append(result.run_time_ms / 1000)
        out["store_execution_ms"] = ms(executions)
        pings = []
        for _ in range(1000):
            start = time.perf_counter()
            store._client.connection.ping()
            pings.append(time.perf_counter() - start)
        out["socket_ping_ms"] = ms(pings)
        started = time.perf_counter()
        adjacency = AdjacencyGraphRetriever.from_store(pipeline.graph, generation, hops=settings.graph.hops,
                                                       top_n=settings.graph.top_n, decay=settings.graph.decay)
        out["adjacency_load_s"] = time.perf_counter() - started
        pipeline.graph_retriever = adjacency
        adjacency_rounds = [ms(graph_stage_times(pipeline, queries)[0]) for _ in range(rounds + 1)]
        out["retrieve_graph_adjacency_ms"] = median_of(adjacency_rounds[1:])
    finally:
        pipeline.close()
    return out


def bench_http(index: Path, queries: list[str], rounds: int) -> dict:
    variants = {"hybrid": ["dense", "bm25"], "hybrid+graph": ["hybrid+graph"], "routed": ["routed"]}
    times: dict[str, list[dict]] = {v: [] for v in variants}
    server_graph: list[float] = []
    with ServeProcess(index, env={**os.environ}) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        def ask(q: str, retrievers: list[str]) -> float:
            start = time.perf_counter()
            body = client.post("/v1/query", json={"query": q, "top_k": 5, "retrievers": retrievers}).raise_for_status().json()
            elapsed = time.perf_counter() - start
            server_graph.extend(s["ms"] / 1000 for s in body["stages"] if s["name"] == "retrieve_graph")
            return elapsed

        for q in queries[:30]:  # warm-up
            for retrievers in variants.values():
                ask(q, retrievers)
        server_graph.clear()
        names = list(variants)
        for _ in range(rounds):
            per = {v: [] for v in variants}
            for i, q in enumerate(queries):
                for j in range(len(names)):  # rotate the order so no variant always goes first
                    name = names[(i + j) % len(names)]
                    per[name].append(ask(q, variants[name]))
            for name in names:
                times[name].append(ms(per[name]))
    out = {name: median_of(rounds_) for name, rounds_ in times.items()}
    out["p99_ratio_hybrid+graph_over_hybrid"] = out["hybrid+graph"]["p99"] / out["hybrid"]["p99"]
    out["p99_ratio_routed_over_hybrid"] = out["routed"]["p99"] / out["hybrid"]["p99"]
    out["server_retrieve_graph_ms"] = ms(server_graph)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beir", type=Path, required=True)
    parser.add_argument("--index", type=Path, required=True, help="an index of --beir built with the graph")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--http-queries", type=int, default=0, help="queries for the HTTP part (0 = all)")
    parser.add_argument("--ingest-both", action="store_true", help="also two full ingests, with and without graph")
    parser.add_argument("--skip-http", action="store_true")
    parser.add_argument("--json", type=Path, help="results file (default benchmarks/results/graph.json)")
    args = parser.parse_args()
    run = BenchmarkRun("graph")

    settings = RagheatSettings()
    queries = list(load_queries(args.beir).values())
    results: dict = {"beir": str(args.beir), "index": str(args.index), "rounds": args.rounds,
                     "graph_settings": settings.graph.model_dump(
                         include={"backend", "hops", "top_n", "decay", "weight", "execution"})}
    results["quality"] = bench_quality(settings, args.index, args.beir, args.split)
    results["ingest"] = bench_ingest(settings, args.index, args.rounds)
    if args.ingest_both:
        results["ingest_both"] = bench_ingest_both(args.beir, settings)
    results["retrieve_graph"] = bench_retrieve_graph(settings, args.index, queries, args.rounds)
    if not args.skip_http:
        results["http_concurrency_1"] = bench_http(args.index, queries[: args.http_queries or None], args.rounds)
    print(json.dumps(results, indent=2, default=str))
    print(f"wrote {run.write(results, args.json)}")


if __name__ == "__main__":
    main()
