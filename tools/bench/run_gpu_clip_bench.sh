#!/usr/bin/env bash
# CLIP vision towers on the GPU machine, in one command: build precompute
# (tools/bench/build_on_gpu.sh), then tools/bench/clip_throughput.py: precompute with a `.pt2`
# package and with TorchScript against PyNvVideoCodec + the transformers model, with the model
# alone and precompute's decode bound, on the 800-clip set at one frame a second.
#
#   bash tools/bench/run_gpu_clip_bench.sh
# Needs .devbuild/ (tools/bench/fetch_gpu_deps.sh: PyNvVideoCodec's wheel) and
# bench-data/h264_720p (tools/bench/make_video_clips.sh h264_720p) carried. CLIP_ARGS go to
# clip_throughput.py (e.g. "--models clip-l14 --peer-compile"). STAGES (default "build clip"):
# "recipes" also runs tests/gpu/export_recipes_cuda.py (tools/gpu_tests.sh's step 6) on
# bench-data/parity when carried. A second call on a still-warm machine reuses the build, the
# model folders and their packages (in /tmp/clip-bench). Logs in $OUT (default /tmp/out); exit 1
# when a step failed.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python=${BENCH_PYTHON:-python3}
stages=${STAGES:-build clip}
status=0
started=$SECONDS
say() { echo "clip_bench [$((SECONDS - started)) s]: $*"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$OUT/gpu.txt"
# shellcheck source=tools/bench/gpu_build_stage.sh
. tools/bench/gpu_build_stage.sh
if [[ " $stages " == *" build "* ]]; then
  gpu_build_stage || exit 1
fi
gpu_wheels_site
binary=build-gpu/tools/cli/precompute

if [[ " $stages " == *" clip "* ]]; then
  say "CLIP towers (log: $OUT/clip_bench.log)"
  # shellcheck disable=SC2086
  "$python" tools/bench/clip_throughput.py --binary "$binary" ${CLIP_ARGS:-} \
    > "$OUT/clip_bench.log" 2>&1 || status=1
  grep -v '"each"' "$OUT/clip_bench.log" | tail -n 30
fi

if [[ " $stages " == *" recipes "* ]]; then
  say "export recipes on cuda (log: $OUT/export_recipes_cuda.log)"
  "$python" tests/gpu/export_recipes_cuda.py --binary "$binary" --clips bench-data/parity \
    --work /tmp/export-cuda ${RECIPE_ARGS:-} > "$OUT/export_recipes_cuda.log" 2>&1 || status=1
  grep -v '"ok": true' "$OUT/export_recipes_cuda.log" | grep '^{' | tail -n 20
  echo "export_recipes_cuda: $(grep -c '"ok": true' "$OUT/export_recipes_cuda.log") checks passed"
fi
say "exit $status"
exit $status
