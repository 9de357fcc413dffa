"""Can eBPF run here? Privileges, tracefs, kernel headers and the ``bcc`` module, each checked with a
sentence that says what is missing and how to get it.

``bcc`` picks its tracefs path when it is imported (``/sys/kernel/debug/tracing`` if that exists, else
``/sys/kernel/tracing``), so tracefs is made available *before* the import, and the module's choice is
corrected afterwards when the debugfs path exists but holds no tracing files.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
from pathlib import Path

CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF = 21, 38, 39
TRACEFS_PATHS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))


class ProbesUnavailable(RuntimeError):
    """eBPF cannot run in this process; the message is one sentence naming what is missing."""


def effective_capabilities(status: Path = Path("/proc/self/status")) -> int:
    """This process's effective capability bits (from /proc/self/status)."""
    for line in status.read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def missing_privileges(caps: int | None = None) -> list[str]:
    """Capabilities this process lacks for the probes: none with CAP_SYS_ADMIN (root, or kernels before 5.8
    where it covered BPF), else CAP_BPF and CAP_PERFMON. Tracepoints need no CAP_SYS_ADMIN (uprobes would)."""
    caps = effective_capabilities() if caps is None else caps
    if caps & (1 << CAP_SYS_ADMIN):
        return []
    return [name for bit, name in ((CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")) if not caps & (1 << bit)]


def check_privileges(caps: int | None = None) -> None:
    """Raise ``ProbesUnavailable`` naming the capabilities eBPF needs when this process lacks them."""
    missing = missing_privileges(caps)
    if missing:
        raise ProbesUnavailable(
            f"eBPF probes need root or the CAP_BPF and CAP_PERFMON capabilities, and this process lacks "
            f"{' and '.join(missing)} (run as root, or grant them, e.g. `setpriv --inh-caps=+bpf,+perfmon "
            f"--ambient-caps=+bpf,+perfmon ...` or a container's cap_add)")


def tracefs_dir() -> Path | None:
    """The mounted tracefs (the folder that has ``events/``), or None."""
    for path in TRACEFS_PATHS:
        try:
            if (path / "events").is_dir():
                return path
        except PermissionError:
            continue
    return None


def ensure_tracefs() -> Path:
    """The tracefs folder, mounting tracefs at /sys/kernel/tracing first when nothing is mounted (as root)."""
    found = tracefs_dir()
    if found is not None:
        return found
    target = TRACEFS_PATHS[0]
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    if target.is_dir() and libc.mount(b"tracefs", str(target).encode(), b"tracefs", 0, None) == 0:
        return target
    error = os.strerror(ctypes.get_errno()) if target.is_dir() else f"{target} does not exist"
    raise ProbesUnavailable(
        f"tracefs is not mounted and mounting it at {target} failed ({error}); mount it with "
        f"`mount -t tracefs tracefs {target}` (in a container: bind-mount /sys/kernel/tracing from the host)")


def check_kernel_headers(release: str | None = None) -> None:
    """BCC compiles against /lib/modules/$(uname -r)/build, or the kernel's built-in kheaders."""
    release = release or platform.release()
    build = Path("/lib/modules") / release / "build"
    if build.exists() or Path("/sys/kernel/kheaders.tar.xz").exists():
        return
    raise ProbesUnavailable(
        f"no kernel headers for {release}: {build} is missing; run `sudo bash scripts/install.sh`, which links "
        "Debian's linux-headers-<arch> there (they need not match the kernel: the probes read only "
        "tracepoint arguments)")


def import_bcc():
    """The ``bcc`` module, with tracefs mounted and its tracefs path pointing at a working tracefs."""
    tracefs = ensure_tracefs()
    try:
        import bcc
    except ImportError as exc:
        raise ProbesUnavailable(
            f"the bcc Python module is not importable ({exc}); install Debian's python3-bpfcc and run "
            "scripts/install.sh, which makes it importable from .venv") from exc
    if not (Path(bcc.TRACEFS) / "events").is_dir():
        bcc.TRACEFS = str(tracefs)
    return bcc


def prepare():
    """All checks in the order a user fixes them; returns the ``bcc`` module."""
    check_privileges()
    check_kernel_headers()
    return import_bcc()
