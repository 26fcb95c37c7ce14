#!/usr/bin/env bash
# Per-frame encoders from light to heavy on the GPU machine, the table of docs/benchmarks.md's
# "A heavy encoder at 4 frames a second" grown to every case: for each MODEL:SAMPLING of CASES
# (default "resnet50:fps1 vit_b_16:fps1 vit_l_16:fps1 vit_l_16:fps4"), precompute with decoder
# auto, cpu and nvdec, PyNvVideoCodec with the same model batched across clips (256 frames a
# pass) and decoding only, and the model alone: medians of RUNS (default 3) runs taking turns,
# on the 800-clip set (COPIES, default 100). Each case writes $OUT/heavy_MODEL_SAMPLING.json;
# tools/bench/plot_heavy.py draws them.
#
#   STAGES=build bash tools/bench/run_gpu_video_bench.sh      # once per machine
#   CASES="vit_l_16:fps4" bash tools/bench/run_gpu_heavy_bench.sh
#
# A case takes about 5 minutes at 1 frame/s and 9 for ViT-L/16 at 4 frames/s (estimates from
# the runs' lengths): where one command may run 10 minutes, give each its case and keep the
# machine warm between.
# Needs .devbuild/ (PyNvVideoCodec's wheel) and bench-data/h264_720p carried. Exit 1 when a case
# failed.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cases=${CASES:-resnet50:fps1 vit_b_16:fps1 vit_l_16:fps1 vit_l_16:fps4}
status=0
started=$SECONDS
for case in $cases; do
  model=${case%%:*}
  sampling=${case#*:}
  echo "==== $model at $sampling ===="
  t0=$SECONDS
  STAGES=bench BENCH_ARGS="--model $model --samplings $sampling --modes auto,cpu,nvdec \
--one-run-modes none --runs ${RUNS:-3} --copies ${COPIES:-100} --peer-batch 256 \
--peer-decode-bound --alone 256 --json heavy_${model}_${sampling}.json" \
    bash tools/bench/run_gpu_video_bench.sh | grep -v '"each"' || status=1
  echo "$model at $sampling: $((SECONDS - t0)) s"
done
# Only the JSON files come back (the logs repeat them).
rm -f "$OUT/video_throughput.log" "$OUT/pip.log"
echo "run_gpu_heavy_bench: exit $status after $((SECONDS - started)) s"
exit $status
