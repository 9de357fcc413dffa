"""LLM-as-judge (``ragheat judge``, rag/eval/judge.py): how SmolLM2-135M's relevance labels agree with the human qrels.

    # run_all.sh step `judge` (starts vLLM on the real model itself)
    .venv/bin/python benchmarks/bench_judge.py \
        --set scifact=datasets/scifact:train:data/index/scifact \
        --set hotpotqa-dev=datasets/hotpotqa-dev:dev:data/index/hotpotqa-dev \
        --limit 20 --seed 16 --json benchmarks/results/judge.json

Per set, ``--limit`` judged queries drawn with ``--seed``; their hybrid top ``--top-k`` documents are labelled by the
model (``YesNoClient``: the first token's log P(Yes) - log P(No)), as ``ragheat judge`` does. Reported per set:
agreement with the human labels at ``ragheat judge``'s default threshold (Cohen's kappa, the judge's precision and
recall, nDCG@10 of the same ranking from judge labels vs human labels), at argmax (threshold 0: what the model says),
and at the threshold that maximises kappa on the *other* set (held out: a threshold chosen on SciFact and applied to
HotpotQA, and the reverse), with the best in-set kappa as an optimistic ceiling. Writes a results file;
docs/benchmarks.md, "Relevance labels by an LLM judge", shows it.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import DEFAULT_SETS, SERVED, SMOKE, model_sets_parser, parse_set, real_model  # noqa: E402
from benchmarks.docgen.page import preview  # noqa: E402
from loadgen.resultsfile import BenchmarkRun  # noqa: E402
from rag.eval.beir import load_qrels, load_queries  # noqa: E402
from rag.eval.judge import Judge, YesNoClient, agreement, read_margins, retrieved_pairs, write_json_safe  # noqa: E402
from rag.ingest.pipeline import ingest as run_ingest  # noqa: E402
from rag.pipeline import RagPipeline  # noqa: E402
from rag.settings import RagheatSettings  # noqa: E402
from ragheat.commands.judge import DEFAULT_THRESHOLD  # noqa: E402

GRID = [x / 20 for x in range(-80, 21)]  # thresholds -4.0 .. 1.0 in 0.05 steps


def judge_set(name: str, beir: Path, split: str, index: Path, url: str, limit: int, seed: int, top_k: int,
              workers: int, work: Path) -> dict:
    queries, qrels = load_queries(beir), load_qrels(beir, split)
    judged = sorted(q for q in queries if q in qrels)
    chosen = {q: queries[q] for q in sorted(random.Random(seed).sample(judged, min(limit, len(judged))))}
    settings = RagheatSettings()
    settings.graph.enabled = False
    run_ingest(str(beir), index, settings)  # no-op when up to date
    pipeline = RagPipeline(settings, index)
    pipeline.warm_up()
    try:
        ranked, pairs = retrieved_pairs(pipeline, chosen, ["dense", "bm25"], top_k)
    finally:
        pipeline.close()
    out = work / f"{name}.tsv"
    client = YesNoClient(url, SERVED)
    start = time.perf_counter()
    stats = Judge(client, out, workers=workers, threshold=DEFAULT_THRESHOLD).run(pairs)
    seconds = time.perf_counter() - start
    client.close()
    margins = read_margins(out.with_name(out.name + ".margins.tsv"))
    return {"beir": str(beir), "split": split, "queries": len(chosen), "seed": seed, "top_k": top_k,
            "pairs": len(pairs), "run": stats, "seconds": seconds, "pairs_per_s": len(pairs) / seconds,
            "margins": {f"{q}\t{d}": m for (q, d), m in margins.items()}, "ranked": ranked,
            "qrels": {q: qrels[q] for q in chosen}}


def at(s: dict, threshold: float) -> dict:
    labels = {tuple(k.split("\t")): int(m > threshold) for k, m in s["margins"].items()}
    return agreement(labels, s["qrels"], s["ranked"])


def best_threshold(s: dict) -> float:
    scored = [(at(s, t)["kappa"], t) for t in GRID]
    scored = [(k, t) for k, t in scored if k == k]  # NaN: all one label
    return max(scored)[1] if scored else 0.0


def main() -> None:
    run = BenchmarkRun("judge")
    parser = model_sets_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=3 if SMOKE else 20,
                        help="judged queries per set, drawn with --seed")
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    data = {"load_average": list(os.getloadavg()), "workers": args.workers, "default_threshold": DEFAULT_THRESHOLD,
            "sets": {}}
    with contextlib.ExitStack() as stack:
        url = real_model(stack, args.llm_url, max_num_seqs=8)
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ragheat-judge-")))
        for spec in args.set or DEFAULT_SETS:
            name, beir, split, index, _ = parse_set(spec)
            data["sets"][name] = judge_set(name, beir, split, index, url, args.limit, args.seed, args.top_k,
                                           args.workers, work)
            print(f"{name}: {data['sets'][name]['pairs']} pairs in {data['sets'][name]['seconds']:.0f} s", flush=True)
    names = list(data["sets"])
    for name, s in data["sets"].items():
        s["best_threshold"] = best_threshold(s)
    for name, s in data["sets"].items():
        s["at"] = {"argmax (0)": at(s, 0.0)}
        if DEFAULT_THRESHOLD != 0.0:
            s["at"][f"default ({DEFAULT_THRESHOLD})"] = at(s, DEFAULT_THRESHOLD)
        others = [o for o in names if o != name]
        if others:
            t = data["sets"][others[0]]["best_threshold"]
            s["at"][f"held out ({t:g}, from {others[0]})"] = at(s, t)
        s["at"][f"in-set best ({s['best_threshold']:g})"] = at(s, s["best_threshold"])
        s.pop("qrels")
    data = write_json_safe(data)
    print(f"wrote {run.write(data, args.json)}")
    print(preview("judge", data))


if __name__ == "__main__":
    main()
