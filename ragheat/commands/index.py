"""``ragheat ingest`` and ``ragheat eval``: build an index, and score retrieval on a BEIR split."""

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
    out.print(f"[green]indexed[/] {m['counts']['documents']} documents as {m['counts']['chunks']} chunks "
              f"into {report.generation} in {m['timings_s']['total']:.1f} s "
              f"(embed {m['timings_s']['embed']:.1f} s)")


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
    from rich.table import Table

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
