"""What a pipeline loads to serve the graph: the linker, the store (started or connected, checked against the
manifest) and the retriever over it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rag.errors import IndexLoadError
from rag.graph.cypher import COUNT_NODES
from rag.graph.linker import GazetteerLinker
from rag.graph.retriever import AdjacencyGraphRetriever, CypherGraphRetriever
from rag.graph.store import GraphStoreUnavailable, SupervisedStore, open_store
from rag.protocols import EntityLinker, GraphRetriever
from rag.settings import GraphSettings


@dataclass
class GraphStage:
    """The graph parts of a served pipeline."""

    store: SupervisedStore
    linker: EntityLinker
    retriever: GraphRetriever


def load_graph_stage(settings: GraphSettings, folder: Path, manifest: dict) -> GraphStage:
    """Start (or connect to) the store holding this generation's graph and check it holds what the manifest says;
    ``IndexLoadError`` naming the folder when the graph cannot be served."""
    block = manifest["graph"]
    if block["backend"] != settings.backend:
        raise IndexLoadError(folder, f"its graph was built for the {block['backend']} store but graph.backend is "
                                     f"{settings.backend}; rebuild it (`ragheat ingest --force`) or set "
                                     f"RAGHEAT_GRAPH__BACKEND={block['backend']}")
    linker = GazetteerLinker.load(
        folder, embedding_seeds=settings.embedding_seeds if settings.link_by_embedding else 0,
        embedding_min_similarity=settings.embedding_min_similarity,
        embedding_seed_weight=settings.embedding_seed_weight)
    store = SupervisedStore(open_store(settings, folder))
    generation = block["generation"]
    try:
        store.warm_up()
        entities = int(store.run(COUNT_NODES["Entity"], {"g": generation})[0][0])
    except GraphStoreUnavailable as exc:
        store.close()
        raise IndexLoadError(folder, f"its graph store cannot be started or reached: {exc}") from exc
    expected = block["counts"]["entities"]
    if entities != expected:
        store.close()
        raise IndexLoadError(folder, f"the {settings.backend} graph store holds {entities} entities of generation "
                                     f"{generation}, the manifest says {expected}; rebuild it (`ragheat ingest --force`)")
    options = {"hops": settings.hops, "top_n": settings.top_n, "decay": settings.decay}
    if settings.execution == "adjacency":
        retriever: GraphRetriever = AdjacencyGraphRetriever.from_store(store, generation, **options)
    else:
        retriever = CypherGraphRetriever(store, generation, **options)
    return GraphStage(store, linker, retriever)
