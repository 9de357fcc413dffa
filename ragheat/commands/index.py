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
                                                             "any +-joined combination (hybrid+graph), routed"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the report here"),
    results_file: Optional[Path] = typer.Option(None, "--results-file", help="also write the report as a benchmark "
                                                "results file (command, commit, machine; benchmarks/README.md)"),
) -> None:
    """Retrieval quality (nDCG@10, recall@10/100, MRR@10) and latency on a BEIR split."""
    from loadgen.resultsfile import BenchmarkRun
    from rag.eval.beir import load_qrels, load_queries
    from rag.eval.runner import evaluate as run_eval, parse_retriever_sets
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
                if (problem := pipeline.check_retrievers(names)) is not None:
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
            out.print(f"[yellow]{name}: the graph stage was skipped for {m['skipped']} queries (store unavailable)[/]")
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
