"""The device timer (rag/devicetime.py): the monotonic fallback here; CUDA events where a GPU is (marked gpu).
Its export, ``ragheat_stage_device_seconds``, is tested against a real scrape in tests/telemetry/test_scrape.py."""

from __future__ import annotations

import ctypes
import time

import pytest

from rag.devicetime import CLOCKS, DeviceTimer, _CudaDriver


def test_monotonic_fallback_times_the_call_and_says_so():
    timer = DeviceTimer("monotonic")
    value, timing = timer.call(lambda seconds: time.sleep(seconds) or "done", 0.02)
    assert value == "done" and timing.clock == "monotonic" == timer.clock
    assert 0.02 <= timing.host_seconds < 0.5 and timing.device_seconds == timing.host_seconds
    with timer.measure() as block:
        time.sleep(0.01)
    assert block.timing.clock == "monotonic" and 0.01 <= block.timing.device_seconds == block.timing.host_seconds


def test_a_failing_call_raises_its_own_error():
    with pytest.raises(ZeroDivisionError):
        DeviceTimer("monotonic").call(lambda: 1 / 0)


def test_detect_and_cpu_work_choose_a_known_clock_and_unknown_backends_are_rejected():
    assert DeviceTimer.detect().clock in CLOCKS
    assert DeviceTimer.for_device(False).backend == "monotonic"  # CPU work never probes the driver
    with pytest.raises(ValueError, match="backend must be cuda, torch or monotonic"):
        DeviceTimer("opencl")


def test_query_embedding_and_dense_search_carry_device_time(pipeline):
    """The embedder and the FAISS retriever wrap only their model run / index search."""
    embedding = pipeline.embedder.embed_query("Vitamin D deficiency is associated with bone density loss.")
    assert embedding.device is not None and embedding.device.clock == pipeline.embedder.device_timer.clock
    retrieval = pipeline.retrievers["dense"].retrieve("", embedding.vector, 5)
    assert retrieval.device is not None and len(retrieval.hits) == 5
    if embedding.device.clock == "monotonic":  # tokenising and hit building are outside the wrapped call
        assert 0 < embedding.device.device_seconds <= embedding.seconds
        assert 0 < retrieval.device.device_seconds <= retrieval.seconds
    assert pipeline.retrievers["bm25"].retrieve("bone density", None, 5).device is None  # never on a GPU


@pytest.mark.gpu
def test_cuda_events_time_device_work():
    # Deselected by the default -m 'not gpu'; selected without a device, tests/conftest.py fails it with a reason.
    assert _CudaDriver.available(), "no CUDA device (libcuda.so.1 and a GPU are needed)"
    driver = _CudaDriver()
    timer = DeviceTimer.detect()
    assert timer.backend == "cuda"
    size = 1 << 30
    pointer = ctypes.c_uint64()
    driver._check(driver.lib.cuMemAlloc_v2(ctypes.byref(pointer), size), "cuMemAlloc")

    def memset_20_gib():  # 20 GiB of memset on the legacy default stream: milliseconds of device work
        for _ in range(20):
            driver._check(driver.lib.cuMemsetD8Async(pointer, 1, size, None), "cuMemsetD8Async")

    try:
        _, idle = timer.call(lambda: None)
        _, busy = timer.call(memset_20_gib)
    finally:
        driver.lib.cuMemFree_v2(pointer)
    assert busy.clock == "cuda" and busy.device_seconds > 10 * idle.device_seconds
    assert 0 < busy.device_seconds <= busy.host_seconds * 1.05
