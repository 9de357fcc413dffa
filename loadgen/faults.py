"""Constant load and the faults injected under it, for the drills that check what ``ragheat explain`` says: an
open-loop sender whose rate can change while it runs (overload is the same sender, faster), processes spinning on
the host's cores (a neighbour taking the CPU), a dependency paused and resumed (a graph store or model server that
stalls or stops), a thread spinning inside the service (work no request explains), a neighbour taking the host's
memory (the page cache reclaimed and faulted back) and a neighbour writing to the disk."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from loadgen.cpu import process_tree


def wait_until(unix_time: float) -> None:
    """Sleep until a wall-clock instant (now if it has passed): the drills' phases are instants Prometheus also
    reads."""
    time.sleep(max(0.0, unix_time - time.time()))


class OpenLoop:
    """``with OpenLoop(url, rate, queries):`` POSTs ``{"query": ...}`` to ``url/v1/query`` at ``rate`` per second,
    whatever the answers' speed (an open loop: a slow service queues them); ``rate`` may change while it runs."""

    def __init__(self, url: str, rate: float, queries: Path, path: str = "/v1/query", workers: int = 96) -> None:
        self.url, self.rate, self.path = url.rstrip("/"), rate, path
        self.texts = [json.loads(line)["text"] for line in Path(queries).read_text().splitlines() if line.strip()]
        if not self.texts:
            raise ValueError(f"{queries}: no queries")
        self.sent = 0
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="open-loop")
        self._client = httpx.Client(timeout=30, limits=httpx.Limits(max_connections=workers))
        self._thread = threading.Thread(target=self._run, name="open-loop", daemon=True)

    def _ask(self, text: str) -> None:
        try:
            self._client.post(self.url + self.path, json={"query": text})
        except httpx.HTTPError:
            pass  # a refused or timed-out request is the service's signal, counted on its side

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self._pool.submit(self._ask, self.texts[self.sent % len(self.texts)])
            self.sent += 1
            next_at += 1.0 / self.rate
            time.sleep(max(0.0, next_at - time.monotonic()))

    def __enter__(self) -> "OpenLoop":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._pool.shutdown(wait=True)
        self._client.close()


class CpuHog:
    """``with CpuHog(processes):`` that many processes spinning in a loop, each wanting a whole core."""

    def __init__(self, processes: int | None = None) -> None:
        self.processes = processes or os.cpu_count() or 1
        self._children: list[subprocess.Popen] = []

    def __enter__(self) -> "CpuHog":
        self._children = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.processes)]
        return self

    def __exit__(self, *exc) -> None:
        for child in self._children:
            child.kill()
            child.wait()


def descendants_named(root: int, name: str) -> list[int]:
    """The processes under ``root`` (itself excluded) whose command name (``/proc/PID/comm``) is ``name``."""
    found = []
    for pid in process_tree([root]) - {root}:
        with contextlib.suppress(OSError):  # gone meanwhile
            if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                found.append(pid)
    return sorted(found)


class Paused:
    """``with Paused(pids, stopped_s, period_s):`` stops the processes (SIGSTOP) for ``stopped_s`` of every
    ``period_s`` and lets them run (SIGCONT) the rest: a dependency that stalls, as one on a slow disk, in long GC
    pauses or saturated by other clients does. ``stopped_s >= period_s`` keeps them stopped: a dependency that
    stopped answering. ``group=True`` signals each pid's process group (a server and its workers)."""

    def __init__(self, pids: list[int], stopped_s: float, period_s: float = 1.0, group: bool = False) -> None:
        if not pids:
            raise ValueError("Paused: no process to pause")
        self.pids, self.stopped_s, self.period_s, self.group = pids, stopped_s, period_s, group
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="paused", daemon=True)

    def _signal(self, sig: int) -> None:
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig) if self.group else os.kill(pid, sig)

    def _run(self) -> None:
        stopped_for = None if self.stopped_s >= self.period_s else self.stopped_s  # None: until the block ends
        while not self._stop.is_set():
            self._signal(signal.SIGSTOP)
            if self._stop.wait(stopped_for):
                break
            self._signal(signal.SIGCONT)
            self._stop.wait(self.period_s - self.stopped_s)

    def __enter__(self) -> "Paused":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._signal(signal.SIGCONT)


_SPINNER = '''"""Loaded at start-up through PYTHONPATH by the explain drills: a thread that spins in Python while
the file named by {variable} exists (a busy thread inside the service, holding the GIL the requests need)."""
import os, threading, time

def _spin(trigger):
    while True:
        while os.path.exists(trigger):
            deadline = time.monotonic() + 0.05
            while time.monotonic() < deadline:
                pass
        time.sleep(0.2)

if os.environ.get("{variable}"):
    threading.Thread(target=_spin, args=(os.environ["{variable}"],), name="drill-spinner", daemon=True).start()
'''


class InProcessSpinner:
    """A thread inside another Python process that spins in pure Python while ``with`` lasts: work no request
    explains, holding the interpreter's lock. The process must be started with ``env()`` (a ``sitecustomize``
    module on its ``PYTHONPATH`` starts the thread, idle until the trigger file appears); nothing in the service
    itself knows about it."""

    VARIABLE = "RAGHEAT_DRILL_SPIN_FILE"

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.trigger = self.folder / "spin"
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "sitecustomize.py").write_text(_SPINNER.replace("{variable}", self.VARIABLE))

    def env(self, base: dict[str, str]) -> dict[str, str]:
        path = os.pathsep.join(p for p in (str(self.folder), base.get("PYTHONPATH", "")) if p)
        return {**base, "PYTHONPATH": path, self.VARIABLE: str(self.trigger)}

    def __enter__(self) -> "InProcessSpinner":
        self.trigger.touch()
        return self

    def __exit__(self, *exc) -> None:
        self.trigger.unlink(missing_ok=True)


_MEMORY_HOG = """import signal, sys, time
leave, chunk = int(sys.argv[1]) << 20, 64 << 20
with open("/proc/self/oom_score_adj", "w") as f:
    f.write("1000")  # if the kernel must kill, it kills this
signal.signal(signal.SIGUSR1, lambda *_: globals().update(leave=int(sys.argv[2]) << 20))
held, said = [], False
def available():
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("MemAvailable:"))
while True:
    free = available()
    if free > leave + chunk:
        block = bytearray(chunk)
        block[::4096] = b"\\1" * (chunk // 4096)  # touch every page: calloc's zero pages take no memory
        held.append(block)
    elif free < leave // 2 and held:
        held.pop()
    else:
        if not said:
            print(len(held) * chunk >> 20, flush=True)  # holding (once): how many MiB
            said = True
        time.sleep(0.2)
"""


class MemoryHog:
    """A process beside the service that takes the host's memory: ``prepare()`` takes all that is free but
    ``headroom_mib`` more than ``leave_mib`` (quick, and costly in CPU: do it before the baseline), then
    ``with hog:`` takes the rest down to ``leave_mib`` and holds it, so the kernel reclaims the page cache every
    process runs from (the service's code, libraries, mapped files) and they fault it back in: memory pressure, as
    a leaking or greedy neighbour makes. It gives memory back when less than half of what it leaves is left, and
    asks the kernel to kill it first."""

    def __init__(self, leave_mib: int = 384, headroom_mib: int = 2048) -> None:
        self.leave_mib, self.headroom_mib = leave_mib, headroom_mib
        self._child: subprocess.Popen | None = None

    def prepare(self) -> int:
        """Start the process and return once it holds what it takes first (MiB)."""
        self._child = subprocess.Popen([sys.executable, "-c", _MEMORY_HOG, str(self.leave_mib + self.headroom_mib),
                                        str(self.leave_mib)], stdout=subprocess.PIPE, text=True)
        line = self._child.stdout.readline()
        if not line:
            raise RuntimeError(f"the memory hog exited with code {self._child.wait()} while taking memory")
        return int(line)

    def __enter__(self) -> "MemoryHog":
        if self._child is None:
            self.prepare()
        self._child.send_signal(signal.SIGUSR1)
        return self

    def __exit__(self, *exc) -> None:
        if self._child is not None:
            self._child.kill()
            self._child.wait()
            self._child.stdout.close()
            self._child = None


class MemoryCgroup:
    """A memory cgroup (v1 or v2) beside the caller's, for a process whose memory a drill squeezes.

    ``with group.holding_new_children():`` puts the caller in it while it starts the process, so the process and
    everything it loads are charged to the group (moving a running process would leave its pages charged where
    they are); ``with group.limited(keep):`` caps the group at what it uses less the share of its page cache
    ``keep`` does not leave, so the kernel reclaims its file pages (the index files it maps) and it faults them
    back in from the disk: memory pressure on a cold page cache, as a container's too tight limit makes. Only
    pages the group brought in are its own: evict a file's cached pages first (``evict_page_cache``)."""

    def __init__(self, name: str = "ragheat-drill") -> None:
        if os.geteuid() != 0:
            raise PermissionError("MemoryCgroup: squeezing a process's memory needs root (cgroup files)")
        own = {line.split(":", 2)[1]: line.split(":", 2)[2].strip()
               for line in Path("/proc/self/cgroup").read_text().splitlines()}
        v1 = Path("/sys/fs/cgroup/memory")
        if "memory" in own and v1.is_dir():
            self.v2, self.parent = False, v1 / own["memory"].lstrip("/")
        elif "" in own and (Path("/sys/fs/cgroup") / "cgroup.controllers").exists():
            self.v2, self.parent = True, Path("/sys/fs/cgroup") / own[""].lstrip("/")
        else:
            raise RuntimeError("MemoryCgroup: no memory cgroup controller (v1 or v2) is mounted")
        self.path = self.parent / name
        self.path.mkdir(exist_ok=True)
        self._limit_file().write_text(self.no_limit)  # a group a killed drill left keeps its limit otherwise

    @contextlib.contextmanager
    def holding_new_children(self):
        (self.path / "cgroup.procs").write_text(str(os.getpid()))
        try:
            yield self
        finally:
            (self.parent / "cgroup.procs").write_text(str(os.getpid()))

    def _stat(self) -> dict[str, int]:
        rows = (line.split() for line in (self.path / "memory.stat").read_text().splitlines())
        return {key: int(value) for key, value in rows}

    @property
    def no_limit(self) -> str:
        return "max" if self.v2 else "-1"

    def _limit_file(self) -> Path:
        return self.path / ("memory.high" if self.v2 else "memory.limit_in_bytes")

    @contextlib.contextmanager
    def limited(self, keep: float):
        cache = self._stat()["file" if self.v2 else "cache"]
        usage = int((self.path / ("memory.current" if self.v2 else "memory.usage_in_bytes")).read_text())
        limit = usage - int((1 - keep) * cache)  # usage counts kernel memory too: take the cache's share off it
        step = max(cache // 10, 1 << 20)
        while True:
            try:
                self._limit_file().write_text(str(limit))
                break
            except OSError as exc:  # EBUSY: the kernel could not reclaim down to it (pages in use): a little more
                if exc.errno != errno.EBUSY or limit >= usage:
                    raise
                limit += step
        # v1's limit is hard: a process whose anonymous memory grows past it is killed; v2's memory.high throttles
        # it instead. On v1 the group's tasks wait at the limit (its OOM killer off) and a watcher raises the limit a
        # step each time they do: the squeeze stays on the page cache, and the service lives.
        control, done = self.path / "memory.oom_control", threading.Event()

        def watch() -> None:
            nonlocal limit
            while not done.wait(0.02):
                if "under_oom 1" in control.read_text():
                    limit += step
                    self._limit_file().write_text(str(limit))

        watcher = None if self.v2 else threading.Thread(target=watch, name="rh:cgroup-watch", daemon=True)
        if watcher is not None:
            control.write_text("1")
            watcher.start()
        try:
            yield limit
        finally:
            if watcher is not None:
                done.set()
                watcher.join()
            self._limit_file().write_text(self.no_limit)
            if watcher is not None:
                control.write_text("0")

    def remove(self) -> None:
        """Once its processes are gone."""
        with contextlib.suppress(OSError):
            self.path.rmdir()


def evict_page_cache(folder: Path) -> int:
    """Drop the page cache of every file under ``folder`` that no process maps (``POSIX_FADV_DONTNEED``), so the
    next process to read them brings them in (and is charged for them); returns the files' bytes."""
    total = 0
    for path in Path(folder).rglob("*"):
        if path.is_file():
            with open(path, "rb") as file:
                os.fsync(file.fileno())  # dirty pages are not dropped: written back first
                os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            total += path.stat().st_size
    return total


_WRITER = """import os, sys
block, size = os.urandom(1 << 20), 256
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o600)
while True:
    for _ in range(size):
        os.write(fd, block)
        os.fsync(fd)
    os.lseek(fd, 0, os.SEEK_SET)
"""


class DiskWriter:
    """``with DiskWriter(folder):`` a process beside the service writing to a file in ``folder`` and syncing every
    megabyte (a neighbour flooding the disk: a backup, a log shipper, a compaction)."""

    def __init__(self, folder: Path) -> None:
        self.file = Path(folder) / "disk-writer.bin"
        self._child: subprocess.Popen | None = None

    def __enter__(self) -> "DiskWriter":
        self.file.parent.mkdir(parents=True, exist_ok=True)
        self._child = subprocess.Popen([sys.executable, "-c", _WRITER, str(self.file)])
        return self

    def __exit__(self, *exc) -> None:
        if self._child is not None:
            self._child.kill()
            self._child.wait()
        self.file.unlink(missing_ok=True)
