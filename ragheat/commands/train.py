"""``ragheat train-router`` and ``ragheat train-reranker``: retrain the query router and the reranker's
projection head from BEIR training splits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ragheat.clikit import beir_sets, fail as _fail, guard, load_settings, out, progress_bar

_guard = guard()


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
    """Retrain the query router from per-query outcomes of every route, with and without the reranker
    (rerank.enabled), on BEIR training splits."""
    import sys

    from rag.eval.beir import load_qrels, load_queries
    from rag.ingest.pipeline import ingest as run_ingest
    from rag.pipeline import RagPipeline
    from rag.routing.router import SHIPPED_MODEL
    from rag.routing.train import collect_outcomes, train_router as fit

    sets = beir_sets(beir, split, index)
    settings = load_settings()
    if not settings.graph.enabled:
        _fail("the router chooses between routes with and without the graph: graph.enabled must be on")
    data = [(folder, sp, load_queries(folder), load_qrels(folder, sp), idx)
            for folder, sp, idx in sets]
    tables, datasets = [], []
    with progress_bar() as progress:
        for folder, sp, queries, qrels, idx in data:
            run_ingest(str(folder), idx, settings, progress=progress)  # no-op when up to date
            # Served as hybrid: the router being trained (or a broken one) is not needed to collect outcomes.
            hybrid = settings.model_copy(update={"retrieval": settings.retrieval.model_copy(
                update={"retrievers": ["dense", "bm25"]})})
            pipeline = RagPipeline(hybrid, idx)
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
        rules = "; ".join(f"{rule.replace('_', '-')} {d[rule]['ndcg@10']:.4f}"
                          for rule in ("graph_if_linked", "graph_if_linked_else_rerank") if rule in d)
        out.print(f"{name}: router (nested CV) nDCG@10 {cv['ndcg@10']:.4f} ±{cv['ndcg@10_std_over_repeats']:.4f}, "
                  f"{cv['retrievers_per_query']:.2f} retrievers/query; best fixed {best[0]} {best[1]['ndcg@10']:.4f}; "
                  f"{rules}")
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
