"""The probes' user-space half without eBPF: format parsing, slots to buckets, thread names to stages,
syscall families, the exported families, pid discovery and the privilege sentence."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from probes.collector import KernelCollector
from probes.discover import listening_ports, pids_for_url
from probes.environment import CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN, ProbesUnavailable, check_privileges
from probes.program import FormatError, ProgramOptions, SwitchStateBits, build_program, parse_switch_state_bits
from probes.stats import (KernelSnapshot, Log2Histogram, aggregate, family_of, stage_of, syscall_family_table,
                          tcp_state_label)
from rag.stages import STAGES
from rag.threadnames import stage_comm
from telemetry.buckets import KERNEL_LOG2_SECONDS
from telemetry.metrics import KERNEL_METRICS, KERNEL_STAGES, SYSCALL_FAMILIES

# print fmt as kernel 6.x prints it (TASK_REPORT_MAX = 0x100), and a variant whose preempted bit is another
# value (0x80), to show that the bit is read from the format, not assumed
FMT_6 = ('print fmt: "prev_comm=%s prev_pid=%d prev_prio=%d prev_state=%s%s ==> next_comm=%s next_pid=%d '
         'next_prio=%d", REC->prev_comm, REC->prev_pid, REC->prev_prio, (REC->prev_state & ((((0x00000000 | '
         '0x00000001 | 0x00000002 | 0x00000004 | 0x00000008 | 0x00000010 | 0x00000020 | 0x00000040) + 1) << 1) - '
         '1)) ? __print_flags(REC->prev_state & ((((0x00000000 | 0x00000001 | 0x00000002 | 0x00000004 | '
         '0x00000008 | 0x00000010 | 0x00000020 | 0x00000040) + 1) << 1) - 1), "|", { 0x00000001, "S" }, '
         '{ 0x00000002, "D" }, { 0x00000004, "T" }, { 0x00000008, "t" }, { 0x00000010, "X" }, { 0x00000020, '
         '"Z" }, { 0x00000040, "P" }, { 0x00000080, "I" }) : "R", REC->prev_state & (((0x00000000 | 0x00000001 '
         '| 0x00000002 | 0x00000004 | 0x00000008 | 0x00000010 | 0x00000020 | 0x00000040) + 1) << 1) ? "+" : "", '
         'REC->next_comm, REC->next_pid, REC->next_prio')
FMT_OLD = ('print fmt: "prev_comm=%s prev_pid=%d prev_prio=%d prev_state=%s%s ==> next_comm=%s next_pid=%d '
           'next_prio=%d", REC->prev_comm, REC->prev_pid, REC->prev_prio, (REC->prev_state & ((((0x0000 | 0x0001 | '
           '0x0002 | 0x0004 | 0x0008 | 0x0010 | 0x0020 | 0x0040) + 1) << 1) - 1)) ? __print_flags(REC->prev_state '
           '& ((((0x0000 | 0x0001 | 0x0002 | 0x0004 | 0x0008 | 0x0010 | 0x0020 | 0x0040) + 1) << 1) - 1), "|", '
           '{ 0x0001, "S" }, { 0x0002, "D" }, { 0x0004, "T" }, { 0x0008, "t" }, { 0x0010, "X" }, { 0x0020, "Z" }, '
           '{ 0x0040, "P" }) : "R", REC->prev_state & ((0x0000 | 0x0001 | 0x0002 | 0x0004 | 0x0008 | 0x0010 | '
           '0x0020 | 0x0040) + 1) ? "+" : "", REC->next_comm, REC->next_pid, REC->next_prio')


def test_state_bits_come_from_the_print_fmt():
    assert parse_switch_state_bits(FMT_6) == SwitchStateBits(preempted=0x100, interruptible=0x1, uninterruptible=0x2)
    assert parse_switch_state_bits(FMT_OLD).preempted == 0x80


def test_a_format_without_the_preempted_marker_is_an_error_naming_the_file():
    without_plus = FMT_6.replace('? "+" : ""', '? "" : ""')
    with pytest.raises(FormatError, match="preempted marker.*my/format"):
        parse_switch_state_bits(without_plus, "my/format")


def test_slot_k_is_exactly_the_k_th_log2_bucket():
    hist = Log2Histogram()
    hist.add(0, 3, 1_500)            # under 1 us
    hist.add(14, 5, 50_000_000)      # 8.192 .. 16.383 ms
    hist.add(len(KERNEL_LOG2_SECONDS), 1, 9_000_000_000)  # past the last edge: +Inf only
    buckets = hist.cumulative_buckets()
    assert [edge for edge, _ in buckets] == [*KERNEL_LOG2_SECONDS, float("inf")]
    assert buckets[0] == (1e-6, 3)
    assert buckets[13][1] == 3 and buckets[14] == (2 ** 14 / 1e6, 8)
    assert buckets[-2][1] == 8 and buckets[-1][1] == 9
    assert hist.sum_seconds == pytest.approx(1.5e-6 + 0.05 + 9.0)


def test_thread_names_map_to_stages():
    for stage in (*STAGES, "http"):
        assert stage_of(stage_comm(stage) + b"\0" * 3) == stage
    assert stage_of(b"rh:retrieve_den") == "retrieve_dense"  # truncated to the kernel's 15 bytes
    assert stage_of(b"python3") == stage_of(b"rh:unknown") == stage_of(b"") == "other"


def test_aggregate_folds_threads_of_one_stage_and_clamps_unknown_labels():
    rows = [(b"rh:embed", 1, 3, 2, 10), (b"rh:embed", 1, 3, 1, 5), (b"worker", 0, 2, 4, 8), (b"rh:embed", 99, 1, 1, 1)]
    out = aggregate(rows, ("preempted", "blocked", "uninterruptible"))
    assert out[("embed", "blocked")].slots[3] == 3 and out[("other", "preempted")].count == 4
    assert out[("embed", "uninterruptible")].count == 1


def test_syscall_families_by_name_and_number():
    assert family_of("pread64") == "read" and family_of("epoll_pwait2") == "poll"
    assert family_of("clock_nanosleep") == "sleep" and family_of("no_such_call") == "other"
    table = syscall_family_table(4, {0: "read", 1: "write", 3: "close"})
    assert [SYSCALL_FAMILIES[i] for i in table] == ["read", "write", "other", "file"]


def test_tcp_states_follow_the_kernel_numbering():
    assert tcp_state_label(1) == "established" and tcp_state_label(2) == "syn_sent"
    assert tcp_state_label(0) == tcp_state_label(99) == "other"


def test_program_compiles_in_only_what_is_enabled():
    bits = SwitchStateBits(0x100, 1, 2)
    everything = build_program(ProgramOptions(syscalls=True, filter_tcp_ports=True), bits)
    assert "BPF_HASH(targets, u32, u8, MAX_TARGETS)" in everything and "#define STATE_PREEMPTED 0x100" in everything
    assert "RAW_TRACEPOINT_PROBE(sys_enter)" in everything and "#define FILTER_TCP_PORTS 1" in everything
    scheduler_only = build_program(ProgramOptions(tcp_retransmits=False), bits)
    assert "sys_enter" not in scheduler_only and "tcp_retransmit_skb" not in scheduler_only
    fallback = build_program(ProgramOptions(scheduler=False, syscalls=True, raw_syscall_tracepoints=False),
                             None)
    assert "TRACEPOINT_PROBE(raw_syscalls, sys_enter)" in fallback and "sched_switch" not in fallback


def _families(collector: KernelCollector) -> dict:
    registry = CollectorRegistry()
    registry.register(collector)
    return {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}


def test_collector_exports_every_closed_set_series_from_the_first_scrape():
    snap = KernelSnapshot()
    snap.runqueue["embed"] = Log2Histogram()
    snap.runqueue["embed"].add(5, 7, 70_000)
    snap.tcp_retransmits["syn_sent"] = 2
    families = _families(KernelCollector(lambda: snap, syscalls=True))
    runqueue = families[KERNEL_METRICS["runqueue"]]
    counts = {s.labels["stage"]: s.value for s in runqueue.samples if s.name.endswith("_count")}
    assert counts == {**{stage: 0 for stage in KERNEL_STAGES}, "embed": 7}
    assert len([s for s in families[KERNEL_METRICS["syscall"]].samples if s.name.endswith("_count")]) == \
        len(KERNEL_STAGES) * len(SYSCALL_FAMILIES)
    retransmits = families[KERNEL_METRICS["tcp_retransmits"].removesuffix("_total")]
    assert {s.labels["state"]: s.value for s in retransmits.samples}["syn_sent"] == 2
    assert all(f.documentation for f in families.values())


def test_a_probe_that_is_off_exports_nothing():
    families = _families(KernelCollector(KernelSnapshot, scheduler=False, syscalls=False, tcp_retransmits=True))
    assert set(families) == {KERNEL_METRICS["tcp_retransmits"].removesuffix("_total")}


def test_pid_and_ports_are_found_from_a_listening_socket():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert port in listening_ports(os.getpid())
        assert pids_for_url(f"http://127.0.0.1:{port}/metrics") == ([os.getpid()], port)


def test_every_process_sharing_a_port_is_found():
    """``serve --workers N``: each worker binds the port with SO_REUSEPORT; the probes follow all of them."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        child = subprocess.Popen([sys.executable, "-c", f"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1); s.bind(("127.0.0.1", {port}))
s.listen(); print("listening", flush=True); time.sleep(60)"""], stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline().strip() == "listening"
            assert pids_for_url(f"http://127.0.0.1:{port}") == (sorted([os.getpid(), child.pid]), port)
        finally:
            child.kill()
            child.wait()


@pytest.mark.parametrize("url, sentence", [
    ("http://10.1.2.3:8000", "must name this machine"),
    ("http://127.0.0.1:notaport", "invalid port"),
])
def test_bad_service_urls_are_named(url, sentence):
    with pytest.raises(ProbesUnavailable, match=sentence):
        pids_for_url(url)


def test_privileges_need_sys_admin_or_bpf_and_perfmon():
    check_privileges(1 << CAP_SYS_ADMIN)
    check_privileges((1 << CAP_BPF) | (1 << CAP_PERFMON))
    with pytest.raises(ProbesUnavailable, match="lacks CAP_PERFMON"):
        check_privileges(1 << CAP_BPF)
    with pytest.raises(ProbesUnavailable, match="lacks CAP_BPF and CAP_PERFMON"):
        check_privileges(0)
