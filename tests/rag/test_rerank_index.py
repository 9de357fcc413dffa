"""The reranker over a real index (the SciFact subset): token vectors stored at ingest from the embedding run itself,
``hybrid+rerank`` through ``ragheat eval``'s runner, and ``train-reranker`` end to end on a tiny split."""

from __future__ import annotations

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from rag.eval.beir import load_qrels, load_queries
from rag.eval.runner import evaluate, parse_retriever_sets, run_retrieval
from rag.ingest.pipeline import passage_text
from rag.rerank.head import DEFAULT_HEAD, RerankHead
from rag.rerank.reranker import load_reranker


def test_the_encoder_returns_token_states_from_the_same_run(embedder):
    result, states = embedder.embed_query_tokens("Vitamin D deficiency raises the risk of fractures.")
    assert states.shape == (result.tokens, 384)
    pooled = states.mean(axis=0)  # the graph's mean pooling over the very same states
    np.testing.assert_allclose(pooled / np.linalg.norm(pooled), result.vector, atol=1e-5)
    np.testing.assert_array_equal(result.vector, embedder.embed_query("Vitamin D deficiency raises the risk of "
                                                                      "fractures.").vector)


def test_ingest_stores_each_chunks_token_vectors(pipeline, embedder):
    index = pipeline.index
    block = index.manifest["rerank"]
    reranker = load_reranker(index.folder, index.manifest)
    chunks = index.chunks
    counts = embedder.count_tokens([passage_text(c) for c in chunks])
    assert block["tokens"] == sum(counts) and block["chunks"] == len(chunks) and block["dtype"] == "int8"  # default
    assert block["bytes"] >= sum(counts) * block["dim"]  # a byte per dimension (plus a scale per token)
    # Round trip: what is stored for a chunk is the head's projection of that chunk's own token states.
    for chunk_id in (0, len(chunks) // 2, len(chunks) - 1):
        parts = {}
        embedder.embed_many([passage_text(chunks[chunk_id])], on_tokens=lambda i, s: parts.setdefault(i, s))
        stored, starts = reranker.vectors.gather([chunk_id])
        assert list(starts) == [0] and len(stored) == counts[chunk_id]
        # int8 with one scale per token: unit vectors, so each value is within half a step (1/254) of its projection.
        np.testing.assert_allclose(stored, reranker.head.project(parts[0]), atol=1 / 254 + 1e-3)


def test_hybrid_rerank_is_an_eval_name(pipeline, scifact_subset):
    queries, qrels = load_queries(scifact_subset), load_qrels(scifact_subset, "train")
    assert parse_retriever_sets("hybrid,hybrid+rerank,bm25+rerank") == {
        "hybrid": ("dense", "bm25"), "hybrid+rerank": ("dense", "bm25", "rerank"), "bm25+rerank": ("bm25", "rerank")}
    for bad, reason in (("rerank+hybrid", "rerank comes last"), ("+rerank", "--retrievers"),
                        ("sparse+rerank", "unknown retriever")):
        with pytest.raises(ValueError, match=reason):
            parse_retriever_sets(bad)
    judged = {q: t for q, t in queries.items() if q in qrels}
    report = evaluate(pipeline, judged, qrels, ["hybrid", "hybrid+rerank"])["retrievers"]
    assert set(report) == {"hybrid", "hybrid+rerank"}
    assert 0 < report["hybrid+rerank"]["ndcg@10"] <= 1 and report["hybrid+rerank"]["latency_ms"]["p99"] > 0
    # The reranker reorders only the top 50 fused chunks: each query keeps the same documents, in another order.
    some = dict(list(judged.items())[:15])
    plain, _, _ = run_retrieval(pipeline, some, ("dense", "bm25"), depth=10)
    reranked, _, _ = run_retrieval(pipeline, some, ("dense", "bm25", "rerank"), depth=10)
    assert any(plain[q] != reranked[q] for q in some), "the reranker changed no ranking at all"
    assert all(set(reranked[q][:5]) <= set(plain[q]) | set(reranked[q]) for q in some)


@pytest.mark.timeout(900)
def test_train_reranker_end_to_end_on_a_tiny_split(scifact_subset, subset_index, tmp_path, monkeypatch):
    import sys

    from ragheat.commands import index, train

    app = typer.Typer()
    app.command()(train.train_reranker)
    app.command("other")(index.ingest)  # two commands: typer then expects the command name
    out = tmp_path / "head.npz"
    args = ["train-reranker", "--beir", str(scifact_subset), "--index", str(subset_index), "--out", str(out),
            "--epochs", "1", "--max-queries", "12", "--seed", "3", "--token-cache", str(tmp_path / "cache"),
            "--json", str(tmp_path / "report.json")]
    monkeypatch.setattr(sys, "argv", ["ragheat", *args])  # what the head records as its command
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    head = RerankHead.load(out)
    assert head.meta["seed"] == 3 and head.meta["data"]["queries"] == 12 and head.meta["command"].startswith("ragheat train-reranker --beir")
    assert head.projection.shape == (384, 128) and head.projection_sha256 != RerankHead.load(DEFAULT_HEAD).projection_sha256
    assert (tmp_path / "cache" / "raw_tokens.npy").is_file() and (tmp_path / "report.json").is_file()
    assert (tmp_path / "head.onnx").is_file() and head.project(np.ones((2, 384), np.float32)).shape == (2, 128)
    # Bad input is a sentence, not a traceback.
    result = CliRunner().invoke(app, ["train-reranker", "--beir", str(scifact_subset), "--split", "nope",
                                      "--index", str(subset_index)])
    assert result.exit_code != 0 and "nope.tsv does not exist" in result.output


def test_default_is_what_the_service_serves_by_default():
    from rag.settings import RagheatSettings

    assert parse_retriever_sets("default,hybrid", RagheatSettings()) == {
        "default": ("routed", "rerank"), "hybrid": ("dense", "bm25")}
    plain = RagheatSettings(retrieval={"retrievers": ["dense", "bm25"]}, rerank={"enabled": False})
    assert parse_retriever_sets("default", plain) == {"default": ("dense", "bm25")}
    with pytest.raises(ValueError, match="settings"):
        parse_retriever_sets("default")
