"""Device time of GPU work, measured with CUDA events, next to host time; the monotonic clock without a GPU.

Host time (``perf_counter`` around a block) on a GPU includes launch overhead and, for asynchronous work,
possibly none of the kernel time at all; CUDA events recorded on the stream before and after the work
measure what the device spent. Backends, tried in order by ``DeviceTimer.detect()``:

- ``torch``: ``torch.cuda.Event(enable_timing=True)`` on the current stream, when torch sees a GPU;
- ``cuda``: the CUDA driver API (``libcuda.so.1``, installed with the NVIDIA driver) through ctypes, with
  events on the legacy default stream, which orders them after the work of every blocking stream
  (onnxruntime-gpu's and FAISS GPU's included) - no torch needed;
- ``monotonic``: no GPU: device time is the host time and ``clock`` says so.

``ragheat_stage_device_seconds{stage, clock}`` (``DeviceTimeMetrics``) exports the device side; the host
side is the stage's own ``ragheat_stage_duration_seconds``.

    >>> timer = DeviceTimer.detect()
    >>> with timer.measure("embed") as timing:
    ...     session.run(...)
    >>> timing.device_seconds, timing.host_seconds, timing.clock
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass

CLOCKS = ("cuda", "monotonic")  # label values of ragheat_stage_device_seconds{clock}


@dataclass
class DeviceTiming:
    stage: str
    clock: str = "monotonic"  # "cuda" when measured with CUDA events
    host_seconds: float = 0.0
    device_seconds: float = 0.0


class _Measurement:
    def __init__(self, timer: "DeviceTimer", stage: str) -> None:
        self.timer, self.timing = timer, DeviceTiming(stage, "monotonic" if timer.backend == "monotonic" else "cuda")

    def __enter__(self) -> DeviceTiming:
        self.events = self.timer._record_start()
        self.start = time.perf_counter()
        return self.timing

    def __exit__(self, *exc) -> None:
        device = self.timer._record_end(self.events)  # synchronises on the end event: host time includes the wait
        self.timing.host_seconds = time.perf_counter() - self.start
        self.timing.device_seconds = self.timing.host_seconds if device is None else device
        if self.timer.on_timing is not None:
            self.timer.on_timing(self.timing)


class DeviceTimer:
    """Measures blocks of GPU work; ``backend`` is ``torch``, ``cuda`` or ``monotonic``."""

    def __init__(self, backend: str = "monotonic", on_timing=None) -> None:
        if backend not in ("torch", "cuda", "monotonic"):
            raise ValueError(f"backend must be torch, cuda or monotonic. Currently, it is {backend!r}")
        self.backend, self.on_timing = backend, on_timing
        self._cuda = _CudaDriver() if backend == "cuda" else None

    @classmethod
    def detect(cls, on_timing=None) -> "DeviceTimer":
        try:
            import torch

            if torch.cuda.is_available():
                return cls("torch", on_timing)
        except ImportError:
            pass
        if _CudaDriver.available():
            return cls("cuda", on_timing)
        return cls("monotonic", on_timing)

    def measure(self, stage: str) -> _Measurement:
        return _Measurement(self, stage)

    def _record_start(self):
        if self.backend == "torch":
            import torch

            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            return start, end
        if self.backend == "cuda":
            return self._cuda.record_start()
        return None

    def _record_end(self, events) -> float | None:
        if self.backend == "torch":
            start, end = events
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1000.0
        if self.backend == "cuda":
            return self._cuda.record_end(events)
        return None


class _CudaDriver:
    """The few driver-API calls an event timer needs, on the device's primary context."""

    _lib = None

    @classmethod
    def _load(cls):
        if cls._lib is None:
            lib = ctypes.CDLL("libcuda.so.1")
            count = ctypes.c_int(0)
            if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
                raise OSError("no CUDA device")
            cls._lib = lib
        return cls._lib

    @classmethod
    def available(cls) -> bool:
        try:
            cls._load()
            return True
        except OSError:
            return False

    def __init__(self) -> None:
        lib = self._load()
        device, self.context = ctypes.c_int(0), ctypes.c_void_p()
        self._check(lib.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
        self._check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.context), device), "cuDevicePrimaryCtxRetain")
        self.lib = lib

    @staticmethod
    def _check(status: int, call: str) -> None:
        if status != 0:
            raise RuntimeError(f"{call} failed with CUDA error {status}")

    def _event(self) -> ctypes.c_void_p:
        event = ctypes.c_void_p()
        self._check(self.lib.cuEventCreate(ctypes.byref(event), 0), "cuEventCreate")
        return event

    def record_start(self):
        self._check(self.lib.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        start, end = self._event(), self._event()
        self._check(self.lib.cuEventRecord(start, None), "cuEventRecord")  # None = the legacy default stream
        return start, end

    def record_end(self, events) -> float:
        start, end = events
        try:
            self._check(self.lib.cuEventRecord(end, None), "cuEventRecord")
            self._check(self.lib.cuEventSynchronize(end), "cuEventSynchronize")
            ms = ctypes.c_float()
            self._check(self.lib.cuEventElapsedTime(ctypes.byref(ms), start, end), "cuEventElapsedTime")
            return ms.value / 1000.0
        finally:
            self.lib.cuEventDestroy_v2(start)
            self.lib.cuEventDestroy_v2(end)


class DeviceTimeMetrics:
    """``ragheat_stage_device_seconds{stage, clock}``; pass ``record`` as a ``DeviceTimer``'s ``on_timing``."""

    def __init__(self, registry) -> None:
        from prometheus_client import Histogram

        from telemetry.buckets import LATENCY_SECONDS
        from telemetry.metrics import VLLM_METRICS

        self.histogram = Histogram(VLLM_METRICS["device_seconds"],
                                   "Device time of one stage's GPU work (CUDA events), or its host time when "
                                   "there is no GPU (clock=monotonic).", ["stage", "clock"],
                                   buckets=LATENCY_SECONDS, registry=registry)

    def record(self, timing: DeviceTiming) -> None:
        self.histogram.labels(timing.stage, timing.clock).observe(timing.device_seconds)
