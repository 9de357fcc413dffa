"""The CUDA-event timer: the monotonic fallback here; CUDA events where a GPU is (marked gpu)."""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry

from telemetry.cuda_timer import DeviceTimeMetrics, DeviceTimer, _CudaDriver
from telemetry.metrics import VLLM_METRICS


def test_monotonic_fallback_reports_host_time_as_device_time_and_says_so():
    registry = CollectorRegistry()
    metrics = DeviceTimeMetrics(registry)
    timer = DeviceTimer("monotonic", on_timing=metrics.record)
    with timer.measure("embed") as timing:
        time.sleep(0.02)
    assert timing.clock == "monotonic" and 0.02 <= timing.host_seconds < 0.5
    assert timing.device_seconds == timing.host_seconds
    name = VLLM_METRICS["device_seconds"]
    assert registry.get_sample_value(name + "_count", {"stage": "embed", "clock": "monotonic"}) == 1
    assert registry.get_sample_value(name + "_sum", {"stage": "embed", "clock": "monotonic"}) == timing.device_seconds


def test_detect_falls_back_without_a_gpu_and_rejects_unknown_backends():
    timer = DeviceTimer.detect()
    assert timer.backend in ("torch", "cuda", "monotonic")
    with pytest.raises(ValueError, match="backend"):
        DeviceTimer("opencl")


@pytest.mark.gpu
def test_cuda_events_time_device_work():
    if not _CudaDriver.available():
        pytest.skip("no CUDA device (libcuda.so.1 and a GPU are needed)")
    driver = _CudaDriver()
    timer = DeviceTimer("cuda")
    size = 1 << 30
    pointer = __import__("ctypes").c_uint64()
    driver._check(driver.lib.cuMemAlloc_v2(__import__("ctypes").byref(pointer), size), "cuMemAlloc")
    try:
        with timer.measure("probe") as idle:
            pass
        with timer.measure("probe") as busy:
            for _ in range(20):  # 20 GiB of memset on the legacy default stream: milliseconds of device work
                driver._check(driver.lib.cuMemsetD8Async(pointer, 1, size, None), "cuMemsetD8Async")
    finally:
        driver.lib.cuMemFree_v2(pointer)
    assert busy.clock == "cuda" and busy.device_seconds > 10 * idle.device_seconds
    assert 0 < busy.device_seconds <= busy.host_seconds * 1.05
