"""The eBPF program (BCC C) and the tracepoint facts it is built from.

Everything the program reads comes from tracepoint arguments (whose layout BCC takes from the running
kernel's ``format`` files) or BPF helpers, never from a kernel structure, so the numbers are right on a
kernel whose headers do not match the installed ones. The few kernel constants it needs (which
``prev_state`` bits mean preempted, sleeping, uninterruptible) are parsed from ``sched_switch``'s own
``print fmt`` instead of being hard-coded per kernel version.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass
from pathlib import Path

from telemetry.buckets import KERNEL_LOG2_SECONDS
from telemetry.metrics import OFFCPU_REASONS, SYSCALL_FAMILIES

MAX_SLOT = len(KERNEL_LOG2_SECONDS)
"""Slot k holds latencies in [2^(k-1), 2^k) microseconds (slot 0: under 1 us); slots past the last bucket
edge are clamped to MAX_SLOT, which only the +Inf bucket counts."""


@dataclass(frozen=True)
class SwitchStateBits:
    """``sched_switch`` ``prev_state`` bits, as the running kernel prints them."""

    preempted: int      # TASK_REPORT_MAX: the task was preempted while runnable ("R+")
    interruptible: int  # "S"
    uninterruptible: int  # "D"


class FormatError(RuntimeError):
    """A tracepoint format this module cannot read (the message names the file)."""


_BIN_OPS = {ast.BitOr: operator.or_, ast.BitAnd: operator.and_, ast.Add: operator.add,
            ast.Sub: operator.sub, ast.LShift: operator.lshift, ast.RShift: operator.rshift}


def _eval_int(expression: str) -> int:
    """Evaluate an integer constant expression made of literals, | & + - << >> and parentheses."""
    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BIN_OPS:
            return _BIN_OPS[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError(f"not a constant expression: {expression!r}")
    return walk(ast.parse(expression.strip(), mode="eval"))


def _balanced(text: str, start: int) -> str:
    """The parenthesised group opening at ``text[start]``, parentheses included."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i + 1]
    raise ValueError("unbalanced parentheses")


def parse_switch_state_bits(format_text: str, where: str = "sched_switch format") -> SwitchStateBits:
    """Read the preempted / S / D bits from ``sched_switch``'s print fmt.

    The format prints ``prev_state`` with ``__print_flags(..., { 0x1, "S" }, { 0x2, "D" }, ...)`` and
    appends ``"+"`` when ``prev_state & <TASK_REPORT_MAX expression> ? "+" : ""``; both are read here.
    """
    fmt_line = next((line for line in format_text.splitlines() if line.startswith("print fmt:")), "")
    flags = {name: int(value, 16) for value, name in re.findall(r'\{\s*(0x[0-9a-fA-F]+),\s*"(\w)"\s*\}', fmt_line)}
    preempted = 0
    # The "+" marker is the last `REC->prev_state & (...) ? "+"` in the line.
    for match in re.finditer(r'REC->prev_state\s*&\s*(?=\()', fmt_line):
        group = _balanced(fmt_line, match.end())
        if fmt_line[match.end() + len(group):].lstrip().startswith('? "+"'):
            preempted = _eval_int(group)
    if "S" not in flags or "D" not in flags:
        raise FormatError(f"cannot find the S and D prev_state flags in the {where}")
    if not preempted:
        raise FormatError(f"cannot find the preempted marker (\"+\") in the {where}")
    return SwitchStateBits(preempted=preempted, interruptible=flags["S"], uninterruptible=flags["D"])


def read_switch_state_bits(tracefs: Path) -> SwitchStateBits:
    """The ``prev_state`` bits of ``sched_switch`` on this kernel, read from its format file."""
    path = tracefs / "events" / "sched" / "sched_switch" / "format"
    try:
        return parse_switch_state_bits(path.read_text(), str(path))
    except OSError as exc:
        raise FormatError(f"cannot read {path}: {exc.strerror}") from exc


@dataclass(frozen=True)
class ProgramOptions:
    """What to compile in. The target processes (``KernelProbes.retarget``) are not compiled in: a map holds them."""

    scheduler: bool = True
    syscalls: bool = False
    tcp_retransmits: bool = True
    filter_tcp_ports: bool = False
    raw_syscall_tracepoints: bool = True


_COMMON = r"""
#include <uapi/linux/ptrace.h>

struct hist_key { char comm[16]; u32 label; u32 slot; };
struct hist_val { u64 count; u64 sum_ns; };

/* The target processes (tgids, as the kernel's init PID namespace numbers them), filled in from user space: one
   service process, or the workers of `ragheat serve --workers N`, whose threads are then counted together. */
BPF_HASH(targets, u32, u8, MAX_TARGETS);

static __always_inline int is_target(u64 pid_tgid) {
    u32 tgid = pid_tgid >> 32;
    return targets.lookup(&tgid) != 0;
}

static __always_inline u32 slot_of(u64 delta_ns) {
    u64 us = delta_ns / 1000;
    u32 slot = us ? bpf_log2l(us) : 0;   /* bpf_log2l(v) = floor(log2 v) + 1 for v >= 1 */
    return slot > MAX_SLOT ? MAX_SLOT : slot;
}

"""

# One function per histogram map: BCC rewrites map calls where they are written, so a map cannot be a
# parameter (nor used inside a macro). Atomics because a key is shared by all CPUs.
_HISTOGRAM = r"""
BPF_HASH(NAME, struct hist_key, struct hist_val, SIZE);

static __always_inline void observe_NAME(struct hist_key *key, u64 delta_ns) {
    struct hist_val zero = {}, *val;
    key->slot = slot_of(delta_ns);
    val = NAME.lookup_or_try_init(key, &zero);
    if (val) {
        __sync_fetch_and_add(&val->count, 1);
        __sync_fetch_and_add(&val->sum_ns, delta_ns);
    }
}
"""


def _histogram(name: str, size: int) -> str:
    return _HISTOGRAM.replace("NAME", name).replace("SIZE", str(size))


_SCHEDULER = _histogram("runqueue_hist", 4096) + _histogram("offcpu_hist", 8192) + r"""
struct offcpu_start_t { u64 ts; u32 reason; };
BPF_TABLE("lru_hash", u32, struct offcpu_start_t, offcpu_start, 16384);  /* target tid -> left the CPU */
BPF_TABLE("lru_hash", u32, u64, wakeup_ts, 16384);                       /* target tid -> woken up */

/* A thread of the target is off the CPU iff offcpu_start holds it, so that map doubles as the set of the
   targets' threads at wake-up time: no fork tracking and no per-event tgid lookup of the wakee. */
TRACEPOINT_PROBE(sched, sched_wakeup) {
    u32 tid = args->pid;
    struct offcpu_start_t *off = offcpu_start.lookup(&tid);
    /* A preempted thread is already waiting for a CPU (recent kernels still trace a wake-up of a runnable
       task); only the first wake-up of a sleeping one starts its run-queue wait. */
    if (!off || off->reason == REASON_PREEMPTED)
        return 0;
    u64 now = bpf_ktime_get_ns();
    wakeup_ts.insert(&tid, &now);
    return 0;
}

/* A new thread is woken by its creator (wake_up_new_task runs in the forking thread), so the current
   tgid tells whether it belongs to the target. */
TRACEPOINT_PROBE(sched, sched_wakeup_new) {
    if (!is_target(bpf_get_current_pid_tgid()))
        return 0;
    u32 tid = args->pid;
    u64 now = bpf_ktime_get_ns();
    wakeup_ts.update(&tid, &now);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_switch) {
    u64 now = bpf_ktime_get_ns();
    if (is_target(bpf_get_current_pid_tgid())) {   /* current is prev */
        long state = args->prev_state;
        struct offcpu_start_t start = {now, REASON_BLOCKED};
        if ((state & STATE_PREEMPTED) || (state & (STATE_PREEMPTED - 1)) == 0)
            start.reason = REASON_PREEMPTED;       /* still runnable: waits for a CPU from now on */
        else if (state & STATE_UNINTERRUPTIBLE)
            start.reason = REASON_UNINTERRUPTIBLE;
        u32 prev = args->prev_pid;
        offcpu_start.update(&prev, &start);
    }
    u32 next = args->next_pid;
    struct hist_key key = {};
    int woke = 0;
    u64 *woken = wakeup_ts.lookup(&next);
    if (woken) {                               /* was asleep: the run-queue wait began at the wake-up */
        __builtin_memcpy(&key.comm, args->next_comm, sizeof(key.comm));
        observe_runqueue_hist(&key, now - *woken);
        wakeup_ts.delete(&next);
        woke = 1;
    }
    struct offcpu_start_t *off = offcpu_start.lookup(&next);
    if (!off)
        return 0;
    if (!woke)
        __builtin_memcpy(&key.comm, args->next_comm, sizeof(key.comm));
    if (!woke && off->reason == REASON_PREEMPTED)   /* was runnable all along: waited since it left */
        observe_runqueue_hist(&key, now - off->ts);
    key.label = off->reason;
    observe_offcpu_hist(&key, now - off->ts);
    offcpu_start.delete(&next);
    return 0;
}
"""

_SYSCALLS_COMMON = _histogram("syscall_hist", 8192) + r"""
struct syscall_start_t { u64 ts; u32 family; };
BPF_TABLE("lru_hash", u32, struct syscall_start_t, syscall_start, 16384);
BPF_ARRAY(syscall_family, u32, SYSCALL_TABLE_SIZE);   /* syscall nr -> family index + 1, from user space */

static __always_inline int syscall_enter(long nr) {
    u64 id = bpf_get_current_pid_tgid();
    if (!is_target(id))
        return 0;
    u32 tid = id, index = nr, *family = syscall_family.lookup(&index);
    /* entries hold family + 1, so that a slot user space has not filled yet (0) reads "other" */
    struct syscall_start_t start = {bpf_ktime_get_ns(), family && *family ? *family - 1 : FAMILY_OTHER};
    syscall_start.update(&tid, &start);
    return 0;
}

static __always_inline int syscall_exit(void) {
    u64 id = bpf_get_current_pid_tgid();
    if (!is_target(id))
        return 0;
    u32 tid = id;
    struct syscall_start_t *start = syscall_start.lookup(&tid);
    if (!start)
        return 0;
    struct hist_key key = {.label = start->family};
    bpf_get_current_comm(&key.comm, sizeof(key.comm));
    observe_syscall_hist(&key, bpf_ktime_get_ns() - start->ts);
    syscall_start.delete(&tid);
    return 0;
}
"""

_SYSCALLS_RAW = r"""
RAW_TRACEPOINT_PROBE(sys_enter) { return syscall_enter((long)ctx->args[1]); }  /* (regs, id) */
RAW_TRACEPOINT_PROBE(sys_exit) { return syscall_exit(); }
"""

_SYSCALLS_TRACEPOINT = r"""
TRACEPOINT_PROBE(raw_syscalls, sys_enter) { return syscall_enter(args->id); }
TRACEPOINT_PROBE(raw_syscalls, sys_exit) { return syscall_exit(); }
"""

_TCP = r"""
BPF_ARRAY(tcp_retransmits, u64, 16);   /* by TCP state (include/net/tcp_states.h, a stable ABI) */
BPF_HASH(tcp_ports, u16, u8, 64);      /* the service's ports; the retransmit timer runs in softirq, so no pid */

TRACEPOINT_PROBE(tcp, tcp_retransmit_skb) {
#if FILTER_TCP_PORTS
    u16 sport = args->sport, dport = args->dport;
    if (!tcp_ports.lookup(&sport) && !tcp_ports.lookup(&dport))
        return 0;
#endif
    u32 state = args->state;
    tcp_retransmits.increment(state);
    return 0;
}
"""

SYSCALL_TABLE_SIZE = 1024
MAX_TARGETS = 64  # processes probed at once (`serve --workers` allows 64)


def build_program(options: ProgramOptions, bits: SwitchStateBits | None) -> str:
    """BCC C source for ``options``; ``bits`` is required with the scheduler probes."""
    defines = {
        "MAX_TARGETS": MAX_TARGETS,
        "MAX_SLOT": MAX_SLOT,
        "REASON_PREEMPTED": OFFCPU_REASONS.index("preempted"),
        "REASON_BLOCKED": OFFCPU_REASONS.index("blocked"),
        "REASON_UNINTERRUPTIBLE": OFFCPU_REASONS.index("uninterruptible"),
        "FAMILY_OTHER": SYSCALL_FAMILIES.index("other"),
        "SYSCALL_TABLE_SIZE": SYSCALL_TABLE_SIZE,
        "FILTER_TCP_PORTS": int(options.filter_tcp_ports),
    }
    parts = [_COMMON]
    if options.scheduler:
        if bits is None:
            raise ValueError("the scheduler probes need the sched_switch state bits")
        defines.update(STATE_PREEMPTED=hex(bits.preempted), STATE_UNINTERRUPTIBLE=hex(bits.uninterruptible))
        parts.append(_SCHEDULER)
    if options.syscalls:
        parts += [_SYSCALLS_COMMON, _SYSCALLS_RAW if options.raw_syscall_tracepoints else _SYSCALLS_TRACEPOINT]
    if options.tcp_retransmits:
        parts.append(_TCP)
    header = "".join(f"#define {name} {value}\n" for name, value in defines.items())
    return header + "".join(parts)
