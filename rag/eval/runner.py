"""``ragheat eval``: run the query path's retrieval on BEIR queries and score it against the qrels.

Names (``--retrievers``): ``dense``, ``bm25``, ``graph``, ``hybrid`` (= dense+bm25), any ``+``-joined combination
(fused by weighted RRF, e.g. ``hybrid+graph``), and ``routed`` (the router picks per query). Each is run through
``RagPipeline.retrieve``, exactly as a request would be, so what is scored is what is served. Any of them followed
by ``+rerank`` (``hybrid+rerank``) also runs the late-interaction reranker (``rag.rerank``) over the fused
candidates inside ``retrieve``, as a request is reranked (the query's token states come from its one embed run);
``routed+rerank`` reranks the queries whose route keeps the reranker, as the service does. ``+hyde``
(``hybrid+hyde``, before ``+rerank``: ``hybrid+hyde+rerank``) runs the ``hyde`` stage: the language model's
hypothetical passage searched beside the question in the dense run (``rag.generation.hyde``; the pipeline needs
``generation.generator`` openai or vllm). Sets without it are scored without HyDE, whatever
``hyde.enabled`` says. ``default`` is what the service serves by default: ``retrieval.retrievers``, with ``+hyde``
when ``hyde.enabled`` and ``+rerank`` when ``rerank.enabled`` (``default_set``).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Mapping, Sequence

import numpy as np

from rag.eval.beir import Qrels, score_run
from rag.pipeline import RagPipeline
from rag.routing.names import expand, parse_eval_names
from rag.query_context import QueryContext

DEPTH = 100  # documents per query, enough for recall@100
RERANK = "rerank"
"""The suffix (``hybrid+rerank``) and the last element of a set's retrievers that asks for the reranker."""
HYDE = "hyde"
"""The suffix (``hybrid+hyde``) and the element of a set's retrievers (before ``rerank``) that asks for HyDE."""


DEFAULT = "default"
"""The set name that stands for what the service serves by default (``default_set``)."""


def default_set(settings) -> tuple[str, ...]:
    """What ``settings`` serve by default, as a set's retrievers: ``retrieval.retrievers`` (expanded), ``hyde`` when
    ``hyde.enabled`` and dense runs, ``rerank`` when ``rerank.enabled``."""
    names = expand(settings.retrieval.retrievers)
    hyde = settings.hyde.enabled and ("dense" in names or names == ("routed",))
    return names + ((HYDE,) if hyde else ()) + ((RERANK,) if settings.rerank.enabled else ())


def parse_retriever_sets(spec: str, settings=None) -> dict[str, tuple[str, ...]]:
    """``dense,bm25,hybrid+graph,routed,hybrid+rerank,default`` -> {name: retrievers (plus ``rerank`` last)}; a
    sentence naming ``--retrievers`` when invalid. ``default`` needs ``settings``."""
    named: dict[str, tuple[str, ...]] = {}
    for name in (n.strip() for n in spec.split(",")):
        if not name:
            continue
        if name == DEFAULT:
            if settings is None:
                raise ValueError("--retrievers default: what the service serves depends on its settings")
            named[name] = default_set(settings)
            continue
        base, rerank = (name[: -len(RERANK) - 1], True) if name.endswith(f"+{RERANK}") else (name, False)
        base, hyde = (base[: -len(HYDE) - 1], True) if base.endswith(f"+{HYDE}") else (base, False)
        if RERANK in base.split("+"):
            raise ValueError(f"--retrievers {name}: rerank comes last, after the retrievers (e.g. hybrid+rerank)")
        if HYDE in base.split("+"):
            raise ValueError(f"--retrievers {name}: hyde comes after the retrievers (e.g. hybrid+hyde, "
                             f"hybrid+hyde+rerank)")
        expanded = parse_eval_names(base)[base]  # a sentence naming --retrievers when base is empty or unknown
        if hyde and "dense" not in expanded:
            raise ValueError(f"--retrievers {name}: hyde adds a dense query, so the set must include dense")
        named[name] = expanded + ((HYDE,) if hyde else ()) + ((RERANK,) if rerank else ())
    return named or parse_eval_names(spec)


def split_rerank(retrievers: Sequence[str]) -> tuple[tuple[str, ...], bool]:
    """(the retrievers, whether the set asks for the reranker); a ``hyde`` element is dropped (``split_options``)."""
    names, _, rerank = split_options(retrievers)
    return names, rerank


def split_options(retrievers: Sequence[str]) -> tuple[tuple[str, ...], bool, bool]:
    """(the retrievers, whether the set asks for HyDE, whether it asks for the reranker)."""
    names = tuple(retrievers)
    rerank = bool(names) and names[-1] == RERANK
    names = names[:-1] if rerank else names
    hyde = bool(names) and names[-1] == HYDE
    return (names[:-1] if hyde else names), hyde, rerank


def run_retrieval(pipeline: RagPipeline, queries: Mapping[str, str], retrievers: Sequence[str],
                  depth: int = DEPTH, advance=None,
                  reranker=None) -> tuple[dict[str, list[str]], list[float], list[QueryContext]]:
    """Ranked document ids per query, the per-query retrieval latency (seconds) and what each query ran.
    ``retrievers`` ending in ``rerank`` reranks the fused candidates inside the pipeline, as a request is (a routed
    query only when its route keeps the reranker), with ``reranker`` in place of the pipeline's when given (default:
    the pipeline's, or the index's stored token vectors with the shipped head, ``rag.rerank.reranker.load_reranker``);
    ``hyde`` before it runs the pipeline's HyDE stage (a query whose passage was not written in time is counted in
    ``QueryContext.skipped``)."""
    retrievers, hyde, rerank = split_options(retrievers)
    if hyde and getattr(pipeline, "hyde", None) is None:
        raise ValueError("+hyde needs a language model: set generation.generator to openai or vllm (and its server)")
    if rerank and reranker is None and getattr(pipeline, "reranker", None) is None:
        from rag.rerank.reranker import load_reranker

        reranker = load_reranker(pipeline.index.folder, pipeline.index.manifest)
    run: dict[str, list[str]] = {}
    latencies: list[float] = []
    runs: list[QueryContext] = []
    # Documents have several chunks: ask for more chunks than documents, then keep each doc's best.
    chunk_depth = depth * 3
    for qid, text in queries.items():
        start = time.perf_counter()
        # rerank and hyde as the set asks: a set is scored as itself, whatever rerank.enabled and hyde.enabled say.
        context = pipeline.retrieve(text, chunk_depth, retrievers, rerank=rerank, hyde=hyde, reranker=reranker)
        latencies.append(time.perf_counter() - start)
        runs.append(context)
        run[qid] = [doc for doc, _ in pipeline.chunk_hits_to_docs(context.hits)][:depth]
        if advance:
            advance()
    return run, latencies, runs


def evaluate(pipeline: RagPipeline, queries: Mapping[str, str], qrels: Qrels,
             sets: Mapping[str, Sequence[str]] | Sequence[str], progress=None, reranker=None) -> dict:
    """``{"retrievers": {name: {metrics..., "latency_ms", "retrievers_per_query", "routes", "skipped"}}}`` for each
    named set (a name -> retrievers mapping, or names that ``parse_retriever_sets`` reads)."""
    if not isinstance(sets, Mapping):
        sets = parse_retriever_sets(",".join(sets))
    judged = {qid: text for qid, text in queries.items() if qid in qrels}
    report: dict = {"queries": len(judged), "retrievers": {}}
    for name, retrievers in sets.items():
        advance = None
        if progress is not None:
            task = progress.add_task(f"eval {name}", total=len(judged))
            advance = lambda: progress.advance(task)  # noqa: E731
        run, latencies, runs = run_retrieval(pipeline, judged, retrievers, advance=advance, reranker=reranker)
        metrics = score_run(run, qrels)
        ms = np.asarray(latencies) * 1000.0
        metrics["latency_ms"] = {"p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99))}
        # Retrievers that ran (a graph with no linked entity does not run; one whose store was down is counted).
        ran = [len(r.retrieved) + len(r.skipped) for r in runs]
        metrics["retrievers_per_query"] = float(np.mean(ran)) if ran else 0.0
        routes = Counter(r.route for r in runs)
        metrics["routes"] = {route: count / len(runs) for route, count in sorted(routes.items())} if runs else {}
        metrics["reranked_share"] = float(np.mean([r.reranked is not None for r in runs])) if runs else 0.0
        metrics["skipped"] = sum(1 for r in runs if r.skipped)
        metrics["hyde_skipped"] = sum(1 for r in runs if "hyde" in r.skipped)  # no passage in time: question only
        metrics["graph_skipped"] = sum(1 for r in runs if "retrieve_graph" in r.skipped)  # the store was down
        report["retrievers"][name] = metrics
    return report
