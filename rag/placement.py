"""Where the service's work runs and how its index memory is held: the settings section ``placement``.

Three knobs, each measured before ``ragheat tune`` keeps it (docs/tuning.md):

- ``placement.cpus``: the cores the service's threads run on. Applied to every thread of the process at start,
  before the models load, so the threads ONNX Runtime, FAISS and the web server create later inherit it (Linux
  gives each new thread its creator's affinity). A model server on other cores then never shares theirs.
- ``placement.math_threads``: FAISS's OpenMP threads (0 leaves FAISS's default, one per core).
- ``placement.memory``: ``default`` reads the token vectors into the page cache at warm-up (they may be evicted
  later); ``lock`` also locks every page the process has mapped once a generation is warm (``mlockall``: the dense
  index, the token vectors, the models), so no lookup waits on a fault or a re-read; ``hugepages`` copies the token
  vectors into anonymous memory advised for transparent huge pages (fewer TLB misses over a large, scattered read).

``host_capabilities`` says what the host can do for placement and what it cannot (cache allocation, isolated cores,
transparent huge pages, the locked-memory limit), so a report can say why a knob was not tried.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import resource
from pathlib import Path

import numpy as np

from rag.errors import ConfigurationError

MCL_CURRENT = 1


def parse_cpu_list(text: str) -> frozenset[int]:
    """``0-3,6`` (as ``taskset -c`` and the kernel's cpulist files write them) as a set; ValueError with a reason."""
    cpus: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        low, _, high = part.partition("-")
        try:
            first, last = int(low), int(high) if high else int(low)
        except ValueError:
            raise ValueError(f"{part!r} is not a CPU number or range (e.g. 0-3,6)") from None
        if first < 0 or last < first:
            raise ValueError(f"{part!r} is not a CPU range: it must run upwards from 0 or more")
        cpus.update(range(first, last + 1))
    if not cpus:
        raise ValueError("no CPU listed")
    return frozenset(cpus)


def format_cpu_list(cpus) -> str:
    """The shortest cpulist for ``cpus``: {0, 1, 2, 5} -> ``0-2,5``."""
    ordered, parts = sorted(cpus), []
    for cpu in ordered:
        if parts and parts[-1][1] == cpu - 1:
            parts[-1][1] = cpu
        else:
            parts.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


def usable_cpus() -> frozenset[int]:
    """The cores this process may run on now."""
    return frozenset(os.sched_getaffinity(0))


def pin_process(cpus: frozenset[int]) -> None:
    """Every thread of this process onto ``cpus`` (later threads inherit it); ConfigurationError naming the setting
    when a listed core is not one the process may use."""
    allowed = usable_cpus()
    if not cpus <= allowed:
        raise ConfigurationError(f"placement.cpus lists {format_cpu_list(cpus - allowed)}, which this process may not "
                                 f"run on (it may use {format_cpu_list(allowed)})")
    for task in Path("/proc/self/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except ProcessLookupError:  # the thread ended meanwhile
            pass


def set_math_threads(threads: int) -> None:
    """FAISS's OpenMP threads for this process (0: leave FAISS's default)."""
    if threads > 0:
        import faiss

        faiss.omp_set_num_threads(threads)


def apply_process_placement(cpus: str, math_threads: int) -> None:
    """``placement.cpus`` and ``placement.math_threads``, at start before anything heavy loads."""
    if cpus:
        pin_process(parse_cpu_list(cpus))
    set_math_threads(math_threads)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def lock_mapped_memory() -> None:
    """Fault in and lock every page the process has mapped now (``mlockall(MCL_CURRENT)``); ConfigurationError with
    the reason (the locked-memory limit, the missing capability) when the kernel refuses."""
    if _libc().mlockall(MCL_CURRENT) != 0:
        code = ctypes.get_errno()
        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        why = ("the locked-memory limit (ulimit -l: " + ("unlimited" if soft == resource.RLIM_INFINITY else
                                                         f"{soft // 1024} KiB") + ") is below what the service maps"
               if code in (errno.ENOMEM, errno.EAGAIN) else
               "locking needs CAP_IPC_LOCK or a locked-memory limit (ulimit -l) that covers it"
               if code == errno.EPERM else os.strerror(code))
        raise ConfigurationError(f"placement.memory=lock: the kernel refused to lock the service's memory ({why}); "
                                 "raise the limit (LimitMEMLOCK= in a unit, --ulimit memlock= in a container) or "
                                 "set placement.memory=default")


def huge_page_copy(array: np.ndarray) -> np.ndarray:
    """A copy of ``array`` in anonymous memory advised for transparent huge pages (``MADV_HUGEPAGE``), written once
    so its pages are present; the advice is a hint: the kernel backs what it can with huge pages."""
    size = max(array.nbytes, 1)
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        region.madvise(mmap.MADV_HUGEPAGE)
    copy = np.frombuffer(region, dtype=array.dtype, count=array.size).reshape(array.shape)
    copy[...] = array
    return copy


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def host_capabilities() -> dict:
    """What this host offers placement, each with a sentence where it lacks it: the cores, isolated cores (the
    kernel's ``isolcpus``), cache allocation (Intel RDT / AMD PQoS through resctrl), transparent huge pages, and how
    much memory may be locked."""
    cpus = usable_cpus()
    isolated = _read("/sys/devices/system/cpu/isolated") or ""
    flags = next((line.split(":", 1)[1].split() for line in (_read("/proc/cpuinfo") or "").splitlines()
                  if line.startswith("flags")), [])
    cat = "cat_l3" in flags or "cat_l2" in flags
    resctrl = Path("/sys/fs/resctrl/info").is_dir()
    thp = _read("/sys/kernel/mm/transparent_hugepage/enabled") or ""
    thp_mode = thp[thp.find("[") + 1:thp.find("]")] if "[" in thp else None
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    lockable = None if soft == resource.RLIM_INFINITY else soft
    lacks = {}
    if not isolated:
        lacks["isolated_cores"] = ("no isolated cores (isolcpus= on the kernel command line): the service's cores "
                                   "are shared with every other process the scheduler places there")
    if not cat:
        lacks["cache_allocation"] = ("the CPU reports no cache allocation technology (cat_l3): the last-level cache "
                                     "cannot be partitioned between the service and the model server")
    elif not resctrl:
        lacks["cache_allocation"] = "the CPU has cache allocation but resctrl is not mounted (/sys/fs/resctrl)"
    if thp_mode not in ("always", "madvise"):
        lacks["huge_pages"] = (f"transparent huge pages are {thp_mode or 'absent'}: placement.memory=hugepages has "
                               "no effect")
    if lockable is not None and lockable < (64 << 20) and os.geteuid() != 0:
        lacks["memory_lock"] = (f"the locked-memory limit is {lockable // 1024} KiB (ulimit -l) and the process has "
                                "no CAP_IPC_LOCK: placement.memory=lock would be refused")
    return {"cpus": format_cpu_list(cpus), "cores": len(cpus), "isolated_cores": isolated or None,
            "cache_allocation": cat and resctrl, "transparent_huge_pages": thp_mode,
            "memlock_limit_bytes": lockable, "root": os.geteuid() == 0, "lacks": lacks}
