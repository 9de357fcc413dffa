"""Embedding precision schemes side by side: batch independence, fidelity to fp32, speed, retrieval.

    .venv/bin/python benchmarks/bench_embedding.py            # 4 schemes, the doc section's table
    .venv/bin/python benchmarks/bench_embedding.py --schemes fp32,int8-dynamic,int8-rowwise,int8-static,w8-float,int8 \
        --ndcg fp32,int8-dynamic,int8 --chunks 2000 --rounds 5      # the full comparison (tens of minutes)

Writes a results file (loadgen.resultsfile: the figures plus machine, commit and load) to
benchmarks/results/embedding.json, or to --json / --results-file.

Every scheme is built from the same fp32 graph into --work (the shipped ones through the real
``ensure_encoder``, so the file measured is the file served) and run through the embedder's own
session options, feed and batching code:

  fp32              the reference graph (rag.embedding.onnx_builder)
  int8-dynamic      ORT quantize_dynamic, per-channel int8 weights, ONE activation scale per batch
                    (per-batch scales make a text's vector depend on its batch)
  int8-rowwise      what `query_precision=int8-row` runs (rag.embedding.quantize.quantize_rowwise_int8): per-token
                    activation scales computed in the graph, MatMulInteger, per-channel weights
  int8-static       QDQ with activation scales calibrated on SciFact windows (Percentile), per-channel weights
  w8-float          int8 weights in blocks of 32 (MatMulNBits), float activations (accuracy_level 1)
  int8              what `precision=int8` ships (rag.embedding.quantize): int8 weights in blocks of 32,
                    activations quantised per row and block by MatMulNBits (accuracy_level 4)

Measured, per scheme:
  batch independence  each probe text alone vs inside many batches (random mixes, padding-heavy
                      neighbours, the length-sorted token-budget batches of ingestion): min cosine
  agreement           cosine to fp32, each of --agree sentences embedded alone: median, 1st pct, min
  query speed         one 20-word-piece query at a time on a 1-thread session: P50 / P99 (ms)
  bulk speed          ~--chunks SciFact chunks, length-sorted into ingestion's token-budget batches, on a
                      --bulk-threads session: word pieces and documents per second, and this process's
                      CPU seconds (robust to a busy neighbour, which stretches wall time, not CPU time)
  retrieval           (--ndcg) dense nDCG@10 on the --split claims, exact inner-product search over
                      all chunks (no ANN error), a document ranked by its best chunk

Speed rounds are interleaved (every scheme once per round, the order rotating) and reported as the
median over rounds with the min..max spread, so a busy neighbour slows all schemes alike.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.docgen.page import preview  # noqa: E402
from loadgen.resultsfile import BenchmarkRun  # noqa: E402
from rag.embedding import quantize  # noqa: E402
from rag.embedding.embedder import OnnxEmbedder, _session, _token_budget_batches  # noqa: E402
from rag.embedding.encoder_spec import INT8_SCHEME  # noqa: E402
from rag.embedding.model_store import ensure_encoder  # noqa: E402
from rag.eval.beir import load_qrels, load_queries, ndcg_at  # noqa: E402
from rag.ingest.chunking import TokenWindowChunker  # noqa: E402
from rag.ingest.sentences import sentence_spans  # noqa: E402
from rag.ingest.sources import load_beir  # noqa: E402
from rag.settings import EmbeddingSettings  # noqa: E402

SCHEMES = ("fp32", "int8-dynamic", "int8-rowwise", "int8-static", "w8-float", "int8")
DEFAULT_SCHEMES = ("fp32", "int8-dynamic", "w8-float", "int8")  # the reference, per-batch int8, the two per-row ones
ODD_TEXTS = ["short", "?", "x " * 300, "1234567890 " * 40, "THE THE THE THE THE",
             "α-synuclein, β-amyloid and ΔF508 at 5 µg/mL", "a"]


# -- building the schemes ------------------------------------------------------------------------
def _quiet_root_logger(fn, *args, **kwargs):
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # ORT's quantisers log hints on the root logger
    try:
        return fn(*args, **kwargs)
    finally:
        root.setLevel(level)


def build_dynamic(fp32: Path, out: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    _quiet_root_logger(quantize_dynamic, str(fp32), str(out), weight_type=QuantType.QInt8, per_channel=True,
                       op_types_to_quantize=["MatMul"])


def build_static(fp32: Path, out: Path, calibration: list[list[int]]) -> None:
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter({"input_ids": np.array([ids], np.int64),
                               "attention_mask": np.ones((1, len(ids)), np.int64)} for ids in calibration)

        def get_next(self):
            return next(self.feeds, None)

    _quiet_root_logger(quantize_static, str(fp32), str(out), Reader(), quant_format=QuantFormat.QDQ,
                       op_types_to_quantize=["MatMul"], per_channel=True, activation_type=QuantType.QUInt8,
                       weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.Percentile)


def build_schemes(work: Path, names, calibration) -> dict[str, Path]:
    work.mkdir(parents=True, exist_ok=True)
    cache = work / "cache"
    fp32 = ensure_encoder(None, cache, "fp32").onnx_path
    paths = {"fp32": fp32, "int8": ensure_encoder(None, cache, "int8").onnx_path}
    if "int8-rowwise" in names:
        paths["int8-rowwise"] = ensure_encoder(None, cache, "int8-row").onnx_path
    builders = {"int8-dynamic": build_dynamic,
                "int8-static": lambda src, dst: build_static(src, dst, calibration),
                "w8-float": lambda src, dst: quantize.quantize_blockwise_int8(src, dst, accuracy_level=1)}
    for name in names:
        if name in builders:
            path = work / f"{fp32.parent.name}-{name}.onnx"
            if not path.exists():
                builders[name](fp32, path)
            paths[name] = path
    return {n: paths[n] for n in names}


# -- data -----------------------------------------------------------------------------------------
def real_sentences(beir: Path, n: int, skip_docs: int = 0) -> list[str]:
    """Up to three sentences from each abstract, in corpus order from document ``skip_docs``."""
    out: list[str] = []
    with open(beir / "corpus.jsonl", encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if i < skip_docs:
                continue
            text = json.loads(line)["text"]
            out += [text[a:b] for a, b in sentence_spans(text)[:3]]
            if len(out) >= n:
                break
    return out[:n]


def passages(corpus, tokenizer: Tokenizer, limit: int | None) -> tuple[list[str], list[str]]:
    """(passage texts, their document ids) exactly as ingestion chunks and embeds them."""
    settings = EmbeddingSettings()
    chunker = TokenWindowChunker(tokenizer, 240, 16, budget=settings.max_seq_length - 2)
    texts, doc_ids = [], []
    for doc, spans in zip(corpus.documents, chunker.split(corpus.documents)):
        for a, b in spans:
            texts.append(f"{doc.title}\n{doc.text[a:b]}" if doc.title else doc.text[a:b])
            doc_ids.append(doc.doc_id)
            if limit and len(texts) == limit:
                return texts, doc_ids
    return texts, doc_ids


class Runner:
    """One scheme's two sessions, fed exactly as ``OnnxEmbedder`` feeds them."""

    def __init__(self, path: Path, tokenizer: Tokenizer, bulk_threads: int, batch_tokens: int) -> None:
        self.query = _session(path, 1)
        self.bulk = _session(path, bulk_threads)
        self.tokenizer, self.batch_tokens = tokenizer, batch_tokens

    def alone(self, texts) -> np.ndarray:
        return np.stack([self.query.run(None, OnnxEmbedder._feed([e]))[0][0]
                         for e in self.tokenizer.encode_batch(list(texts))])

    def together(self, texts) -> np.ndarray:
        return self.bulk.run(None, OnnxEmbedder._feed(self.tokenizer.encode_batch(list(texts))))[0]

    def many(self, encodings) -> np.ndarray:
        out = np.zeros((len(encodings), 384), np.float32)
        order = np.argsort([len(e.ids) for e in encodings], kind="stable")
        for batch in _token_budget_batches(order, encodings, self.batch_tokens):
            out[batch] = self.bulk.run(None, OnnxEmbedder._feed([encodings[i] for i in batch]))[0]
        return out


# -- measurements ---------------------------------------------------------------------------------
def batch_independence(runner: Runner, probes: list[str], pool: list[str], mixes: int, seed: int) -> dict:
    """Min cosine between a probe text embedded alone and the same text inside other batches."""
    rng = np.random.default_rng(seed)
    texts = probes + ODD_TEXTS
    alone = runner.alone(texts)
    worst = np.ones(len(texts))

    def see(indices, vectors):
        for i, v in zip(indices, vectors):
            worst[i] = min(worst[i], float(v @ alone[i]))

    # 1. ingestion's batching: everything at once, length-sorted into token-budget batches
    see(range(len(texts)), runner.many(runner.tokenizer.encode_batch(texts)))
    # 2. random mixes of probes, other sentences and odd texts, batch sizes 2..32
    for _ in range(mixes):
        mine = rng.choice(len(texts), size=int(rng.integers(1, 8)), replace=False)
        others = [pool[j] for j in rng.choice(len(pool), size=int(rng.integers(1, 25)), replace=False)]
        batch = [texts[i] for i in mine] + others
        see(mine, runner.together(batch)[: len(mine)])
    # 3. padding-heavy: each text next to a 256-word-piece neighbour (mostly padding for short texts)
    for i in range(len(texts)):
        see([i], runner.together([texts[i], ODD_TEXTS[2]])[:1])
        see([i], runner.together([texts[i], ODD_TEXTS[3], "?"])[:1])
    return {"texts": len(texts), "mixes": mixes, "min_cosine": float(worst.min()),
            "max_one_minus_cosine": float(1 - worst.min()), "below_0_999": int((worst < 0.999).sum()),
            "below_0_9999": int((worst < 0.9999).sum())}


def agreement(vectors: np.ndarray, reference: np.ndarray) -> dict:
    cosine = (vectors * reference).sum(axis=1)
    return {"n": len(cosine), "median": float(np.median(cosine)), "p1": float(np.percentile(cosine, 1)),
            "min": float(cosine.min())}


def speed(runners: dict[str, Runner], query_feeds, bulk_feeds, bulk_tokens: int, bulk_docs: int, rounds: int,
          per_round: int) -> dict:
    """Interleaved rounds: per round, every scheme's query P50/P99 and bulk word pieces (and documents) per
    second, with the bulk pass's process CPU seconds."""
    names = list(runners)
    query: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    bulk: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            session = runners[name].query
            for feed in query_feeds[:10]:
                session.run(None, feed)
            ms = []
            for i in range(per_round):
                feed = query_feeds[i % len(query_feeds)]
                start = time.perf_counter()
                session.run(None, feed)
                ms.append((time.perf_counter() - start) * 1000.0)
            query[name].append((float(np.percentile(ms, 50)), float(np.percentile(ms, 99))))
            start, cpu_start = time.perf_counter(), time.process_time()
            for feed in bulk_feeds:
                runners[name].bulk.run(None, feed)
            bulk[name].append(bulk_tokens / (time.perf_counter() - start))
            cpu[name].append(time.process_time() - cpu_start)
        print(f"  speed round {r + 1}/{rounds} done", flush=True)
    out = {}
    for name in names:
        p50s, p99s = [p for p, _ in query[name]], [p for _, p in query[name]]
        out[name] = {"query_ms": {"p50": statistics.median(p50s), "p99": statistics.median(p99s),
                                  "p50_spread": [min(p50s), max(p50s)], "p99_spread": [min(p99s), max(p99s)]},
                     "bulk_word_pieces_per_s": {"median": statistics.median(bulk[name]),
                                                "spread": [min(bulk[name]), max(bulk[name])]},
                     "bulk_docs_per_s": {"median": statistics.median(bulk[name]) * bulk_docs / bulk_tokens,
                                         "spread": [v * bulk_docs / bulk_tokens for v in (min(bulk[name]),
                                                                                           max(bulk[name]))]},
                     "bulk_cpu_s": {"median": statistics.median(cpu[name]), "spread": [min(cpu[name]), max(cpu[name])]}}
    return out


def dense_ndcg(runner: Runner, chunk_encodings, chunk_docs: list[str], queries: dict[str, str], qrels) -> float:
    """Dense nDCG@10 with exact search: chunks embedded as ingestion does, each query alone."""
    vectors = runner.many(chunk_encodings)
    judged = [q for q in queries if q in qrels]
    query_vectors = runner.alone([queries[q] for q in judged])
    scores = query_vectors @ vectors.T
    total = 0.0
    for row, qid in zip(scores, judged):
        ranked: list[str] = []
        for j in np.argsort(-row, kind="stable"):
            if chunk_docs[j] not in ranked:
                ranked.append(chunk_docs[j])
                if len(ranked) == 10:
                    break
        total += ndcg_at(ranked, qrels[qid], 10)
    return total / len(judged)


# -- main -----------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--beir", type=Path, default=Path("datasets/scifact"))
    ap.add_argument("--split", default="train")
    ap.add_argument("--json", "--results-file", dest="json", type=Path,
                    help="results file (default benchmarks/results/embedding.json)")
    ap.add_argument("--work", type=Path, default=Path("data/bench/embedding-schemes"),
                    help="scheme graphs are built here once (a scratch model cache, not ~/.cache/ragheat)")
    ap.add_argument("--schemes", default=",".join(DEFAULT_SCHEMES), help=f"comma list of {', '.join(SCHEMES)}")
    ap.add_argument("--probes", type=int, default=60, help="texts checked for batch independence")
    ap.add_argument("--mixes", type=int, default=20, help="random batch mixes")
    ap.add_argument("--agree", type=int, default=200, help="sentences compared with fp32")
    ap.add_argument("--chunks", type=int, default=300, help="chunks in the bulk speed run")
    ap.add_argument("--bulk-threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--queries-per-round", type=int, default=100)
    ap.add_argument("--ndcg", default="",
                    help="schemes whose dense nDCG@10 is measured over the whole corpus ('' = none; minutes each)")
    run = BenchmarkRun("embedding")
    args = ap.parse_args()
    names = [n.strip() for n in args.schemes.split(",") if n.strip()]
    unknown = sorted(set(names) - set(SCHEMES))
    if unknown or "fp32" not in names:
        ap.error(f"--schemes takes a comma list of {', '.join(SCHEMES)} including fp32; got {unknown or names}")
    ndcg_names = [n for n in args.ndcg.split(",") if n.strip() and n in names]
    load_before = os.getloadavg()
    settings = EmbeddingSettings()
    tokenizer = Tokenizer.from_file(str(ensure_encoder(None, args.work / "cache", "fp32").tokenizer_path))
    tokenizer.enable_truncation(max_length=settings.max_seq_length)
    tokenizer.no_padding()

    # Static calibration: 64-word-piece windows of abstracts from the far end of the corpus.
    plain = Tokenizer.from_str(tokenizer.to_str())
    plain.no_truncation()
    calibration = []
    for text in real_sentences(args.beir, 4000, skip_docs=4000)[::3]:
        ids = plain.encode(text, add_special_tokens=False).ids
        if len(ids) >= 62 and len(calibration) < 256:
            calibration.append([101] + ids[:62] + [102])
    paths = build_schemes(args.work, names, calibration)
    runners = {n: Runner(p, tokenizer, args.bulk_threads, settings.batch_tokens) for n, p in paths.items()}

    sentences = real_sentences(args.beir, args.agree + args.probes + 400)
    agree_texts = sentences[: args.agree]
    probes = sentences[args.agree: args.agree + args.probes]
    pool = sentences[args.agree + args.probes:]
    results: dict = {"schemes": {}}
    reference = runners["fp32"].alone(agree_texts)
    for name, runner in runners.items():
        print(f"{name}: batch independence and agreement", flush=True)
        results["schemes"][name] = {
            "file": paths[name].name, "size_mib": round(paths[name].stat().st_size / 2**20, 1),
            "batch_independence": batch_independence(runner, probes, pool, args.mixes, seed=19),
            "agreement_with_fp32": agreement(runner.alone(agree_texts), reference)}

    corpus = load_beir(args.beir)
    queries = load_queries(args.beir)
    q20 = [t for t in queries.values() if len(tokenizer.encode(t).ids) == 20][:20]
    query_feeds = [OnnxEmbedder._feed([tokenizer.encode(t)]) for t in q20]
    bulk_texts, bulk_doc_ids = passages(corpus, tokenizer, args.chunks)
    bulk_encodings = tokenizer.encode_batch(bulk_texts)
    order = np.argsort([len(e.ids) for e in bulk_encodings], kind="stable")
    bulk_feeds = [OnnxEmbedder._feed([bulk_encodings[i] for i in b])
                  for b in _token_budget_batches(order, bulk_encodings, settings.batch_tokens)]
    bulk_tokens = sum(len(e.ids) for e in bulk_encodings)
    print(f"speed: {len(q20)} queries of 20 word pieces, {len(bulk_texts)} chunks ({bulk_tokens} word pieces)",
          flush=True)
    for name, figures in speed(runners, query_feeds, bulk_feeds, bulk_tokens, len(set(bulk_doc_ids)), args.rounds,
                               args.queries_per_round).items():
        results["schemes"][name].update(figures)

    if ndcg_names:
        texts, docs = passages(corpus, tokenizer, None)
        encodings = tokenizer.encode_batch(texts)
        qrels = load_qrels(args.beir, args.split)
        for name in ndcg_names:
            print(f"{name}: dense nDCG@10 over {len(texts)} chunks", flush=True)
            results["schemes"][name]["dense_ndcg@10"] = dense_ndcg(runners[name], encodings, docs, queries, qrels)

    results["setup"] = {
        "beir": str(args.beir), "split": args.split, "probes": args.probes, "mixes": args.mixes,
        "agree": args.agree, "bulk_chunks": len(bulk_texts), "bulk_docs": len(set(bulk_doc_ids)),
        "bulk_word_pieces": bulk_tokens,
        "bulk_threads": args.bulk_threads, "rounds": args.rounds, "queries_per_round": args.queries_per_round,
        "int8_scheme": INT8_SCHEME, "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "load_average_before": load_before, "load_average_after": os.getloadavg()}
    print(f"wrote {run.write(results, args.json)}")
    print(preview("embedding", results))


if __name__ == "__main__":
    main()
