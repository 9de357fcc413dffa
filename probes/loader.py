"""Compile, attach and read the eBPF probes for one target process (or the workers of one service).

    probes = KernelProbes.attach(pid, ProbeSettings(), tcp_ports=[8000])   # or attach([pid1, pid2], ...)
    probes.retarget([pid1, pid3])     # a worker restarted: follow its successor
    snapshot = probes.snapshot()      # cumulative KernelSnapshot, read from the kernel maps
    probes.close()

Attaching compiles the C program with BCC (a few seconds of clang); reading walks the aggregated maps only,
never per-event data, so a scrape costs a few map syscalls per distinct (thread name, label, slot).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Sequence

from probes import environment
from probes.program import MAX_TARGETS, SYSCALL_TABLE_SIZE, ProgramOptions, build_program, read_switch_state_bits
from probes.stats import KernelSnapshot, aggregate, syscall_family_table, tcp_state_label
from rag.settings import ProbeSettings
from telemetry.metrics import OFFCPU_REASONS, SYSCALL_FAMILIES

log = logging.getLogger(__name__)


def _tgid_of(pid: int) -> int:
    """The thread-group id of ``pid`` (a thread id is accepted too); names the pid when it does not exist."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Tgid:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    raise environment.ProbesUnavailable(f"no process with pid {pid} is running")


def kernel_tgid(pid: int) -> int:
    """``pid`` as the kernel's init PID namespace numbers it, which is what BPF helpers return.

    In a container with its own PID namespace, /proc/PID/status's ``NSpid`` lists the pid from the outermost
    namespace this /proc can see; unless that is the init namespace the probes cannot filter correctly."""
    tgid = _tgid_of(pid)
    ns_path = Path("/proc/self/ns/pid")
    try:
        init_ns = os.stat(ns_path).st_ino == 0xEFFFFFFC  # PROC_PID_INIT_INO
    except OSError:
        init_ns = True
    if not init_ns:
        raise environment.ProbesUnavailable(
            "ragheat probes runs in a PID namespace other than the host's, where pids differ from the kernel's; "
            "run it in the host PID namespace (docker run --pid=host, Kubernetes hostPID: true)")
    return tgid


def _kernel_tgids(pids: tuple[int, ...]) -> tuple[int, ...]:
    if not pids:
        raise environment.ProbesUnavailable("no process to probe")
    if len(pids) > MAX_TARGETS:
        raise environment.ProbesUnavailable(f"{len(pids)} processes to probe; at most {MAX_TARGETS}")
    return tuple(kernel_tgid(p) for p in pids)


class KernelProbes:
    """The attached BPF programs of one target and a reader of their maps (thread-safe)."""

    def __init__(self, bpf, options: ProgramOptions) -> None:
        self._bpf = bpf
        self.options = options
        self._lock = threading.Lock()
        self._closed = False
        self.targets: tuple[int, ...] = ()  # the probed processes' pids, as given

    @classmethod
    def attach(cls, pid: int | Sequence[int], settings: ProbeSettings,
               tcp_ports: list[int] | tuple[int, ...] = ()) -> "KernelProbes":
        """Compile and attach the probes ``settings`` enables to process ``pid`` (or to several processes, whose
        threads are counted together by stage: the workers of one service).

        ``tcp_ports``: count retransmits only on connections with one of these local or remote ports (the
        service's); empty counts every retransmit on the host. Raises ``ProbesUnavailable`` with a sentence."""
        bcc = environment.prepare()
        pids = (pid,) if isinstance(pid, int) else tuple(pid)
        tgids = _kernel_tgids(pids)
        tracefs = environment.ensure_tracefs()
        scheduler, syscalls, tcp = settings.scheduler, settings.syscalls, settings.tcp_retransmits
        if tcp and not bcc.BPF.tracepoint_exists("tcp", "tcp_retransmit_skb"):
            log.warning("this kernel has no tcp:tcp_retransmit_skb tracepoint; TCP retransmits are not counted")
            tcp = False
        if not (scheduler or syscalls or tcp):
            raise environment.ProbesUnavailable(
                "every probe is switched off (probes.scheduler, probes.syscalls, probes.tcp_retransmits)")
        options = ProgramOptions(scheduler=scheduler, syscalls=syscalls, tcp_retransmits=tcp,
                                 filter_tcp_ports=bool(tcp_ports),
                                 raw_syscall_tracepoints=bool(bcc.BPF.support_raw_tracepoint()))
        bits = read_switch_state_bits(tracefs) if scheduler else None
        try:
            bpf = bcc.BPF(text=build_program(options, bits).encode())
        except Exception as exc:  # noqa: BLE001 - BCC raises bare Exception for compile and load failures
            raise environment.ProbesUnavailable(
                f"compiling or loading the eBPF programs failed ({str(exc).strip().splitlines()[-1]}); "
                "see docs/probes.md, 'Requirements'") from exc
        probes = cls(bpf, options)
        probes._set_targets(pids, tgids)
        if syscalls:
            table = bpf[b"syscall_family"]
            for nr, family in enumerate(syscall_family_table(SYSCALL_TABLE_SIZE)):
                table[table.Key(nr)] = table.Leaf(family + 1)  # 0 means not filled in yet
        if tcp and tcp_ports:
            ports = bpf[b"tcp_ports"]
            for port in tcp_ports:
                ports[ports.Key(port)] = ports.Leaf(1)
        log.info("eBPF probes attached to pid %s (scheduler=%s syscalls=%s tcp_retransmits=%s)",
                 ", ".join(map(str, tgids)), scheduler, syscalls, tcp)
        return probes

    def retarget(self, pids: Sequence[int]) -> None:
        """Probe these processes from now on (a restarted worker in, its dead predecessor out); what was counted
        stays. Raises ``ProbesUnavailable`` when one of them is not running."""
        tgids = _kernel_tgids(tuple(pids))
        with self._lock:
            if not self._closed:
                self._set_targets(tuple(pids), tgids)

    def _set_targets(self, pids: tuple[int, ...], tgids: tuple[int, ...]) -> None:
        table = self._bpf[b"targets"]
        for key in [k for k in table.keys() if k.value not in tgids]:
            del table[key]
        for tgid in tgids:
            table[table.Key(tgid)] = table.Leaf(1)
        self.targets = pids

    def _rows(self, name: str):
        for key, value in self._bpf[name.encode()].items():
            yield bytes(key.comm), key.label, key.slot, value.count, value.sum_ns

    def snapshot(self) -> KernelSnapshot:
        """Everything counted since attach (the kernel maps are never cleared, so values only grow)."""
        with self._lock:
            snap = KernelSnapshot()
            if self._closed:
                return snap
            if self.options.scheduler:
                snap.runqueue = aggregate(self._rows("runqueue_hist"), None)
                snap.offcpu = aggregate(self._rows("offcpu_hist"), OFFCPU_REASONS)
            if self.options.syscalls:
                snap.syscall = aggregate(self._rows("syscall_hist"), SYSCALL_FAMILIES)
            if self.options.tcp_retransmits:
                for state, count in self._bpf[b"tcp_retransmits"].items():
                    if count.value:
                        label = tcp_state_label(state.value)
                        snap.tcp_retransmits[label] = snap.tcp_retransmits.get(label, 0) + count.value
            return snap

    def close(self) -> None:
        """Detach the programs and free the maps."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._bpf.cleanup()

    def __enter__(self) -> "KernelProbes":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
