"""Device time of GPU work, measured with CUDA events, next to host time; the monotonic clock without a GPU.

Host time (``perf_counter`` around a call) on a GPU includes launch overhead and, for asynchronous work,
possibly none of the kernel time; CUDA events recorded on the stream before and after the work measure what
the device spent. Backends:

- ``cuda``: the CUDA driver API (``libcuda.so.1``, installed with the NVIDIA driver) through ctypes, with
  events on the legacy default stream, which orders them after the work of every blocking stream
  (onnxruntime-gpu's and FAISS GPU's included). ``detect()`` picks it when a device is present: no torch.
- ``torch``: ``torch.cuda.Event(enable_timing=True)`` on torch's current stream, for torch work on a stream
  of its own; chosen explicitly, never by ``detect()`` (importing torch costs seconds).
- ``monotonic``: no GPU: device time is the wrapped call's own host time and ``clock`` says so.

This module measures; ``telemetry/`` exports (``ragheat_stage_device_seconds{stage, clock}``, from the
``device_seconds``/``clock`` of a ``rag.types.StageTiming``). It imports neither torch nor a metrics library.

    >>> timer = DeviceTimer.detect()
    >>> outputs, timing = timer.call(session.run, None, feed)
    >>> timing.device_seconds, timing.host_seconds, timing.clock
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from typing import Any, Callable

CLOCKS = ("cuda", "monotonic")
"""Label values of ``ragheat_stage_device_seconds{clock}``: torch events are CUDA events too."""


@dataclass(frozen=True, slots=True)
class DeviceTiming:
    """One measured call: ``device_seconds`` by ``clock``, and the host time around it (which on a GPU
    includes waiting for the end event)."""

    clock: str
    device_seconds: float
    host_seconds: float


class DeviceTimer:
    """Times calls that may run on a GPU; ``backend`` is ``cuda``, ``torch`` or ``monotonic``."""

    def __init__(self, backend: str = "monotonic") -> None:
        if backend not in ("cuda", "torch", "monotonic"):
            raise ValueError(f"backend must be cuda, torch or monotonic. Currently, it is {backend!r}")
        self.backend = backend
        self.clock = "monotonic" if backend == "monotonic" else "cuda"
        self._cuda = _CudaDriver() if backend == "cuda" else None

    @classmethod
    def detect(cls) -> "DeviceTimer":
        """CUDA driver events when a CUDA device is present, else the monotonic clock."""
        return cls("cuda" if _CudaDriver.available() else "monotonic")

    @classmethod
    def for_device(cls, on_gpu: bool) -> "DeviceTimer":
        """The timer for work that runs on a GPU (``detect()``) or on the CPU (monotonic, no driver probe)."""
        return cls.detect() if on_gpu else cls("monotonic")

    def call(self, function: Callable[..., Any], *args: Any) -> tuple[Any, DeviceTiming]:
        """``function(*args)`` and its timing. On the CPU path this adds two ``perf_counter`` calls and one
        small object, nothing next to the model run it times: every request can afford it."""
        if self.backend == "monotonic":
            start = time.perf_counter()
            value = function(*args)
            seconds = time.perf_counter() - start
            return value, DeviceTiming("monotonic", seconds, seconds)
        with self.measure() as measurement:
            value = function(*args)
        return value, measurement.timing

    def measure(self) -> "_Measurement":
        """``with timer.measure() as m: ...`` then ``m.timing``: for a block rather than one call."""
        return _Measurement(self)

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


class _Measurement:
    timing: DeviceTiming | None = None

    def __init__(self, timer: DeviceTimer) -> None:
        self.timer = timer

    def __enter__(self) -> "_Measurement":
        self.events = self.timer._record_start()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        device = self.timer._record_end(self.events)  # synchronises on the end event: host time includes the wait
        host = time.perf_counter() - self.start
        self.timing = DeviceTiming(self.timer.clock, host if device is None else device, host)


class _CudaDriver:
    """The few driver-API calls an event timer needs, on device 0's primary context."""

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
