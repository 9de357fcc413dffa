"""The passages on a Milvus server against the generation's own files, side by side on one index:

    .venv/bin/python benchmarks/bench_milvus.py --beir datasets/scifact --split train --index data/index/scifact \
        --results-file benchmarks/results/milvus.json

1. Publishing: the index's current generation is linked into a scratch index and ingested again with
   ``vector_store.backend=milvus`` into a milvus-lite server started for the run (nothing is embedded again: the
   vectors come from the generation's dense index); the ingest's wall time by part.
2. Quality: ``ragheat eval``'s code (``evaluate``) on the split's judged questions, dense, bm25 and hybrid, on both
   backends: nDCG@10 and recall@10; and, per retriever, how many questions get the same top 10 from both.
3. The two stages at concurrency 1: each question's dense and BM25 search on both backends in turn (as the
   pipeline times them), ``--rounds`` rounds: P50/P99 per round.
4. Memory: one ``ragheat serve`` per configuration on the scratch index (local; milvus with the generation's files
   as the fallback; milvus without one, ``vector_store.fallback=none``), each answering the latency part's questions
   over HTTP once, then its resident memory (VmRSS) and its dense and BM25 files' size on disk.

milvus-lite is Milvus' protocol served by a Python engine: its latencies say what this backend costs on one
machine without Milvus, not what a Milvus cluster costs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from benchmarks.common import resident_bytes  # noqa: E402
from loadgen.resultsfile import BenchmarkRun  # noqa: E402

SETS = ("dense", "bm25", "hybrid")
HITS = 100  # a search's hits in the latency part (retrieval.candidates' default)


def scratch_copy(index: Path, scratch: Path) -> Path:
    """A new index folder whose current generation is ``index``'s, its files hard-linked."""
    from rag.index.store import CURRENT, GENERATIONS, link_files, resolve_generation

    generation = resolve_generation(index)
    target = scratch / "index"
    link_files(generation, target / GENERATIONS / generation.name)
    os.symlink(Path(GENERATIONS) / generation.name, target / CURRENT)
    return target


def latency(pipelines: dict, texts: list[str], rounds: int) -> dict:
    """Per backend and retriever: each round's P50/P99 ms of the search alone, the backends interleaved."""
    embedder = next(iter(pipelines.values())).embedder
    vectors = [embedder.embed_query(t).vector for t in texts]
    out = {b: {r: {"p50_ms": [], "p99_ms": []} for r in ("dense", "bm25")} for b in pipelines}
    for _ in range(rounds):
        seconds = {b: {"dense": [], "bm25": []} for b in pipelines}
        for text, vector in zip(texts, vectors):
            for backend, pipeline in pipelines.items():
                for name in ("dense", "bm25"):
                    result = pipeline.retrievers[name].retrieve(text, vector, HITS)
                    seconds[backend][name].append(result.seconds)
        for backend, by_name in seconds.items():
            for name, values in by_name.items():
                out[backend][name]["p50_ms"].append(float(np.percentile(values, 50) * 1e3))
                out[backend][name]["p99_ms"].append(float(np.percentile(values, 99) * 1e3))
    return out


MEMORY_CONFIGS = {
    "local": {"RAGHEAT_VECTOR_STORE__BACKEND": "local"},
    "milvus-files": {"RAGHEAT_VECTOR_STORE__BACKEND": "milvus", "RAGHEAT_VECTOR_STORE__FALLBACK": "files"},
    "milvus-none": {"RAGHEAT_VECTOR_STORE__BACKEND": "milvus", "RAGHEAT_VECTOR_STORE__FALLBACK": "none"}}


def memory(index: Path, uri: str, texts: list[str], work: Path) -> dict:
    """Per configuration (``MEMORY_CONFIGS``): resident MiB once ready and after answering ``texts`` over HTTP."""
    import httpx

    from rag.index.dense import DENSE_FILE
    from rag.index.sparse import BM25_DIR
    from rag.index.store import resolve_generation
    from stack.servers import ServeFleet

    configs = {name: ((), {**env, "RAGHEAT_VECTOR_STORE__URI": uri}) for name, env in MEMORY_CONFIGS.items()}
    generation = resolve_generation(index)
    on_disk = {"dense": (generation / DENSE_FILE).stat().st_size,
               "bm25": sum(f.stat().st_size for f in (generation / BM25_DIR).rglob("*") if f.is_file())}
    out = {"on_disk_mib": {k: v / 2**20 for k, v in on_disk.items()}, "servers": {}}
    with ServeFleet(index, configs, work) as fleet:
        ready = {name: resident_bytes(pid) / 2**20 for name, pid in fleet.pids.items()}
        for name, url in fleet.urls.items():
            with httpx.Client(base_url=url, timeout=60) as client:
                for text in texts:
                    client.post("/v1/query", json={"query": text}).raise_for_status()
                described = client.get("/readyz").json().get("vector_store")
            out["servers"][name] = {"ready_mib": ready[name], "answered_mib": resident_bytes(fleet.pids[name]) / 2**20,
                                    "vector_store": described}
    if any((s["vector_store"] or {}).get("failed_searches") for s in out["servers"].values()):
        raise SystemExit("searches on the Milvus server failed during the memory part: no results written")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--beir", type=Path, default=Path("datasets/scifact"))
    p.add_argument("--split", default="train")
    p.add_argument("--index", type=Path, default=Path("data/index/scifact"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--latency-queries", type=int, default=200, help="questions per latency round")
    p.add_argument("--results-file", "--json", dest="results_file", type=Path, default=None)
    args = p.parse_args()

    from rag.eval.beir import load_qrels, load_queries
    from rag.eval.runner import evaluate
    from rag.index.store import read_manifest
    from rag.ingest.pipeline import ingest
    from rag.pipeline import RagPipeline
    from rag.settings import RagheatSettings
    from stack.milvus_lite import MilvusLiteServer

    record = BenchmarkRun("milvus")
    queries, qrels = load_queries(args.beir), load_qrels(args.beir, args.split)
    judged = {q: t for q, t in queries.items() if q in qrels}
    base = RagheatSettings()
    served = read_manifest(args.index)
    with tempfile.TemporaryDirectory() as scratch, MilvusLiteServer(Path(scratch) / "milvus") as server:
        index = scratch_copy(args.index, Path(scratch))
        milvus = base.model_copy(update={"vector_store": base.vector_store.model_copy(
            update={"backend": "milvus", "uri": server.uri})})
        started = time.perf_counter()
        report = ingest(served["corpus"]["location"], index, milvus)
        publish = {"wall_s": time.perf_counter() - started, "timings_s": report.manifest["timings_s"],
                   "vector_store": report.manifest["vector_store"], "reused": "reused" in report.manifest["timings_s"]}
        print(f"published in {publish['wall_s']:.1f} s: {publish['vector_store']['timings_s']}", flush=True)
        pipelines = {"local": RagPipeline(base, index), "milvus": RagPipeline(milvus, index)}
        try:
            for pipeline in pipelines.values():
                pipeline.warm_up()
            quality = {b: evaluate(pl, queries, qrels, list(SETS))["retrievers"] for b, pl in pipelines.items()}
            quality = {b: {s: {m: r[s][m] for m in ("ndcg@10", "recall@10")} for s in SETS}
                       for b, r in quality.items()}
            print(f"quality: {quality}", flush=True)
            texts = list(judged.values())
            same = {}
            embedder = pipelines["local"].embedder
            for name in ("dense", "bm25"):
                agree = 0
                for text in texts:
                    vector = embedder.embed_query(text).vector
                    lists = [[h.chunk_id for h in pl.retrievers[name].retrieve(text, vector, 10).hits]
                             for pl in pipelines.values()]
                    agree += lists[0] == lists[1]
                same[name] = agree
            stages = latency(pipelines, texts[: args.latency_queries], args.rounds)
            if failed := pipelines["milvus"].vector_store.failures:  # those searches fell back to the local files
                raise SystemExit(f"{failed} searches on the Milvus server failed: no results written")
            print(f"same top 10: {same} of {len(texts)}; stages: "
                  + str({b: {n: round(float(np.median(v['p50_ms'])), 2) for n, v in r.items()}
                         for b, r in stages.items()}), flush=True)
        finally:
            for pipeline in pipelines.values():
                pipeline.close()
        held = memory(index, server.uri, texts[: args.latency_queries], Path(scratch) / "logs")
        print("resident MiB after answering: " + str({n: round(v["answered_mib"], 1)
                                                      for n, v in held["servers"].items()}), flush=True)
    data = {"beir": str(args.beir), "split": args.split, "index": str(args.index), "questions": len(judged),
            "chunks": served["counts"]["chunks"], "publish": publish, "quality": quality,
            "same_top10": same, "latency_queries": min(args.latency_queries, len(judged)), "rounds": args.rounds, "hits": HITS,
            "stages": stages, "memory": held}
    path = record.write(data, args.results_file)
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
