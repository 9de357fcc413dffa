"""The openai generator against a real vLLM: answers carry generation stats and support flags, and
/v1/query/stream forwards tokens as they arrive. Random weights write noise: these test mechanics."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from rag.api.app import create_app
from stack.servers import BackgroundServer
from rag.pipeline import RagPipeline

pytestmark = pytest.mark.slow
QUESTION = "What causes drug resistance in bacteria?"


@pytest.fixture(scope="module")
def llm_url(settings, subset_index, vllm_server):
    gen = settings.generation.model_copy(update={"generator": "openai", "base_url": vllm_server.url, "model": "",
                                                 "max_tokens": 48, "first_token_timeout_s": 20.0,
                                                 "passages": 1})  # prompt + answer within max_model_len 512
    llm_settings = settings.model_copy(update={"generation": gen})
    pipeline = RagPipeline(llm_settings, subset_index)
    pipeline.warm_up()
    with BackgroundServer(create_app(llm_settings, pipeline=pipeline)) as url:
        yield url


def test_query_returns_a_written_answer_with_generation_stats(llm_url):
    body = httpx.post(llm_url + "/v1/query", json={"query": QUESTION}, timeout=60).json()
    assert body["generator"] == "openai" and not body["degraded"], body
    assert body["answer"] and body["generation"]["model"] == "tiny"
    assert 0 < body["generation"]["ttft_ms"] and 1 <= body["generation"]["output_tokens"] <= 48
    names = [s["name"] for s in body["stages"]]
    assert names[-3:] == ["generate_prefill", "generate_decode", "support_check"], names
    # noise cites nothing the passages say: every sentence is flagged, and counted
    assert body["support"] and body["unsupported_sentences"] == sum(not s["supported"] for s in body["support"]) > 0


def test_stream_forwards_tokens_before_the_answer_is_complete(llm_url):
    arrivals = []
    with httpx.stream("POST", llm_url + "/v1/query/stream", json={"query": QUESTION}, timeout=60) as response:
        assert response.status_code == 200
        kind = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                arrivals.append((kind, json.loads(line[6:]), time.perf_counter()))
    kinds = [k for k, _, _ in arrivals]
    assert kinds[0] == "sources" and kinds[-1] == "done" and "degraded" not in kinds, kinds
    tokens = [(data, t) for k, data, t in arrivals if k == "token"]
    assert len(tokens) >= 2
    done = arrivals[-1]
    assert done[1]["generator"] == "openai" and done[1]["generation"]["output_tokens"] >= len(tokens) - 1
    assert tokens[0][1] < tokens[-1][1] < done[2], "tokens must arrive one by one, before the end"
    answers = [data for k, data, _ in arrivals if k == "answer"]
    assert "".join(d["text"] for d, _ in tokens).strip().startswith(answers[0]["text"][:10])
