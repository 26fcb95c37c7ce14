#!/usr/bin/env bash
# WebDataset tar input against the same clips as files, on the GPU machine, in one command:
# builds precompute (tools/bench/build_on_gpu.sh; a no-op on a warm machine that built it), then
# tools/bench/tar_vs_files.py: the clip set COPIES times over (default 20: 800 clips) packed into
# TARS tar shards (default 8), the same config on both inputs, RUNS runs each (default 3), taking
# turns. Needs .devbuild/ and bench-data/h264_720p carried. Logs and JSON lines in $OUT (default
# /tmp/out); exit 1 when a step failed.
#
#   bash tools/bench/run_gpu_tar_bench.sh
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python=${BENCH_PYTHON:-python3}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$OUT/gpu.txt"
# shellcheck source=tools/bench/gpu_build_stage.sh
. tools/bench/gpu_build_stage.sh
gpu_build_stage || exit 1
timeout 560 "$python" tools/bench/tar_vs_files.py --binary build-gpu/tools/cli/precompute \
  --clips bench-data/h264_720p --copies "${COPIES:-20}" --tars "${TARS:-8}" --runs "${RUNS:-3}" \
  2>&1 | tee "$OUT/tar_vs_files.log" | grep -v '^{'
exit "${PIPESTATUS[0]}"
