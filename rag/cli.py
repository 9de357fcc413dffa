"""The ``ragheat`` command: ingest, serve, query, eval, demo.

Flags override settings from the environment (``RAGHEAT_<SECTION>__<FIELD>``), which override defaults.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Optional

import typer
from pydantic import ValidationError
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from rag.clikit import console, fail as _fail, guard, out
from rag.settings import RagheatSettings

app = typer.Typer(help="ragheat: observability-first RAG on embedded defaults.", no_args_is_help=True,
                  pretty_exceptions_enable=False)


def load_settings(**overrides: dict) -> RagheatSettings:
    """Environment settings with the given section overrides; a bad value exits with the setting's name."""
    try:
        base = RagheatSettings()
        update = {}
        for section, values in overrides.items():
            values = {k: v for k, v in values.items() if v is not None}
            if values:
                update[section] = getattr(base, section).model_copy(update=values).model_dump()
        return RagheatSettings(**{**base.model_dump(), **update}) if update else base
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "settings"
        _fail(f"invalid setting {where}: {first['msg'].removeprefix('Value error, ')}")


def progress_bar() -> Progress:
    return Progress(TextColumn("{task.description:<22}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("eta"), TimeRemainingColumn(), console=console, transient=False)


_guard = guard()


@app.command()
@_guard
def ingest(
    source: str = typer.Argument(..., help="BEIR folder (corpus.jsonl), folder of .txt/.md files, or 'wiki'"),
    index: Path = typer.Option(Path("data/index"), "--index", help="index folder to create or update"),
    chunker: Optional[str] = typer.Option(None, help="tokens | semantic"),
    window: Optional[int] = typer.Option(None, help="token-window size (word pieces)"),
    overlap: Optional[int] = typer.Option(None, help="tokens shared by consecutive windows"),
    index_kind: Optional[str] = typer.Option(None, "--index-kind", help="flat | hnsw | ivfpq"),
    hnsw_m: Optional[int] = typer.Option(None, help="HNSW M"),
    ef_construction: Optional[int] = typer.Option(None, help="HNSW efConstruction"),
    nlist: Optional[int] = typer.Option(None, help="IVF lists (0 = automatic)"),
    pq_m: Optional[int] = typer.Option(None, help="PQ sub-quantisers"),
    precision: Optional[str] = typer.Option(None, help="fp32 | int8 (embedding model)"),
    force: bool = typer.Option(False, help="rebuild even if the index is up to date"),
) -> None:
    """Chunk, embed and index SOURCE into a new generation of INDEX, swapped in atomically."""
    from rag.ingest.pipeline import ingest as run_ingest

    settings = load_settings(
        chunking={"strategy": chunker, "window_tokens": window, "overlap_tokens": overlap},
        index={"kind": index_kind, "hnsw_m": hnsw_m, "hnsw_ef_construction": ef_construction,
               "ivf_nlist": nlist, "pq_m": pq_m},
        embedding={"precision": precision})
    with progress_bar() as progress:
        report = run_ingest(source, index, settings, force=force, progress=progress)
    m = report.manifest
    if report.skipped:
        out.print(f"[green]{index}[/] is up to date (generation {m['generation']}); use --force to rebuild")
        return
    out.print(f"[green]indexed[/] {m['counts']['documents']} documents as {m['counts']['chunks']} chunks "
              f"into {report.generation} in {m['timings_s']['total']:.1f} s "
              f"(embed {m['timings_s']['embed']:.1f} s)")


@app.command()
@_guard
def serve(
    index: Optional[Path] = typer.Option(None, "--index", help="index folder (default server.index_dir)"),
    host: Optional[str] = typer.Option(None, help="bind address"),
    port: Optional[int] = typer.Option(None, help="port"),
    log_level: str = typer.Option("info", help="uvicorn log level"),
    prometheus: bool = typer.Option(False, "--prometheus", help="also start a local Prometheus scraping this server"),
    telemetry_on: bool = typer.Option(True, "--telemetry/--no-telemetry", help="metrics, traces and OTLP export"),
    generator: Optional[str] = typer.Option(None, help="extractive | openai | vllm (see docs/vllm.md)"),
    llm_url: Optional[str] = typer.Option(None, "--llm-url", help="openai: the server's /v1 URL"),
    llm_model: Optional[str] = typer.Option(None, "--llm-model", help="openai: served model; vllm: model folder"),
    probes_on: bool = typer.Option(False, "--probes", help="also run the eBPF kernel probes in this process, "
                                                           "exported at /metrics (needs root or CAP_BPF+CAP_PERFMON)"),
) -> None:
    """Serve the HTTP API (OpenAPI docs at /docs, metrics at /metrics)."""
    import contextlib
    import signal

    import uvicorn

    from rag.api.app import create_app
    from rag.pipeline import RagPipeline

    settings = load_settings(server={"host": host, "port": port, "index_dir": index},
                             generation={"generator": generator, "base_url": llm_url, "model": llm_model})
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    pipeline = RagPipeline(settings, settings.server.index_dir)
    pipeline.warm_up()  # a missing or corrupt index stops here, with its path, before anything binds
    app = create_app(settings, pipeline=pipeline)
    telemetry = None
    if telemetry_on:
        from telemetry import build_telemetry
        from telemetry.asgi import instrument_app

        telemetry = build_telemetry(settings, pipeline)
        instrument_app(app, telemetry)
    with contextlib.ExitStack() as stack:
        if prometheus:
            if telemetry is None or not settings.telemetry.metrics:
                _fail("--prometheus needs metrics: drop --no-telemetry and keep telemetry.metrics on")
            if settings.server.port == 0:
                _fail("--prometheus needs a fixed --port to scrape")
            from telemetry.prometheus_server import LocalPrometheus

            scrape_host = "127.0.0.1" if settings.server.host in ("0.0.0.0", "::") else settings.server.host
            url = stack.enter_context(LocalPrometheus(f"{scrape_host}:{settings.server.port}"))
            out.print(f"prometheus: {url}  (scraping http://{scrape_host}:{settings.server.port}/metrics, "
                      "exemplar storage on)")
        if probes_on:
            if telemetry is None or not settings.telemetry.metrics:
                _fail("--probes needs metrics: drop --no-telemetry and keep telemetry.metrics on")
            from probes.inprocess import start as start_probes

            # Never fails the service: without privileges it logs what is missing and serves without them.
            stack.enter_context(start_probes(settings, telemetry.registry))
        # uvicorn re-raises SIGTERM after its graceful shutdown; exiting through SystemExit lets the
        # ExitStack stop the local Prometheus and the telemetry exporters instead of dying mid-way.
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
        try:
            uvicorn.run(app, host=settings.server.host, port=settings.server.port, log_level=log_level)
        finally:
            if telemetry is not None:
                telemetry.shutdown()


@app.command()
@_guard
def query(
    text: str = typer.Argument(..., help="the question"),
    index: Optional[Path] = typer.Option(None, "--index", help="answer in-process from this index"),
    url: Optional[str] = typer.Option(None, help="ask a running server instead, e.g. http://127.0.0.1:8000"),
    top_k: int = typer.Option(5, min=1, max=100, help="sources to return"),
    retrievers: Optional[str] = typer.Option(None, help="dense, bm25 or dense,bm25 (hybrid)"),
    as_json: bool = typer.Option(False, "--json", help="print the raw response"),
) -> None:
    """Answer one question with citations and per-stage timings."""
    names = [r.strip() for r in retrievers.split(",")] if retrievers else None
    body = {"query": text, "top_k": top_k, **({"retrievers": names} if names else {})}
    if url:
        import httpx

        response = httpx.post(url.rstrip("/") + "/v1/query", json=body, timeout=60)
        if response.status_code != 200:
            _fail(f"{response.status_code}: {response.json().get('reason', response.text)}")
        data = response.json()
    else:
        from rag.api.schemas import QueryRequest, QueryResponse
        from rag.pipeline import RagPipeline

        settings = load_settings(server={"index_dir": index})
        try:
            request = QueryRequest(**body)
        except ValidationError as exc:
            _fail(exc.errors()[0]["msg"].removeprefix("Value error, "))
        pipeline = RagPipeline(settings, settings.server.index_dir)
        pipeline.warm_up()
        data = QueryResponse.from_result(pipeline.query(request.query, top_k, names)).model_dump()
    if as_json:
        out.print_json(json.dumps(data))
    else:
        print_answer(data)


def print_answer(data: dict) -> None:
    out.print(f"[bold]{data['answer']}[/]  [dim]({data['generator']})[/]")
    for c in data["citations"]:
        out.print(f"  [{c['number']}] {c['title']} [dim]({c['doc_id']} {c['chunk_start']}:{c['chunk_end']}, "
                  f"score {c['score']:.4f})[/]")
    out.print("  " + "  ".join(f"{s['name']} {s['ms']:.2f} ms" for s in data["stages"]), style="dim")


@app.command("eval")
@_guard
def evaluate(
    beir: Path = typer.Option(..., "--beir", help="BEIR folder: corpus.jsonl, queries.jsonl, qrels/<split>.tsv"),
    index: Optional[Path] = typer.Option(None, "--index", help="index of that corpus (built if absent)"),
    split: str = typer.Option("train", help="qrels split"),
    retrievers: str = typer.Option("dense,bm25,hybrid", help="comma list of dense, bm25, hybrid"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the report here"),
) -> None:
    """Retrieval quality (nDCG@10, recall@10/100, MRR@10) and latency on a BEIR split."""
    from rag.eval.beir import load_qrels, load_queries
    from rag.eval.runner import evaluate as run_eval, parse_retriever_sets
    from rag.ingest.pipeline import ingest as run_ingest
    from rag.pipeline import RagPipeline

    try:
        sets = parse_retriever_sets(retrievers)
    except ValueError as exc:
        _fail(str(exc))
    settings = load_settings()
    index = index or Path("data/index") / beir.resolve().name
    queries, qrels = load_queries(beir), load_qrels(beir, split)
    with progress_bar() as progress:
        run_ingest(str(beir), index, settings, progress=progress)  # no-op when up to date
        pipeline = RagPipeline(settings, index)
        pipeline.warm_up()
        report = run_eval(pipeline, queries, qrels, sets, progress=progress)
    report.update({"beir": str(beir), "split": split, "index": pipeline.index.manifest["dense"],
                   "model": pipeline.index.manifest["model"], "chunking": pipeline.index.manifest["chunking"],
                   "fusion": settings.retrieval.model_dump(include={"rrf_k", "dense_weight", "bm25_weight",
                                                                    "candidates"})})
    table = Table(title=f"{beir.name} ({split}, {report['queries']} queries)")
    for column in ("retrievers", "nDCG@10", "R@10", "R@100", "MRR@10", "p50 ms", "p99 ms"):
        table.add_column(column, justify="right")
    for name, m in report["retrievers"].items():
        table.add_row(name, *(f"{m[k]:.4f}" for k in ("ndcg@10", "recall@10", "recall@100", "mrr@10")),
                      f"{m['latency_ms']['p50']:.2f}", f"{m['latency_ms']['p99']:.2f}")
    out.print(table)
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(report, indent=2, sort_keys=True))
        out.print(f"wrote {json_out}")


@app.command()
@_guard
def bench(
    url: str = typer.Option(..., "--url", help="the service, e.g. http://127.0.0.1:8000"),
    rates: str = typer.Option("5,10,20,40", help="open loop: offered req/s, '5,10,20' or 'start:stop:step'"),
    mode: str = typer.Option("open", help="open (Poisson arrivals) | closed (N concurrent clients)"),
    concurrency: str = typer.Option("1,2,4,8", help="closed loop: client counts, comma list"),
    duration: float = typer.Option(10.0, min=0.1, help="measured seconds per step"),
    warmup: float = typer.Option(2.0, min=0.0, help="unmeasured seconds before each step"),
    queries: Optional[Path] = typer.Option(None, help="plain lines or a BEIR queries.jsonl (default: built-in)"),
    slo_ms: float = typer.Option(420.0, help="P99 objective used for the knee"),
    max_error_rate: float = typer.Option(0.001, help="error share allowed at the knee"),
    timeout: float = typer.Option(10.0, help="per-request timeout, seconds"),
    seed: int = typer.Option(0, help="seed for arrivals and query order"),
    out_dir: Path = typer.Option(Path("out/bench"), "--out", help="results.json, report.html and its PNGs go here"),
    prometheus_url: Optional[str] = typer.Option(None, "--prometheus", help="take per-stage percentiles from this "
                                                 "Prometheus (scraping the service) instead of the responses"),
) -> None:
    """Sweep load against a running service; report percentiles per step and the knee (max rate meeting the SLO)."""
    from loadgen.arrivals import parse_rates
    from loadgen.runner import DEFAULT_QUERIES, load_queries, shuffled
    from loadgen.sweep import results_table, run_sweep, write_results

    if mode not in ("open", "closed"):
        _fail(f"--mode must be open or closed, not {mode!r}")
    try:
        levels = parse_rates(rates) if mode == "open" else [float(int(c)) for c in concurrency.split(",") if c.strip()]
        texts = load_queries(queries) if queries else DEFAULT_QUERIES
    except (ValueError, OSError) as exc:
        _fail(str(exc))
    if mode == "closed" and (not levels or min(levels) < 1):
        _fail("--concurrency takes positive whole numbers, e.g. 1,2,4")
    with progress_bar() as progress:
        results = run_sweep(url, shuffled(texts, seed), mode=mode, levels=levels, duration_s=duration,
                            warmup_s=warmup, slo_ms=slo_ms, max_error_rate=max_error_rate, seed=seed,
                            timeout_s=timeout, progress=progress, prometheus_url=prometheus_url)
    path = write_results(results, out_dir)
    from loadgen.report import render_report

    report = render_report(path)
    out.print(results_table(results))
    knee = results["knee_qps"]
    if mode == "open":
        out.print(f"knee: {knee:g} req/s" if knee is not None else "knee: none of the offered rates met the SLO")
    out.print(f"wrote {path} and {report}" + ("  (interrupted: partial results)" if results["interrupted"] else ""))


@app.command("ann-bench")
@_guard
def ann_bench(
    beir: Path = typer.Option(..., "--beir", help="BEIR folder whose index provides the first vector set"),
    index: Optional[Path] = typer.Option(None, "--index", help="its index (built if absent; flat or hnsw)"),
    wiki: bool = typer.Option(True, "--wiki/--no-wiki", help="also the Wikipedia corpus in small chunks"),
    wiki_window: int = typer.Option(20, min=8, help="token window for the Wikipedia chunks (20 gives ~50k)"),
    holdout: int = typer.Option(1000, min=10, help="Wikipedia chunks held out as queries"),
    threads: str = typer.Option("1,2,4,8,16", help="concurrent searchers"),
    seconds: float = typer.Option(1.0, min=0.1, help="seconds per throughput measurement"),
    out_dir: Path = typer.Option(Path("out/ann-bench"), "--out", help="results.json and plots go here"),
) -> None:
    """Compare flat, HNSW (M 16/32/64, efSearch sweep) and IVF-PQ (nprobe sweep) on real embeddings."""
    import numpy as np

    from rag.eval.beir import load_queries
    from rag.index import annbench
    from rag.ingest.pipeline import ingest as run_ingest
    from rag.pipeline import RagPipeline

    try:
        thread_counts = [int(t) for t in threads.split(",") if t.strip()]
        if not thread_counts or min(thread_counts) < 1:
            raise ValueError
    except ValueError:
        _fail(f"--threads takes positive whole numbers, e.g. 1,2,4; got {threads!r}")
    settings = load_settings()
    index = index or Path("data/index") / beir.resolve().name
    with progress_bar() as progress:
        run_ingest(str(beir), index, settings, progress=progress)
    pipeline = RagPipeline(settings, index)
    pipeline.warm_up()
    faiss_index = pipeline.index.faiss_index
    if pipeline.index.manifest["dense"]["kind"] == "ivfpq":
        _fail(f"{index} is an ivfpq index, whose vectors are compressed; give a flat or hnsw index")
    datasets = {beir.resolve().name: (faiss_index.reconstruct_n(0, faiss_index.ntotal),
                                      np.stack([pipeline.embedder.embed_query(q).vector
                                                for q in load_queries(beir).values()]))}
    if wiki:
        datasets["wiki"] = _wiki_vectors(pipeline.embedder, wiki_window, holdout)
    out_dir.mkdir(parents=True, exist_ok=True)
    points = []
    for name, (base, queries) in datasets.items():
        out.print(f"[bold]{name}[/]: {len(base):,} vectors, {len(queries):,} queries")
        points += annbench.run_ann_bench(name, base, queries, threads=thread_counts, seconds=seconds,
                                         report=lambda line: out.print(line, highlight=False))
    (out_dir / "results.json").write_text(json.dumps([p.to_json() for p in points], indent=2))
    images = annbench.plot(points, out_dir)
    table = Table(title="ANN indexes: recall@10 vs exact, throughput and P99 by concurrent searchers")
    for column in ("data", "index", "search", "build s", "MB", "recall@10", *(f"QPS/P99 @{t}" for t in thread_counts)):
        table.add_column(column, justify="right")
    for p in points:
        if p.concurrency:
            table.add_row(p.dataset, p.index, p.search, f"{p.build_s:.1f}", f"{p.memory_mb:.1f}",
                          f"{p.recall_at_10:.4f}", *(f"{p.concurrency[str(t)]['qps']:.0f}/"
                                                     f"{p.concurrency[str(t)]['p99_ms']:.2f}" for t in thread_counts))
    out.print(table)
    out.print(f"wrote {out_dir / 'results.json'} and {', '.join(str(i) for i in images)}")


def _wiki_vectors(embedder, window: int, holdout: int):
    """Wikipedia summaries in ``window``-token chunks, embedded once and cached under data/annbench/."""
    import numpy as np

    from rag.ingest.chunking import TokenWindowChunker
    from rag.ingest.sources import load_wiki

    cache = Path("data/annbench") / f"wiki-w{window}-{embedder.files.precision}.npy"
    if cache.is_file():
        vectors = np.load(cache)
    else:
        docs = load_wiki().documents
        chunker = TokenWindowChunker(embedder.tokenizer, window, 0)
        texts = [d.text[a:b] for d, spans in zip(docs, chunker.split(docs)) for a, b in spans]
        with progress_bar() as progress:
            task = progress.add_task(f"embed wiki ({len(texts):,} chunks)", total=len(texts))
            vectors = embedder.embed_many(texts, progress=lambda n: progress.advance(task, n))
        cache.parent.mkdir(parents=True, exist_ok=True)
        np.save(cache, vectors)
    rng = np.random.default_rng(0)
    held = rng.choice(len(vectors), size=min(holdout, len(vectors) // 10), replace=False)
    keep = np.ones(len(vectors), dtype=bool)
    keep[held] = False
    return vectors[keep], vectors[held]


@app.command("tune-vllm")
@_guard
def tune_vllm(
    model: Path = typer.Option(..., "--model", help="model folder (config.json + tokenizer) for vLLM"),
    max_num_seqs: str = typer.Option("4,8,16", "--max-num-seqs", help="comma list"),
    max_model_len: str = typer.Option("1024,2048", "--max-model-len", help="comma list"),
    block_size: str = typer.Option("", "--block-size", help="comma list; empty = vLLM's default (CPU: multiples of 32)"),
    rate: float = typer.Option(2.0, min=0.01, help="offered requests per second, Poisson"),
    duration: float = typer.Option(30.0, min=0.5, help="seconds of load per cell"),
    prompt_tokens: int = typer.Option(256, min=1, help="prompt length of every request (random token ids)"),
    max_tokens: int = typer.Option(128, min=1, help="output tokens of every request (ignore_eos)"),
    slo_ttft_ms: float = typer.Option(1000.0, help="TTFT P99 objective"),
    slo_e2e_ms: float = typer.Option(10000.0, help="end-to-end P99 objective"),
    load_format: str = typer.Option("auto", help="vLLM --load-format; dummy = random weights (smoke runs)"),
    gpu: bool = typer.Option(False, "--gpu", help="GPU vLLM: no CPU environment settings, graphs allowed"),
    out_dir: Path = typer.Option(Path("out/tune-vllm"), "--out", help="results.json and heatmaps go here"),
) -> None:
    """Sweep vLLM's max_num_seqs x max_model_len (x block size) at a fixed offered rate; tokens/s, TTFT and
    E2E P99 per cell, as a table and a heatmap, with the cells that meet the SLO marked."""
    from rag.generation.vllm_server import vllm_python
    from rag.generation.vllm_tuning import run_tuning, write_results

    def numbers(flag: str, text: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            _fail(f"{flag} takes whole numbers separated by commas, got {text!r}")
        if any(v < 1 for v in values):
            _fail(f"{flag} takes positive numbers, got {text!r}")
        return values

    seqs, lens = numbers("--max-num-seqs", max_num_seqs), numbers("--max-model-len", max_model_len)
    blocks = numbers("--block-size", block_size) or [None]
    if not seqs or not lens:
        _fail("--max-num-seqs and --max-model-len need at least one value each")
    if not gpu and any(b % 32 for b in blocks if b):
        _fail(f"--block-size: vLLM on CPU needs a multiple of 32, got {block_size}")
    if not (model / "config.json").is_file():
        _fail(f"--model {model}: no config.json there (a Hugging Face model folder is needed)")
    if prompt_tokens + max_tokens > min(lens):
        out.print(f"[yellow]note:[/] prompt + output ({prompt_tokens + max_tokens} tokens) exceeds max_model_len "
                  f"{min(lens)}: those cells will reject every request")
    python = vllm_python()
    table = Table(title=f"vLLM tuning at {rate:g} req/s: {prompt_tokens} prompt + {max_tokens} output tokens")
    for column in ("block", "max_model_len", "max_num_seqs", "tok/s", "TTFT P99 ms", "E2E P99 ms", "errors", "SLO"):
        table.add_column(column, justify="right")

    def report(cell) -> None:
        row = (str(cell.block_size or "default"), str(cell.max_model_len), str(cell.max_num_seqs))
        if cell.failure:
            console.print(f"cell {row}: vLLM did not start: {cell.failure}")
            table.add_row(*row, "-", "-", "-", "-", "[red]failed[/]")
            return
        console.print(f"cell seqs={cell.max_num_seqs} len={cell.max_model_len} block={row[0]}: "
                      f"{cell.tokens_per_s:.1f} tok/s, TTFT P99 {cell.ttft_p99_ms or 0:.0f} ms")
        table.add_row(*row, f"{cell.tokens_per_s:.1f}", f"{cell.ttft_p99_ms or 0:.1f}", f"{cell.e2e_p99_ms or 0:.1f}",
                      f"{cell.errors}/{cell.requests}", "[green]meets[/]" if cell.meets_slo else "misses")

    results = run_tuning(model, max_num_seqs=seqs, max_model_len=lens, block_sizes=blocks, rate=rate,
                         duration_s=duration, prompt_tokens=prompt_tokens, max_tokens=max_tokens,
                         slo_ttft_ms=slo_ttft_ms, slo_e2e_ms=slo_e2e_ms, load_format=load_format,
                         python=python, cpu=not gpu, on_cell=report)
    paths = write_results(results, out_dir)
    out.print(table)
    out.print(f"wrote {', '.join(str(p) for p in paths)}")


@app.command()
@_guard
def demo(
    index: Path = typer.Option(Path("data/index/wiki"), "--index", help="where the demo index lives"),
    source: str = typer.Option("wiki", help="corpus to ingest when the index is absent"),
    port: int = typer.Option(0, help="port for the demo server (0 = any free port)"),
) -> None:
    """Ingest the demo corpus if absent, serve it, ask sample questions over HTTP, print stage timings."""
    from rag.demo import run_demo

    run_demo(load_settings(), index, source, port, console=out, progress=progress_bar)


# Sub-command groups owned by their packages; each module imports its heavy dependencies lazily.
from dashboards.cli import app as _dashboards_app  # noqa: E402
from probes.cli import probes as _probes_command  # noqa: E402
from stack.cli import app as _stack_app  # noqa: E402

app.add_typer(_dashboards_app, name="dashboards")
app.command("probes")(_probes_command)
app.add_typer(_stack_app, name="stack")


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
