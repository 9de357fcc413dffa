"""The graph part of an index generation, built by ``ragheat ingest`` beside the dense and BM25 indexes: the graph
from the chunks, loaded into the store (the embedded FalkorDB's ``graph.rdb`` inside the generation folder, or the
Neo4j server under the generation's key), and the linker's alias table; all before the generation is published, so
one atomic swap publishes them together.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable, Sequence

from rag.graph.build import GRAPH_FORMAT, build_graph
from rag.graph.cypher import count_generation, delete_generation, load_graph, stored_generations, total_rows
from rag.graph.falkordb import RDB_FILE
from rag.graph.linker import GazetteerLinker
from rag.graph.store import open_store
from rag.settings import GraphSettings
from rag.types import Chunk

log = logging.getLogger("ragheat.graph")
StepStarter = Callable[[str, int | None], Callable[..., None]]


def graph_config(settings: GraphSettings) -> dict:
    """What the built graph depends on: part of the ingest fingerprint (query-time fields are not)."""
    if not settings.enabled:
        return {"enabled": False}
    config = settings.model_dump(include={"enabled", "backend", "max_alias_df", "min_alias_chars", "comma_aliases",
                                          "link_by_embedding"})
    config["format"] = GRAPH_FORMAT
    if settings.backend == "neo4j":
        config.update(uri=settings.uri, database=settings.database)
    return config


def build_generation_graph(folder: Path, generation: str, chunks: Sequence[Chunk], settings: GraphSettings, *,
                           embed_titles: Callable | None = None, start_step: StepStarter | None = None) -> dict:
    """Build the graph of ``chunks`` into generation ``generation`` (its folder ``folder``); the manifest's
    ``graph`` block (backend, parameters, counts, files, timings). ``embed_titles(texts, progress)`` embeds entity
    titles when ``link_by_embedding`` is on; ``start_step(description, total)`` returns a progress advance."""
    start_step = start_step or (lambda description, total: (lambda n=1: None))
    timings: dict[str, float] = {}
    started = time.perf_counter()
    graph = build_graph(chunks, max_alias_df=settings.max_alias_df, min_alias_chars=settings.min_alias_chars,
                        comma_aliases=settings.comma_aliases, advance=start_step("graph: mentions", len(chunks)))
    timings["build"] = time.perf_counter() - started

    vectors = None
    if settings.link_by_embedding:
        if embed_titles is None:
            raise ValueError("graph.link_by_embedding needs an embedder for the entity titles")
        started = time.perf_counter()
        vectors = embed_titles(graph.entity_titles, start_step("graph: title vectors", len(graph.entity_titles)))
        timings["title_vectors"] = time.perf_counter() - started
    linker = GazetteerLinker.from_graph(graph, entity_vectors=vectors)
    files = linker.save(folder)

    started = time.perf_counter()
    store = open_store(settings, folder, persist=True)
    store.warm_up()
    try:
        timings["store_start"] = time.perf_counter() - started
        loaded = load_graph(store, graph, generation, batch=settings.load_batch,
                            advance=start_step(f"graph: load ({settings.backend})", total_rows(graph)))
        timings["store_load"] = sum(loaded.values())
        counts = count_generation(store, generation)
        if settings.backend == "falkordb":
            started = time.perf_counter()
            store.save()
            timings["store_save"] = time.perf_counter() - started
            files.append(RDB_FILE)
    finally:
        started = time.perf_counter()
        store.close()
        timings["store_stop"] = time.perf_counter() - started
    expected = {"entity": len(graph.entity_names), "doc": len(graph.doc_keys), "chunk": graph.n_chunks,
                "mentions": graph.stats["mentions"], "co_occurs": graph.stats["co_occurs"]}
    wrong = {k: (counts[k], v) for k, v in expected.items() if counts[k] != v}
    if wrong:
        raise RuntimeError(f"the graph store holds other counts than were loaded (stored, built): {wrong}")
    return {"backend": settings.backend, "generation": generation, "config": graph_config(settings),
            "counts": {**graph.stats, **{f"stored_{k}": v for k, v in counts.items()}},
            "files": sorted(files), "timings_s": {k: round(v, 3) for k, v in timings.items()}}


def prune_store_generations(settings: GraphSettings, folder: Path, keep: set[str]) -> list[str]:
    """Neo4j only: remove the generations the index no longer has (after a swap, or left by a failed ingest)."""
    if settings.backend != "neo4j":
        return []
    store = open_store(settings, folder)
    store.warm_up()
    try:
        gone = sorted(stored_generations(store) - keep)
        for generation in gone:
            delete_generation(store, generation)
        return gone
    finally:
        store.close()
