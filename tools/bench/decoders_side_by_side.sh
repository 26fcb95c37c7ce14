#!/usr/bin/env bash
# The two decoders side by side, without the graph or an encoder: how much the CPU decoders
# slow NVDEC's sessions down when both run in one machine at once, as under video.decoder: auto,
# and whether a lower scheduling priority for the CPU decoders gives the engines back their pace.
# Runs build-gpu/tools/bench/decode_bench (build it first: tools/bench/build_on_gpu.sh) on the
# GPU machine, 720p H.264 (bench-data/h264_720p), 1 frame/s; one JSON line a decoder and case.
#   bash tools/bench/decoders_side_by_side.sh [CLIP_DIR]
# SAMPLING (default "--fps 1"; "--num-frames 4" for 4 frames a clip) and NICE_LEVELS (default
# "0 10 19") and THREAD_COUNTS (default: the cores, and two fewer) narrow it to fewer cases.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
bench=build-gpu/tools/bench/decode_bench
clips=("${1:-bench-data/h264_720p}"/*.mp4)
cores=$(nproc)
read -r -a sampling <<< "${SAMPLING:---fps 1}"
nvdec() { "$bench" --decoder nvdec --threads 7 "${sampling[@]}" --repeat "$1" "${clips[@]}"; }
cpu() { "$bench" --decoder cpu --threads "$1" "${sampling[@]}" --repeat "$2" "${clips[@]}"; }
case_line() { echo "---- $1"; }
case_line "NVDEC alone"; nvdec 40
case_line "CPU alone, $cores threads"; cpu "$cores" 40
for nice_level in ${NICE_LEVELS:-0 10 19}; do
  for threads in ${THREAD_COUNTS:-$cores $((cores - 2))}; do
    case_line "NVDEC beside the CPU, $threads threads at nice $nice_level"
    nice -n "$nice_level" "$bench" --decoder cpu --threads "$threads" "${sampling[@]}" --repeat 70 \
      "${clips[@]}" > /tmp/side-cpu.json 2>&1 &
    sleep 0.5
    nvdec 40
    wait
    cat /tmp/side-cpu.json
  done
done
