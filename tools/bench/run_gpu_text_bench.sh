#!/usr/bin/env bash
# The GPU text benchmark in one command: build precompute on the GPU machine
# (tools/bench/build_on_gpu.sh), then measure it against the Python baselines
# (tools/bench/text_throughput.py); logs and reports land in $OUT (default /tmp/out).
#
# Before, on the Debian machine (network needed, once): bash tools/bench/fetch_gpu_deps.sh
# Then on the GPU machine, from the repository root (the working tree and .devbuild/ copied
# there; one command, under 10 minutes):
#   bash tools/bench/run_gpu_text_bench.sh
# Expected: under 1 min FFmpeg, 1-2 min precompute's build, 3-4 min of measurements. Should the
# 600 s limit of one command be too short, build first with a separate call
# (command="bash tools/bench/build_on_gpu.sh"): on the still-warm machine this script's build
# step then takes seconds.
# Extra arguments go to text_throughput.py (also TEXT_BENCH_ARGS), e.g.
#   bash tools/bench/run_gpu_text_bench.sh --batch-size 8192 --max-batch-tokens 131072
# A second call on a still-warm machine reuses FFmpeg, the build folder and the generated data.
#
# Exit code: build_on_gpu.sh's when the build failed (the baselines still run), else
# text_throughput.py's (1 when any step failed).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
started=$SECONDS
python=${BENCH_PYTHON:-python3}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 |
  tee "$OUT/gpu.txt" || true

echo "==== build (log: $OUT/build.log) ===="
t0=$SECONDS
bash tools/bench/build_on_gpu.sh 2>&1 | tee "$OUT/build.log"
build_rc=${PIPESTATUS[0]}
build_s=$((SECONDS - t0))
[ "$build_rc" -eq 0 ] || echo "run_gpu_text_bench: the build FAILED (exit $build_rc); measuring" \
                              "the baselines anyway"

echo "==== text throughput (log: $OUT/text_throughput.log) ===="
t0=$SECONDS
# shellcheck disable=SC2086  # TEXT_BENCH_ARGS is a list of words
"$python" tools/bench/text_throughput.py --build build-gpu ${TEXT_BENCH_ARGS:-} "$@" 2>&1 |
  tee "$OUT/text_throughput.log"
bench_rc=${PIPESTATUS[0]}
bench_s=$((SECONDS - t0))

echo "==== tokenizer throughput, all cores (log: $OUT/tokenize.log) ===="
# The short captions of whichever model ran (text_throughput.py's names for each).
for pair in "short.jsonl bert-random" "short-xlmr.jsonl xlmr-random"; do
  # shellcheck disable=SC2086  # two words: the manifest, the model folder
  set -- $pair
  [ -x build-gpu/tools/cli/precompute ] && [ -f "/tmp/text-bench/$1" ] || continue
  "$python" -c "import json,sys; [print(json.loads(l)['text']) for l in open(sys.argv[1])]" \
    "/tmp/text-bench/$1" > "/tmp/text-bench/$1.txt"
  # shellcheck disable=SC1091
  (source build-gpu/precompute-env.sh 2>/dev/null
   build-gpu/tools/cli/precompute tokenize --model "/tmp/text-bench/$2" \
     --file "/tmp/text-bench/$1.txt" --stats --threads "$(nproc)") 2>&1 | tee -a "$OUT/tokenize.log"
done

echo
echo "==== summary ===="
echo "build: exit $build_rc in $build_s s; text_throughput.py: exit $bench_rc in $bench_s s;" \
     "total $((SECONDS - started)) s"
grep -E '^build_on_gpu: (ERROR|[0-9]\.|done)' "$OUT/build.log" || true
if [ -f "$OUT/text_throughput.md" ]; then
  cat "$OUT/text_throughput.md"
else
  echo "no $OUT/text_throughput.md; last lines of $OUT/text_throughput.log:"
  tail -n 40 "$OUT/text_throughput.log"
fi
echo "files in $OUT: $(cd "$OUT" && echo *)"
if [ "$build_rc" -ne 0 ]; then exit "$build_rc"; fi
exit "$bench_rc"
