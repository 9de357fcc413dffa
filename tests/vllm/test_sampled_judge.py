"""The sampled judge (``quality.judge_rate``) against a real vLLM through ``ragheat serve``'s wiring: every answer's
first passage is judged off the request path, the model's replies are read as relevant / not relevant (random
weights: whichever, but read), and ``ragheat_quality_judged_total`` counts each outcome on /metrics."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from rag.errors import ConfigurationError
from rag.pipeline import RagPipeline
from rag.stages import JUDGE_OUTCOMES
from ragheat.service import build_service
from stack.servers import BackgroundServer

pytestmark = pytest.mark.slow
QUESTIONS = ("What causes drug resistance in bacteria?", "Does vitamin D deficiency cause bone loss?",
             "How do statins lower cholesterol?")


def judged(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    return {s.labels["outcome"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "ragheat_quality_judged_total"}


def test_every_answer_is_judged_off_the_request_path_and_counted(settings, subset_index, vllm_server):
    gen = settings.generation.model_copy(update={"generator": "openai", "base_url": vllm_server.url, "model": "",
                                                 "max_tokens": 16, "first_token_timeout_s": 20.0,
                                                 "prompt_budget_tokens": 120, "passages": 1})
    admission = settings.admission.model_copy(update={"deadline_ms": 60_000.0, "max_timeout_ms": 60_000.0})
    quality = settings.quality.model_copy(update={"judge_rate": 1.0})
    s = settings.model_copy(update={"generation": gen, "admission": admission, "quality": quality,
                                    "graph": settings.graph.model_copy(update={"enabled": False})})
    service = build_service(s, RagPipeline(s, subset_index), registry=CollectorRegistry())
    try:
        with BackgroundServer(service.app) as url:
            assert judged(url) == dict.fromkeys(JUDGE_OUTCOMES, 0.0)  # every outcome, from the first scrape
            for question in QUESTIONS:
                assert httpx.post(url + "/v1/query", json={"query": question}, timeout=120).status_code == 200
            deadline = time.monotonic() + 120
            while sum(judged(url).values()) < len(QUESTIONS) and time.monotonic() < deadline:
                time.sleep(0.5)
            counts = judged(url)
            last_error = service.generations.current.judge.last_error
    finally:
        service.close()
    assert counts["failed"] == counts["dropped"] == 0, (counts, last_error)
    assert counts["relevant"] + counts["not_relevant"] + counts["unparsed"] == len(QUESTIONS), counts


def test_a_judge_without_a_model_is_refused_at_start(settings, subset_index):
    s = settings.model_copy(update={"quality": settings.quality.model_copy(update={"judge_rate": 0.1})})
    with pytest.raises(ConfigurationError, match="quality.judge_rate needs a language model"):
        RagPipeline(s, subset_index).warm_up()
