#!/usr/bin/env bash
# Dense sampling against NVIDIA's own decoder on the GPU machine, in one command: NVDEC alone
# (decode_bench, 4 frames a second, one NVDEC session per thread) against PyNvVideoCodec decoding
# the same sampled frames to RGB in device memory (tools/bench/video_throughput.py
# --peer-decode-only), run by run in turn on the same clips, the engines' utilisation sampled
# for each (tools/bench/decoder_util.sh); then the GPU tests
# (tools/gpu_tests.sh's ctest part), the three-encoder memory budget
# (tools/bench/gpu_budget_split.py, which reads the summary's memory.gpu_budget) and, with time
# left, the whole graph at 4 frames a second with ResNet-50 against the full peer.
#
#   bash tools/bench/run_gpu_dense_vs_peer.sh
# Needs .devbuild/ and bench-data/h264_720p carried. RUNS (default 3), COPIES (default 20: 160
# clips), SESSIONS (default 14: two per engine on H100/H200), DECODE_SAMPLINGS (default "fps4":
# the NVDEC cases, tools/bench/nvdec_engines.sh's SAMPLINGS; "fps4 all cuvid" adds every frame
# through FFmpeg's hwaccel and through its *_cuvid decoders), STAGES (default
# "alone tests budget graph"). Logs and JSON lines in $OUT (default /tmp/out); exit 1 when a
# step failed.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python=${BENCH_PYTHON:-python3}
clips=bench-data/h264_720p
runs=${RUNS:-3}
copies=${COPIES:-20}
sessions=${SESSIONS:-14}
stages=${STAGES:-alone tests budget graph}
decode_samplings=${DECODE_SAMPLINGS:-fps4}
status=0
started=$SECONDS
say() { echo "dense_vs_peer [$((SECONDS - started)) s]: $*"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$OUT/gpu.txt"
# shellcheck source=tools/bench/gpu_build_stage.sh
. tools/bench/gpu_build_stage.sh
GPU_TESTS=1 gpu_build_stage || exit 1
# shellcheck disable=SC1091
source build-gpu/precompute-env.sh
gpu_wheels_site
[ -d "$clips" ] || { echo "no $clips (tools/bench/make_video_clips.sh h264_720p)"; exit 1; }
binary=build-gpu/tools/cli/precompute

if [[ " $stages " == *" alone "* ]]; then
  say "NVDEC alone ($decode_samplings) against PyNvVideoCodec decode-only, 4 frames/s," \
    "$runs runs in turn"
  for k in $(seq "$runs"); do
    SAMPLINGS=$decode_samplings SESSION_COUNTS=$sessions REPEAT=$copies \
      bash tools/bench/nvdec_engines.sh "$clips" | tee -a "$OUT/dense_alone.jsonl" | cut -c1-400 ||
      status=1
    bash tools/bench/decoder_util.sh timeout 200 "$python" tools/bench/video_throughput.py \
      --binary "$binary" --clips "$clips" --copies "$copies" --runs 1 --samplings fps4 --modes "" \
      --peer-decode-only > "$OUT/dense_peer_$k.log" 2>&1 || status=1
    # The peer's line, then the engines' while it ran.
    grep '^{' "$OUT/dense_peer_$k.log" | tail -n 2 | paste -sd' ' | tee -a "$OUT/dense_peer.jsonl" |
      cut -c1-400
  done
fi

if [[ " $stages " == *" tests "* ]]; then
  say "GPU tests (ctest -L gpu)"
  (cd build-gpu && timeout 240 ctest -L gpu --output-on-failure > "$OUT/ctest_gpu.log" 2>&1) ||
    status=1
  grep -E "tests passed|tests failed|\(Failed\)|\(Skipped\)" "$OUT/ctest_gpu.log" | tail -n 15
fi

if [[ " $stages " == *" budget "* ]]; then
  say "three encoders under one GPU memory budget"
  timeout 240 "$python" tools/bench/gpu_budget_split.py --build build-gpu --out "$OUT" \
    > "$OUT/gpu_budget_split.log" 2>&1 || status=1
  tail -n 12 "$OUT/gpu_budget_split.log"
fi

if [[ " $stages " == *" graph "* ]] && [ $((SECONDS - started)) -lt 380 ]; then
  say "the graph at 4 frames/s, ResNet-50, against the full peer"
  timeout $((560 - (SECONDS - started))) "$python" tools/bench/video_throughput.py \
    --binary "$binary" --clips "$clips" --copies "$copies" --runs "$runs" --samplings fps4 \
    --modes auto,nvdec --one-run-modes "" > "$OUT/dense_graph.log" 2>&1 || status=1
  grep -v '^{' "$OUT/dense_graph.log" | tail -n 8
fi
say "exit $status"
exit $status
