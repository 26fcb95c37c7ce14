#!/usr/bin/env bash
# Where the NVDEC path's time goes at dense sampling (4 frames a second on 10-s clips with 2-s
# GOPs: no keyframe seek helps, and most frames are decoded), on the GPU machine, in one command:
#
#   bash tools/bench/run_gpu_dense_probe.sh
#
# 1. builds (tools/bench/build_on_gpu.sh with the GPU tests, so tools/gpu_tests.sh reuses it);
# 2. the NVDEC decoders alone (decode_bench through tools/bench/nvdec_engines.sh, engines'
#    utilisation sampled): 1 frame/s against 4 frames/s, 1 and 14 sessions, and 4 frames/s with
#    seeking and frame dropping off; the CPU decoders alone at 4 frames/s;
# 3. the same 4 frames/s through the whole graph with ResNet-50 (tools/bench/video_throughput.py,
#    decoder nvdec and cpu, 160 clips), so that the decoders alone and in the graph compare;
# 4. when Nsight Systems is installed, a profile of decode_bench at 4 frames/s (CUDA API and OS
#    runtime summaries in $OUT/nsys_*.txt).
# Needs .devbuild/ and bench-data/h264_720p (tools/bench/make_video_clips.sh h264_720p) carried.
# Logs and JSON lines in $OUT (default /tmp/out). Exit 1 when a step failed.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python=${BENCH_PYTHON:-python3}
clips=bench-data/h264_720p
status=0
started=$SECONDS
say() { echo "dense_probe [$((SECONDS - started)) s]: $*"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$OUT/gpu.txt"
# shellcheck source=tools/bench/gpu_build_stage.sh
. tools/bench/gpu_build_stage.sh
GPU_TESTS=1 gpu_build_stage || exit 1
# shellcheck disable=SC1091
source build-gpu/precompute-env.sh
gpu_wheels_site
[ -d "$clips" ] || { echo "no $clips (tools/bench/make_video_clips.sh h264_720p)"; exit 1; }

say "NVDEC alone"
for spec in "fps1:14" "fps4:14" "fps4:1" "fps4-noskip:14"; do
  SAMPLINGS=${spec%%:*} SESSION_COUNTS=${spec##*:} REPEAT=${REPEAT:-5} \
    bash tools/bench/nvdec_engines.sh "$clips" | tee -a "$OUT/engines.jsonl" || status=1
done
say "CPU alone, 4 frames/s"
timeout 200 build-gpu/tools/bench/decode_bench --decoder cpu --threads "$(nproc)" --fps 4 \
  --repeat "${REPEAT:-5}" "$clips"/*.mp4 2>&1 | tee -a "$OUT/engines.jsonl" || status=1

say "the graph at 4 frames/s, ResNet-50"
timeout 300 "$python" tools/bench/video_throughput.py --binary build-gpu/tools/cli/precompute \
  --clips "$clips" --copies "${COPIES:-20}" --runs 1 --samplings fps4 --modes nvdec,cpu \
  --no-peer > "$OUT/graph.log" 2>&1 || status=1
tail -n 8 "$OUT/graph.log"
cp /tmp/video-bench/*.summary.json "$OUT/" 2>/dev/null

nsys=$(command -v nsys || compgen -G "/opt/nvidia/nsight-systems*/bin/nsys" ||
       compgen -G "/usr/local/cuda/bin/nsys")
nsys=${nsys%%$'\n'*}
if [ -n "$nsys" ]; then
  say "Nsight Systems: $nsys"
  timeout 200 "$nsys" profile --trace=cuda,osrt --sample=none --force-overwrite=true \
    -o /tmp/dense-probe build-gpu/tools/bench/decode_bench --decoder nvdec --threads 14 \
    --fps 4 --repeat 3 "$clips"/*.mp4 > "$OUT/nsys_run.txt" 2>&1 || status=1
  for report in cuda_api_sum osrt_sum cuda_gpu_kern_sum; do
    timeout 120 "$nsys" stats --report "$report" --format csv /tmp/dense-probe.nsys-rep \
      > "$OUT/nsys_$report.txt" 2>&1
  done
else
  say "no Nsight Systems on this machine"
fi
say "exit $status"
exit $status
