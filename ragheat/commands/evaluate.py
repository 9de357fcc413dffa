"""``ragheat eval``: score retrieval on a BEIR split (nDCG@10, recall, MRR, latency per retriever)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ragheat.clikit import fail as _fail, guard, load_settings, out, progress_bar

_guard = guard()


@_guard
def evaluate(
    beir: Path = typer.Option(..., "--beir", help="BEIR folder: corpus.jsonl, queries.jsonl, qrels/<split>.tsv"),
    index: Optional[Path] = typer.Option(None, "--index", help="index of that corpus (built if absent)"),
    split: str = typer.Option("train", help="qrels split"),
    retrievers: str = typer.Option("dense,bm25,hybrid", help="comma list of dense, bm25, graph, hybrid (= dense+bm25), "
                                                             "any +-joined combination (hybrid+graph), routed; "
                                                             "+rerank after any of them (hybrid+rerank); default = "
                                                             "what the service serves by default"),
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

    settings = load_settings()
    try:
        sets = parse_retriever_sets(retrievers, settings)
    except ValueError as exc:
        _fail(str(exc))
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
        if 0 < m["reranked_share"] < 1:  # the router kept the fused order for the others
            out.print(f"{name}: reranked {m['reranked_share']:.1%} of the queries")
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
