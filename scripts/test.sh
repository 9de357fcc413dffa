#!/usr/bin/env bash
# Install everything the tests need, then run the whole suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --test
# vLLM (CPU build) in its own environment, for the generation tests (tests/vllm).
bash scripts/install_vllm.sh
# The 25 slowest setups, calls and teardowns close the report, so that CI's output says where the time goes.
exec .venv/bin/python -m pytest --durations=25 "$@"
