"""The openai generator against a real vLLM: answers carry generation stats and support flags, and
/v1/query/stream forwards tokens as they arrive. Random weights write noise, which the support check must catch
every time: the noise is never served, the extractive answer is (degraded, ``unsupported``)."""

from __future__ import annotations

import json
import re
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
                                                 "prompt_budget_tokens": 120,
                                                 "passages": 1})  # prompt + answer within max_model_len 512
    # A deadline the model's first answer on two loaded cores cannot exhaust: with the default one, the stream's
    # request (the second) may be predicted too slow for the model and answered extractively without a token.
    admission = settings.admission.model_copy(update={"deadline_ms": 60_000.0, "max_timeout_ms": 60_000.0})
    llm_settings = settings.model_copy(update={"generation": gen, "admission": admission})
    pipeline = RagPipeline(llm_settings, subset_index)
    pipeline.warm_up()
    with BackgroundServer(create_app(llm_settings, pipeline=pipeline)) as url:
        yield url


def test_noise_is_never_served_the_extractive_answer_is(llm_url):
    body = httpx.post(llm_url + "/v1/query", json={"query": QUESTION}, timeout=60).json()
    assert body["generator"] == "extractive" and body["degraded"] and body["degraded_reason"] == "unsupported", body
    # The model did answer, and was timed.
    assert body["generation"]["model"] == "tiny"
    assert 0 < body["generation"]["ttft_ms"] and 1 <= body["generation"]["output_tokens"] <= 48
    names = [s["name"] for s in body["stages"]]
    assert names[-4:] == ["generate_prefill", "generate_decode", "support_check", "generate"], names
    # noise cites nothing the passages say: every sentence is flagged, counted and dropped
    assert body["support"] and all(not s["supported"] and s["dropped"] for s in body["support"])
    assert body["unsupported_sentences"] == body["dropped_sentences"] == len(body["support"])
    # what is served is the passages' own sentences, each cited
    passages = {c["number"]: c["text"] for c in body["citations"]}
    served = re.findall(r"(.+?) \[(\d+)\](?: |$)", body["answer"])
    assert served and all(sentence in passages[int(n)] for sentence, n in served), body["answer"]


def test_stream_forwards_tokens_then_says_to_discard_them(llm_url):
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
    assert kinds[0] == "sources" and kinds[-1] == "done", kinds
    tokens = [(data, t) for k, data, t in arrivals if k == "token"]
    assert len(tokens) >= 2, arrivals[-1][1]
    assert tokens[0][1] < tokens[-1][1] < arrivals[-1][2], "tokens must arrive one by one, before the end"
    degraded = next(data for k, data, _ in arrivals if k == "degraded")
    assert degraded["reason"] == "unsupported" and degraded["discard_tokens"] == len(tokens)
    assert kinds.index("degraded") > kinds.index("token") and kinds.index("degraded") < kinds.index("answer")
    done = arrivals[-1][1]
    assert done["generator"] == "extractive" and done["degraded_reason"] == "unsupported"
    assert done["generation"]["output_tokens"] >= len(tokens) - 1
    noise = "".join(d["text"] for d, _ in tokens).strip()
    assert not any(noise[:20] in data["text"] for k, data, _ in arrivals if k == "answer")
