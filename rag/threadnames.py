"""OS-level thread names that say which pipeline stage a thread is running.

The kernel knows a thread by its ``comm`` (15 bytes, set with ``prctl(PR_SET_NAME)``); eBPF probes read it
from tracepoint arguments (``sched_switch``'s ``prev_comm``/``next_comm``) or ``bpf_get_current_comm``.
Naming the thread ``rh:<stage>`` while a stage runs lets ``probes/`` attribute run-queue, off-CPU and
syscall time to stages without reading any kernel structure. Renaming costs one system call at each stage
boundary, called straight through ctypes with the GIL held (below).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading

PREFIX = "rh:"
_PR_SET_NAME, _PR_GET_NAME = 15, 16

# PyDLL, not CDLL: CDLL releases the GIL around every call, and re-acquiring it behind busy request threads can
# take far longer than prctl itself, which never blocks; so it is called with the GIL held.
_libc = ctypes.PyDLL(ctypes.util.find_library("c") or None, use_errno=True) if sys.platform == "linux" else None


def stage_comm(stage: str) -> bytes:
    """The comm a thread carries while running ``stage`` (truncated to the kernel's 15 bytes)."""
    return (PREFIX + stage).encode()[:15]


def stages_by_comm(stages) -> dict[bytes, str]:
    """The inverse of ``stage_comm`` over ``stages``; refuses names that truncate to the same comm."""
    table = {stage_comm(stage): stage for stage in stages}
    if len(table) != len(set(stages)):
        raise ValueError(f"stage names collide within the kernel's 15-byte thread names: {sorted(stages)}")
    return table


def get_name() -> bytes:
    """This thread's kernel name (b"" where the platform has none)."""
    if _libc is None:
        return b""
    buf = ctypes.create_string_buffer(16)
    _libc.prctl(_PR_GET_NAME, buf, 0, 0, 0)
    return buf.value


def set_name(name: bytes) -> None:
    """Rename this thread for the kernel (no-op off Linux)."""
    if _libc is not None:
        _libc.prctl(_PR_SET_NAME, name, 0, 0, 0)


_original_names: dict[int, bytes] = {}


def original_name() -> bytes:
    """This thread's name before any stage renamed it (read once per thread: a read costs a buffer and a
    system call, and stage boundaries are hot)."""
    ident = threading.get_ident()
    name = _original_names.get(ident)
    if name is None:
        name = get_name()
        if name.startswith(PREFIX.encode()):
            # A new thread inherits its creator's name: worker threads started by the rh:http event loop would
            # otherwise count their time between stages as http. Python's own thread name says what it is.
            name = threading.current_thread().name.encode("utf-8", "replace")[:15]
        _original_names[ident] = name
        if len(_original_names) > 4096:  # thread ids are reused; keep the map from growing without bound
            _original_names.clear()
    return name
