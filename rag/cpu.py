"""What the CPU offers the integer kernels: its identity (which decides which precision runs fastest, kept per CPU)
and whether ONNX Runtime's uint8 x int8 product is exact on it."""

from __future__ import annotations

from typing import Iterable

# What decides which precision runs faster: the CPU's model and the instruction sets ONNX Runtime's kernels pick.
ISA_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "amx_bf16", "neon",
             "asimddp", "sve")
# ONNX Runtime's uint8 x int8 kernel adds pairs of products in 16 bits, and saturates, on x86 CPUs without these;
# with VNNI or AMX it accumulates in 32 bits and is exact.
EXACT_U8S8_ISA = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


def cpu_identity() -> dict:
    """The CPU's model and the instruction sets of ``ISA_FLAGS`` it has (Linux's /proc/cpuinfo; empty elsewhere)."""
    try:
        text = open("/proc/cpuinfo", encoding="utf-8", errors="replace").read()
    except OSError:
        return {}
    fields = dict(line.split(":", 1) for line in text.split("\n\n")[0].splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    return {"model": fields.get("model name") or fields.get("CPU part", ""), "isa": sorted(flags & set(ISA_FLAGS))}


def exact_u8s8(isa: Iterable[str]) -> bool:
    """Whether a CPU with these instruction-set flags (``cpu_identity``'s ``isa``) runs ONNX Runtime's uint8 x int8
    products exactly."""
    return bool(EXACT_U8S8_ISA & set(isa))
