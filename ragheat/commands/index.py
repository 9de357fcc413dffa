"""``ragheat ingest``: build an index generation from a source and swap it in."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ragheat.clikit import guard, load_settings, out, progress_bar

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
