#!/usr/bin/env bash
# GPU memory budgets in one command on the GPU machine: build (tools/bench/build_on_gpu.sh),
# then tools/bench/gpu_memory_budget.py. From the repository root (the working tree and
# .devbuild/ copied there; under 10 minutes):
#   bash tools/bench/run_gpu_memory_bench.sh
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1 | tee "$OUT/gpu.txt" || true
t0=$SECONDS
bash tools/bench/build_on_gpu.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build: $((SECONDS - t0)) s"
"${BENCH_PYTHON:-python3}" tools/bench/gpu_memory_budget.py --build build-gpu --out "$OUT" "$@"
