"""The pipeline's worker threads run at a lower CPU priority than the event loop.

Past the knee there are more runnable threads than cores: the workers (a query's stages), the event loop (accepting,
parsing, admitting and refusing), and often a load generator or a proxy beside the service. At equal priority the
kernel shares the cores evenly, so a refusal that costs the service next to nothing waits its turn behind queries it
will not answer, and reaches the client late. A nice value on the worker threads (Linux schedules threads,
and ``setpriority`` on a thread id lowers that thread alone) lets the event loop run first whenever it is runnable; the
workers still get every cycle it does not use. Raising one's own nice value needs no privilege. The gain is measured
side by side in docs/benchmarks.md (Capacity and admission control).

A language model server on the same cores (vLLM on CPU) then also runs before the query threads, which only read its
stream: the model's stages may take longer on a shared CPU; with ``admission.worker_nice`` 0 they compete evenly.

Scope: nice orders threads within one scheduling group. With ``kernel.sched_autogroup_enabled`` (desktop sessions) or
in a container's cgroup, it does not lower the service against other groups.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)
_state = threading.local()
_warned = False


def lower_this_thread(nice: int) -> None:
    """Give the calling thread ``nice`` (0-19; never a higher priority than it has) once in its life; later calls cost
    an attribute lookup. Where the platform cannot (no per-thread priority), say so once and carry on."""
    global _warned
    if nice <= 0 or getattr(_state, "nice", None) == nice:
        return
    try:
        tid = threading.get_native_id()
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:  # a service started under `nice` already is left as it is
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    except (AttributeError, OSError) as exc:  # AttributeError: no setpriority (Windows)
        if not _warned:
            _warned = True
            log.warning("admission.worker_nice=%d: the worker threads keep the usual priority (%s)", nice, exc)
    _state.nice = nice


def thread_nice() -> int:
    """The calling thread's own nice value (Linux: per thread)."""
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
