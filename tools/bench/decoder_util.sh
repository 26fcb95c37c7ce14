#!/usr/bin/env bash
# Runs one command while nvidia-smi samples the GPU's decoder utilisation every 100 ms
# (utilization.decoder: the share of the last sample period in which the NVDEC engines decoded),
# then prints one JSON line of the samples: {"decoder_util_pct": {mean, median, max, samples,
# samples_at_0}}. The command's own output comes first, unchanged; the exit code is the
# command's. What an engine-bound case looks like: engines near 100% while the command ran.
#   bash tools/bench/decoder_util.sh COMMAND [ARG...]
# Samples reading 0 (the command opening or closing, before and after the engines work) are
# counted apart and left out of the figures.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: decoder_util.sh COMMAND [ARG...]" >&2; exit 2; }
# Removed at the end rather than by an EXIT trap, which the sampler's subshell would run (and
# remove the file) when nvidia-smi is missing.
samples=$(mktemp /tmp/decoder-util.XXXXXX)
nvidia-smi --query-gpu=utilization.decoder --format=csv,noheader,nounits -lms 100 \
  > "$samples" 2>/dev/null &
sampler=$!
"$@"
rc=$?
kill "$sampler" 2>/dev/null
wait "$sampler" 2>/dev/null
python3 - "$samples" <<'PY'
import json, statistics, sys
values = [int(row) for row in open(sys.argv[1]) if row.strip().isdigit()]
busy = [v for v in values if v > 0]
print(json.dumps({"decoder_util_pct": {
    "mean": round(statistics.mean(busy), 1) if busy else None,
    "median": statistics.median(busy) if busy else None,
    "max": max(busy) if busy else None,
    "samples": len(busy),
    "samples_at_0": len(values) - len(busy),
}}))
PY
rm -f "$samples"
exit $rc
