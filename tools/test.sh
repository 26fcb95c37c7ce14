#!/usr/bin/env bash
# Every test: set-up (tools/setup.sh), the GoogleTest suites through CTest, then the pytest suite
# that runs the real CLI on generated media and checks the shards with h5py.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
ctest --test-dir build --output-on-failure -j "$(nproc)"
PRECOMPUTE_BUILD_DIR="$PWD/build" .venv/bin/python -m pytest -q tests/python "$@"
