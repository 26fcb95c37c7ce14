#!/usr/bin/env bash
# Decoding work with and without seeking to keyframes (Note [Seeking to what is sampled] in
# pipeline/media/video_decoder.cpp), on this machine's CPU: 8 x 60-s 720p30 H.264 clips (x264
# veryfast, its default keyint 250: a keyframe every ~8 s), the demo's video encoder at 224x224,
# 2 decode threads, `num_frames: 4` and `fps: 1`, each with `video.seek: true` and `false`, three
# runs each. Prints whole-process seconds, the run time from precompute's summary and the
# summary's decoded-frame counts. Needs the build (tools/setup.sh).
#   bash tools/bench/cpu_video_seek.sh [WORK_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
work=${1:-/tmp/precompute-seek-bench}
mkdir -p "$work"
[ -f "$work/long60.mp4" ] || ffmpeg -v error -y -f lavfi -i testsrc2=s=1280x720:r=30:d=60 \
  -c:v libx264 -preset veryfast -pix_fmt yuv420p "$work/long60.mp4"
[ -f "$work/models/video_demo.pt" ] ||
  .venv/bin/python tools/scripts/export_encoders.py demo "$work/models" > /dev/null
.venv/bin/python - "$work" <<'PY'
import json, sys
work = sys.argv[1]
with open(f"{work}/m.jsonl", "w") as f:
    for i in range(8):
        f.write(json.dumps({"id": f"c{i}", "video": f"{work}/long60.mp4"}) + "\n")
for seek in (True, False):
    for name, sampling in (("n4", {"num_frames": 4}), ("fps1", {"fps": 1})):
        cfg = {"input": {"manifest": f"{work}/m.jsonl"},
               "output": {"path": f"{work}/out-{name}-{seek}", "overwrite": True},
               "run": {"progress_interval_s": 0, "decode_threads": 2},
               "video": {"encoder": {"path": f"{work}/models/video_demo.pt"},
                         "sampling": sampling, "size": 224, "seek": seek}}
        with open(f"{work}/{name}-{'seek' if seek else 'full'}.yaml", "w") as f:
            f.write(json.dumps(cfg))
PY
for cfg in n4-full n4-seek fps1-full fps1-seek; do
  for rep in 1 2 3; do
    start=$(date +%s.%N)
    "$root/build/tools/cli/precompute" run --config "$work/$cfg.yaml" 2> "$work/$cfg.$rep.log"
    end=$(date +%s.%N)
    run=$(grep -o "[0-9]* samples in [0-9.]* s" "$work/$cfg.$rep.log" | tail -1 | awk '{print $4}')
    decoding=$(grep -o "video decoding: [^;]*" "$work/$cfg.$rep.log")
    echo "$cfg run $rep: whole process $(echo "$end - $start" | bc) s, run $run s; $decoding"
  done
done
