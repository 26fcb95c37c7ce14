# shellcheck shell=bash
# Sourced by the GPU benchmark wrappers (run_gpu_*_bench.sh), from the repository root:
# gpu_build_stage runs tools/bench/build_on_gpu.sh with its log in $OUT/build.log, shows its
# step lines and how long it took, and returns 1 when the build failed.
gpu_build_stage() {
  echo "==== build (log: $OUT/build.log) ===="
  local t0=$SECONDS rc=0
  bash tools/bench/build_on_gpu.sh > "$OUT/build.log" 2>&1 || rc=1
  grep -E '^build_on_gpu: ' "$OUT/build.log" | tail -n 12
  echo "build: $((SECONDS - t0)) s"
  return "$rc"
}
