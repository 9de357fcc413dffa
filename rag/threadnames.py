"""OS-level thread names that say which pipeline stage a thread is running.

The kernel knows a thread by its ``comm`` (15 bytes, set with ``prctl(PR_SET_NAME)``); eBPF probes read it
from tracepoint arguments (``sched_switch``'s ``prev_comm``/``next_comm``) or ``bpf_get_current_comm``.
Naming the thread ``rh:<stage>`` while a stage runs lets ``probes/`` attribute run-queue, off-CPU and
syscall time to stages without reading any kernel structure. Renaming costs one system call (about a
microsecond) at each stage boundary.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

PREFIX = "rh:"
_PR_SET_NAME, _PR_GET_NAME = 15, 16

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True) if sys.platform == "linux" else None


def stage_comm(stage: str) -> bytes:
    """The comm a thread carries while running ``stage`` (truncated to the kernel's 15 bytes)."""
    return (PREFIX + stage).encode()[:15]


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
