"""Admission control, deadlines and the queue stage (rag/api/admission.py, rag/deadline.py), against a real uvicorn
serving a real SciFact-subset index with telemetry on, and the controller itself on an event loop.

Slowness is injected with ``faults.delay_stage`` (the stage sleeps inside its own timing), so the tests do not depend
on how fast this machine is: a 300 ms stage is slow on any machine."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from api_testkit import metric_values, serve_live, with_sections
from rag.api.admission import SHED_REASONS, AdmissionController, Shed, Slot, parse_timeout_header
from rag.api.worker_priority import lower_this_thread, thread_nice
from rag.deadline import Deadline, ServiceTimes
from rag.pipeline import RagPipeline
from rag.settings import AdmissionSettings
from rag.slo import SLO_MS
from rag.types import StageTiming

QUERY = "0-dimensional biomaterials lack inductive properties."
DELAY_MS = 300.0


def _scrape(url: str) -> str:
    return httpx.get(url + "/metrics", timeout=30).text


def _stage_counts(text: str) -> dict[str, float]:
    return metric_values(text, "ragheat_stage_duration_seconds_count", "stage")


def _shed(text: str) -> dict[str, float]:
    return metric_values(text, "ragheat_requests_shed_total", "reason")


def _parse_sse(text: str) -> list[tuple[str, dict]]:
    events = []
    for block in text.split("\n\n"):
        if block.strip():
            fields = dict(line.split(": ", 1) for line in block.splitlines())
            events.append((fields["event"], json.loads(fields["data"])))
    return events


# -- the controller and the deadline, without a server ---------------------------------------------------------


def test_slots_then_queue_then_queue_full_and_release_hands_on():
    async def scenario():
        times = ServiceTimes()
        controller = AdmissionController(1, 1, times)
        now = time.perf_counter()
        first = await controller.acquire(now, 10.0)
        assert isinstance(first, Slot) and controller.in_flight == 1
        queued = asyncio.ensure_future(controller.acquire(now, 10.0))
        await asyncio.sleep(0.01)
        assert not queued.done() and controller.waiting == 1
        full = await controller.acquire(now, 10.0)
        assert isinstance(full, Shed) and full.reason == "queue_full" and full.headers["Retry-After"] == "1"
        first.release()
        first.release()  # idempotent: the slot goes to the waiter once
        second = await asyncio.wait_for(queued, 1)
        assert isinstance(second, Slot) and controller.in_flight == 1 and controller.waiting == 0
        second.release()
        assert controller.in_flight == 0
        return controller.counts

    assert asyncio.run(scenario()) == {"queue_full": 1, "deadline": 0, "expired": 0}


@pytest.mark.serial  # a refusal's few milliseconds, which another test's load on the same cores would stretch
def test_predicted_miss_is_shed_at_once_and_a_queued_query_expires_at_its_deadline():
    async def scenario():
        times = ServiceTimes()
        times.observe([StageTiming("embed", 0.2)], 0.2)  # each query holds its slot ~200 ms
        controller = AdmissionController(1, 10, times)
        heard = []
        controller.listeners.append(heard.append)
        holder = await controller.acquire(time.perf_counter(), 10.0)
        started = time.perf_counter()
        shed = await controller.acquire(started, 0.1)  # 200 ms to a slot + 200 ms of its own > 100 ms
        refusal_s = time.perf_counter() - started
        assert isinstance(shed, Shed) and shed.reason == "deadline", shed
        assert refusal_s < 0.005, f"a refusal must not wait: {refusal_s * 1000:.2f} ms"
        times.service_s = times.core_s = 0.001  # the prediction says it fits, but the slot never frees
        started = time.perf_counter()
        expired = await controller.acquire(started, 0.05)
        waited = time.perf_counter() - started
        assert isinstance(expired, Shed) and expired.reason == "expired", expired
        assert 0.03 <= waited < 0.5, waited
        holder.release()
        assert controller.in_flight == 0 and controller.waiting == 0
        return heard

    assert asyncio.run(scenario()) == ["deadline", "expired"]


def test_a_free_slot_admits_even_a_tight_deadline_and_a_busy_one_sheds_it():
    async def scenario():
        times = ServiceTimes()
        times.observe([StageTiming("embed", 0.05)], 0.05)
        controller = AdmissionController(1, 4, times)
        free = await controller.acquire(time.perf_counter(), 0.01)  # nothing to wait for: its deadline degrades it
        busy = await controller.acquire(time.perf_counter(), 0.01)
        ample = asyncio.ensure_future(controller.acquire(time.perf_counter(), 1.0))
        await asyncio.sleep(0.01)
        free.release()
        return free, busy, await asyncio.wait_for(ample, 1)

    free, busy, ample = asyncio.run(scenario())
    assert isinstance(free, Slot) and isinstance(ample, Slot)
    assert isinstance(busy, Shed) and busy.reason == "deadline"
    assert float(busy.headers["Server-Timing"].split("dur=")[1]) < 5


def test_a_deadline_skips_an_optional_stage_it_cannot_hold_and_retries_it_when_the_estimate_is_old():
    clock = [0.0]
    times = ServiceTimes(alpha=1.0, ttl_s=5.0, clock=lambda: clock[0])
    times.observe([StageTiming("rerank", 0.3), StageTiming("generate", 0.01), StageTiming("queue", 9.0)], 0.35)
    assert times.stage("queue") is None, "waiting is not service"
    assert times.core_s == pytest.approx(0.05) and times.service_s == pytest.approx(0.35)
    deadline = Deadline(deadline_at=time.perf_counter() + 0.2, times=times)
    why = deadline.shortfall("rerank", then=("generate",))
    assert why.startswith("deadline:") and "rerank" in why
    assert deadline.shortfall("hyde") is None, "a stage never measured runs (and is measured)"
    assert Deadline(time.perf_counter() + 1.0, times).shortfall("rerank", then=("generate",)) is None
    assert Deadline(time.perf_counter() + 0.2, times, enabled=False).shortfall("rerank") is None
    clock[0] = 6.0  # the estimate is older than ttl_s: the stage may have got faster
    assert Deadline(time.perf_counter() + 0.2, times).shortfall("rerank") is None


def test_a_stale_estimate_is_replaced_by_the_next_run_not_averaged_with_it():
    # A cold start's first rerank (page faults on the token vectors) took 0.8 s: rerank is skipped until the estimate
    # is older than ttl_s; the one run that follows must let it back in, however heavily the average weighs the past.
    clock = [0.0]
    times = ServiceTimes(alpha=0.2, ttl_s=5.0, clock=lambda: clock[0])
    times.observe([StageTiming("rerank", 0.8)], 0.8)
    assert Deadline(time.perf_counter() + 0.4, times).shortfall("rerank") is not None
    clock[0] = 6.0
    times.observe([StageTiming("rerank", 0.002)], 0.01)
    assert times.stage("rerank") == pytest.approx(0.002)
    assert Deadline(time.perf_counter() + 0.4, times).shortfall("rerank") is None
    clock[0] = 7.0  # a fresh estimate is still averaged: one slow run does not decide alone
    times.observe([StageTiming("rerank", 0.102)], 0.11)
    assert times.stage("rerank") == pytest.approx(0.002 + 0.2 * 0.1)


@pytest.mark.parametrize("value, problem", [("abc", "whole number"), ("0", "outside"), ("-5", "whole number"),
                                            ("1.5", "whole number"), ("20001", "outside"), ("", "whole number")])
def test_timeout_header_is_validated_with_a_reason(value, problem):
    with pytest.raises(ValueError, match=problem):
        parse_timeout_header(value, 20_000)
    assert parse_timeout_header(" 250 ", 20_000) == 250.0 and parse_timeout_header(None, 20_000) is None


def test_deadline_is_the_slo_by_default_and_the_tighter_of_body_and_header():
    controller = AdmissionController(1, 1, ServiceTimes())
    assert controller.deadline_s(None, None) == pytest.approx(SLO_MS / 1000)
    assert controller.deadline_s(100, "300") == pytest.approx(0.1)
    assert controller.deadline_s(300, "100") == pytest.approx(0.1)
    with pytest.raises(ValueError, match="timeout_ms"):
        controller.deadline_s(10_001, None)


# -- over HTTP -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plain(settings, subset_index):
    """Default admission settings."""
    s = with_sections(settings, server={"reload_poll_s": 0})
    with serve_live(s, RagPipeline(s, subset_index)) as live:
        yield live


def test_queue_stage_in_the_response_the_stream_and_the_metrics(plain):
    before = _stage_counts(_scrape(plain.url)).get("queue", 0.0)
    with httpx.Client(base_url=plain.url, timeout=60) as client:
        body = client.post("/v1/query", json={"query": QUERY}).json()
        names = [s["name"] for s in body["stages"]]
        assert names[0] == "queue" and names.count("queue") == 1, names
        assert 0 <= body["stages"][0]["ms"] < 1000
        stream = client.post("/v1/query/stream", json={"query": QUERY})
        assert stream.status_code == 200, stream.text
        done = [data for event, data in _parse_sse(stream.text) if event == "done"][0]
        assert done["stages"][0]["name"] == "queue", done["stages"]
    after = _stage_counts(_scrape(plain.url))
    assert after["queue"] - before == 2, after
    assert set(_shed(_scrape(plain.url))) == set(SHED_REASONS), "every shed reason is exported from the start"


def _threads_by_nice() -> dict[int, set[str]]:
    """This process's threads (kernel names) by nice value, from /proc/self/task/*/stat (field 19)."""
    out: dict[int, set[str]] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except FileNotFoundError:  # the thread ended
            continue
        name, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        out.setdefault(int(fields[16]), set()).add(name)
    return out


def test_queries_run_on_threads_below_the_event_loop_in_priority(plain):
    # Past the knee the event loop (admission, refusals) must get the cores before the workers (worker_priority.py).
    response = httpx.post(plain.url + "/v1/query", json={"query": QUERY}, timeout=30)
    assert response.status_code == 200, response.text
    base = os.getpriority(os.PRIO_PROCESS, 0)  # 0, unless the suite itself runs under `nice`
    by_nice = _threads_by_nice()
    assert AdmissionSettings().worker_nice == 10 and by_nice.get(max(base, 10)), by_nice
    if base < 10:
        assert "rh:http" in by_nice.get(base, set()), f"the event loop keeps the usual priority: {by_nice}"


def test_lower_this_thread_lowers_that_thread_alone_and_once():
    seen = []

    def worker():
        lower_this_thread(7)
        lower_this_thread(7)  # once per thread: the second call makes no system call and changes nothing
        seen.append(thread_nice())

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    base = thread_nice()
    assert seen == [max(base, 7)] and thread_nice() == base, "the calling thread alone"
    lower_this_thread(0)  # 0: the usual priority, nothing to do
    assert thread_nice() == base


@pytest.mark.parametrize("body, headers, needle", [
    ({"timeout_ms": 0}, {}, "timeout_ms"),
    ({"timeout_ms": "100"}, {}, "timeout_ms"),
    ({"timeout_ms": 1.5}, {}, "timeout_ms"),
    ({"timeout_ms": 10_001}, {}, "admission.max_timeout_ms"),
    ({}, {"X-Request-Timeout-Ms": "soon"}, "X-Request-Timeout-Ms"),
    ({}, {"X-Request-Timeout-Ms": "0"}, "X-Request-Timeout-Ms"),
    ({}, {"X-Request-Timeout-Ms": "99999999"}, "X-Request-Timeout-Ms"),
], ids=["zero", "string", "fraction", "over-max", "header-word", "header-zero", "header-huge"])
@pytest.mark.parametrize("path", ["/v1/query", "/v1/query/stream"])
def test_bad_deadlines_are_422_with_a_reason(plain, body, headers, needle, path):
    response = httpx.post(plain.url + path, json={"query": QUERY, **body}, headers=headers, timeout=30)
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "invalid_request" and needle in response.json()["reason"], response.json()


def test_a_good_deadline_is_served(plain):
    response = httpx.post(plain.url + "/v1/query", json={"query": QUERY, "timeout_ms": 5000},
                          headers={"X-Request-Timeout-Ms": "4000"}, timeout=30)
    assert response.status_code == 200 and response.json()["citations"], response.text


@pytest.fixture(scope="module")
def slow(settings, subset_index):
    """One query in flight at a time, two waiting, and an embed stage that takes DELAY_MS."""
    s = with_sections(settings, server={"reload_poll_s": 0}, admission={"max_in_flight": 1, "max_queue": 2},
                      faults={"delay_stage": "embed", "delay_ms": DELAY_MS})
    with serve_live(s, RagPipeline(s, subset_index)) as live:
        yield live


def _post_timed(client: httpx.Client, body: dict) -> tuple[int, float, httpx.Response]:
    started = time.perf_counter()
    response = client.post("/v1/query", json=body)
    return response.status_code, time.perf_counter() - started, response


@pytest.fixture
def shared(slow):
    """One client for every thread (a client per request would spend tens of ms setting itself up, on the same
    cores as the server, and time that instead of the refusal)."""
    with httpx.Client(base_url=slow.url, timeout=60, limits=httpx.Limits(max_connections=32)) as client:
        for _ in range(3):
            client.get("/healthz")
        yield client


@pytest.mark.serial  # the refusals' milliseconds, which another test's load on the same cores would stretch
def test_overload_is_shed_at_once_with_retry_after_counted_and_never_500(slow, shared):
    shared.post("/v1/query", json={"query": QUERY, "timeout_ms": 5000})  # learn ~300 ms
    before = _shed(_scrape(slow.url))
    with ThreadPoolExecutor(12) as pool:
        outcomes = list(pool.map(lambda i: _post_timed(shared, {"query": f"{QUERY} {i}", "timeout_ms": 5000}),
                                 range(12)))
    statuses = [status for status, _, _ in outcomes]
    assert 500 not in statuses and set(statuses) <= {200, 503}, statuses
    served = [seconds for status, seconds, _ in outcomes if status == 200]
    refused = [(seconds, response) for status, seconds, response in outcomes if status == 503]
    assert 1 <= len(served) <= 3 + 2, statuses  # at most one in flight and two waiting at a time, give or take
    assert refused, statuses
    for _, response in refused:
        assert response.headers["Retry-After"].isdigit() and int(response.headers["Retry-After"]) >= 1
        assert response.json()["error"] in SHED_REASONS and "overloaded" in response.json()["reason"]
    # The service's own time from the arrival stamp to the refusal (its Server-Timing header): decided on the event
    # loop, before any thread-pool hop, so it stays within 5 ms however busy the workers are.
    held_ms = sorted(float(r.headers["Server-Timing"].split("dur=")[1]) for _, r in refused)
    assert statistics.median(held_ms) <= 5.0, held_ms
    # Client-side latency of a refusal (loopback HTTP included) against the 300 ms a query takes: refused at once.
    refusal_ms = sorted(seconds * 1000 for seconds, _ in refused)
    assert statistics.median(refusal_ms) < 50 and refusal_ms[-1] < DELAY_MS, refusal_ms
    after = _shed(_scrape(slow.url))
    counted = {reason: after[reason] - before[reason] for reason in SHED_REASONS}
    by_kind = {reason: sum(r.json()["error"] == reason for _, r in refused) for reason in SHED_REASONS}
    assert counted == by_kind, (counted, by_kind)


def test_a_query_that_would_miss_its_deadline_is_shed_and_a_patient_one_waits(slow, shared):
    shared.post("/v1/query", json={"query": QUERY, "timeout_ms": 5000})  # learn ~300 ms, whichever test ran first
    with ThreadPoolExecutor(2) as pool:
        holder = pool.submit(_post_timed, shared, {"query": QUERY, "timeout_ms": 5000})
        time.sleep(0.1)  # the holder is in flight
        status, seconds, response = _post_timed(shared, {"query": QUERY, "timeout_ms": 200})
        patient = pool.submit(_post_timed, shared, {"query": QUERY, "timeout_ms": 5000})
        assert status == 503 and response.json()["error"] == "deadline", response.text
        assert seconds < 0.1, seconds
        assert holder.result()[0] == 200 and patient.result()[0] == 200


@pytest.fixture(scope="module")
def slow_rerank(settings, subset_index):
    """Reranking on, and a rerank stage that takes DELAY_MS."""
    s = with_sections(settings, server={"reload_poll_s": 0}, rerank={"enabled": True},
                      faults={"delay_stage": "rerank", "delay_ms": DELAY_MS})
    with serve_live(s, RagPipeline(s, subset_index)) as live:
        yield live


def test_an_optional_stage_the_deadline_cannot_hold_is_skipped_and_listed(slow_rerank):
    url = slow_rerank.url
    before = metric_values(_scrape(url), "ragheat_stage_skipped_total", "stage").get("rerank", 0.0)
    with httpx.Client(base_url=url, timeout=60) as client:
        full = client.post("/v1/query", json={"query": QUERY, "top_k": 3})  # the SLO holds 300 ms of rerank
        assert full.status_code == 200 and "rerank" in [s["name"] for s in full.json()["stages"]], full.text
        assert full.json()["skipped_stages"] == [] and full.json()["degraded"] is False
        tight = client.post("/v1/query", json={"query": QUERY, "top_k": 3}, headers={"X-Request-Timeout-Ms": "150"})
        body = tight.json()
        assert tight.status_code == 200, tight.text
        assert "rerank" not in [s["name"] for s in body["stages"]] and len(body["citations"]) == 3
        assert [s["stage"] for s in body["skipped_stages"]] == ["rerank"], body["skipped_stages"]
        assert body["skipped_stages"][0]["reason"].startswith("deadline:") and body["degraded"] is True
        stream = client.post("/v1/query/stream", json={"query": QUERY, "top_k": 3, "timeout_ms": 150})
        done = [data for event, data in _parse_sse(stream.text) if event == "done"][0]
        assert [s["stage"] for s in done["skipped_stages"]] == ["rerank"] and done["degraded"] is True, done
    after = metric_values(_scrape(url), "ragheat_stage_skipped_total", "stage")["rerank"]
    assert after - before == 2


def test_the_language_model_is_skipped_when_the_deadline_cannot_hold_it(settings, subset_index):
    """The language model is optional too: with its recent time over what the deadline leaves, the extractive answer
    is served, degraded as slow, and the model is never asked."""

    class NeverAsked:
        name, metrics_dir = "stub", None

        def stream(self, query, passages):
            raise AssertionError("the deadline should have skipped the language model")

        def close(self):
            pass

    pipeline = RagPipeline(settings, subset_index)
    pipeline.warm_up()
    pipeline.llm = NeverAsked()
    times = ServiceTimes()
    times.observe([StageTiming("generate_prefill", 0.3), StageTiming("generate_decode", 0.5),
                   StageTiming("support_check", 0.01)], 0.85)
    arrival = time.perf_counter()
    result = pipeline.query(QUERY, 3, arrival=arrival, deadline=Deadline(arrival + 0.2, times))
    assert result.generator == "extractive" and result.degraded_reason == "slow" and result.sources
    assert list(result.skipped) == ["generate_prefill"] and "language model" in result.skipped["generate_prefill"]
    assert result.degraded_detail == result.skipped["generate_prefill"]
    assert [s.name for s in result.stages][0] == "queue" and "generate_prefill" not in [s.name for s in result.stages]
