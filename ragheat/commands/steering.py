"""``ragheat measure-ladder``: the cost and quality of each rung of the quality ladder the load controller steps
(rag/steering), measured on corpora's own questions, written as the ladder file the controller prices rungs by."""

from __future__ import annotations

import json
import platform
import shlex
import statistics
from pathlib import Path
from typing import Optional

import typer

from ragheat.clikit import beir_sets, fail as _fail, guard, load_settings, out, progress_bar

_guard = guard()


@_guard
def measure_ladder(
    beir: str = typer.Option(..., "--beir", help="BEIR folders whose labelled queries measure each rung, "
                                                 "comma-separated"),
    split: str = typer.Option("train", help="qrels split per folder (comma-separated) or one for all"),
    index: Optional[str] = typer.Option(None, "--index", help="their indexes, comma-separated (built if absent; "
                                                             "default data/index/<folder name>)"),
    rounds: int = typer.Option(3, "--rounds", min=1, max=20, help="passes over the queries per rung (CPU per "
                                                                  "answer is the median pass's)"),
    limit: Optional[int] = typer.Option(None, "--limit", min=10, help="use at most this many queries per folder"),
    out_path: Optional[Path] = typer.Option(None, "--out", help="where to write the ladder (default: the one "
                                                                "shipped in rag/steering/ladder.json)"),
) -> None:
    """Measure every rung of the quality ladder this service's settings run: CPU per answer, latency, nDCG@10."""
    from rag.eval.beir import load_qrels, load_queries
    from rag.ingest.pipeline import ingest as run_ingest
    from rag.pipeline import RagPipeline
    from rag.steering.ladder import DEFAULT_LADDER, distinct_levels
    from rag.steering.measure import measure_rungs

    sets = beir_sets(beir, split, index)
    settings = load_settings()
    levels = distinct_levels(settings)
    measured: dict[str, dict[str, dict]] = {level: {} for level in levels}
    with progress_bar() as progress:
        for folder, sp, idx in sets:
            qrels = load_qrels(folder, sp)
            queries = {q: t for q, t in load_queries(folder).items() if q in qrels}
            queries = dict(list(queries.items())[:limit])
            if not queries:
                _fail(f"{folder}: no labelled query in split {sp}")
            run_ingest(str(folder), idx, settings, progress=progress)  # no-op when up to date
            pipeline = RagPipeline(settings, idx)
            pipeline.warm_up()
            try:
                task = progress.add_task(f"{folder.name}: {len(levels)} rungs", total=len(queries) * (rounds + 1)
                                         * len(levels))
                rows = measure_rungs(pipeline, levels, queries, qrels, rounds, advance=lambda: progress.advance(task))
                for level, row in rows.items():
                    measured[level][folder.name] = row.to_json()
            finally:
                pipeline.close()
    command = shlex.join(["ragheat", "measure-ladder", "--beir", beir, "--split", split,
                          *(["--index", index] if index else []), "--rounds", str(rounds),
                          *(["--limit", str(limit)] if limit else []), *(["--out", str(out_path)] if out_path else [])])
    ladder = {"levels": {level: {"cpu_ms": round(statistics.median(r["cpu_ms"] for r in rows.values()), 3),
                                 "ndcg@10": {name: r["ndcg@10"] for name, r in rows.items()},
                                 "corpora": rows}
                         for level, rows in measured.items()},
              "source": {"command": command, "machine": platform.processor() or platform.machine(),
                         "retrievers": list(settings.retrieval.retrievers), "rerank": settings.rerank.enabled,
                         "generator": settings.generation.generator}}
    target = out_path or DEFAULT_LADDER
    target.write_text(json.dumps(ladder, indent=1) + "\n")
    for level, row in ladder["levels"].items():
        quality = ", ".join(f"{name} {value:.3f}" for name, value in row["ndcg@10"].items())
        out.print(f"{level:15s} {row['cpu_ms']:7.2f} ms CPU per answer   nDCG@10 {quality}")
    out.print(f"[green]wrote[/] {target}")
