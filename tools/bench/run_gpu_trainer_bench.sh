#!/usr/bin/env bash
# The trainer benchmark in one command on the GPU machine: build precompute
# (tools/bench/build_on_gpu.sh), then tools/bench/trainer_bench.py: precompute embeds 40,000
# samples into pooled 768-d float16 vectors x 3 modalities; the reader alone with 0/4/8/16
# workers, random and shard order; the seed's fusion trainer three ways (encoders fine-tuned in
# the loop, encoders under no_grad, the head on the precomputed vectors) under a 24 GiB cap:
# largest batch and samples/s. Logs, trainer_bench.json and trainer_bench.md land in $OUT
# (default /tmp/out).
#
# Before, on the Debian machine (network needed, once):
#   bash tools/bench/fetch_gpu_deps.sh                                  # .devbuild/ (h5py wheel)
#   .venv/bin/python tools/bench/trainer_bench.py --make-media bench-data/trainer   # 8 clips, 100 KB
# Then on the GPU machine, from the repository root (the working tree, .devbuild/ and
# bench-data/trainer/ copied there). A cold build takes about 3 min and the measurements 5-6,
# so with a 600 s limit per command use two calls on the same warm machine:
#   STAGES=build bash tools/bench/run_gpu_trainer_bench.sh
#   STAGES=bench bash tools/bench/run_gpu_trainer_bench.sh
# (one call, `bash tools/bench/run_gpu_trainer_bench.sh`, does both). Extra arguments go to
# trainer_bench.py (also BENCH_ARGS), e.g.
#   bash tools/bench/run_gpu_trainer_bench.sh --samples 100000 --ways c,c2
#
# Exit code: 1 when the build or any step of the benchmark failed.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
stages=${STAGES:-build bench}
python=${BENCH_PYTHON:-python3}
started=$SECONDS
status=0

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT/gpu.txt"
nproc | sed 's/^/cores: /' | tee -a "$OUT/gpu.txt"

# shellcheck source=tools/bench/gpu_build_stage.sh
. tools/bench/gpu_build_stage.sh
if [[ " $stages " == *" build "* ]]; then
  gpu_build_stage || status=1
fi

# h5py (the reader's dependency) from the carried wheels when this Python lacks it.
"$python" -c "import h5py" 2>/dev/null || gpu_wheels_site
"$python" -c "import torch, torchvision, transformers, h5py; print('torch', torch.__version__,
  'torchvision', torchvision.__version__, 'transformers', transformers.__version__,
  'h5py', h5py.__version__)" 2>&1 | tee -a "$OUT/gpu.txt"

if [[ " $stages " == *" bench "* ]]; then
  echo "==== trainer bench (log: $OUT/trainer_bench.log) ===="
  t0=$SECONDS
  media=()
  [ -d bench-data/trainer ] && media=(--media bench-data/trainer)
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of words
  "$python" tools/bench/trainer_bench.py --binary build-gpu/tools/cli/precompute --out "$OUT" \
    "${media[@]}" ${BENCH_ARGS:-} "$@" 2>&1 | tee "$OUT/trainer_bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  echo "bench: $((SECONDS - t0)) s"
fi
echo "run_gpu_trainer_bench: exit $status after $((SECONDS - started)) s"
exit $status
