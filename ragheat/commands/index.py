"""``ragheat ingest``, ``ragheat eval`` and ``ragheat train-router``: build an index, score retrieval on a BEIR
split, and retrain the query router from BEIR training splits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ragheat.clikit import fail as _fail, guard, load_settings, out, progress_bar

_guard = guard()


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
    timings = m["timings_s"]
    parts = [f"embed {timings['embed']:.1f} s" if "embed" in timings else "chunks and embeddings reused"]
    if m.get("graph"):
        counts = m["graph"]["counts"]
        parts.append(f"graph {timings['graph']:.1f} s: {counts['entities']} entities, {counts['mentions']} mentions, "
                     f"{counts['co_occurs']} co-occurrences")
    out.print(f"[green]indexed[/] {m['counts']['documents']} documents as {m['counts']['chunks']} chunks "
              f"into {report.generation} in {timings['total']:.1f} s ({'; '.join(parts)})")


@_guard
def evaluate(
    beir: Path = typer.Option(..., "--beir", help="BEIR folder: corpus.jsonl, queries.jsonl, qrels/<split>.tsv"),
    index: Optional[Path] = typer.Option(None, "--index", help="index of that corpus (built if absent)"),
    split: str = typer.Option("train", help="qrels split"),
    retrievers: str = typer.Option("dense,bm25,hybrid", help="comma list of dense, bm25, graph, hybrid (= dense+bm25), "
                                                             "any +-joined combination (hybrid+graph), routed; "
                                                             "+rerank after any of them (hybrid+rerank)"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the report here"),
    results_file: Optional[Path] = typer.Option(None, "--results-file", help="also write the report as a benchmark "
                                                "results file (command, commit, machine; benchmarks/README.md)"),
) -> None:
    """Retrieval quality (nDCG@10, recall@10/100, MRR@10) and latency on a BEIR split."""
    from loadgen.resultsfile import BenchmarkRun
    from rag.eval.beir import load_qrels, load_queries
    from rag.eval.runner import evaluate as run_eval, parse_retriever_sets, split_rerank
    from rag.ingest.pipeline import ingest as run_ingest
    from rich.table import Table

    from rag.pipeline import RagPipeline

    run_record = BenchmarkRun(results_file.stem) if results_file else None

    try:
        sets = parse_retriever_sets(retrievers)
    except ValueError as exc:
        _fail(str(exc))
    settings = load_settings()
    if any("graph" in names for names in sets.values()) and not settings.graph.enabled:
        _fail("--retrievers names graph, but graph.enabled is off (RAGHEAT_GRAPH__ENABLED)")
    index = index or Path("data/index") / beir.resolve().name
    queries, qrels = load_queries(beir), load_qrels(beir, split)
    with progress_bar() as progress:
        run_ingest(str(beir), index, settings, progress=progress)  # no-op when up to date
        pipeline = RagPipeline(settings, index)
        pipeline.warm_up()
        try:
            for names in sets.values():
                if (problem := pipeline.check_retrievers(split_rerank(names)[0])) is not None:
                    _fail(f"--retrievers {'+'.join(names)}: {problem}")
            report = run_eval(pipeline, queries, qrels, sets, progress=progress)
        finally:
            pipeline.close()
    manifest = pipeline.index.manifest
    report.update({"beir": str(beir), "split": split, "index": manifest["dense"], "model": manifest["model"],
                   "chunking": manifest["chunking"], "counts": manifest["counts"], "lexical": manifest.get("lexical"),
                   "search": settings.index.model_dump(include={"hnsw_ef_search", "ivf_nprobe"}),
                   "fusion": {**settings.retrieval.model_dump(include={"rrf_k", "dense_weight", "bm25_weight",
                                                                       "candidates"}),
                              "graph_weight": settings.graph.weight},
                   "graph": None if not manifest.get("graph") else {
                       "counts": manifest["graph"]["counts"],
                       "query": settings.graph.model_dump(include={"hops", "top_n", "decay", "execution",
                                                                   "link_by_embedding"})},
                   "router": getattr(getattr(pipeline.router, "model", None), "metadata", {}).get("trained")})
    table = Table(title=f"{beir.name} ({split}, {report['queries']} queries)")
    for column in ("retrievers", "nDCG@10", "R@10", "R@100", "MRR@10", "retr/q", "p50 ms", "p99 ms"):
        table.add_column(column, justify="right")
    for name, m in report["retrievers"].items():
        table.add_row(name, *(f"{m[k]:.4f}" for k in ("ndcg@10", "recall@10", "recall@100", "mrr@10")),
                      f"{m['retrievers_per_query']:.2f}", f"{m['latency_ms']['p50']:.2f}",
                      f"{m['latency_ms']['p99']:.2f}")
    out.print(table)
    for name, m in report["retrievers"].items():
        if name == "routed" or len(m["routes"]) > 1:
            out.print(f"{name} routes: " + ", ".join(f"{r} {share:.1%}" for r, share in m["routes"].items()))
        if m["skipped"]:
            if m.get("graph_skipped"):
                out.print(f"[yellow]{name}: the graph stage was skipped for {m['graph_skipped']} queries (store "
                          f"unavailable)[/]")
            if m.get("hyde_skipped"):
                out.print(f"[yellow]{name}: hyde was skipped for {m['hyde_skipped']} queries (the model was slow, down "
                          f"or wrote nothing usable: dense ran on the question alone)[/]")
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(report, indent=2, sort_keys=True))
        out.print(f"wrote {json_out}")
    if run_record is not None:
        out.print(f"wrote {run_record.write(report, results_file)}")


@_guard
def train_router(
    beir: str = typer.Option(..., "--beir", help="BEIR folders with training splits, comma-separated"),
    split: str = typer.Option("train", help="qrels split per folder (comma-separated), or one for all"),
    index: Optional[str] = typer.Option(None, "--index", help="their indexes, comma-separated (built if absent; "
                                                             "default data/index/<folder name>)"),
    out_path: Optional[Path] = typer.Option(None, "--out", help="where to write the model (default: the one "
                                                                "shipped in rag/routing/router.npz)"),
    repeats: int = typer.Option(5, min=1, max=50, help="nested cross-validation repeats (seeds) for the report"),
    seed: int = typer.Option(0, help="seed of the cross-validation folds (training itself is deterministic)"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the training report here"),
) -> None:
    """Retrain the query router from per-query outcomes of every route on BEIR training splits."""
    import sys

    from rag.eval.beir import load_qrels, load_queries
    from rag.ingest.pipeline import ingest as run_ingest
    from rag.pipeline import RagPipeline
    from rag.routing.router import SHIPPED_MODEL
    from rag.routing.train import collect_outcomes, train_router as fit

    folders = [Path(p) for p in beir.split(",") if p.strip()]
    splits = [s.strip() for s in split.split(",")]
    if len(splits) == 1:
        splits *= len(folders)
    indexes = [Path(p) for p in index.split(",")] if index else [Path("data/index") / f.resolve().name for f in folders]
    if len(splits) != len(folders) or len(indexes) != len(folders):
        _fail(f"--split and --index take one value per --beir folder ({len(folders)}), or one --split for all")
    settings = load_settings()
    if not settings.graph.enabled:
        _fail("the router chooses between routes with and without the graph: graph.enabled must be on")
    data = [(folder, sp, load_queries(folder), load_qrels(folder, sp), idx)
            for folder, sp, idx in zip(folders, splits, indexes)]
    tables, datasets = [], []
    with progress_bar() as progress:
        for folder, sp, queries, qrels, idx in data:
            run_ingest(str(folder), idx, settings, progress=progress)  # no-op when up to date
            pipeline = RagPipeline(settings, idx)
            pipeline.warm_up()
            try:
                task = progress.add_task(f"outcomes {folder.name}", total=sum(1 for q in queries if q in qrels))
                tables.append(collect_outcomes(pipeline, folder.name, queries, qrels,
                                               advance=lambda: progress.advance(task)))
            finally:
                pipeline.close()
            manifest = pipeline.index.manifest
            datasets.append({"beir": str(folder), "split": sp, "queries": len(tables[-1].qids),
                             "corpus_sha256": manifest["corpus"]["content_sha256"],
                             "index_fingerprint": manifest["fingerprint"]})
        model, report = fit(tables, repeats=repeats, seed=seed, progress=lambda message: out.print(message))
    report["datasets_used"] = datasets
    model.metadata = {"trained": {"command": " ".join(["ragheat", *sys.argv[1:]]), "datasets": datasets,
                                  "seed": seed, "l2": report["l2"], "repeats": repeats},
                      "report": report}
    target = out_path or SHIPPED_MODEL
    model.save(target)
    for name, d in report["datasets"].items():
        cv, best = d["router_nested_cv"], max(d["fixed"].items(), key=lambda kv: kv[1]["ndcg@10"])
        out.print(f"{name}: router (nested CV) nDCG@10 {cv['ndcg@10']:.4f} ±{cv['ndcg@10_std_over_repeats']:.4f}, "
                  f"{cv['retrievers_per_query']:.2f} retrievers/query; best fixed {best[0]} {best[1]['ndcg@10']:.4f}; "
                  f"graph-if-linked {d['graph_if_linked']['ndcg@10']:.4f}")
    out.print(f"[green]wrote[/] {target} (l2 {report['l2']})")
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(report, indent=2, sort_keys=True))
        out.print(f"wrote {json_out}")


@_guard
def train_reranker(
    beir: Path = typer.Option(..., "--beir", help="BEIR folder with a training split"),
    split: str = typer.Option("train", help="qrels split"),
    out_path: Optional[Path] = typer.Option(None, "--out", help="where to write the head (default: the shipped one, "
                                                                "rag/rerank/heads/)"),
    index: Optional[Path] = typer.Option(None, "--index", help="index of that corpus, read as it is (built only if "
                                                               "absent; default data/index/<folder name>)"),
    candidates: int = typer.Option(50, min=2, max=1000, help="fused candidates per query (the hard negatives)"),
    epochs: int = typer.Option(6, min=1, max=100, help="passes over the training queries"),
    distill: float = typer.Option(0.1, min=0.0, max=1.0, help="share of the target given to the fused scores"),
    seed: int = typer.Option(0, help="seed of the initialisation, the query order and the folds"),
    folds: int = typer.Option(0, "--cv", min=0, max=20, help="also report k-fold cross-validation (0 = off)"),
    max_queries: int = typer.Option(0, min=0, help="use only the first N judged queries (0 = all; for smoke runs)"),
    token_cache: Optional[Path] = typer.Option(None, "--token-cache", help="folder caching the candidates' raw "
                                               "token states between runs (written if absent)"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the training report here"),
) -> None:
    """Train the late-interaction reranker's head (torch) on a BEIR split, with hard negatives from hybrid retrieval."""
    import sys

    from rag.errors import IndexLoadError
    from rag.eval.beir import load_qrels, load_queries
    from rag.index.store import resolve_generation
    from rag.ingest.pipeline import ingest as run_ingest, passage_text
    from rag.pipeline import RagPipeline
    from rag.rerank.head import DEFAULT_HEAD
    from rag.rerank.train import RawTokens, collect_examples, cross_validate, fit_head, ndcg_table, score_examples

    try:
        import torch  # noqa: F401  (training only; serving never imports it)
    except ImportError:
        _fail("train-reranker needs torch: install the test extra (pip install -e '.[test]')")
    settings = load_settings()
    index = index or Path("data/index") / beir.resolve().name
    queries, qrels = load_queries(beir), load_qrels(beir, split)
    if max_queries:
        queries = dict(list((q, t) for q, t in queries.items() if q in qrels)[:max_queries])
    with progress_bar() as progress:
        try:
            resolve_generation(index)
        except IndexLoadError:  # an existing index is trained on as it is: its fingerprint goes into the head
            run_ingest(str(beir), index, settings, progress=progress)
        pipeline = RagPipeline(settings, index)
        pipeline.warm_up()
        try:
            task = progress.add_task("first stage", total=sum(1 for q in queries if q in qrels))
            examples = collect_examples(pipeline, queries, qrels, candidates,
                                        advance=lambda: progress.advance(task))
            chunks = pipeline.index.chunks
            raw = RawTokens.load(token_cache, len(chunks)) if token_cache else None
            needed = {int(i) for ex in examples for i in ex.ids}
            if raw is None or _cache_lacks(raw, needed):
                task = progress.add_task("token states", total=len(needed))
                raw = RawTokens.encode(pipeline.embedder, [passage_text(c) for c in chunks], needed,
                                       progress=lambda n: progress.advance(task, n))
                if token_cache:
                    raw.save(token_cache)
        finally:
            pipeline.close()
    if not any(ex.labels.max() > 0 for ex in examples):
        _fail(f"no judged query of {beir} ({split}) has a relevant document among its {candidates} candidates")
    fit = {"epochs": epochs, "distill": distill}
    report: dict = {"beir": str(beir), "split": split, "queries": len(examples), "candidates": candidates,
                    "command": " ".join(["ragheat", *sys.argv[1:]])}
    if folds:
        report["cv"] = cross_validate(examples, raw, qrels, folds=folds, seed=seed, log=out.print, **fit)
    head = fit_head(examples, raw, seed=seed, log=out.print, **fit)
    manifest = pipeline.index.manifest
    trained_on = {"beir": str(beir), "split": split, "queries": len(examples),
                  "corpus_sha256": manifest["corpus"]["content_sha256"], "index_fingerprint": manifest["fingerprint"]}
    train_ndcg = {"hybrid": float(ndcg_table(examples, qrels).mean()),
                  "rerank": float(ndcg_table(examples, qrels, score_examples(head, examples, raw)).mean())}
    report["train_ndcg@10"] = train_ndcg
    meta = {**head.meta, "command": " ".join(["ragheat", *sys.argv[1:]]), "data": trained_on,
            "candidates": candidates, "train_ndcg@10": train_ndcg}
    if folds:
        meta["cv"] = report["cv"]["summary"]
    target = type(head)(head.projection, head.weights, head.bias, head.mean, head.std, meta).save(
        out_path or DEFAULT_HEAD)
    if folds:
        cv = report["cv"]["summary"]
        out.print(f"{folds}-fold CV nDCG@10: hybrid {cv['hybrid']:.4f} -> rerank {cv['rerank']:.4f} "
                  f"±{cv['rerank_std']:.4f} (smallest gain {cv['gain_min']:+.4f})")
    out.print(f"[green]wrote[/] {target} and its ONNX export {target.with_suffix('.onnx').name} (training queries: "
              f"hybrid {train_ndcg['hybrid']:.4f} -> rerank "
              f"{train_ndcg['rerank']:.4f}); indexes re-ingest to store token vectors for a new head")
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(report, indent=2, sort_keys=True))
        out.print(f"wrote {json_out}")


def _cache_lacks(raw, needed: set[int]) -> bool:
    """Whether a token cache lacks any needed chunk."""
    return any(raw.offsets[i + 1] <= raw.offsets[i] for i in needed)
