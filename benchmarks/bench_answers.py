"""Answer quality on HotpotQA (dev): the extractive answer and SmolLM2-135M's written answer side by side, against the
gold answers of ``questions_full.jsonl``; the share of written sentences the support check flags; and how many
tokens a constrained written answer takes (what ``generation.max_tokens`` must leave room for).

    # run_all.sh step `answers` (starts vLLM on the real model itself)
    .venv/bin/python benchmarks/bench_answers.py --beir datasets/hotpotqa-dev --index data/index/hotpotqa-dev \
        --questions 30 --seed 16 --json benchmarks/results/answers.json

Both generators answer the same ``--questions`` questions (drawn with ``--seed``) from the same retrieval (hybrid,
top 5; the model reads the top ``generation.passages``, compressed to ``prompt_budget_tokens``). Scores: exact match
and token F1 after SQuAD normalisation (lower case, no punctuation or articles), citation markers removed; and
"gold in answer" (the normalised gold string occurs in the answer), fairer to a sentence-long answer. The written
answers run with ``--max-tokens`` (default 256, above the default 96) so their natural length is measured: P50/P90 and
the share that hit the cap. Writes a results file; docs/benchmarks.md, "Written answers from a real model", shows it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import statistics
import string
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import SERVED, SMOKE, p50_p99, real_model  # noqa: E402
from benchmarks.docgen.page import preview  # noqa: E402
from loadgen.resultsfile import BenchmarkRun  # noqa: E402
from rag.ingest.pipeline import ingest as run_ingest  # noqa: E402
from rag.pipeline import RagPipeline  # noqa: E402
from rag.settings import RagheatSettings  # noqa: E402


def normalize(text: str) -> str:
    text = re.sub(r"\[\d+\]|\[unsupported\]", " ", text.lower())
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def f1(prediction: str, gold: str) -> float:
    p, g = normalize(prediction).split(), normalize(gold).split()
    common = sum((Counter(p) & Counter(g)).values())
    if not p or not g or common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def score(answers: dict[str, str], gold: dict[str, str]) -> dict:
    qids = list(gold)
    return {"exact_match": statistics.fmean(normalize(answers[q]) == normalize(gold[q]) for q in qids),
            "f1": statistics.fmean(f1(answers[q], gold[q]) for q in qids),
            "gold_in_answer": statistics.fmean(f" {normalize(gold[q])} " in f" {normalize(answers[q])} " for q in qids)}


def run(beir: Path, index: Path, url: str, n: int, seed: int, max_tokens: int) -> dict:
    rows = [json.loads(line) for line in (beir / "questions_full.jsonl").read_text().splitlines() if line.strip()]
    rows = sorted(random.Random(seed).sample(rows, min(n, len(rows))), key=lambda r: r["_id"])
    gold = {r["_id"]: r["answer"] for r in rows}
    base = RagheatSettings()
    base.graph.enabled = False
    llm = base.model_copy(update={"generation": base.generation.model_copy(update={
        "generator": "openai", "base_url": url, "model": SERVED, "max_tokens": max_tokens,
        "first_token_timeout_s": 120.0, "deadline_s": 300.0, "connect_timeout_s": 5.0})})
    answers: dict[str, dict[str, str]] = {"extractive": {}, "llm": {}}
    written, tokens, ttft, degraded, examples = [], [], [], Counter(), []
    run_ingest(str(beir), index, base)  # no-op when up to date
    pipeline = RagPipeline(llm, index)
    pipeline.warm_up()
    try:
        for i, r in enumerate(rows, 1):
            result = pipeline.query(r["question"], 5, ["dense", "bm25"])
            passages = [s.chunk for s in result.sources[: llm.generation.passages]]
            answers["extractive"][r["_id"]] = pipeline.generator.generate(r["question"], passages).answer
            answers["llm"][r["_id"]] = result.answer
            degraded[result.degraded_reason or "served"] += 1
            written.extend(result.support)
            if result.generation is not None:
                tokens.append(result.generation.output_tokens)
                ttft.append(result.generation.ttft_s)
            if len(examples) < 4:
                examples.append({"question": r["question"], "gold": r["answer"], "llm": result.answer,
                                 "extractive": answers["extractive"][r["_id"]]})
            print(f"{i}/{len(rows)} {degraded}", flush=True)
    finally:
        pipeline.close()
    t = np.asarray(tokens, dtype=float)
    return {"questions": len(rows), "seed": seed, "max_tokens": max_tokens,
            "scores": {name: score(a, gold) for name, a in answers.items()},
            "served": dict(degraded),
            "sentences_written": len(written), "sentences_flagged": sum(not s.supported for s in written),
            "flagged_share": (sum(not s.supported for s in written) / len(written)) if written else None,
            "output_tokens": {"p50": float(np.percentile(t, 50)), "p90": float(np.percentile(t, 90)),
                              "max": float(t.max()), "at_cap": int((t >= max_tokens).sum()), "n": int(len(t)),
                              "over_96": int((t > 96).sum()), "all": [int(x) for x in t]}
            if len(t) else None,
            "ttft_ms": {"p50": float(np.percentile(ttft, 50) * 1000), "p99": float(np.percentile(ttft, 99) * 1000)}
            if ttft else None,
            "examples": examples}


def rates(beir: Path, index: Path, url: str, rates_per_s: list[float], duration_s: float, seed: int) -> dict:
    """Open loop: Poisson arrivals at each rate for ``duration_s``, each a whole query (retrieval + written answer,
    ``generation.max_tokens`` at its default) on its own thread; TTFT as the generator saw it (request sent -> first
    token) and end to end from the intended arrival, so queueing counts."""
    import threading
    import time

    rows = [json.loads(line) for line in (beir / "questions_full.jsonl").read_text().splitlines() if line.strip()]
    base = RagheatSettings()
    base.graph.enabled = False
    llm = base.model_copy(update={"generation": base.generation.model_copy(update={
        "generator": "openai", "base_url": url, "model": SERVED, "first_token_timeout_s": 120.0,
        "deadline_s": 300.0, "connect_timeout_s": 5.0})})
    pipeline = RagPipeline(llm, index)
    pipeline.warm_up()
    out = {}
    try:
        for rate in rates_per_s:
            rng = random.Random(seed)
            arrivals, t = [], rng.expovariate(rate)
            while t < duration_s:
                arrivals.append(t)
                t += rng.expovariate(rate)
            ttft, e2e, degraded, lock = [], [], Counter(), threading.Lock()
            tokens, decode_s = [], []  # per written answer: output tokens, and the time from first to last
            start = time.perf_counter()

            def one(at: float, question: str) -> None:
                result = pipeline.query(question, 5, ["dense", "bm25"])
                done = time.perf_counter() - start - at
                with lock:
                    e2e.append(done)
                    degraded[result.degraded_reason or "served"] += 1
                    if result.generation is not None:
                        ttft.append(result.generation.ttft_s)
                        tokens.append(result.generation.output_tokens)
                        decode_s.append(sum(result.generation.inter_token_s))

            threads = []
            for i, at in enumerate(arrivals):
                time.sleep(max(0.0, at - (time.perf_counter() - start)))
                th = threading.Thread(target=one, args=(at, rng.choice(rows)["question"]), daemon=True)
                th.start()
                threads.append(th)
            for th in threads:
                th.join()
            elapsed = time.perf_counter() - start
            # Decode speed one answer saw (tokens after the first over the time after the first), and what the
            # model wrote in all per second of the step (arrivals and the drain after them).
            per_answer = [(n - 1) / d for n, d in zip(tokens, decode_s) if n > 1 and d > 0]
            out[f"{rate:g}"] = {"requests": len(arrivals), "ttft_ms": p50_p99(ttft), "e2e_ms": p50_p99(e2e),
                                "outcomes": dict(degraded), "drain_s": elapsed - duration_s,
                                "output_tokens": int(sum(tokens)), "output_tokens_per_s": sum(tokens) / elapsed,
                                "decode_tokens_per_s": p50_p99(per_answer, scale=1.0)}
            print(f"rate {rate:g}/s: {out[f'{rate:g}']}", flush=True)
    finally:
        pipeline.close()
    return {"duration_s": duration_s, "max_tokens": base.generation.max_tokens, "by_rate": out}


def main() -> None:
    record = BenchmarkRun("answers")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--beir", type=Path, default=Path("datasets/hotpotqa-dev"))
    parser.add_argument("--index", type=Path, default=Path("data/index/hotpotqa-dev"))
    parser.add_argument("--questions", type=int, default=3 if SMOKE else 30)
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--rates", default="" if SMOKE else "1,4", help="open-loop arrival rates (req/s) for TTFT "
                                                                        "under load; empty = skip that part")
    parser.add_argument("--rate-duration", type=float, default=20.0, help="seconds of arrivals per rate")
    parser.add_argument("--part", choices=("all", "quality", "rates"), default="all")
    parser.add_argument("--llm-url", help="a running vLLM OpenAI server's /v1 URL serving the model as 'smollm2'")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    load = list(os.getloadavg())
    with contextlib.ExitStack() as stack:
        url = real_model(stack, args.llm_url, max_num_seqs=4)
        data = run(args.beir, args.index, url, args.questions, args.seed, args.max_tokens) \
            if args.part != "rates" else {}
        if args.rates and args.part != "quality":
            data["rates"] = rates(args.beir, args.index, url, [float(x) for x in args.rates.split(",")],
                                  args.rate_duration, args.seed)
    data["load_average"] = load
    print(f"wrote {record.write(data, args.json)}")
    print(preview("answers", data))


if __name__ == "__main__":
    main()
