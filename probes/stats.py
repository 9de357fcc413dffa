"""What the probes measured, as plain data: thread names mapped to stages, log2 slots to histogram buckets.

No BPF and no Prometheus here (``probes.collector`` exports, ``probes.loader`` reads the kernel maps), so
all of it is testable without privileges.
"""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from rag.threadnames import stages_by_comm
from telemetry.buckets import KERNEL_LOG2_SECONDS
from telemetry.metrics import KERNEL_STAGES, KERNEL_TCP_STATES, SYSCALL_FAMILIES

STAGE_BY_COMM: dict[bytes, str] = stages_by_comm(KERNEL_STAGES)  # raises if two truncate alike
"""Kernel thread names (``comm``, truncated to 15 bytes as the kernel does) that identify a stage."""

TCP_STATE_LABELS = KERNEL_TCP_STATES
TCP_STATES = KERNEL_TCP_STATES[:-1]  # numbered from TCP_ESTABLISHED = 1; the last label is "other"


def stage_of(comm: bytes) -> str:
    """The ``stage`` label of a thread named ``comm``: its stage, ``http`` for the event loop, else ``other``."""
    return STAGE_BY_COMM.get(comm.split(b"\0", 1)[0], "other")


def tcp_state_label(state: int) -> str:
    """The ``state`` label of a kernel TCP state number (``other`` for an unknown one)."""
    return TCP_STATES[state - 1] if 1 <= state <= len(TCP_STATES) else "other"


@dataclass
class Log2Histogram:
    """Counts per log2 slot (slot k: [2^(k-1), 2^k) us; slot 0: under 1 us) and the exact sum."""

    slots: list[int] = field(default_factory=lambda: [0] * (len(KERNEL_LOG2_SECONDS) + 1))
    sum_seconds: float = 0.0

    def add(self, slot: int, count: int, sum_ns: int) -> None:
        self.slots[min(slot, len(self.slots) - 1)] += count
        self.sum_seconds += sum_ns / 1e9

    @property
    def count(self) -> int:
        return sum(self.slots)

    def cumulative_buckets(self) -> list[tuple[float, int]]:
        """``(le, count <= le)`` for each ``KERNEL_LOG2_SECONDS`` edge, then ``(inf, total)``.

        Slot k's values are below 2^k us, the k-th edge, so bucket k is exactly slots 0..k."""
        out, running = [], 0
        for edge, count in zip(KERNEL_LOG2_SECONDS, self.slots):
            running += count
            out.append((edge, running))
        out.append((float("inf"), self.count))
        return out


@dataclass
class KernelSnapshot:
    """Everything the probes have counted since they were attached (cumulative, like Prometheus counters)."""

    runqueue: dict[str, Log2Histogram] = field(default_factory=dict)                # stage
    offcpu: dict[tuple[str, str], Log2Histogram] = field(default_factory=dict)      # (stage, reason)
    syscall: dict[tuple[str, str], Log2Histogram] = field(default_factory=dict)     # (stage, family)
    tcp_retransmits: dict[str, int] = field(default_factory=dict)                   # state


HistRow = tuple[bytes, int, int, int, int]
"""One kernel map entry: (comm, label index, slot, count, sum of nanoseconds)."""


def aggregate(rows: Iterable[HistRow], label_names: tuple[str, ...] | None) -> dict:
    """Fold per-thread-name rows into histograms keyed by stage, or by (stage, label) with ``label_names``."""
    out: dict = {}
    for comm, label, slot, count, sum_ns in rows:
        stage = stage_of(comm)
        if label_names is None:
            key = stage
        else:
            key = (stage, label_names[label] if 0 <= label < len(label_names) else label_names[-1])
        out.setdefault(key, Log2Histogram()).add(slot, count, sum_ns)
    return out


# System-call families by name. A call belongs to one family by what it is, not by the file it acts on:
# read(2) on a socket is "read".
_FAMILY_NAMES = {
    "read": "read readv pread64 preadv preadv2",
    "write": "write writev pwrite64 pwritev pwritev2 sendfile splice tee vmsplice copy_file_range",
    "network": "socket socketpair connect accept accept4 bind listen shutdown sendto recvfrom sendmsg recvmsg "
               "sendmmsg recvmmsg getsockname getpeername setsockopt getsockopt",
    "poll": "poll ppoll select pselect6 epoll_wait epoll_pwait epoll_pwait2 epoll_ctl epoll_create epoll_create1",
    "futex": "futex futex_waitv futex_wait futex_wake futex_requeue",
    "memory": "mmap munmap mremap mprotect madvise brk mlock mlock2 munlock mlockall munlockall msync mincore "
              "pkey_mprotect process_madvise",
    "file": "open openat openat2 creat close close_range stat fstat lstat newfstatat statx lseek access faccessat "
            "faccessat2 getdents getdents64 fcntl ioctl dup dup2 dup3 pipe pipe2 unlink unlinkat rename renameat "
            "renameat2 mkdir mkdirat rmdir readlink readlinkat fsync fdatasync sync_file_range ftruncate truncate "
            "chmod fchmod fchmodat chown fchown lchown fchownat statfs fstatfs fallocate flock",
    "sleep": "nanosleep clock_nanosleep pause",
}
SYSCALL_FAMILY_BY_NAME = {name: family for family, names in _FAMILY_NAMES.items() for name in names.split()}
assert set(_FAMILY_NAMES) | {"other"} == set(SYSCALL_FAMILIES)


def family_of(syscall_name: str) -> str:
    """The system-call family (label) of a syscall name."""
    return SYSCALL_FAMILY_BY_NAME.get(syscall_name, "other")


_UNISTD = {"x86_64": "x86_64-linux-gnu/asm/unistd_64.h", "aarch64": "asm-generic/unistd.h"}  # linux-libc-dev


def syscall_numbers(machine: str | None = None, include: Path = Path("/usr/include")) -> dict[int, str]:
    """Syscall number -> name for this architecture, from the installed UAPI header (linux-libc-dev), else
    from BCC's own table; the numbers are the kernel's ABI, so the header need not match the kernel."""
    machine = machine or platform.machine()
    header = include / _UNISTD.get(machine, f"{machine}-linux-gnu/asm/unistd.h")
    numbers: dict[int, str] = {}
    if header.is_file():
        for name, number in re.findall(r"^#define __NR_(\w+)\s+(\d+)\s*$", header.read_text(), re.M):
            numbers.setdefault(int(number), name)
    if not numbers:
        try:
            from bcc.syscall import syscalls  # x86_64 only, or whatever `ausyscall --dump` says
            numbers = {nr: name.decode() for nr, name in syscalls.items()}
        except Exception:  # noqa: BLE001 - no table at all: every syscall reads "other", said in the docs
            numbers = {}
    return numbers


def syscall_family_table(size: int, numbers: dict[int, str] | None = None) -> list[int]:
    """Family index per syscall number ``0..size-1``, for the kernel's lookup array."""
    numbers = syscall_numbers() if numbers is None else numbers
    other = SYSCALL_FAMILIES.index("other")
    return [SYSCALL_FAMILIES.index(family_of(numbers[nr])) if nr in numbers else other for nr in range(size)]
