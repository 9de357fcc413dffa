"""The late-interaction reranker (stage ``rerank``, rag/rerank): its quality, held out, and its costs.

    # quality (run_all.sh step `rerank`): the training report of `ragheat train-reranker --cv 5`, and each
    # --cross set scored hybrid vs hybrid+rerank query by query with a head trained on the other set
    .venv/bin/python benchmarks/bench_rerank.py --part quality --train-report train.json \
        --cross hotpotqa-dev=datasets/hotpotqa-dev:dev:data/index/hotpotqa-dev-tokens --json benchmarks/results/rerank.json
    # costs (step `rerank-latency`, a quiet machine)
    .venv/bin/python benchmarks/bench_rerank.py --part latency --index data/index/scifact-tokens --beir datasets/scifact \
        --json benchmarks/results/rerank-latency.json

Measured (latency part):
  rerank stage      ``LateInteractionReranker.rerank`` alone (project the query, gather the candidates' stored
                    vectors, MaxSim, combine) over the real fused candidates of each query: P50 / P99 (ms) at
                    --candidates (default 50), --rounds times per query; wall time, and this thread's CPU time
                    (robust to a busy neighbour, which stretches wall time, not CPU time)
  embed stage       one query's model run asking for the pooled vector alone vs for the token states too (the
                    reranker's query side): P50 / P99 (ms); the difference is all that reranking adds before it
  /v1/query         concurrency 1 over loopback against two `ragheat serve` processes on the same index, rerank off
                    and on, query by query alternately (--http-queries per round, --rounds rounds)
  index size        bytes of the stored token vectors vs the rest of the generation (dense, BM25, chunks, graph)
Quality part: the k-fold CV of the training report (train on k-1 folds, score the held-out one) and, per --cross
set, nDCG@10 of hybrid and hybrid+rerank per query (paired: mean gain and its standard error).

Writes a results file (loadgen.resultsfile); docs/benchmarks.md, "Reranking", shows both parts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import p50_p99, parse_set  # noqa: E402
from benchmarks.docgen.page import preview  # noqa: E402
from loadgen.resultsfile import BenchmarkRun  # noqa: E402
from rag.eval.beir import load_qrels, load_queries, ndcg_at  # noqa: E402
from rag.eval.runner import run_retrieval  # noqa: E402
from rag.index.store import resolve_generation  # noqa: E402
from rag.pipeline import RagPipeline  # noqa: E402
from rag.rerank.firststage import FirstStageRecorder  # noqa: E402
from rag.rerank.reranker import load_reranker  # noqa: E402
from rag.settings import RagheatSettings  # noqa: E402
from stack.servers import ServeProcess  # noqa: E402

def _settings(head: Path | None = None) -> RagheatSettings:
    """Defaults without the graph; ``head``: the one the index's token vectors were projected with (reranking is on
    by default, so the pipeline loads it)."""
    settings = RagheatSettings()
    settings.graph.enabled = False
    if head is not None:
        settings.rerank.head = head
    return settings


def stage_costs(index: Path, beir: Path, split: str, head: Path | None, candidates: int, queries: int,
                rounds: int) -> dict:
    """The rerank stage alone, the embed stage with and without token states, the stored vectors' size."""
    pipeline = RagPipeline(_settings(head), index)
    pipeline.warm_up()
    reranker = load_reranker(pipeline.index.folder, pipeline.index.manifest, head, candidates)
    # The same vectors through numpy's float32 product: what the int8 product (the served one) replaced.
    reference = load_reranker(pipeline.index.folder, pipeline.index.manifest, head, candidates, float_product=True)
    qrels = load_qrels(beir, split)
    texts = [t for q, t in load_queries(beir).items() if q in qrels][:queries]
    rerank_s, rerank_cpu_s, embed_s, embed_tokens_s, float_s, float_cpu_s = [], [], [], [], [], []
    score_gap, same_top = [], []
    with FirstStageRecorder(pipeline) as recorder:
        for text in texts:
            fused = pipeline.retrieve(text, candidates, ("dense", "bm25"))
            query = recorder.take(text)
            for r in range(rounds):
                for which, wall, cpu_s in ((reranker, rerank_s, rerank_cpu_s), (reference, float_s, float_cpu_s))[
                        ::1 if r % 2 else -1]:  # neither always goes first
                    cpu = time.thread_time()
                    wall.append(which.rerank(query, fused.hits, 10).seconds)
                    cpu_s.append(time.thread_time() - cpu)
            served, exact = reranker.scores(query, fused.hits), reference.scores(query, fused.hits)
            score_gap.append(float(np.abs(served - exact).max()) if len(served) else 0.0)
            same_top.append(list(np.argsort(-served, kind="stable")[:10]) == list(np.argsort(-exact, kind="stable")[:10]))
    embedder = pipeline.embedder
    for _ in range(rounds):
        for text in texts:
            start = time.perf_counter()
            embedder.embed_query(text)
            embed_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            embedder.embed_query_tokens(text)
            embed_tokens_s.append(time.perf_counter() - start)
    folder = resolve_generation(index)
    block = pipeline.index.manifest["rerank"]
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    pipeline.close()
    return {"candidates": candidates, "queries": len(texts), "rounds": rounds,
            "rerank_ms": p50_p99(rerank_s), "rerank_cpu_ms": p50_p99(rerank_cpu_s), "embed_ms": p50_p99(embed_s),
            "float_product": {"rerank_ms": p50_p99(float_s), "rerank_cpu_ms": p50_p99(float_cpu_s),
                              "max_score_gap": max(score_gap), "median_score_gap": float(np.median(score_gap)),
                              "same_top10": float(np.mean(same_top)), "queries": len(score_gap)}
            if reranker._int8 is not None else None,
            "embed_with_tokens_ms": p50_p99(embed_tokens_s),
            "index": {"rerank_bytes": block["bytes"], "other_bytes": total - block["bytes"], "dtype": block["dtype"],
                      "tokens": block["tokens"], "chunks": block["chunks"], "dim": block["dim"]},
            "head": reranker.head.meta.get("command")}


def http_costs(index: Path, texts: list[str], rounds: int) -> dict:
    """/v1/query at concurrency 1, rerank off and on, two servers on the same index, alternating query by query."""
    base = {**os.environ, "RAGHEAT_RERANK__STORE_TOKENS": "true", "RAGHEAT_GRAPH__ENABLED": "false"}
    per_round: dict[str, list[dict]] = {"off": [], "on": []}
    server_rerank: list[float] = []
    with ServeProcess(index, env={**base, "RAGHEAT_RERANK__ENABLED": "false"}) as off, \
            ServeProcess(index, env={**base, "RAGHEAT_RERANK__ENABLED": "true"}) as on, \
            httpx.Client(timeout=60) as client:
        urls = {"off": off.url, "on": on.url}

        def ask(which: str, text: str) -> float:
            start = time.perf_counter()
            body = client.post(urls[which] + "/v1/query", json={"query": text, "top_k": 5}).raise_for_status().json()
            elapsed = time.perf_counter() - start
            server_rerank.extend(s["ms"] / 1000 for s in body["stages"] if s["name"] == "rerank")
            return elapsed

        for text in texts[:30]:  # warm-up: both servers' first requests pay for lazy set-up
            ask("off", text), ask("on", text)
        server_rerank.clear()
        for _ in range(rounds):
            times = {"off": [], "on": []}
            for i, text in enumerate(texts):
                order = ("off", "on") if i % 2 else ("on", "off")  # neither always goes first
                for which in order:
                    times[which].append(ask(which, text))
            for which in times:
                per_round[which].append(p50_p99(times[which]))
    out = {which: {"p50": statistics.median(r["p50"] for r in rounds_), "p99": statistics.median(r["p99"] for r in rounds_),
                   "rounds_p50": [r["p50"] for r in rounds_], "rounds_p99": [r["p99"] for r in rounds_]}
           for which, rounds_ in per_round.items()}
    out["p99_ratio_on_over_off"] = [b["p99"] / a["p99"] for a, b in zip(per_round["off"], per_round["on"])]
    out["server_rerank_ms"] = p50_p99(server_rerank) or {"n": 0}
    out["queries"] = len(texts)
    return out


def product_quality(name: str, beir: Path, split: str, index: Path, head: Path | None) -> dict:
    """hybrid+rerank with MaxSim's int8 product (served) vs numpy's float32 product, query by query (paired)."""
    pipeline = RagPipeline(_settings(head), index)
    pipeline.warm_up()
    qrels = load_qrels(beir, split)
    judged = {q: t for q, t in load_queries(beir).items() if q in qrels and any(g > 0 for g in qrels[q].values())}
    ndcg = {}
    for product, exact in (("int8", False), ("float32", True)):
        reranker = load_reranker(pipeline.index.folder, pipeline.index.manifest, head, float_product=exact)
        run, _, _ = run_retrieval(pipeline, judged, ("dense", "bm25", "rerank"), reranker=reranker)
        ndcg[product] = np.array([ndcg_at(run.get(q, []), qrels[q], 10) for q in judged])
    pipeline.close()
    diff = ndcg["int8"] - ndcg["float32"]
    return {"name": name, "queries": len(judged), "int8": float(ndcg["int8"].mean()),
            "float32": float(ndcg["float32"].mean()), "diff": float(diff.mean()),
            "diff_se": float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else 0.0,
            "better": int((diff > 1e-9).sum()), "worse": int((diff < -1e-9).sum())}


def cross_quality(name: str, beir: Path, split: str, index: Path, head: Path | None) -> dict:
    """hybrid vs hybrid+rerank on one set, query by query (paired)."""
    pipeline = RagPipeline(_settings(head), index)
    pipeline.warm_up()
    reranker = load_reranker(pipeline.index.folder, pipeline.index.manifest, head)
    qrels = load_qrels(beir, split)
    judged = {q: t for q, t in load_queries(beir).items() if q in qrels and any(g > 0 for g in qrels[q].values())}
    base, _, _ = run_retrieval(pipeline, judged, ("dense", "bm25"))
    reranked, _, _ = run_retrieval(pipeline, judged, ("dense", "bm25", "rerank"), reranker=reranker)
    pipeline.close()
    a = np.array([ndcg_at(base.get(q, []), qrels[q], 10) for q in judged])
    b = np.array([ndcg_at(reranked.get(q, []), qrels[q], 10) for q in judged])
    gain = b - a
    return {"name": name, "beir": str(beir), "split": split, "queries": len(judged), "head": reranker.head.meta.get("command"),
            "hybrid": float(a.mean()), "rerank": float(b.mean()), "gain": float(gain.mean()),
            "gain_se": float(gain.std(ddof=1) / np.sqrt(len(gain))), "better": int((gain > 0).sum()),
            "worse": int((gain < 0).sum())}


def main() -> None:
    run = BenchmarkRun("rerank")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("quality", "latency"), required=True)
    parser.add_argument("--index", type=Path, help="latency: an index built with stored token vectors")
    parser.add_argument("--beir", type=Path, help="latency: the BEIR folder of its corpus (queries, qrels)")
    parser.add_argument("--split", default="train")
    parser.add_argument("--head", type=Path, default=None, help="latency: the head (default: the shipped one)")
    parser.add_argument("--candidates", type=int, default=50)
    parser.add_argument("--queries", type=int, default=200, help="latency: queries timed")
    parser.add_argument("--rounds", type=int, default=3, help="latency: timings per query (and HTTP rounds)")
    parser.add_argument("--http-queries", type=int, default=200, help="latency: /v1/query requests per round "
                                                                     "and server (0 = skip)")
    parser.add_argument("--train-report", type=Path, help="quality: `ragheat train-reranker --cv K --json` output")
    parser.add_argument("--cross", action="append", default=[], metavar="NAME=BEIR:SPLIT:INDEX[:HEAD]",
                        help="quality: a set scored with the head its index was built with (HEAD, default shipped)")
    parser.add_argument("--product", action="append", default=[], metavar="NAME=BEIR:SPLIT:INDEX[:HEAD]",
                        help="latency: a set scored with hybrid+rerank by the int8 and the float32 MaxSim product")
    parser.add_argument("--json", "--results-file", dest="json", type=Path, default=None)
    args = parser.parse_args()

    if args.part == "latency":
        if args.index is None or args.beir is None:
            parser.error("--part latency needs --index and --beir")
        run.name = "rerank-latency"
        data = stage_costs(args.index, args.beir, args.split, args.head, args.candidates, args.queries, args.rounds)
        if args.http_queries:
            qrels = load_qrels(args.beir, args.split)
            texts = [t for q, t in load_queries(args.beir).items() if q in qrels][: args.http_queries]
            data["http"] = http_costs(args.index, texts, args.rounds)
        r, c, i = data["rerank_ms"], data["rerank_cpu_ms"], data["index"]
        print(f"rerank stage ({args.candidates} candidates): P50 {r['p50']:.2f} ms, P99 {r['p99']:.2f} ms wall; "
              f"CPU P50 {c['p50']:.2f} ms, P99 {c['p99']:.2f} ms")
        for which in ("off", "on") if "http" in data else ():
            print(f"/v1/query rerank {which}: P50 {data['http'][which]['p50']:.2f} P99 {data['http'][which]['p99']:.2f} ms")
        print(f"index: token vectors {i['rerank_bytes'] / 2**20:.1f} MiB beside {i['other_bytes'] / 2**20:.1f} MiB")
        data["products"] = []
        for spec in args.product:
            name, beir, split, index, head = _set_spec(parser, "--product", spec)
            result = product_quality(name, beir, split, index, head)
            data["products"].append(result)
            print(f"{name}: hybrid+rerank int8 product {result['int8']:.4f}, float32 {result['float32']:.4f} "
                  f"({result['diff']:+.4f} ± {result['diff_se']:.4f}; {result['better']} better / {result['worse']} worse)")
    else:
        data = {"cross": []}
        if args.train_report:
            report = json.loads(args.train_report.read_text())
            data["cv"], data["cv_set"] = report["cv"], f"{report['beir']} ({report['split']}, {report['queries']} queries)"
            data["train_command"] = report.get("command")
            print(f"CV: hybrid {data['cv']['summary']['hybrid']:.4f} -> rerank {data['cv']['summary']['rerank']:.4f}")
        for spec in args.cross:
            name, beir, split, index, head = _set_spec(parser, "--cross", spec)
            result = cross_quality(name, beir, split, index, head)
            data["cross"].append(result)
            print(f"{name}: hybrid {result['hybrid']:.4f} -> rerank {result['rerank']:.4f} "
                  f"({result['gain']:+.4f} ± {result['gain_se']:.4f})")
    print(f"wrote {run.write(data, args.json)}")
    print(preview(run.name, data))


def _set_spec(parser: argparse.ArgumentParser, flag: str, spec: str) -> tuple[str, Path, str, Path, Path | None]:
    try:
        return parse_set(spec)
    except ValueError as exc:
        parser.error(f"{flag} {exc}")


if __name__ == "__main__":
    main()
