"""The quality ladder's rungs on a real pipeline (rag/stages.py LEVEL_TABLE, RagPipeline.query/retrieve ``level``),
and the ladder as a service's settings run it (rag/steering/ladder.py)."""

from __future__ import annotations

import json

import pytest

from rag.errors import ConfigurationError
from rag.settings import RagheatSettings
from rag.stages import LEVEL_TABLE, QUALITY_LEVELS
from rag.steering.ladder import DEFAULT_LADDER, Ladder, distinct_levels

QUERY = "0-dimensional biomaterials lack inductive properties."


def _stages(result) -> list[str]:
    return [s.name for s in result.stages]


def test_each_rung_runs_what_it_says_and_says_so(pipeline):
    full = pipeline.query(QUERY, 5)
    assert full.level == "full" and not full.degraded and "rerank" in _stages(full)
    shallow = pipeline.retrieve(QUERY, 5, level="shallow_rerank")
    assert shallow.rerank and shallow.rerank_depth == 20
    no_rerank = pipeline.query(QUERY, 5, level="no_rerank")
    assert "rerank" not in _stages(no_rerank) and "embed" in _stages(no_rerank)
    assert no_rerank.level == "no_rerank" and no_rerank.degraded and not no_rerank.skipped
    bm25 = pipeline.query(QUERY, 5, level="bm25_only")
    assert _stages(bm25) == ["retrieve_bm25", "generate"], "BM25 alone never embeds the query"
    assert bm25.route == "bm25" and bm25.sources
    assert bm25.quality is not None and bm25.quality.verdict == "unscored"


def test_a_shallow_rerank_rescores_only_its_depth(pipeline):
    deep = pipeline.retrieve(QUERY, 30, ["hybrid"])  # one arm at every level (a router may pick another)
    shallow = pipeline.retrieve(QUERY, 30, ["hybrid"], level="shallow_rerank")
    unranked = pipeline.retrieve(QUERY, 30, ["hybrid"], level="no_rerank")
    # past the rung's depth the fused order is kept: the tails are the no-rerank ranking's
    assert [h.chunk_id for h in shallow.hits[20:]] == [h.chunk_id for h in unranked.hits[20:30]]
    assert {h.chunk_id for h in shallow.hits[:20]} == {h.chunk_id for h in unranked.hits[:20]}
    assert len(deep.hits) == len(shallow.hits) == 30


def test_a_light_search_fuses_fewer_candidates_from_a_cheaper_dense_search(pipeline):
    full = pipeline.retrieve(QUERY, 5, ["hybrid"], level="no_rerank")
    light = pipeline.retrieve(QUERY, 5, ["hybrid"], level="light_search")
    candidates = pipeline.settings.retrieval.candidates
    assert full.retrieved["dense"] == candidates and light.retrieved["dense"] == candidates // 4
    assert light.retrieved["bm25"] <= candidates // 4 and len(light.hits) == 5
    # The fused top answers barely move: the best candidates are among each list's first quarter.
    assert len({h.chunk_id for h in light.hits} & {h.chunk_id for h in full.hits}) >= 3


def test_search_effort_is_a_per_call_parameter_of_an_approximate_index():
    import faiss
    import numpy as np

    from rag.index.dense import search, search_params

    vectors = np.random.default_rng(0).normal(size=(2000, 16)).astype(np.float32)
    hnsw = faiss.IndexHNSWFlat(16, 8, faiss.METRIC_INNER_PRODUCT)
    hnsw.add(vectors)
    hnsw.hnsw.efSearch = 128
    assert search_params(hnsw, 1.0) is None and search_params(hnsw, 0.25).efSearch == 32
    ids, _ = search(hnsw, vectors[0], 10, search_params(hnsw, 0.25))
    assert len(ids) == 10 and hnsw.hnsw.efSearch == 128  # the index's own setting is untouched
    ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(16), 16, 8, faiss.METRIC_INNER_PRODUCT)
    ivf.train(vectors)
    ivf.nprobe = 8
    assert search_params(ivf, 0.25).nprobe == 2
    assert search_params(faiss.IndexFlatIP(16), 0.25) is None  # exact: nothing to cut


def test_an_unknown_rung_is_refused_with_the_list(pipeline):
    with pytest.raises(ValueError, match="bm25_only"):
        pipeline.query(QUERY, 5, level="cheap")


def test_rungs_that_cut_only_what_the_service_does_not_run_are_left_out():
    # The default service routes (the graph is one of its choices), reranks and answers extractively.
    assert distinct_levels(RagheatSettings()) == ("full", "no_graph", "shallow_rerank", "no_rerank", "light_search",
                                                  "bm25_only")
    hybrid = RagheatSettings(retrieval={"retrievers": ["dense", "bm25"]})
    assert distinct_levels(hybrid) == ("full", "shallow_rerank", "no_rerank", "light_search", "bm25_only")
    exact_dense = RagheatSettings(retrieval={"retrievers": ["dense"]}, index={"kind": "flat"})
    assert "light_search" not in distinct_levels(exact_dense)  # one exact list: no effort to cut
    routed_with_model = RagheatSettings(retrieval={"retrievers": ["routed"]}, generation={"generator": "openai"},
                                        hyde={"enabled": True})
    assert distinct_levels(routed_with_model) == QUALITY_LEVELS
    bm25_only = RagheatSettings(retrieval={"retrievers": ["bm25"]}, rerank={"enabled": False})
    assert distinct_levels(bm25_only) == ("full",)


def test_the_shipped_ladder_is_measured_for_every_rung_of_the_default_service_and_is_a_frontier():
    ladder = Ladder.load()
    served = distinct_levels(RagheatSettings())
    assert set(served) <= set(ladder.cpu_ms), "measure-ladder measured every rung the default service runs"
    steps = ladder.frontier(served)  # a rung that saves too little is measured, and left out of the steps
    assert steps[0] == "full" and steps[-1] == "bm25_only" and len(steps) >= 3
    costs = [ladder.cpu_ms[name] for name in steps]
    assert costs == sorted(costs, reverse=True), "each step costs less than the one above it"
    source = json.loads(DEFAULT_LADDER.read_text())["source"]
    assert source["command"].startswith("ragheat measure-ladder")


def test_a_rung_that_saves_nothing_is_not_a_step(tmp_path):
    levels = {"full": {"cpu_ms": 6.0}, "shallow_rerank": {"cpu_ms": 5.9}, "no_rerank": {"cpu_ms": 4.0}}
    (tmp_path / "ladder.json").write_text(json.dumps({"levels": levels}))
    ladder = Ladder.load(tmp_path / "ladder.json")
    assert ladder.frontier(("full", "shallow_rerank", "no_rerank", "bm25_only")) == ("full", "no_rerank", "bm25_only")


@pytest.mark.parametrize("content, match", [("{", "not a ladder file"), ('{"levels": {"cheap": {"cpu_ms": 1}}}',
                                                                         "do not exist")])
def test_a_bad_ladder_file_names_itself(tmp_path, content, match):
    path = tmp_path / "ladder.json"
    path.write_text(content)
    with pytest.raises(ConfigurationError, match=match):
        Ladder.load(path)


def test_the_level_table_is_cumulative():
    """Each rung keeps the cuts of the rungs above it: a step down never brings a stage back."""
    fields = ("hyde", "language_model", "graph", "dense")
    for upper, lower in zip(LEVEL_TABLE, LEVEL_TABLE[1:]):
        for name in fields:
            assert getattr(upper, name) or not getattr(lower, name), (upper.name, lower.name, name)
        upper_depth = 10**6 if upper.rerank_candidates is None else upper.rerank_candidates
        lower_depth = 10**6 if lower.rerank_candidates is None else lower.rerank_candidates
        assert lower_depth <= upper_depth
