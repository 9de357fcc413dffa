"""Child processes: start one with its output in a log file, wait until it answers, stop it with SIGTERM and then
SIGKILL. The serve process, the local Prometheus, the vLLM server, ``ragheat stack up`` and the embedded graph store
(``rag.graph.falkordb``) all use this one helper, so each of them starts, reports a failed start and stops the same
way. It lives in ``rag/`` because the RAG domain itself needs a child at run time (the graph store); ``stack/``
builds its topology on it.

``die_with_parent`` children are asked to die with this process (``PR_SET_PDEATHSIG``). Linux sends that signal when
the *thread* that forked the child exits, not the process, so such children are forked from a thread that lives as
long as the process: the main thread when the caller is on it, else one spawner thread started once. (A pipeline
warmed up in a server's worker thread would otherwise lose its graph store when that worker retires.)

    >>> with ChildProcess("prometheus", [binary, ...], log_path=folder / "prometheus.log") as child:
    ...     child.wait_until_ok("http://127.0.0.1:9090/-/ready", timeout_s=30)
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

import httpx

LOG_TAIL_CHARS = 1500


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the caller binds it soon after)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_until_ok(url: str, timeout_s: float, alive: Callable[[], bool], what: str) -> None:
    """Poll ``url`` until it answers 200; fail early, naming ``what``, if ``alive()`` turns false."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"{what} stopped during start-up (see its log)")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{what}: {url} did not answer 200 within {timeout_s} s")


def terminate(send: Callable[[int], None], gone: Callable[[], bool], timeout_s: float,
              kill_timeout_s: float = 5.0) -> None:
    """``send(SIGTERM)``, then ``send(SIGKILL)`` if ``gone()`` is still false after ``timeout_s``; returns once
    ``gone()`` (or the kill's wait is over). A ``send`` that finds nobody (``ProcessLookupError``) ends it.
    SIGCONT follows SIGTERM, as systemd sends it: a stopped process would otherwise hold its SIGTERM until the kill."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, kill_timeout_s)):
        if gone():
            return
        try:
            send(sig)
            if sig == signal.SIGTERM:
                send(signal.SIGCONT)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if gone():
                return
            time.sleep(0.05)


def group_members(pgid: int, proc: Path = Path("/proc")) -> list[int]:
    """Running (not zombie) processes of process group ``pgid``."""
    members = []
    for entry in os.listdir(proc):
        if entry.isdigit() and (fields := stat_fields(entry, proc)) and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def stat_fields(pid: int | str, proc: Path = Path("/proc")) -> list[str] | None:
    """/proc/PID/stat after the command name (which may hold spaces or parentheses); None when gone."""
    try:
        return (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


_PR_SET_PDEATHSIG = 1


def _die_with_parent_of(parent_pid: int) -> Callable[[], None]:
    """The ``preexec_fn`` that asks Linux to SIGTERM the child when its parent (the forking thread) dies, so nothing
    outlives a crashed parent; a parent already gone before the request took effect is caught by ``getppid``."""

    def preexec() -> None:
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            return
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


class _Spawner:
    """One thread that lives as long as the process and forks ``die_with_parent`` children for callers on other
    threads (see the module's docstring)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def call(self, fn: Callable[[], subprocess.Popen]) -> subprocess.Popen:
        if threading.current_thread() is threading.main_thread():
            return fn()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="childproc-spawner", daemon=True)
                self._thread.start()
        done: queue.SimpleQueue = queue.SimpleQueue()
        self._jobs.put((fn, done))
        ok, value = done.get()
        if not ok:
            raise value
        return value

    def _run(self) -> None:
        while True:
            fn, done = self._jobs.get()
            try:
                done.put((True, fn()))
            except BaseException as exc:  # handed back to the caller's thread
                done.put((False, exc))


_spawner = _Spawner()


class ChildProcess:
    """One child process: ``start()``, ``wait_until_ok(url)``, ``stop()`` (SIGTERM, then SIGKILL after
    ``stop_timeout_s``), or ``with`` for start and stop.

    ``own_session``: the child leads a process group of its own, so signals reach its children too (vLLM's engine
    core) and a Ctrl-C in the terminal does not; ``die_with_parent``: Linux stops it if this process dies first;
    ``log_path``: stdout and stderr go there (None: inherited from this process)."""

    def __init__(self, name: str, argv: Sequence[str], *, log_path: Path | None = None,
                 env: Mapping[str, str] | None = None, own_session: bool = True, die_with_parent: bool = False,
                 stdin: int | None = None, stop_timeout_s: float = 10.0) -> None:
        self.name, self.argv, self.log_path = name, [str(a) for a in argv], log_path
        self.env = None if env is None else dict(env)
        self.own_session, self.die_with_parent, self.stdin = own_session, die_with_parent, stdin
        self.stop_timeout_s = stop_timeout_s
        self.process: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError(f"{self.name} has not been started")
        return self.process.pid

    def start(self) -> "ChildProcess":
        """Start the child; returns itself."""
        if self.log_path is None:
            self.process = self._popen(None)
        else:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "wb") as log:  # the child keeps its own copy of the descriptor
                self.process = self._popen(log)
        return self

    def _popen(self, log) -> subprocess.Popen:
        output = {} if log is None else {"stdout": log, "stderr": subprocess.STDOUT}

        def popen() -> subprocess.Popen:
            return subprocess.Popen(self.argv, env=self.env, stdin=self.stdin, start_new_session=self.own_session,
                                    preexec_fn=_die_with_parent_of(os.getpid()) if self.die_with_parent else None,
                                    **output)

        return _spawner.call(popen) if self.die_with_parent else popen()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        if self.log_path is None:
            return ""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def wait_until_ok(self, url: str, timeout_s: float) -> None:
        """Return once ``url`` answers 200. If the child exits first: ``RuntimeError`` with its exit code and the
        end of its log; if ``timeout_s`` passes: ``TimeoutError`` naming its log. The child is left running
        either way (``stop()`` or the ``with`` block's end stops it)."""
        where = f" (log {self.log_path})" if self.log_path is not None else ""
        try:
            wait_until_ok(url, timeout_s, self.alive, self.name)
        except RuntimeError:
            tail = self.log_tail()
            raise RuntimeError(f"{self.name} exited with code {self.process.returncode} during start-up{where}"
                               + (f":\n{tail}" if tail else "")) from None
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}{where}") from None

    def stop(self) -> None:
        """SIGTERM (to its group when it has one), SIGKILL after ``stop_timeout_s``; returns once it (and, with
        ``own_session``, every process of its group) is gone."""
        process = self.process
        if process is None:
            return
        pid = process.pid

        def send(sig: int) -> None:
            if self.own_session:
                os.killpg(pid, sig)
            else:
                process.send_signal(sig)

        def gone() -> bool:
            return process.poll() is not None and not (self.own_session and group_members(pid))

        terminate(send, gone, self.stop_timeout_s)
        try:
            process.wait(timeout=1)  # reap it, so no zombie stays behind
        except subprocess.TimeoutExpired:
            pass

    def __enter__(self) -> "ChildProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
