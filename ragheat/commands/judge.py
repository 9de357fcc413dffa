"""``ragheat judge``: the language model labels each retrieved (query, passage) pair relevant or not
(rag/eval/judge.py), writes the labels as BEIR qrels, and reports how they agree with the human qrels."""

from __future__ import annotations

import contextlib
import json
import random
from pathlib import Path
from typing import Optional

import typer

from ragheat.clikit import fail as _fail, guard, load_settings, out, progress_bar

_guard = guard()
DEFAULT_THRESHOLD = 0.0
"""log P(Yes) - log P(No) above which a pair counts as relevant: 0 = the model's own choice between the two words.
No other threshold carried from one set to another (SciFact <-> HotpotQA) does better for SmolLM2-135M
(docs/benchmarks.md, "Relevance labels by an LLM judge"), so none is tuned in."""


@_guard
def judge(
    beir: Path = typer.Option(..., "--beir", help="BEIR folder: corpus.jsonl, queries.jsonl, qrels/<split>.tsv"),
    split: str = typer.Option("train", "--split", help="qrels split whose queries are judged (and compared with)"),
    index: Optional[Path] = typer.Option(None, "--index", help="index of that corpus (default data/index/<name>; "
                                                               "built if absent)"),
    retrievers: str = typer.Option("hybrid", "--retrievers", help="what retrieves the passages to judge "
                                                                  "(dense, bm25, hybrid, ...)"),
    top_k: int = typer.Option(10, "--top-k", min=1, max=100, help="documents judged per query"),
    out_file: Path = typer.Option(..., "--out", help="BEIR qrels written here (resumed when it exists)"),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="judge this many of the split's queries, drawn "
                                                                     "with --seed (default: all)"),
    seed: int = typer.Option(16, "--seed", help="which queries --limit draws"),
    llm_url: Optional[str] = typer.Option(None, "--llm-url", help="an OpenAI-compatible server's /v1 URL; default: "
                                                                  "generation.generator's model, else vLLM started "
                                                                  "on the installed SmolLM2-135M-Instruct"),
    workers: int = typer.Option(4, "--workers", min=1, max=64, help="requests in flight (the server batches them)"),
    threshold: float = typer.Option(DEFAULT_THRESHOLD, "--threshold",
                                    help="relevant when log P(Yes) - log P(No) of the model's first token exceeds this "
                                         "(OpenAI-compatible servers; docs/vllm.md says why this default)"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the agreement report here"),
) -> None:
    """Label retrieved passages with the language model; write BEIR qrels; report agreement with the human ones."""
    from rag.eval.beir import load_qrels, load_queries
    from rag.eval.judge import Judge, agreement, read_judged, retrieved_pairs, write_json_safe
    from rag.ingest.pipeline import ingest as run_ingest
    from rag.pipeline import RagPipeline
    from rag.routing.names import expand

    try:
        names = expand(retrievers)
    except ValueError as exc:
        _fail(f"--retrievers {retrievers}: {exc}")
    queries, qrels = load_queries(beir), load_qrels(beir, split)
    judged_qids = sorted(q for q in queries if q in qrels)
    if not judged_qids:
        _fail(f"no query of {beir}/queries.jsonl is in qrels/{split}.tsv")
    if limit is not None and limit < len(judged_qids):
        judged_qids = sorted(random.Random(seed).sample(judged_qids, limit))
    chosen = {q: queries[q] for q in judged_qids}
    settings = load_settings()
    # Retrieval only here: the judge's model is its own (below), whatever generation.generator says.
    retrieval = settings.model_copy(update={"generation": settings.generation.model_copy(
        update={"generator": "extractive"}), "hyde": settings.hyde.model_copy(update={"enabled": False})})
    index = index or Path("data/index") / beir.resolve().name
    with progress_bar() as progress, contextlib.ExitStack() as stack:
        run_ingest(str(beir), index, retrieval, progress=progress)  # no-op when up to date
        pipeline = RagPipeline(retrieval, index)
        pipeline.warm_up()
        if (problem := pipeline.check_retrievers(names)) is not None:
            _fail(f"--retrievers {retrievers}: {problem}")
        task = progress.add_task("retrieve", total=len(chosen))
        ranked, pairs = retrieved_pairs(pipeline, chosen, names, top_k, advance=lambda: progress.advance(task))
        asker = stack.enter_context(_judge_model(settings, llm_url))
        task = progress.add_task("judge", total=len(pairs))
        stats = Judge(asker, out_file, workers=workers, threshold=threshold).run(
            pairs, on_done=lambda: progress.advance(task))
    labels = read_judged(out_file)
    mine = {(q, d): labels[(q, d)] for q, d, *_ in pairs if (q, d) in labels}
    if not mine:
        _fail(f"the model labelled none of the {len(pairs)} pairs ({stats['unparsed']} unparsed, "
              f"{stats['errors']} errors: {stats['unparsed_examples'][:2]})")
    report = {"beir": str(beir), "split": split, "retrievers": retrievers, "top_k": top_k, "queries": len(chosen),
              "seed": seed if limit else None, "out": str(out_file), "run": stats,
              "agreement": agreement(mine, qrels, ranked, k=min(10, top_k))}
    a = report["agreement"]
    k = min(10, top_k)
    out.print(f"judged {a['pairs']} pairs of {a['queries']} queries ({stats['resumed']} resumed, "
              f"{stats['unparsed']} unparsed, {stats['errors']} errors) -> {out_file}")
    out.print(f"relevant: judge {a['judge_relevant']}, human {a['human_relevant']}; agreement {a['agreement']:.3f}, "
              f"Cohen's kappa {a['kappa']:.3f}; judge precision {a['precision']:.3f}, recall {a['recall']:.3f}")
    out.print(f"nDCG@{k} of this ranking: from human labels {a[f'ndcg@{k}_human']:.4f}, from the judge's "
              f"{a[f'ndcg@{k}_judge']:.4f} (per-query Pearson r {a[f'ndcg@{k}_pearson']:.3f})")
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(write_json_safe(report), indent=2, sort_keys=True))
        out.print(f"wrote {json_out}")


@contextlib.contextmanager
def _judge_model(settings, llm_url: str | None):
    """The judge's ``ask``: the OpenAI-compatible server at ``llm_url`` (or ``generation.base_url`` with the openai
    generator), its Yes/No log-probabilities read; the in-process engine (vllm generator), its reply parsed; else
    vLLM's OpenAI server started on the installed real model for the length of the command."""
    from rag.eval.judge import CompleterAsker, YesNoClient

    g = settings.generation
    if llm_url is None and g.generator == "vllm":
        from rag.generation.vllm_engine import InProcessVllmGenerator

        llm = InProcessVllmGenerator(g)
        llm.warm_up()
        try:
            yield CompleterAsker(llm)
        finally:
            llm.close()
        return
    with contextlib.ExitStack() as stack:
        url, model = llm_url, "" if llm_url else g.model
        if url is None and g.generator == "openai":
            url = g.base_url
        if url is None:
            from ragheat.commands.demo_llm import SERVED_NAME, resolve_model
            from rag.childproc import free_port
            from stack.vllm import VllmServer

            folder, _ = resolve_model("auto")
            out.print(f"starting vLLM on {folder} for the judge (CPU; loading takes tens of seconds) ...")
            url = stack.enter_context(VllmServer(folder, port=free_port(), python=g.vllm_python,
                                                 served_name=SERVED_NAME, max_model_len=2048, max_num_seqs=8,
                                                 block_size=32))
            model = SERVED_NAME
        client = YesNoClient(url, model, connect_timeout_s=max(g.connect_timeout_s, 5.0))
        stack.callback(client.close)
        yield client
