"""ragheat's vLLM plugin inside a real vLLM server: its per-step metrics move with load, and a KV cache too
small for the load shows preemptions, in agreement with vLLM's own counter."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from telemetry.metrics import VLLM_METRICS, VLLM_NATIVE_METRICS

pytestmark = pytest.mark.slow
PROMPT_TOKENS, OUTPUT_TOKENS = 64, 196  # 260 tokens = 9 blocks of 32 per request


def scrape(server) -> dict[tuple[str, tuple], float]:
    text = httpx.get(server.metrics_url, timeout=10).text
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("engine", "model_name")))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def delta(before: dict, after: dict, name: str, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def burst(server, concurrency: int, seed: int) -> None:
    """``concurrency`` distinct prompts at once (distinct: the prefix cache must not share their blocks)."""
    rng = np.random.default_rng(seed)

    async def main():
        async with httpx.AsyncClient(timeout=120) as client:
            async def one():
                response = await client.post(server.url + "/completions", json={
                    "model": "tiny", "prompt": rng.integers(10, 1500, PROMPT_TOKENS).tolist(),
                    "max_tokens": OUTPUT_TOKENS, "ignore_eos": True, "temperature": 0.0})
                assert response.status_code == 200, response.text
            await asyncio.gather(*(one() for _ in range(concurrency)))
    asyncio.run(main())


def test_plugin_metrics_are_served_next_to_vllms_own(vllm_server):
    burst(vllm_server, 1, seed=0)
    names = {name for name, _ in scrape(vllm_server)}
    for family in ("step_duration", "scheduled_tokens", "kv_blocks_allocated", "kv_blocks_freed"):
        assert VLLM_METRICS[family] + "_count" in names, family
    for family in ("kv_free_blocks", "kv_usage", "preemptions"):
        assert VLLM_METRICS[family] in names, family
    for native in ("ttft", "inter_token"):
        assert VLLM_NATIVE_METRICS[native] + "_count" in names, native
    for native in ("kv_usage", "running", "waiting", "preemptions"):
        assert VLLM_NATIVE_METRICS[native] in names, native


def test_more_concurrent_requests_allocate_more_blocks_and_batch_decode_tokens(vllm_server):
    m = VLLM_METRICS
    runs = {}
    for concurrency in (1, 4):
        before = scrape(vllm_server)
        burst(vllm_server, concurrency, seed=concurrency)
        after = scrape(vllm_server)
        runs[concurrency] = {
            "allocated": delta(before, after, m["kv_blocks_allocated"] + "_sum"),
            "freed": delta(before, after, m["kv_blocks_freed"] + "_sum"),
            "decode_steps": delta(before, after, m["scheduled_tokens"] + "_count", phase="decode"),
            "single_token_steps": delta(before, after, m["scheduled_tokens"] + "_bucket", phase="decode", le="1.0"),
            "prefill_tokens": delta(before, after, m["scheduled_tokens"] + "_sum", phase="prefill"),
        }
    one, four = runs[1], runs[4]
    assert one["allocated"] >= 9 and one["freed"] == one["allocated"], one  # a finished request frees its blocks
    assert four["allocated"] >= 3.5 * one["allocated"], runs
    assert four["prefill_tokens"] >= 4 * PROMPT_TOKENS > one["prefill_tokens"], runs
    assert one["single_token_steps"] == one["decode_steps"], one  # one sequence: one token per decode step
    assert four["single_token_steps"] < four["decode_steps"] / 2, four  # four sequences batched per step
    after = scrape(vllm_server)
    assert after[(m["kv_usage"], ())] == 0.0 and after[(m["kv_free_blocks"], ())] >= 40  # all released


def test_a_small_kv_cache_forces_preemptions_that_the_metrics_show(vllm_server):
    before = scrape(vllm_server)
    burst(vllm_server, 8, seed=8)  # 8 x 9 blocks > 48 blocks
    after = scrape(vllm_server)
    ours = delta(before, after, VLLM_METRICS["preemptions"])
    theirs = delta(before, after, VLLM_NATIVE_METRICS["preemptions"])
    assert ours > 0, "eight 9-block requests in a 48-block cache should have preempted"
    assert ours == theirs
