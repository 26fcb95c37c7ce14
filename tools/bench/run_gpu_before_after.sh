#!/usr/bin/env bash
# A change's before and after on the GPU machine in one command: the working tree and an earlier
# commit built side by side, then the video benchmark (tools/bench/video_throughput.py: 1 frame a
# second, decoder auto, ResNet-50) and the text benchmark (tools/bench/text_scale.py: short
# captions, BERT-base, one GPU) with both binaries, run by run in turn, so that a drift of the
# machine falls on both alike.
#
# Before, on the Debian machine:
#   git archive -o .devbuild/baseline-COMMIT.tar COMMIT
#   bash tools/bench/fetch_gpu_deps.sh; bash tools/bench/make_video_clips.sh h264_720p
# Then on the GPU machine (the working tree, .devbuild/ and bench-data/h264_720p carried):
#   BASELINE=.devbuild/baseline-COMMIT.tar bash tools/bench/run_gpu_before_after.sh
# RUNS (default 3), COPIES (video: copies of each clip, default 100) and CAPTIONS (default
# 500000) size it to fit one 10-minute command. Logs and JSON in $OUT (default /tmp/out).
# Exit 1 when a step failed.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python=${BENCH_PYTHON:-python3}
runs=${RUNS:-3}
status=0
started=$SECONDS
say() { echo "before_after [$((SECONDS - started)) s]: $*"; }
[ -n "${BASELINE:-}" ] || { echo "set BASELINE to a git archive tarball" >&2; exit 2; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$OUT/gpu.txt"
# shellcheck source=tools/bench/gpu_build_stage.sh
. tools/bench/gpu_build_stage.sh
gpu_build_stage || exit 1
say "baseline build"
bash tools/bench/build_baseline_on_gpu.sh "$BASELINE" > "$OUT/build_baseline.log" 2>&1 ||
  { tail -n 30 "$OUT/build_baseline.log"; exit 1; }
# shellcheck disable=SC1091
source build-gpu/precompute-env.sh
gpu_wheels_site
after=build-gpu/tools/cli/precompute
before=build-gpu-baseline/tools/cli/precompute

say "video, 1 frame a second, decoder auto"
"$python" tools/bench/video_throughput.py --binary "$after" --binary "$before" \
  --samplings fps1 --modes auto --one-run-modes "" --runs "$runs" --copies "${COPIES:-100}" \
  --no-peer > "$OUT/video_before_after.log" 2>&1 || status=1
grep -v '^{' "$OUT/video_before_after.log" | tail -n 30
cp "$OUT/video_bench.json" "$OUT/video_before_after.json" 2>/dev/null

say "text, short captions, one GPU"
"$python" tools/bench/text_scale.py --binary "$after" --binary "$before" --devices cuda:0 \
  --captions "${CAPTIONS:-500000}" --runs "$runs" --peer-runs 0 \
  > "$OUT/text_before_after.log" 2>&1 || status=1
grep -v '^{' "$OUT/text_before_after.log" | tail -n 30
cp "$OUT/text_scale.json" "$OUT/text_before_after.json" 2>/dev/null
say "done (exit $status)"
exit "$status"
