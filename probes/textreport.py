"""BCC-style text histograms of a ``KernelSnapshot`` (``ragheat probes --print SECONDS``)."""

from __future__ import annotations

from probes.stats import KernelSnapshot, Log2Histogram

_WIDTH = 40


def format_histogram(title: str, hist: Log2Histogram) -> str:
    """One log2 histogram in microseconds, as BCC's ``print_log2_hist`` lays it out."""
    last = max((i for i, count in enumerate(hist.slots) if count), default=-1)
    peak = max(hist.slots) or 1
    lines = [f"{title}  (count {hist.count}, mean {hist.sum_seconds / hist.count * 1e6:.0f} us)"
             if hist.count else f"{title}  (nothing counted)"]
    if last >= 0:
        lines.append(f"{'usecs':>20}{'':>4}: {'count':<8} distribution")
    for slot in range(last + 1):
        low, high = (0, 0) if slot == 0 else (1 << (slot - 1), (1 << slot) - 1)
        count = hist.slots[slot]
        bar = "*" * round(count / peak * _WIDTH)
        lines.append(f"{low:>10} -> {high:<10}: {count:<8}|{bar:<{_WIDTH}}|")
    return "\n".join(lines)


def format_snapshot(snap: KernelSnapshot) -> str:
    """Text histograms of a ``KernelSnapshot``, one per stage and probe (``ragheat probes --print``)."""
    parts = []
    for stage, hist in sorted(snap.runqueue.items()):
        parts.append(format_histogram(f"run-queue latency, stage={stage}", hist))
    for (stage, reason), hist in sorted(snap.offcpu.items()):
        parts.append(format_histogram(f"off-CPU time, stage={stage} reason={reason}", hist))
    for (stage, family), hist in sorted(snap.syscall.items()):
        parts.append(format_histogram(f"system-call latency, stage={stage} family={family}", hist))
    if snap.tcp_retransmits:
        parts.append("TCP retransmits by state: " + ", ".join(f"{s}={n}" for s, n in sorted(snap.tcp_retransmits.items())))
    return "\n\n".join(parts) if parts else "nothing counted"
