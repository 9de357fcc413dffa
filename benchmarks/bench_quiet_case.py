"""The quiet case: what one query costs when it has the machine to itself, and what the query encoder's choices change.

Three parts, side by side in one run on the same queries:

- ``encoders``: the query encoder alone, one query per run as the service runs it: fp32, int8 and int8-row, on the
  single-thread session (``embedding.query_threads``) and on the quiet session (the idle cores,
  ``embedding.quiet_query_threads``), rounds interleaved; P50/P99 and CPU ms per query, back to back and each run
  after the idle gap a lone request leaves the model (``LONE_QUERY_GAP_S``, what the default's choice times).
- ``quality``: nDCG@10 and recall@10 of every retriever combination with queries embedded at the passages'
  precision and at each other one ``embedding.query_precision`` may choose, against the same index.
- ``http``: one ``ragheat serve`` per configuration over the same index, all running for the whole part: ``reference``
  (queries at the passages' precision on one thread, as before the quiet session), ``quiet-threads`` (the idle cores
  always), ``fastest-precision`` and ``defaults`` (the precision and the lone query's threads as timed on this CPU);
  concurrency 1 request by request in turn across the servers, then
  closed-loop rounds at ``--clients`` for the server's CPU per answer.

    .venv/bin/python benchmarks/bench_quiet_case.py --results-file benchmarks/results/quiet-case.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from benchmarks.common import DEFAULT_SETS, SMOKE, latency_interleaved, parse_set, scifact_queries  # noqa: E402
from benchmarks.common import throughput_rounds  # noqa: E402
from loadgen.resultsfile import BenchmarkRun  # noqa: E402

PARTS = ("encoders", "quality", "http")
# Retriever combinations per set: the graph where the set's questions reach it (multi-hop), reranking on each.
RETRIEVERS = {"scifact": "dense,hybrid,hybrid+rerank",
              "hotpotqa-dev": "dense,hybrid,hybrid+graph,hybrid+rerank,hybrid+graph+rerank"}
HTTP_CONFIGS = {  # name -> environment overrides of `ragheat serve`
    "reference": {"RAGHEAT_EMBEDDING__QUERY_PRECISION": "same", "RAGHEAT_EMBEDDING__QUIET_QUERY_THREADS": "1"},
    "quiet-threads": {"RAGHEAT_EMBEDDING__QUERY_PRECISION": "same",
                      "RAGHEAT_EMBEDDING__QUIET_QUERY_THREADS": str(len(os.sched_getaffinity(0)))},
    "fastest-precision": {"RAGHEAT_EMBEDDING__QUIET_QUERY_THREADS": "1"},
    "defaults": {},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    p.add_argument("--index", type=Path, default=Path("data/index/scifact"), help="the index the http part serves")
    p.add_argument("--queries", type=Path, default=None, help="queries file (default SciFact's)")
    p.add_argument("--encoder-queries", type=int, default=300, help="queries per round of the encoders part")
    p.add_argument("--rounds", type=int, default=3, help="rounds of the encoders and http parts")
    p.add_argument("--http-queries", type=int, default=300, help="concurrency-1 requests per server and round")
    p.add_argument("--clients", type=int, default=4, help="closed-loop clients of the CPU-per-answer rounds")
    p.add_argument("--round-s", type=float, default=8.0, help="seconds of each CPU-per-answer round")
    p.add_argument("--set", dest="sets", action="append", default=None,
                   help="NAME=BEIR:SPLIT:INDEX for the quality part (repeatable; default SciFact train and HotpotQA "
                        "dev)")
    p.add_argument("--work", type=Path, default=None, help="server logs (default: a temporary folder)")
    p.add_argument("--results-file", "--json", dest="results_file", type=Path, default=None,
                   help="write a benchmark results file (loadgen/resultsfile.py) here")
    args = p.parse_args(argv)
    args.parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    if unknown := sorted(set(args.parts) - set(PARTS)):
        p.error(f"--parts: unknown {', '.join(unknown)} (choose from {', '.join(PARTS)})")
    return args


def encoders(queries: list[str], rounds: int) -> dict:
    """Per precision and session: each round's P50/P99 ms and CPU ms per query, and their medians."""
    from rag.embedding.embedder import (LONE_QUERY_GAP_S, QUERY_PRECISIONS, SENTENCE_OUTPUT, TOKEN_OUTPUT,
                                        OnnxEmbedder, _session)
    from rag.embedding.model_store import ensure_encoder
    from rag.settings import EmbeddingSettings

    settings = EmbeddingSettings()
    cores = len(os.sched_getaffinity(0))
    sessions = {}
    for precision in QUERY_PRECISIONS:
        files = ensure_encoder(settings.model_dir, settings.cache_dir, precision)
        sessions[f"{precision}-1-thread"] = _session(files.onnx_path, 1)
        sessions[f"{precision}-quiet-{cores}-threads"] = _session(files.onnx_path, cores, spinning=False)
    embedder = OnnxEmbedder(settings.model_copy(update={"query_precision": "same", "quiet_query_threads": 1}))
    feeds = [embedder._feed([embedder.tokenizer.encode(text)]) for text in queries]  # the service's own tokenising
    names = [SENTENCE_OUTPUT, TOKEN_OUTPUT]  # as the service asks (the reranker's token states from the same run)
    for session in sessions.values():
        for feed in feeds[:20]:
            session.run(names, feed)
    per_round = {name: {"p50_ms": [], "p99_ms": [], "cpu_ms": [], "idle_gap_p50_ms": []} for name in sessions}
    def runs(session, gap_s: float) -> list[float]:
        """Each feed's run alone, seconds; ``gap_s`` idle before each."""
        seconds = []
        for feed in feeds:
            if gap_s:
                time.sleep(gap_s)
            start = time.perf_counter()
            session.run(names, feed)
            seconds.append(time.perf_counter() - start)
        return seconds

    for _ in range(rounds):
        for name, session in sessions.items():
            cpu_start = time.process_time()
            seconds = runs(session, 0.0)
            per_round[name]["cpu_ms"].append((time.process_time() - cpu_start) / len(feeds) * 1e3)
            per_round[name]["p50_ms"].append(float(np.percentile(seconds, 50) * 1e3))
            per_round[name]["p99_ms"].append(float(np.percentile(seconds, 99) * 1e3))
        for name, session in sessions.items():  # each run after a lone request's idle gap
            per_round[name]["idle_gap_p50_ms"].append(float(np.percentile(runs(session, LONE_QUERY_GAP_S), 50) * 1e3))
    tokens = [int(f["input_ids"].shape[1]) for f in feeds]
    return {"cores": cores, "queries": len(feeds), "median_tokens": float(np.median(tokens)),
            "idle_gap_ms": LONE_QUERY_GAP_S * 1e3,
            "sessions": {name: {**{k: statistics.median(v) for k, v in r.items()}, "rounds": r}
                         for name, r in per_round.items()}}


def quality(specs: list[str]) -> dict:
    """Per set and retriever combination: the metrics at each query precision, and each one's difference from the
    passages' precision."""
    from rag.embedding.embedder import QUERY_PRECISIONS
    from rag.eval.beir import load_qrels, load_queries
    from rag.eval.runner import evaluate, parse_retriever_sets
    from rag.pipeline import RagPipeline
    from rag.settings import RagheatSettings

    out = {}
    for spec in specs:
        name, beir, split, index, _head = parse_set(spec)
        queries, qrels = load_queries(beir), load_qrels(beir, split)
        sets = parse_retriever_sets(RETRIEVERS.get(name, "dense,hybrid,hybrid+rerank"))
        base = RagheatSettings()
        passages = base.embedding.precision
        others = [p for p in QUERY_PRECISIONS if p != passages]
        by_precision = {}
        for chosen in (passages, *others):
            settings = base.model_copy(update={"embedding": base.embedding.model_copy(
                update={"query_precision": chosen})})
            pipeline = RagPipeline(settings, index)
            pipeline.warm_up()
            try:
                report = evaluate(pipeline, queries, qrels, sets)
            finally:
                pipeline.close()
            by_precision[chosen] = {combo: {m: r[m] for m in ("ndcg@10", "recall@10")}
                                    for combo, r in report["retrievers"].items()}
        out[name] = {"split": split, "queries": len([q for q in queries if q in qrels]), "passages": passages,
                     "others": others, "metrics": by_precision,
                     "ndcg_difference": {other: {combo: by_precision[other][combo]["ndcg@10"]
                                                 - by_precision[passages][combo]["ndcg@10"]
                                                 for combo in by_precision[passages]} for other in others}}
        print(f"quality {name}: " + json.dumps({o: {k: round(v, 4) for k, v in d.items()}
                                                for o, d in out[name]["ndcg_difference"].items()}), flush=True)
    return out


def http(index: Path, queries: list[str], args: argparse.Namespace, work: Path) -> dict:
    import httpx

    from stack.servers import ServeFleet

    with ServeFleet(index, {name: ((), env) for name, env in HTTP_CONFIGS.items()}, work) as fleet:
        chosen = {name: httpx.get(url + "/readyz", timeout=30).json().get("embedding")
                  for name, url in fleet.urls.items()}
        c1 = latency_interleaved(fleet.urls, queries[: args.http_queries], args.rounds)
        loaded = throughput_rounds(fleet.urls, fleet.pids, queries, args.clients, args.round_s, args.rounds)
    return {"configs": {name: {"env": env, "embedding": chosen[name]} for name, env in HTTP_CONFIGS.items()},
            "concurrency_1": c1, "closed_loop": {"clients": args.clients, "round_s": args.round_s, "servers": loaded}}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if SMOKE:
        args.encoder_queries, args.rounds, args.http_queries, args.round_s = 20, 1, 20, 1.0
    record = BenchmarkRun("quiet-case")
    _, queries = scifact_queries(args.queries)
    data: dict = {"parts": args.parts}
    if "encoders" in args.parts:
        data["encoders"] = encoders(queries[: args.encoder_queries], args.rounds)
        print("encoders: " + json.dumps({k: round(v["p50_ms"], 2) for k, v in data["encoders"]["sessions"].items()}),
              flush=True)
    if "quality" in args.parts:
        data["quality"] = quality(args.sets or list(DEFAULT_SETS))
    if "http" in args.parts:
        with tempfile.TemporaryDirectory() as scratch:
            work = args.work or Path(scratch)
            data["http"] = http(args.index, queries, args, work)
        print("http c=1 P50/P99: " + json.dumps({k: [round(v["p50_ms"], 2), round(v["p99_ms"], 2)]
                                                   for k, v in data["http"]["concurrency_1"].items()}), flush=True)
        print("http CPU ms per answer: " + json.dumps(
            {k: round(v["server_cpu_us_per_request"] / 1000, 2)
             for k, v in data["http"]["closed_loop"]["servers"].items()}), flush=True)
    path = record.write(data, args.results_file)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
