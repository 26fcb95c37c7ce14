#!/usr/bin/env bash
# After tools/bench/run_gpu_text_bench.sh on the same machine: precompute alone on the same
# generated data under variants (attention path, batch limits), to see what each choice is worth.
# Prints one "done:" line per variant. Uses /tmp/text-bench from text_throughput.py.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
# shellcheck disable=SC1091
source build-gpu/precompute-env.sh
bin=build-gpu/tools/cli/precompute
variant() {  # name, environment (VAR=value or ""), extra flags of `precompute run`...
  local name=$1 environment=$2
  shift 2
  for set in short long; do
    local line
    # shellcheck disable=SC2086  # the environment is a list of words
    line=$(env $environment "$bin" run --config "/tmp/text-bench/precompute-$set.yaml" \
      --output "/tmp/text-bench/variant-$name-$set" --overwrite --progress-interval 0 "$@" 2>&1 |
      grep -E "done:|error" | tail -1)
    echo "$name $set: ${line#*done: }"
  done
}
variant packed-default ""
variant padded-attention "PRECOMPUTE_BERT_ATTENTION=padded"
variant batch-1024 "" --batch-size 1024
variant batch-2048 "" --batch-size 2048
