"""``ragheat calibrate-quality``: the threshold of the ``no_good_passage`` verdict and the reference quantiles the
live quality signals are compared with, from a corpus's own training questions (rag/quality)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional

import typer

from ragheat.clikit import beir_sets, fail as _fail, guard, load_settings, out, progress_bar

_guard = guard()


@_guard
def calibrate_quality(
    beir: str = typer.Option(..., "--beir", help="BEIR folders whose queries are the training questions, "
                                                 "comma-separated"),
    split: str = typer.Option("train", help="qrels split whose queries are used, per folder (comma-separated) or one "
                                            "for all; 'all' = every query of queries.jsonl (no labels needed)"),
    index: Optional[str] = typer.Option(None, "--index", help="their indexes, comma-separated (built if absent; "
                                                             "default data/index/<folder name>)"),
    flag_rate: float = typer.Option(0.02, "--flag-rate", min=0.001, max=0.5,
                                    help="share of the training questions the threshold flags as having no good "
                                         "passage: the quality objective leaves room for it"),
    limit: Optional[int] = typer.Option(None, "--limit", min=20, help="use at most this many queries per folder"),
    out_path: Optional[Path] = typer.Option(None, "--out", help="where to write the calibration (default: the one "
                                                                "shipped in rag/quality/calibration.json)"),
) -> None:
    """Calibrate the label-free quality signals on training questions; write the calibration file."""
    from rag.eval.beir import load_qrels, load_queries
    from rag.ingest.pipeline import ingest as run_ingest
    from rag.pipeline import RagPipeline
    from rag.quality.calibration import DEFAULT_CALIBRATION, calibrate
    from rag.quality.signals import retrieval_signals

    sets = beir_sets(beir, split, index)
    settings = load_settings()
    signals: dict[str, list[float]] = {}
    sources = []
    with progress_bar() as progress:
        for folder, sp, idx in sets:
            queries = load_queries(folder)
            if sp != "all":
                qrels = load_qrels(folder, sp)
                queries = {q: t for q, t in queries.items() if q in qrels}
            texts = list(queries.values())[:limit]
            if not texts:
                _fail(f"{folder}: no query to calibrate on (split {sp})")
            run_ingest(str(folder), idx, settings, progress=progress)  # no-op when up to date
            pipeline = RagPipeline(settings, idx)
            pipeline.warm_up()
            try:
                task = progress.add_task(f"signals {folder.name}", total=len(texts))
                found = retrieval_signals(pipeline, texts, advance=lambda: progress.advance(task))
                manifest, description = pipeline.index.manifest, pipeline.describe()
            finally:
                pipeline.close()
            for row in found:
                for name, value in row.values().items():
                    signals.setdefault(name, []).append(value)
            sources.append({"beir": folder.name, "split": sp, "queries": len(texts),
                            "corpus_sha256": manifest["corpus"]["content_sha256"],
                            "embedding_model": description.embedding_model,
                            "query_precision": description.query_precision})
    try:
        command = shlex.join(["ragheat", "calibrate-quality", "--beir", beir, "--split", split,
                              *(["--index", index] if index else []), "--flag-rate", f"{flag_rate:g}",
                              *(["--limit", str(limit)] if limit else []),
                              *(["--out", str(out_path)] if out_path else [])])
        calibration = calibrate(signals, flag_rate, sources + [{"command": command}])
    except ValueError as exc:
        _fail(str(exc))
    target = out_path or DEFAULT_CALIBRATION
    calibration.save(target)
    reference = calibration.reference.get("best_similarity", {})
    out.print(f"best similarity over {len(signals['best_similarity'])} queries: median {reference.get('0.5')}, "
              f"{flag_rate:.1%} below {calibration.min_similarity}")
    out.print(f"[green]wrote[/] {target}")
