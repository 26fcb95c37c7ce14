#!/usr/bin/env bash
# How long `precompute run --overwrite` takes to remove an earlier run's files: 125 shards of 13 MB
# (what a 1,000,000-caption run leaves) are made in a fresh output folder, then the run starts
# over there at debug level; the time is from its "batch limits set" line to its "files removed"
# line. Each binary in turn, RUNS rounds (default 3):
#
#   bash tools/bench/overwrite_removal.sh CONFIG BINARY [BINARY...]
#
# CONFIG: any run config (its output.path is replaced), e.g. the one text_scale.py writes:
#   .venv/bin/python tools/bench/text_scale.py --device-kind cpu --captions 200 --runs 1 \
#       --devices cpu --build build --peer-runs 0 --work /tmp/ts     # then /tmp/ts/cpu-0.yaml
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 CONFIG BINARY [BINARY...]" >&2; exit 2; }
config=$1
shift
out=${WORK:-/tmp/overwrite-removal}/out
cfg=${WORK:-/tmp/overwrite-removal}/config.json
mkdir -p "$(dirname "$out")"
python3 - "$config" "$out" "$cfg" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["output"]["path"] = sys.argv[2]
c["output"]["overwrite"] = True
json.dump(c, open(sys.argv[3], "w"))
PY
for round in $(seq 1 "${RUNS:-3}"); do
  for binary in "$@"; do
    rm -rf "$out"
    mkdir -p "$out"
    for i in $(seq -f "%06g" 0 124); do head -c 13000000 /dev/zero > "$out/shard-$i.h5"; done
    echo '{}' > "$out/index.json"
    sync
    "$binary" run --config "$cfg" --log-level debug 2>&1 |
      grep -E "start-up: (batch limits set|the earlier run's files removed)" |
      python3 -c '
import re, sys
t = [sum(float(x) * m for x, m in zip(re.match(r"\[(\d+):(\d+):([\d.]+)\]", l).groups(),
                                       (3600, 60, 1))) for l in sys.stdin]
print(f"round '"$round"' '"$binary"': removal {t[1] - t[0]:.3f} s" if len(t) == 2 else
      "round '"$round"' '"$binary"': no timeline (did the run start?)")'
  done
done
