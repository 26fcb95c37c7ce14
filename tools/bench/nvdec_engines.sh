#!/usr/bin/env bash
# Whether the NVDEC path is bound by the engines themselves or by the sessions' threads around
# them: the NVDEC decoders alone (build-gpu/tools/bench/decode_bench: no graph, no encoder, no
# CPU decoders) with more sessions than engines, while nvidia-smi samples the GPU's decoder
# utilisation (utilization.decoder: the share of the last sample period in which the engines
# decoded). Engines near 100% mean more sessions cannot help; engines well below it with the
# sessions' threads always in FFmpeg's calls mean the time goes around the engines.
#   bash tools/bench/nvdec_engines.sh [CLIP_DIR]
# SESSION_COUNTS (default "7 14 21"), SAMPLINGS (default "fps1 nf4"; "fps4": 4 frames a second,
# dense sampling, where no keyframe seek helps; "fps4-noskip": the same with seeking and frame
# dropping off, every frame decoded through precompute's path; "all": every frame decoded,
# decode_bench --mode plain; "cuvid": every frame through FFmpeg's *_cuvid decoders, NVIDIA's
# parser, decode_bench --mode cuvid), CONTEXTS (default "shared": the sessions in one CUDA
# context, as precompute opens them; "own": a context each, decode_bench --own-contexts), REPEAT
# (default 40: the clips listed that many times), DROP_FRAMES (default auto: decode_bench
# --drop-frames). One
# JSON line a case: decode_bench's line with the sampling and the utilisation samples' mean,
# median, max and count added (tools/bench/decoder_util.sh).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
bench=build-gpu/tools/bench/decode_bench
clips=("${1:-bench-data/h264_720p}"/*.mp4)
status=0
for sampling in ${SAMPLINGS:-fps1 nf4}; do
  case $sampling in
    fps1) sampling_args=(--fps 1) ;;
    nf4) sampling_args=(--num-frames 4) ;;
    fps4) sampling_args=(--fps 4) ;;
    fps4-noskip) sampling_args=(--fps 4 --no-seek) ;;
    all) sampling_args=(--mode plain --num-frames 4) ;;  # every frame, no seeking or dropping
    cuvid) sampling_args=(--mode cuvid --num-frames 4) ;;  # every frame, FFmpeg's *_cuvid
    *) echo "nvdec_engines: sampling $sampling is fps1, nf4, fps4, fps4-noskip, all or cuvid" >&2
       exit 2 ;;
  esac
  for sessions in ${SESSION_COUNTS:-7 14 21}; do
    for contexts in ${CONTEXTS:-shared}; do
      context_args=()
      [ "$contexts" = own ] && context_args=(--own-contexts)
      out=$(bash tools/bench/decoder_util.sh timeout 300 "$bench" --decoder nvdec \
        --threads "$sessions" "${sampling_args[@]}" "${context_args[@]}" \
        --drop-frames "${DROP_FRAMES:-auto}" --repeat "${REPEAT:-40}" "${clips[@]}" \
        2>/dev/null) || status=1
      SAMPLING=$sampling OUTPUT=$out python3 - <<'PY'
import json, os
lines = [l for l in os.environ["OUTPUT"].splitlines() if l.startswith("{")]
try:
    line = json.loads(lines[-2])
except (IndexError, ValueError):
    line = {"error": "decode_bench printed no result"}
line["sampling"] = os.environ["SAMPLING"]
line.update(json.loads(lines[-1]) if lines else {})
print(json.dumps(line))
PY
    done
  done
done
exit $status
