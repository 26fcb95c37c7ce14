#!/usr/bin/env bash
# The GPU video work in one command: build precompute with NVDEC on the GPU machine
# (tools/bench/build_on_gpu.sh), run the NVDEC parity test (tests/gpu/nvdec_parity.py), then the
# video benchmark against NVIDIA's PyNvVideoCodec (tools/bench/video_throughput.py). Logs and
# JSON reports land in $OUT (default /tmp/out).
#
# Before, on the Debian machine:
#   bash tools/bench/fetch_gpu_deps.sh               # .devbuild/: FFmpeg source, .debs, wheels
#   bash tools/bench/make_video_clips.sh parity      # bench-data/parity
#   bash tools/bench/make_video_clips.sh h264_720p   # bench-data/h264_720p
# Then on the GPU machine, from the repository root (the working tree, .devbuild/ and
# bench-data/ copied there; under 10 minutes):
#   bash tools/bench/run_gpu_video_bench.sh
# STAGES picks the steps (default "build parity bench"; also "decode": the decoders alone, and
# "diag": per-file NVDEC times); BENCH_ARGS go to video_throughput.py.
# A second call on a still-warm machine reuses FFmpeg, the build folder and the installed wheels.
#
# Exit code: 1 when any stage failed.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
stages=${STAGES:-build parity bench}
python=${BENCH_PYTHON:-python3}
started=$SECONDS
status=0

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT/gpu.txt"

# shellcheck source=tools/bench/gpu_build_stage.sh
. tools/bench/gpu_build_stage.sh
if [[ " $stages " == *" build "* ]]; then
  gpu_build_stage || status=1
fi

# The wheels' packages for this Python (PyNvVideoCodec, ...), each once per machine.
gpu_wheels_site
# shellcheck disable=SC1091
[ -f build-gpu/precompute-env.sh ] && source build-gpu/precompute-env.sh

if [[ " $stages " == *" parity "* ]]; then
  echo "==== NVDEC parity (log: $OUT/parity.log) ===="
  t0=$SECONDS
  "$python" tests/gpu/nvdec_parity.py --binary build-gpu/tools/cli/precompute \
    --clips bench-data/parity --work /tmp/nvdec-parity > "$OUT/parity.log" 2>&1
  rc=$?
  # The passing checks are in the log; failures, summaries and errors are shown.
  grep -v '"ok": true' "$OUT/parity.log" | tail -n 60
  [ "$rc" -eq 0 ] || status=1
  echo "parity: $((SECONDS - t0)) s"
fi

if [[ " $stages " == *" decode "* ]]; then
  # The decoders alone (tools/bench/decode_bench.cpp: no graph, no encoder, no LibTorch): the
  # CPU on every core, then NVDEC with 1, 4 and 7 sessions, at both samplings; then every frame
  # of each clip (modes plain and cuvid: FFmpeg's hwaccel as precompute sets it up, and FFmpeg's
  # *_cuvid decoders) with the seconds spent opening, decoding and closing.
  echo "==== decoders alone (log: $OUT/decode.log) ===="
  clips=(${DECODE_CLIPS:-bench-data/h264_720p/*.mp4})
  bench=build-gpu/tools/bench/decode_bench
  for sampling in "--num-frames 4" "--fps 1"; do
    # shellcheck disable=SC2086  # $sampling is two words
    "$bench" --decoder cpu --threads "$(nproc)" $sampling --repeat 40 "${clips[@]}" 2>&1 |
      tee -a "$OUT/decode.log"
    for sessions in 1 4 7; do
      # shellcheck disable=SC2086
      timeout 120 "$bench" --decoder nvdec --threads "$sessions" $sampling --repeat 4 \
        "${clips[@]}" 2>&1 | tee -a "$OUT/decode.log"
    done
  done
  # Before Note [Keeping NVDEC decoders across files]: a decoder per file.
  for sessions in 1 4; do
    timeout 120 "$bench" --decoder nvdec --no-keep --threads "$sessions" --num-frames 4 \
      --repeat 4 "${clips[@]}" 2>&1 | tee -a "$OUT/decode.log"
  done
  for mode in plain cuvid; do
    for sessions in 1 4; do
      timeout 120 "$bench" --decoder nvdec --mode "$mode" --threads "$sessions" --num-frames 4 \
        --repeat "$sessions" "${clips[@]}" 2>&1 | tee -a "$OUT/decode.log"
    done
  done
  "$bench" --decoder cpu --mode plain --threads "$(nproc)" --num-frames 4 --repeat 8 \
    "${clips[@]}" 2>&1 | tee -a "$OUT/decode.log"
fi

if [[ " $stages " == *" diag "* ]]; then
  # Where an NVDEC file's time goes: 16 clips on one session, then on four, per-file times.
  echo "==== NVDEC per-file times (log: $OUT/diag.log) ===="
  for sessions in 1 4; do
    "$python" tools/bench/video_throughput.py --binary build-gpu/tools/cli/precompute \
      --out "$OUT/diag" --copies 2 --runs 1 --samplings nf4 --modes nvdec --no-peer \
      --sessions "$sessions" --log-level debug 2>&1 | tee -a "$OUT/diag.log" | grep '"who"'
    grep -h "ms: opened after" /tmp/video-bench/nvdec*-nf4-1gpu-*0.log | head -n 6 | cut -c 1-260
  done
fi

if [[ " $stages " == *" bench "* ]]; then
  echo "==== video throughput (log: $OUT/video_throughput.log) ===="
  t0=$SECONDS
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of words
  "$python" tools/bench/video_throughput.py --binary build-gpu/tools/cli/precompute \
    --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/video_throughput.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  echo "bench: $((SECONDS - t0)) s"
fi
echo "run_gpu_video_bench: exit $status after $((SECONDS - started)) s"
exit $status
