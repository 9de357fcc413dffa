"""How a ragheat index's costs grow with the corpus: the same service over corpora of growing size, side by side.

The smallest corpus is a real index (default ``data/index/scifact``, served as it is). The larger ones are built
from it, because embedding a hundred thousand chunks with the real encoder takes hours here (the ingest's rate is in
docs/benchmarks.md, "Ingestion"):

- every real chunk is kept; each further chunk copies a real chunk's shape: its dense vector is the source's plus
  Gaussian noise, re-normalised (cosine to the source ~0.9); its token vectors are the source's rows plus noise,
  re-quantised to int8 with one scale a token; its text is the source's sentences in another order with one sentence
  of another real chunk, so BM25 sees the real vocabulary, term frequencies and chunk lengths.
- the dense index, BM25 and the token store are then built by ragheat's own code (rag.index.dense, rag.index.sparse)
  with the real index's parameters; the graph is off (its growth is the graph store's, measured in "Graph retrieval").

Costs depend on sizes, lengths and the spread of the vectors, which these corpora share with the real one, so
latency, memory and disk are representative; their relevance is not, and no quality figure is reported for them.

At each size: disk by part, the service's start-up (``ragheat serve`` until ``/readyz``), its resident memory once
ready, every stage's P50 / P99 and the end-to-end latency at concurrency 1 (SciFact claims), the service's CPU per
answer and answers/s with --clients closed-loop clients, the knee (open-loop Poisson steps at --rates, ascending, until
one misses the SLO: P99 over it, or errors or refusals over ``MAX_ERROR_RATE``), and the hot swap: a new generation
published beside the served one (its files hard-linked), the time until the service serves it and the slowest request
meanwhile.

    .venv/bin/python benchmarks/bench_growth.py --sizes real,30000,100000 --results-file benchmarks/results/growth.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import MAX_ERROR_RATE, SMOKE, p50_p99, resident_bytes  # noqa: E402
from loadgen.resultsfile import BenchmarkRun  # noqa: E402

NOISE_COSINE = 0.9  # a synthetic chunk's dense vector against its source's


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--index", type=Path, default=Path("data/index/scifact"), help="the real index the corpora grow from")
    p.add_argument("--queries", type=Path, default=Path("datasets/scifact/queries.jsonl"), help="BEIR queries file")
    p.add_argument("--sizes", default="real,30000,100000",
                   help="comma list of chunk counts, each optionally :pq64/:pq32/:pq16 (its token vectors as product "
                        "codes); 'real' = the index")
    p.add_argument("--work", type=Path, default=Path("data/bench/growth"), help="where the larger corpora are built")
    p.add_argument("--requests", type=int, default=300, help="concurrency-1 requests per round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--round-s", type=float, default=8.0, help="seconds of each CPU-per-answer round")
    p.add_argument("--rates", default="40:320:40", type=_rates,
                   help="offered req/s of the knee's steps (A:B:STEP or a comma list)")
    p.add_argument("--step-s", type=float, default=8.0, help="measured seconds of each knee step")
    p.add_argument("--warmup-s", type=float, default=2.0, help="seconds before each knee step is measured")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--results-file", "--json", dest="results_file", type=Path,
                   default=Path("benchmarks/results/growth.json"))
    return p.parse_args(argv)


def _rates(spec: str) -> list[float]:
    from loadgen.arrivals import parse_rates

    return sorted(parse_rates(spec))


# -- building a larger corpus --------------------------------------------------------------------------
def _sentences(text: str) -> list[str]:
    parts = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]
    return parts or [text]


def grow(real: Path, size: int, work: Path, seed: int, token_dtype: str = "int8") -> tuple[Path, dict]:
    """An index folder at ``work/<size>[-<token_dtype>]`` whose one generation holds ``size`` chunks grown from
    ``real``, its token vectors stored as ``token_dtype`` (int8, or product codes learnt from the grown int8 ones as an
    ingest learns them); with the seconds each part took to build. Reused when it exists with this size."""
    from rag.index import dense, sparse
    from rag.index.chunks import read_chunks, write_chunks
    from rag.index.store import CHUNKS, IndexWriter, read_manifest, resolve_generation
    from rag.ingest.pipeline import passage_text
    from rag.retrieval.lexical import LexicalAnalyzer
    from rag.settings import IndexSettings
    from rag.types import Chunk

    target = work / f"{size}-{token_dtype}-seed{seed}"
    if (target / "current").exists() and (target / "build.json").exists() and \
            read_manifest(target)["counts"]["chunks"] == size:
        return target, json.loads((target / "build.json").read_text())
    folder = resolve_generation(real)
    manifest = read_manifest(real)
    chunks = list(read_chunks(folder / CHUNKS))  # walked several times: parsed once
    n_real = len(chunks)
    rng = np.random.default_rng(seed)
    timings: dict[str, float] = {}
    t = time.perf_counter()
    sources = np.concatenate([np.arange(min(size, n_real)), rng.integers(0, n_real, max(0, size - n_real))])
    texts_real = [c.text for c in chunks]
    grown = []
    for i, s in enumerate(sources.tolist()):
        c = chunks[s]
        if i < n_real:
            grown.append(c)
            continue
        own = _sentences(texts_real[s])
        rng.shuffle(own)
        other = _sentences(texts_real[int(rng.integers(0, n_real))])
        text = " ".join(own + [other[int(rng.integers(0, len(other)))]])
        grown.append(Chunk(i, f"grown-{i}", c.title, text, 0, len(text)))
    timings["text"] = time.perf_counter() - t

    real_index = dense.load_index(folder, IndexSettings())
    vectors = real_index.reconstruct_n(0, n_real).astype(np.float32)
    dim = vectors.shape[1]
    grown_vectors = vectors[sources]
    if size > n_real:
        # Noise of norm sigma*sqrt(dim) on a unit vector: cosine ~ 1/sqrt(1 + sigma^2 dim) after re-normalising.
        sigma = np.sqrt((1 / NOISE_COSINE**2 - 1) / dim)
        extra = grown_vectors[n_real:] + rng.normal(0, sigma, (size - n_real, dim)).astype(np.float32)
        grown_vectors[n_real:] = extra / np.linalg.norm(extra, axis=1, keepdims=True)

    work.mkdir(parents=True, exist_ok=True)
    with IndexWriter.open(target) as writer:
        t = time.perf_counter()
        dense.save_index(dense.build_index(grown_vectors, manifest["dense"]), writer.folder)
        timings["dense"] = time.perf_counter() - t
        t = time.perf_counter()
        analyzer = LexicalAnalyzer(manifest["lexical"]["stemmer"])
        bm25 = manifest["lexical"]["bm25"]
        model, idf = sparse.build_bm25(analyzer.tokens_many([passage_text(c) for c in grown]), bm25["k1"],
                                       bm25["b"])
        sparse.save_bm25(model, idf, writer.folder)
        write_chunks(writer.folder / CHUNKS, grown)
        timings["bm25"] = time.perf_counter() - t
        t = time.perf_counter()
        rerank = _grow_tokens(folder, manifest["rerank"], sources, n_real, writer.folder, rng)
        timings["rerank_tokens"] = time.perf_counter() - t
        if token_dtype != "int8":
            t = time.perf_counter()
            rerank = _product_code(writer.folder, rerank, token_dtype)
            timings["rerank_codes"] = time.perf_counter() - t
        grown_manifest = {**{k: v for k, v in manifest.items() if k not in ("generation", "format_version")},
                          "graph": None, "rerank": rerank, "fingerprint": f"grown-{size}",
                          "corpus": {**manifest["corpus"], "name": f"{manifest['corpus']['name']}-grown-{size}"},
                          "counts": {"documents": size, "chunks": size, "vocabulary": len(idf)}}
        (target / "build.json").write_text(json.dumps(timings))  # before the corpus is published: reuse finds both
        writer.publish(grown_manifest)
    return target, timings


def _grow_tokens(folder: Path, block: dict, sources: np.ndarray, n_real: int, out: Path, rng) -> dict:
    """The grown chunks' int8 token vectors: each source's rows (dequantised) plus noise, re-quantised per token."""
    from rag.rerank.store import OFFSETS, SCALES, TOKENS, quantize_int8

    codes = np.load(folder / TOKENS, mmap_mode="r")
    scales = np.load(folder / SCALES)
    offsets = np.load(folder / OFFSETS)
    lengths = (offsets[1:] - offsets[:-1])[sources]
    new_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    total = int(new_offsets[-1])
    tokens = np.lib.format.open_memmap(out / TOKENS, mode="w+", dtype=np.int8, shape=(total, codes.shape[1]))
    new_scales = np.empty(total, np.float32)
    block_chunks = 2048
    for begin in range(0, len(sources), block_chunks):
        ids = sources[begin:begin + block_chunks]
        rows = np.concatenate([np.arange(offsets[s], offsets[s + 1]) for s in ids])
        at, end = int(new_offsets[begin]), int(new_offsets[min(begin + block_chunks, len(sources))])
        if begin + block_chunks <= n_real:
            tokens[at:end], new_scales[at:end] = codes[rows], scales[rows]
            continue
        vectors = codes[rows].astype(np.float32) * scales[rows, None]
        vectors += rng.normal(0, 0.02, vectors.shape).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        first_grown = max(0, n_real - begin)  # rows of real chunks in this block keep their codes
        real_rows = int(lengths[begin:begin + first_grown].sum())
        q, s = quantize_int8(vectors[real_rows:])
        tokens[at + real_rows:end], new_scales[at + real_rows:end] = q, s
        tokens[at:at + real_rows], new_scales[at:at + real_rows] = codes[rows[:real_rows]], scales[rows[:real_rows]]
    tokens.flush()
    del tokens
    np.save(out / SCALES, new_scales)
    np.save(out / OFFSETS, new_offsets)
    files = [TOKENS, OFFSETS, SCALES]
    return {**block, "tokens": total, "chunks": len(sources), "files": files,
            "bytes": sum((out / f).stat().st_size for f in files)}


def _product_code(folder: Path, block: dict, dtype: str, block_rows: int = 1 << 20) -> dict:
    """The generation's int8 token vectors replaced by product codes (``rag.rerank.store``), as an ingest with
    ``rerank.token_dtype`` ``dtype`` would have written them."""
    from rag.rerank.store import CODEBOOK, OFFSETS, ROTATION, SCALES, TOKENS, learn_product, product_bytes

    codes = np.load(folder / TOKENS, mmap_mode="r")
    scales = np.load(folder / SCALES, mmap_mode="r")
    pieces = product_bytes(dtype)
    product = learn_product(codes, scales, pieces)
    coded = np.lib.format.open_memmap(folder / f"{TOKENS}.coding", "w+", np.uint8, (len(codes), pieces))
    for begin in range(0, len(codes), block_rows):  # a block at a time: the int8 vectors may exceed memory
        end = begin + block_rows
        coded[begin:end] = product.encode_int8(codes[begin:end], scales[begin:end])
    coded.flush()
    del coded, codes, scales
    os.replace(folder / f"{TOKENS}.coding", folder / TOKENS)
    (folder / SCALES).unlink()
    np.save(folder / CODEBOOK, product.codebook)
    np.save(folder / ROTATION, product.rotation)
    files = [TOKENS, OFFSETS, CODEBOOK, ROTATION]
    return {**block, "dtype": dtype, "files": files, "bytes": sum((folder / f).stat().st_size for f in files)}


# -- measuring one size --------------------------------------------------------------------------------
def disk_by_part(index: Path) -> dict:
    """Bytes on disk of the served generation's parts (the token vectors: the files its manifest lists)."""
    from rag.index.dense import DENSE_FILE
    from rag.index.sparse import BM25_DIR, IDF_FILE
    from rag.index.store import CHUNKS, read_manifest, resolve_generation

    folder = resolve_generation(index)
    parts = {"dense": [DENSE_FILE], "bm25": [BM25_DIR, IDF_FILE], "chunks": [CHUNKS],
             "rerank_tokens": read_manifest(index)["rerank"]["files"]}

    def size(path: Path) -> int:
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size

    return {part: sum(size(folder / name) for name in names) for part, names in parts.items()}


class _Client:
    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=60)

    def query(self, text: str) -> dict:
        try:
            self.conn.request("POST", "/v1/query", body=json.dumps({"query": text}),
                              headers={"content-type": "application/json"})
            response = self.conn.getresponse()
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            self.conn.close()  # the server closed a keep-alive connection left idle: once more on a new one
            self.conn.request("POST", "/v1/query", body=json.dumps({"query": text}),
                              headers={"content-type": "application/json"})
            response = self.conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"/v1/query answered {response.status}: {body[:200]!r}")
        return json.loads(body)

    def get(self, path: str) -> dict:
        self.conn.request("GET", path)
        return json.loads(self.conn.getresponse().read())


def measure(index: Path, queries: list[str], args) -> dict:
    from loadgen.cpu import cpu_seconds
    from rag.index.store import read_manifest
    from stack.servers import ServeProcess

    env = {**os.environ, "RAGHEAT_GRAPH__ENABLED": "false", "RAGHEAT_SERVER__RELOAD_POLL_S": "0.2",
           "RAGHEAT_TELEMETRY__OTLP": "off"}
    started = time.perf_counter()
    with ServeProcess(index, env=env, ready_timeout_s=900) as service:
        startup_s = time.perf_counter() - started
        rss = resident_bytes(service.pid)
        client = _Client(service.url)
        for text in queries[:20]:
            client.query(text)
        e2e, stages = [], {}
        for _ in range(args.rounds):
            for text in queries[:args.requests]:
                t = time.perf_counter()
                body = client.query(text)
                e2e.append(time.perf_counter() - t)
                for stage in body["stages"]:
                    stages.setdefault(stage["name"], []).append(stage["ms"] / 1000)
        rounds = []
        for _ in range(args.rounds):
            cpu0, counts, stop = cpu_seconds(service.pid), [0] * args.clients, time.monotonic() + args.round_s

            def load(k: int) -> None:
                own, i = _Client(service.url), k
                while time.monotonic() < stop:
                    own.query(queries[i % len(queries)])
                    counts[k] += 1  # one counter per thread: no update is lost
                    i += args.clients

            t = time.perf_counter()
            threads = [threading.Thread(target=load, args=(k,)) for k in range(args.clients)]
            [th.start() for th in threads]
            [th.join() for th in threads]
            wall = time.perf_counter() - t
            rounds.append({"answers_per_s": sum(counts) / wall,
                           "cpu_ms_per_answer": 1000 * (cpu_seconds(service.pid) - cpu0) / sum(counts)})
        knee = _knee(service.url, queries, args)
        time.sleep(3.0)  # what the last step left queued drains before the swap is timed
        swap = _hot_swap(index, service, _Client(service.url), queries)
        rss_after = resident_bytes(service.pid)
    manifest = read_manifest(index)
    return {"chunks": manifest["counts"]["chunks"], "tokens": manifest["rerank"]["tokens"],
            "vocabulary": manifest["counts"]["vocabulary"], "disk_bytes": disk_by_part(index),
            "startup_s": startup_s, "rss_bytes": rss, "rss_after_swap_bytes": rss_after,
            "e2e_ms": p50_p99(e2e), "stage_ms": {name: p50_p99(values) for name, values in stages.items()},
            "closed_loop": {"clients": args.clients, "round_s": args.round_s, "rounds": rounds,
                            "answers_per_s": statistics.median(r["answers_per_s"] for r in rounds),
                            "cpu_ms_per_answer": statistics.median(r["cpu_ms_per_answer"] for r in rounds)},
            "knee": knee, "hot_swap": swap}


def _knee(url: str, queries: list[str], args) -> dict:
    """Open-loop steps at ``args.rates``, ascending, until one misses the SLO; the knee (``loadgen.stats.find_knee``)
    and every step's P99, errors and refusals."""
    from loadgen.runner import open_loop, run as run_step
    from loadgen.stats import find_knee
    from rag.slo import SLO_MS

    steps, rows = [], []
    for i, rate in enumerate(args.rates):
        steps.append(run_step(open_loop(url + "/v1/query", queries, rate, args.step_s, args.warmup_s,
                                        seed=args.seed + i, slo_ms=SLO_MS)))
        step = steps[-1]
        rows.append({"offered_qps": rate, "p99_ms": step.latency_ms.get("p99"), "error_rate": step.error_rate,
                     "shed_rate": step.shed_rate})
        if find_knee(steps, SLO_MS, MAX_ERROR_RATE) != rate:
            break
        time.sleep(1.0)  # the queue drains between steps
    return {"steps": rows, "knee_qps": find_knee(steps, SLO_MS, MAX_ERROR_RATE), "step_s": args.step_s,
            "slo_ms": SLO_MS, "max_error_rate": MAX_ERROR_RATE}


def link_generation(source: Path, index: Path) -> str:
    """Publish the generation ``source`` points at into the index folder ``index`` as a new generation whose files
    are hard links to its own (no build cost); returns the new generation's name."""
    from rag.index.store import MANIFEST, IndexWriter, link_files, read_manifest, resolve_generation

    served = resolve_generation(source)
    manifest = {k: v for k, v in read_manifest(source).items() if k not in ("generation", "format_version")}
    with IndexWriter.open(index) as writer:
        link_files(served, writer.folder, skip={MANIFEST})
        writer.publish(manifest)
        return writer.generation


def _hot_swap(index: Path, service, client: _Client, queries: list[str]) -> dict:
    """Publish the served generation again (``link_generation``); the time until the service serves it and every
    request's latency meanwhile."""
    published = time.perf_counter()
    new = link_generation(index, index)
    during, i = [], 0
    deadline = published + 600
    while time.perf_counter() < deadline:
        t = time.perf_counter()
        client.query(queries[i % len(queries)])
        during.append(time.perf_counter() - t)
        i += 1
        if client.get("/readyz").get("generation") == new:
            break
    else:
        raise RuntimeError(f"the service did not swap to {new} within 600 s")
    return {"swap_s": time.perf_counter() - published, "requests_during": len(during),
            "slowest_ms": 1000 * max(during), "median_ms": 1000 * statistics.median(during)}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if SMOKE:
        args.requests, args.rounds, args.round_s, args.rates, args.step_s, args.warmup_s = 20, 1, 1.0, [20.0], 1.0, 0.5
    from rag.index.store import read_manifest

    queries = [json.loads(line)["text"] for line in args.queries.open()]
    run = BenchmarkRun("growth")
    sizes = {}
    for spec in [s.strip() for s in args.sizes.split(",") if s.strip()]:
        if spec == "real":  # served from a folder of its own: the hot swap publishes into the folder it measures
            index, build = args.work / "real", None
            if index.exists():
                shutil.rmtree(index)
            link_generation(args.index, index)
        else:
            size, _, token_dtype = spec.partition(":")
            print(f"growing {args.index} to {int(size):,} chunks in {args.work}", flush=True)
            index, build = grow(args.index, int(size), args.work, args.seed, token_dtype or "int8")
        print(f"measuring {index}", flush=True)
        result = measure(index, queries, args)
        result["built_s"] = build
        result["grown"] = spec != "real"
        result["token_dtype"] = read_manifest(index)["rerank"]["dtype"]
        sizes[spec if spec != "real" else str(result["chunks"])] = result
        print(f"  {result['chunks']:,} chunks: start-up {result['startup_s']:.1f} s, RSS "
              f"{result['rss_bytes'] / 2**30:.2f} GiB, c=1 P50 {result['e2e_ms']['p50']:.2f} ms, "
              f"{result['closed_loop']['answers_per_s']:.0f} answers/s, knee {result['knee']['knee_qps']} req/s, swap "
              f"{result['hot_swap']['swap_s']:.1f} s (the slowest request meanwhile "
              f"{result['hot_swap']['slowest_ms']:.0f} ms)",
              flush=True)
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    run.write({"sizes": sizes, "noise_cosine": NOISE_COSINE, "real_index": str(args.index), "memory_gib": memory_gib},
              args.results_file)
    print(f"wrote {args.results_file}")


if __name__ == "__main__":
    main()
